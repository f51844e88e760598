"""The rows of a .csv/.tsv training file, parsed as `csv` (and pandas) do, and the checks made on them: a quote
left open or text after a closing quote, a header that names a column twice, a row with more fields than the header
(each refused, naming the line); per column, which cells are blank and which texts are overlong.

Used on one block of lines at a time (`hf_sentcl.data.block_scan.TableScan`) and on a whole file refused for its
quotes (`scan_table`, from `hf_sentcl.data.checks`), so both find the same rows and name the same lines.
"""

from __future__ import annotations

import csv
import io
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path

import numpy as np

from hf_sentcl.data.cleaning import FileScan
from hf_sentcl.data.text_lines import blank_flags, line_count, overlong_texts


def scan_table(path: Path, label: str, text: str, delimiter: str, common: dict[str, tuple[int, int]]) -> FileScan:
    """A .csv/.tsv file, parsed as `csv` (and pandas) do, with every row checked against the header line."""
    text = text.removeprefix("\ufeff")  # a byte-order mark (Excel's "UTF-8 CSV"), which pandas skips too
    lines = line_count(text)
    with _no_field_size_limit():
        try:
            rows = strict_rows(text, delimiter)
            problem = None if len(rows) == lines else _quote_problem(path, label, text, delimiter)
        except csv.Error:
            rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
            problem = _quote_problem(path, label, text, delimiter)
    header = header_names(rows)
    fields, columns, long_texts = table_cells(rows[1:], len(header), bool(common["nul"][0]))
    return table_scan(path, label, header, fields, columns, long_texts, problem, delimiter, common)


def strict_rows(text: str, delimiter: str) -> list[list[str]]:
    """The rows of CSV `text` as `csv` parses them, any field size allowed; csv.Error on a malformed quote."""
    with _no_field_size_limit():
        return list(csv.reader(io.StringIO(text), delimiter=delimiter, strict=True))


def header_names(rows: list[list[str]]) -> tuple[str, ...]:
    """A table's column names from its first row, an empty name read as pandas does (`Unnamed: i`)."""
    return tuple(name or f"Unnamed: {i}" for i, name in enumerate(rows[0])) if rows else ()


def table_cells(rows: list[list[str]], width: int, nul: bool) -> tuple[np.ndarray, list[np.ndarray], list]:
    """Rows below a header of `width` columns: each row's number of fields, each column's blank flag per row, and
    the (row, column, characters, non-blank) of each overlong text. `nul`: the rows were parsed with NUL bytes (as
    pandas does: a NUL before a quote makes it text), which do not count as text."""
    fields = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    columns, long_texts = [], []
    for i in range(width):
        values = list(map(itemgetter(i), rows)) if fields.size == 0 or fields.min() > i else [
            row[i] if len(row) > i else "" for row in rows]
        if nul:
            values = [v.replace("\x00", "") for v in values]
        columns.append(blank_flags(values))
        long_texts += overlong_texts(values, i)
    return fields, columns, long_texts


def table_scan(path: Path, label: str, header: tuple[str, ...], fields: np.ndarray, columns: list[np.ndarray],
                long_texts: list, problem: str | None, delimiter: str, common: dict[str, tuple[int, int]]) -> FileScan:
    """The `FileScan` of a .csv/.tsv file from its rows' cells (`table_cells`), refused for `problem` (a quote's),
    a header naming a column twice or a row with more fields than the header."""
    width = len(header)
    all_blank = np.logical_and.reduce(columns) if columns else np.ones(len(fields), dtype=bool)
    blank_rows = (fields == 0) | ((fields == 1) & (columns[0] if columns else True))
    if problem is None:
        problem = _header_problem(path, label, header)
    if problem is None and (fields > width).any():
        extra = np.flatnonzero(fields > width)
        problem = (
            f"{label} '{path}' line {int(extra[0]) + 2}: {int(fields[extra[0]])} fields where the header (line 1) "
            f"has {width} ({len(extra):,} row(s) like this): an unquoted '{delimiter}' inside a text? Quote such "
            "fields (\"a, b\") or remove the extra fields."
        )
    return FileScan(path, label, "csv", len(fields), len(fields) - int(all_blank.sum()), header, problem, **common,
                    blank_cells=tuple(columns), blank_rows=blank_rows, long_texts=tuple(long_texts))


def _quote_problem(path: Path, label: str, text: str, delimiter: str) -> str:
    """The message for the first row that is not one line of well-formed fields: an unbalanced quote (a field that
    runs across line ends, or to the end of the file) or text after a closing quote."""
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, strict=True)
    start = 1
    try:
        for _ in reader:
            if reader.line_num > start:
                return (f"{label} '{path}' line {start}: a quoted field opens on this line and runs on to line "
                        f"{reader.line_num}: an unbalanced quote (\")? A training file holds one row per line; close "
                        "the quote, double quotes inside a quoted field (\"\"), or replace line breaks in a text with "
                        "spaces.")
            start = reader.line_num + 1
    except csv.Error as err:
        if "end of data" in str(err):
            return (f"{label} '{path}' line {start}: a quote (\") opens a field on this line and is never closed: "
                    f"the parser would read the rest of the file (lines {start}-{max(reader.line_num, start)}) as "
                    "one field. Close the quote or double quotes inside a quoted field (\"\").")
        if reader.line_num > start:
            return (f"{label} '{path}' line {start}: a quoted field opens on this line and runs on to line "
                    f"{reader.line_num}, where text follows its closing quote: an unbalanced quote (\")? Close the "
                    "quote or double quotes inside a quoted field (\"\").")
        return (f"{label} '{path}' line {reader.line_num}: text follows a closing quote ({err}); a quote inside a "
                "quoted field must be doubled (\"\").")
    return f"{label} '{path}': the rows do not match its lines (a quoted field that spans lines?)."


def _header_problem(path: Path, label: str, header: tuple[str, ...]) -> str | None:
    seen = set()
    for name in header:
        if name in seen:
            return (f"{label} '{path}' line 1: the header names the column '{name}' twice; "
                    "give each column its own name.")
        seen.add(name)
    return None


@contextmanager
def _no_field_size_limit():
    """`csv` refuses fields over 131,072 characters by default; overlong texts are cut when loaded, not refused."""
    previous = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(previous)
