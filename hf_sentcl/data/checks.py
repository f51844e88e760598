"""Checks of a local training file's content, before any model loads, and the account of what loading will repair or
drop (`hf_sentcl.data.cleaning.DataCleaning`, reported in results.json under `train.data_cleaning`).

One pass over the file's bytes (`scan_data_file`, cached per file version, so the check before the model loads and
the loading itself read the file once; .txt, .csv/.tsv and .jsonl files are read in blocks of whole lines, never held
whole, their rows never kept as Python objects) finds every defect; then each defect is either repaired or dropped,
with a count, or refused with the file and the 1-based line named. A line is a physical line: `\\n`, `\\r\\n` or a
lone `\\r` ends one (as Python's `open`, `datasets` and `pandas` read them). Per defect, and why:

- **invalid UTF-8 bytes** (.txt, .csv, .tsv): each bad sequence is replaced by U+FFFD and the lines are counted
  (`invalid_utf8_lines_repaired`): a few corrupt bytes in a million-line scraped corpus should not cost the run.
  When more than `MAX_INVALID_UTF8_FRACTION` (1%) of the lines hold them, the file is in another encoding (Latin-1,
  cp1252) and repairing would blank out every accented letter, so it is refused with the first offending line and
  byte. .json/.jsonl files are refused at the first bad byte (their reader cannot repair).
- **NUL bytes**: removed, lines counted (`nul_lines_repaired`). They are never text: a NUL comes from a binary or
  UTF-16 file glued in, or a crashed writer's zero-filled block; the rest of the line is kept.
- **CRLF (and lone CR) line ends**: read as `\\n`, counted (`crlf_line_ends_normalised`, INFO only): a file written
  on Windows trains exactly like its LF copy, but a `\\r` should never end up inside a sentence.
- **blank lines** (nothing but whitespace): dropped, counted (`blank_lines_dropped`, INFO only): they hold no
  example, and an empty sentence would be a batch's degenerate positive pair.
- **overlong lines/fields**: kept, stripped and cut to `max_text_chars(max_seq_length)` characters (100 per token, at
  least 10,000: far more than `max_seq_length` tokens can cover, so the model sees exactly what it would have seen),
  counted (`lines_truncated`). Tokenising a many-megabyte "line" (a file without line ends) would take minutes and
  the memory of the whole line for `max_seq_length` tokens.
- **CSV row with a missing value** (an empty cell or a short row, in a column the method reads): dropped, counted
  (`missing_value_rows_dropped`) with its line: a triplet without its hard negative (or a pair without its
  partner) is not an example, and a single row should not stop a run. Cells are read as strings, so sentences like
  "NA", "null" or "None" are text, not missing values (pandas' default would drop them silently).
- **CSV unbalanced quote**: refused, naming the line where the quote opened. An unclosed `"` makes every parser
  read the following lines, delimiters and line ends included, as one field; the rows it swallows can even leave
  the right number of fields, so no repair can be trusted. For the same reason a training CSV holds one row per
  line: a quoted field that spans lines is refused too (a real line break inside a sentence is replaced by a space
  before training anyway), as is text after a closing quote (`"a"b`: quotes inside a field must be doubled).
- **CSV row with more fields than the header**: refused, naming the line and how many rows are affected. An extra
  field is almost always an unquoted delimiter inside a sentence, which shifts that row's sentences into the wrong
  columns; dropping such rows would hide a writer bug that usually affects many rows, and the fix (quote the
  fields) is the user's.

`count_train_examples` returns the number of usable examples, so a recipe can compare them with its batch
(`hf_sentcl.recipe.checks.validate_recipe`).

This module is the entry point and the whole-file fallback; the work is done by `block_scan` (the scans in blocks of
whole lines), `csv_rows` (CSV rows and their refusals), `text_lines` (bytes to text and lines) and `cleaning` (the
`FileScan` found and the `DataCleaning` account), all in `hf_sentcl.data`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from hf_sentcl.data.block_scan import JsonLinesScan, ReadWhole, TableScan, TextScan
from hf_sentcl.data.cleaning import FileScan, require_examples
from hf_sentcl.data.csv_rows import scan_table
from hf_sentcl.data.text_lines import (
    MAX_INVALID_UTF8_FRACTION,
    LineEnds,
    decode_utf8,
    lone_returns_as_newlines,
    no_text,
    not_utf8,
)

#: file extension -> `datasets` builder
FILE_BUILDERS = {"txt": "text", "text": "text", "csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json"}


def count_train_examples(path: Path) -> int:
    """Return the number of usable examples in the local training file `path` (.txt: non-blank lines; .csv/.tsv:
    rows below the header with some text; .jsonl/.json: JSON lines, or the items of one JSON list).

    Raises ValueError naming the file (and line) when the extension is unsupported, the bytes are not UTF-8 (more
    than 1% of the lines, or any in a JSON file), or there is no usable example. The scan is cached per file
    version, so checking twice reads the file once.
    """
    return scan_data_file(path).usable


def check_data_file(path: Path, label: str = "train_file") -> FileScan:
    """`scan_data_file`, raising ValueError (file and line named) when the file is refused: see the module's notes."""
    scan = scan_data_file(path, label)
    if scan.problem:
        raise ValueError(scan.problem)
    return scan


def scan_data_file(path: Path, label: str = "train_file") -> FileScan:
    """One pass over the local file `path` (cached per path, modification time and size): counts of every defect
    the loader repairs or drops, and `problem` when it must be refused. ValueError when it cannot be read at all
    (unsupported extension, not UTF-8, no usable example, invalid JSON)."""
    stat = path.stat()
    return _scan(str(path), stat.st_mtime_ns, stat.st_size, label)


@functools.lru_cache(maxsize=16)
def _scan(path_text: str, mtime_ns: int, size: int, label: str) -> FileScan:
    """`scan_data_file`'s pass: block by block (`TextScan`, `TableScan`, `JsonLinesScan`), or the whole file when a
    block scan leaves it (`ReadWhole`: a JSON list, or a CSV to refuse naming the lines of its quotes)."""
    path = Path(path_text)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FILE_BUILDERS:
        raise ValueError(
            f"{label} '{path}': unsupported extension '{path.suffix or '(none)'}'; use one of "
            f"{', '.join('.' + s for s in FILE_BUILDERS)}."
        )
    builder = FILE_BUILDERS[suffix]
    delimiter = "\t" if suffix == "tsv" else ","
    try:
        if builder == "text":
            return TextScan().of(path, label)
        if builder == "csv":
            return TableScan(delimiter=delimiter).of(path, label)
        return JsonLinesScan().of(path, label)
    except ReadWhole:  # a JSON list, or a CSV refused for its quotes: read whole, for the parser and the lines
        pass
    data = path.read_bytes()
    text, bad_bytes = decode_utf8(data)
    ends = LineEnds(data)
    invalid = (0, 0)
    if bad_bytes:
        lines_in_file = ends.lines
        bad_lines = np.unique(ends.line_of(bad_bytes))
        first = int(bad_lines[0]) + 1
        if builder == "json":
            raise not_utf8(path, label, first, data[bad_bytes[0]])
        if len(bad_lines) > MAX_INVALID_UTF8_FRACTION * lines_in_file:
            raise not_utf8(path, label, first, data[bad_bytes[0]], (len(bad_lines), lines_in_file))
        invalid = (len(bad_lines), first)
    if not text or text.isspace():
        raise no_text(path, label, empty=not text)
    nul, nul_lines = (0, 0), np.zeros(0, dtype=np.int64)
    if "\x00" in text:
        nul_lines = np.unique(ends.line_of(np.flatnonzero(np.frombuffer(data, np.uint8) == 0)))
        nul = (len(nul_lines), int(nul_lines[0]) + 1)
    line_ends = (0, 0)
    if ends.returns:
        line_ends = (ends.returns, ends.line_at(data.index(b"\r")))
    common = {"invalid_utf8": invalid, "nul": nul, "line_ends": line_ends}
    if builder == "json" and nul[0]:
        text = text.replace("\x00", "")
    text = lone_returns_as_newlines(text, ends)
    if builder == "csv":
        scan = scan_table(path, label, text, delimiter, common)
    else:
        scan = _scan_json(path, label, text, **common)
    return require_examples(scan)


def _scan_json(path: Path, label: str, text: str, **common) -> FileScan:
    """A .json list, counted (a file of JSON lines is `JsonLinesScan`'s)."""
    try:
        count = len(json.loads(text))
    except json.JSONDecodeError as err:
        raise ValueError(f"{label} '{path}': not valid JSON (line {err.lineno}: {err.msg}).") from None
    return FileScan(path, label, "json", count, count, **common)
