"""Checks of a local training file's content, before any model loads, and the account of what loading will repair or
drop (`DataCleaning`, reported in results.json under `train.data_cleaning`).

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
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("hf_sentcl")

#: file extension -> `datasets` builder
FILE_BUILDERS = {"txt": "text", "text": "text", "csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json"}

#: more lines than this with invalid UTF-8 bytes: the file is refused as not UTF-8 (fewer are repaired)
MAX_INVALID_UTF8_FRACTION = 0.01
#: the bound on a text's characters, per token of max_seq_length, and at least (see `max_text_chars`)
CHARS_PER_TOKEN = 100
MIN_TEXT_CHARS = 10_000

#: the counts of a `DataCleaning`, in report order: rows dropped, then texts repaired
DROP_COUNTS = ("blank_lines_dropped", "missing_value_rows_dropped")
REPAIR_COUNTS = ("invalid_utf8_lines_repaired", "nul_lines_repaired", "crlf_line_ends_normalised", "lines_truncated")
#: counts logged at INFO (harmless, expected in ordinary files); any other non-zero count is logged at WARNING
INFO_COUNTS = ("blank_lines_dropped", "crlf_line_ends_normalised", "no_gold_label_rows_dropped")
_PHRASES = {
    "blank_lines_dropped": "{n:,} blank line(s) dropped",
    "missing_value_rows_dropped": "{n:,} row(s) with a missing value dropped",
    "no_gold_label_rows_dropped": "{n:,} pair(s) without a gold label dropped",
    "invalid_utf8_lines_repaired": "{n:,} line(s) with invalid UTF-8 repaired (bad bytes -> U+FFFD)",
    "nul_lines_repaired": "{n:,} line(s) with NUL bytes repaired (NULs removed)",
    "crlf_line_ends_normalised": "{n:,} CRLF/CR line end(s) read as LF",
    "lines_truncated": "{n:,} text(s) longer than {bound:,} characters cut to that length",
}


def max_text_chars(max_seq_length: int) -> int:
    """The longest text (characters) kept whole: `CHARS_PER_TOKEN` per token of `max_seq_length`, at least
    `MIN_TEXT_CHARS`. A WordPiece token covers at most 100 characters (longer words become [UNK]), so the cut never
    changes the first `max_seq_length` tokens of ordinary text; it only bounds the tokeniser's work."""
    return max(MIN_TEXT_CHARS, CHARS_PER_TOKEN * max_seq_length)


@dataclass
class DataCleaning:
    """What loading the training data repaired and dropped; `as_dict()` is results.json's `train.data_cleaning`.

    `rows_read` counts the source's rows (a file's lines, below the header for a table); `rows_kept` = `rows_read`
    less the `*_dropped` counts. A line can count under several headings (a line of NULs alone is repaired, then
    dropped as blank). `first_line` gives the 1-based line of each non-zero count's first case, where known.
    """

    source: str  # for the log, e.g. "train_file 'train.txt'"
    file: str | None  # the file's name (a Hub address as given), never a local folder
    format: str  # text, csv, json, dataset, unlabeled_sts, senteval
    rows_read: int
    rows_kept: int
    counts: dict[str, int] = field(default_factory=dict)
    first_line: dict[str, int] = field(default_factory=dict)
    max_chars_per_text: int | None = None

    @classmethod
    def for_source(cls, source: str, format: str, rows_read: int, rows_kept: int, **extra: int) -> DataCleaning:
        """A source that is not a scanned file (a `datasets` id, the STS sentences): only dropped rows to count."""
        counts = {key: 0 for key in (*DROP_COUNTS, *REPAIR_COUNTS)}
        counts["missing_value_rows_dropped"] = rows_read - rows_kept - sum(extra.values())
        counts.update(extra)
        return cls(source, None, format, rows_read, rows_kept, counts)

    def drop(self, key: str, number: int, first_line: int | None = None) -> None:
        """Record `number` more rows dropped under `key` (e.g. NLI pairs without a gold label)."""
        self.counts[key] = self.counts.get(key, 0) + number
        self.rows_kept -= number
        if number and first_line is not None:
            self.first_line.setdefault(key, first_line)

    @property
    def changed(self) -> bool:
        return any(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "format": self.format,
            "rows_read": self.rows_read,
            "rows_kept": self.rows_kept,
            **self.counts,
            "max_chars_per_text": self.max_chars_per_text,
            "first_line": dict(self.first_line),
        }

    def summary(self) -> str:
        parts = []
        for key, number in self.counts.items():
            if number:
                where = f" (first: line {self.first_line[key]})" if key in self.first_line else ""
                parts.append(_PHRASES.get(key, key + ": {n}").format(n=number, bound=self.max_chars_per_text) + where)
        return f"{self.source}: {self.rows_read:,} rows read, {self.rows_kept:,} kept; " + "; ".join(parts) + "."

    def log(self) -> None:
        """One line on the `hf_sentcl` logger when anything was repaired or dropped (process 0 only): WARNING when
        text was changed or rows lost for a defect, INFO for blank lines, line ends and unlabelled NLI pairs."""
        if not self.changed or os.environ.get("RANK", "0") != "0":
            return
        serious = any(number for key, number in self.counts.items() if key not in INFO_COUNTS)
        logger.log(logging.WARNING if serious else logging.INFO, "%s", self.summary())


@dataclass(frozen=True)
class FileScan:
    """What one pass over a local training file found (`scan_data_file`). Rows are lines (below the header line for
    a csv/tsv); `problem` is the reason to refuse the file (`check_data_file`), None when it can be trained on."""

    path: Path
    label: str  # "train_file" or "NLI file", the start of every message
    format: str  # text, csv or json
    rows_read: int
    usable: int  # rows with some non-blank text: `count_train_examples`
    header: tuple[str, ...] = ()
    problem: str | None = None
    invalid_utf8: tuple[int, int] = (0, 0)  # (lines, first line)
    nul: tuple[int, int] = (0, 0)
    line_ends: tuple[int, int] = (0, 0)  # CRLF / lone CR line ends, first line
    #: row index -> blank? per column (csv) or for the one text column (txt); the rows with no text at all
    blank_cells: tuple[np.ndarray, ...] = ()
    blank_rows: np.ndarray | None = None
    #: (row index, column index, characters, non-blank) of every text longer than MIN_TEXT_CHARS
    long_texts: tuple[tuple[int, int, int, bool], ...] = ()

    @property
    def first_row_line(self) -> int:
        """The line of row 0 (rows are one line each in a file without `problem`)."""
        return 2 if self.format == "csv" else 1

    def cleaning(self, columns: tuple[str, ...] | None, max_chars: int) -> DataCleaning:
        """The account of loading this file's `columns` (None: a .txt's one column) with texts cut to `max_chars`."""
        counts = {key: 0 for key in (*DROP_COUNTS, *REPAIR_COUNTS)}
        first: dict[str, int] = {}
        for key, (number, line) in (("invalid_utf8_lines_repaired", self.invalid_utf8),
                                    ("nul_lines_repaired", self.nul),
                                    ("crlf_line_ends_normalised", self.line_ends)):
            counts[key] = number
            if number:
                first[key] = line
        kept = self.rows_read
        if self.format in ("text", "csv"):
            indices = [0] if columns is None else [self.header.index(c) for c in columns]
            blank_rows = self.blank_rows
            missing = np.zeros(self.rows_read, dtype=bool)
            for i in indices:
                missing |= self.blank_cells[i]
            missing &= ~blank_rows
            dropped = blank_rows | missing
            for key, rows in (("blank_lines_dropped", blank_rows), ("missing_value_rows_dropped", missing)):
                counts[key] = int(rows.sum())
                if counts[key]:
                    first[key] = int(np.argmax(rows)) + self.first_row_line
            truncated = sorted(row for row, column, chars, text in self.long_texts
                               if column in indices and chars > max_chars and text and not dropped[row])
            counts["lines_truncated"] = len(truncated)
            if truncated:
                first["lines_truncated"] = truncated[0] + self.first_row_line
            kept -= int(dropped.sum())
        name = self.path.name
        return DataCleaning(f"{self.label} '{name}'", name, self.format, self.rows_read, kept, counts, first,
                            max_chars if self.format in ("text", "csv") else None)


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
            return _TextScan().of(path, label)
        if builder == "csv":
            return _TableScan(delimiter=delimiter).of(path, label)
        return _JsonLinesScan().of(path, label)
    except _ReadWhole:  # a JSON list, or a CSV refused for its quotes: read whole, for the parser and the lines
        pass
    data = path.read_bytes()
    text, bad_bytes = _decode(data)
    ends = _LineEnds(data)
    invalid = (0, 0)
    if bad_bytes:
        lines_in_file = ends.lines
        bad_lines = np.unique(ends.line_of(bad_bytes))
        first = int(bad_lines[0]) + 1
        if builder == "json":
            raise _not_utf8(path, label, first, data[bad_bytes[0]])
        if len(bad_lines) > MAX_INVALID_UTF8_FRACTION * lines_in_file:
            raise _not_utf8(path, label, first, data[bad_bytes[0]], (len(bad_lines), lines_in_file))
        invalid = (len(bad_lines), first)
    if not text or text.isspace():
        raise _no_text(path, label, empty=not text)
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
    text = _lone_returns_as_newlines(text, ends)
    if builder == "csv":
        scan = _scan_table(path, label, text, delimiter, common)
    else:
        scan = _scan_json(path, label, text, **common)
    return _usable(scan)


def _usable(scan: FileScan) -> FileScan:
    if scan.usable == 0:
        what = {"text": "non-blank lines", "csv": "rows below its header"}.get(scan.format, "JSON records")
        raise ValueError(f"{scan.label} '{scan.path}' has no usable training examples (no {what}).")
    return scan


def _split_lines(text: str, ends: _LineEnds, nul_lines: np.ndarray) -> list[str]:
    """The lines of a .txt file as `datasets`' text builder reads them (split at LF, CRLF and lone CR only), NULs
    removed."""
    if ends.returns and ends.returns == ends.crlf == ends.newlines:  # a Windows file: every line ends with CRLF
        lines = text.split("\r\n")
    else:
        if ends.returns:
            text = text.replace("\r\n", "\n")
            if ends.returns > ends.crlf:
                text = text.replace("\r", "\n")
        lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for i in nul_lines:
        lines[i] = lines[i].replace("\x00", "")
    return lines


def _not_utf8(path: Path, label: str, line: int, byte: int, share: tuple[int, int] | None = None) -> ValueError:
    """The refusal of a file that is not UTF-8: `line` holds the first bad `byte`; `share`: (bad lines, lines) when
    the file is refused for too many of them (a file that can be repaired otherwise)."""
    why = "" if share is None else (
        f" ({share[0]:,} of {share[1]:,} lines have invalid bytes: more than {MAX_INVALID_UTF8_FRACTION:.0%}, so "
        "the file is in another encoding)")
    return ValueError(f"{label} '{path}' is not UTF-8 text: line {line} has the byte {byte:#04x}, which is not valid "
                      f"UTF-8{why}. Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`).")


def _no_text(path: Path, label: str, empty: bool) -> ValueError:
    state = "empty" if empty else "blank lines only"
    return ValueError(f"{label} '{path}' has no usable training text ({state}); give a file with one example per line.")


def _lone_returns_as_newlines(text: str, ends: _LineEnds) -> str:
    """`text` with its line ends as LF where it has lone CRs (`csv` reads CRLF itself, but a lone CR outside its
    count of lines; the JSON-lines count splits at LF)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if ends.returns > ends.crlf else text


def _line_count(text: str) -> int:
    """Physical lines of LF-ended `text`, a last line without its LF included."""
    return text.count("\n") + (not text.endswith("\n"))


def _header(rows: list[list[str]]) -> tuple[str, ...]:
    """A table's column names from its first row, an empty name read as pandas does (`Unnamed: i`)."""
    return tuple(name or f"Unnamed: {i}" for i, name in enumerate(rows[0])) if rows else ()


def _blocks_of_lines(path: Path) -> Iterator[bytes]:
    """The bytes of `path` in blocks of whole lines (`TEXT_BLOCK_BYTES`; a longer line comes whole), the last block
    with or without its line end. A block ends at a line end, which no multi-byte UTF-8 sequence contains, so each
    decodes as the whole file would."""
    with path.open("rb") as handle:
        carry = b""
        while True:
            block = handle.read(TEXT_BLOCK_BYTES)
            data = carry + block
            if not block:  # end of file: the last line, with or without its line end
                if data:
                    yield data
                return
            cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
            if cut == len(data) - 1 and data[cut] == 13:  # a CR that may start a CRLF split by the block end
                cut = max(data.rfind(b"\n", 0, cut), data.rfind(b"\r", 0, cut))
            if cut < 0:
                carry = data
                continue
            yield data[: cut + 1]
            carry = data[cut + 1 :]


#: bytes read per block by the scans of .txt, .csv/.tsv and .jsonl files (see `_blocks_of_lines`)
TEXT_BLOCK_BYTES = 8 * 2**20


class _ReadWhole(Exception):
    """Raised by a block scan for a file it leaves to the whole-file scan (`_scan`)."""


@dataclass
class _BlockScan(ABC):
    """The running totals of a scan over blocks of whole lines (`_blocks_of_lines`): a million-line corpus is never
    held whole, so the scan's memory does not grow with the file beyond a few flags per line. Subclasses read each
    block's text (`add`) and build the `FileScan` (`result`)."""

    lines: int = 0
    has_text: bool = False
    bad_lines: list[np.ndarray] = field(default_factory=list)
    first_bad: tuple[int, int] | None = None  # (1-based line, the byte)
    nul_lines: int = 0
    first_nul: int = 0
    returns: int = 0
    first_return: int = 0

    def of(self, path: Path, label: str) -> FileScan:
        """Scan every block of `path`, then check and build the result (ValueError as `_scan` words it)."""
        for data in _blocks_of_lines(path):
            self.add(data, path, label)
        return _usable(self.result(path, label, self._checked_encoding(path, label)))

    @abstractmethod
    def add(self, data: bytes, path: Path, label: str) -> None:
        """Scan one block of whole lines (the last may lack its line end)."""

    @abstractmethod
    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        """The `FileScan` of the whole file; `common`: the repaired defects (`_checked_encoding`)."""

    def _text(self, data: bytes) -> tuple[str, _LineEnds, np.ndarray]:
        """One block's text (bad sequences replaced), its line ends and the 0-based lines in it with NULs, counted
        into the totals; `lines` is the caller's to advance."""
        text, bad_bytes = _decode(data)
        ends = _LineEnds(data)
        if bad_bytes:
            bad = np.unique(ends.line_of(bad_bytes))
            self.bad_lines.append(bad + self.lines)
            if self.first_bad is None:
                self.first_bad = (self.lines + int(bad[0]) + 1, data[bad_bytes[0]])
        self.has_text = self.has_text or (bool(text) and not text.isspace())
        nul_lines = np.zeros(0, dtype=np.int64)
        if "\x00" in text:
            nul_lines = np.unique(ends.line_of(np.flatnonzero(np.frombuffer(data, np.uint8) == 0)))
            if not self.nul_lines:
                self.first_nul = self.lines + int(nul_lines[0]) + 1
            self.nul_lines += len(nul_lines)
        if ends.returns:
            if not self.returns:
                self.first_return = self.lines + ends.line_at(data.index(b"\r"))
            self.returns += ends.returns
        return text, ends, nul_lines

    def _checked_encoding(self, path: Path, label: str) -> dict[str, tuple[int, int]]:
        """The repaired defects' (lines, first line), or ValueError when the file is not UTF-8 or holds no text."""
        invalid = (0, 0)
        if self.first_bad is not None:
            bad = sum(map(len, self.bad_lines))
            line, byte = self.first_bad
            if bad > MAX_INVALID_UTF8_FRACTION * self.lines:
                raise _not_utf8(path, label, line, byte, (bad, self.lines))
            invalid = (bad, line)
        if not self.has_text:
            raise _no_text(path, label, empty=not self.lines)
        return {"invalid_utf8": invalid, "nul": (self.nul_lines, self.first_nul),
                "line_ends": (self.returns, self.first_return)}


@dataclass
class _TextScan(_BlockScan):
    """A .txt file, one example per line."""

    blanks: list[np.ndarray] = field(default_factory=list)
    long_texts: list[tuple[int, int, int, bool]] = field(default_factory=list)

    def add(self, data: bytes, path: Path, label: str) -> None:
        text, ends, nul_lines = self._text(data)
        lines = _split_lines(text, ends, nul_lines)
        self.blanks.append(_blanks(lines))
        self.long_texts += [(row + self.lines, *rest) for row, *rest in _long_texts(lines, 0)]
        self.lines += len(lines)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        blank = np.concatenate(self.blanks)
        return FileScan(path, label, "text", self.lines, self.lines - int(blank.sum()), ("text",), **common,
                        blank_cells=(blank,), blank_rows=blank, long_texts=tuple(self.long_texts))


@dataclass
class _TableScan(_BlockScan):
    """A .csv/.tsv file, parsed as `csv` (and pandas) do, each block of lines on its own: a training CSV holds one
    row per line, so a well-formed file parses block by block as it does whole. A block whose rows are not its
    lines (a quote left open, text after a closing quote) leaves the file to the whole-file scan, which refuses it
    naming the lines."""

    delimiter: str = ","
    header: tuple[str, ...] | None = None
    fields: list[np.ndarray] = field(default_factory=list)
    columns: list[list[np.ndarray]] = field(default_factory=list)  # per column, per block: blank?
    long_texts: list[tuple[int, int, int, bool]] = field(default_factory=list)
    rows: int = 0  # below the header

    def add(self, data: bytes, path: Path, label: str) -> None:
        text, ends, _ = self._text(data)
        text = _lone_returns_as_newlines(text, ends)
        if self.header is None:
            text = text.removeprefix("\ufeff")  # a byte-order mark (Excel's "UTF-8 CSV"), which pandas skips too
        lines = _line_count(text)
        try:
            rows = _strict_rows(text, self.delimiter)
        except csv.Error:
            raise _ReadWhole from None
        if len(rows) != lines:
            raise _ReadWhole
        self.lines += lines
        if self.header is None:
            self.header = _header(rows)
            self.columns = [[] for _ in self.header]
            rows = rows[1:]
        fields, columns, long_texts = _table_cells(rows, len(self.header), "\x00" in text)
        for blanks, column in zip(self.columns, columns):
            blanks.append(column)
        self.long_texts += [(row + self.rows, *rest) for row, *rest in long_texts]
        self.fields.append(fields)
        self.rows += len(rows)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        fields = np.concatenate(self.fields) if self.fields else np.zeros(0, dtype=np.int64)
        columns = [np.concatenate(blanks) for blanks in self.columns]
        return _table_scan(path, label, self.header or (), fields, columns, self.long_texts, None, self.delimiter,
                           common)


@dataclass
class _JsonLinesScan(_BlockScan):
    """A .jsonl file (or a .json file of JSON lines): its non-blank lines counted (its reader, pyarrow's, refuses
    what it cannot parse). A JSON list is left to the whole-file scan: its parser needs it whole."""

    records: int = 0
    started: bool = False  # past the file's first non-blank character

    def add(self, data: bytes, path: Path, label: str) -> None:
        text, ends, _ = self._text(data)
        if self.first_bad is not None:  # pyarrow cannot repair: refused at the first bad byte
            raise _not_utf8(path, label, *self.first_bad)
        text = _lone_returns_as_newlines(text.replace("\x00", ""), ends)
        if not self.started and text.strip():
            self.started = True
            if text.lstrip().startswith("["):
                raise _ReadWhole
        self.records += sum(map(bool, map(str.strip, text.split("\n"))))
        self.lines += _line_count(text)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        return FileScan(path, label, "json", self.records, self.records, **common)


def _scan_table(path: Path, label: str, text: str, delimiter: str, common: dict[str, tuple[int, int]]) -> FileScan:
    """A .csv/.tsv file, parsed as `csv` (and pandas) do, with every row checked against the header line."""
    text = text.removeprefix("\ufeff")  # a byte-order mark (Excel's "UTF-8 CSV"), which pandas skips too
    lines = _line_count(text)
    with _no_field_size_limit():
        try:
            rows = _strict_rows(text, delimiter)
            problem = None if len(rows) == lines else _quote_problem(path, label, text, delimiter)
        except csv.Error:
            rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
            problem = _quote_problem(path, label, text, delimiter)
    header = _header(rows)
    fields, columns, long_texts = _table_cells(rows[1:], len(header), bool(common["nul"][0]))
    return _table_scan(path, label, header, fields, columns, long_texts, problem, delimiter, common)


def _strict_rows(text: str, delimiter: str) -> list[list[str]]:
    """The rows of CSV `text` as `csv` parses them, any field size allowed; csv.Error on a malformed quote."""
    with _no_field_size_limit():
        return list(csv.reader(io.StringIO(text), delimiter=delimiter, strict=True))


def _table_cells(rows: list[list[str]], width: int, nul: bool) -> tuple[np.ndarray, list[np.ndarray], list]:
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
        columns.append(_blanks(values))
        long_texts += _long_texts(values, i)
    return fields, columns, long_texts


def _table_scan(path: Path, label: str, header: tuple[str, ...], fields: np.ndarray, columns: list[np.ndarray],
                long_texts: list, problem: str | None, delimiter: str, common: dict[str, tuple[int, int]]) -> FileScan:
    """The `FileScan` of a .csv/.tsv file from its rows' cells (`_table_cells`), refused for `problem` (a quote's),
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


def _scan_json(path: Path, label: str, text: str, **common) -> FileScan:
    """A .json list, counted (a file of JSON lines is `_JsonLinesScan`'s)."""
    try:
        count = len(json.loads(text))
    except json.JSONDecodeError as err:
        raise ValueError(f"{label} '{path}': not valid JSON (line {err.lineno}: {err.msg}).") from None
    return FileScan(path, label, "json", count, count, **common)


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


def _blanks(values: list[str]) -> np.ndarray:
    """Per value: nothing but whitespace?"""
    return ~np.fromiter(map(bool, map(str.strip, values)), dtype=bool, count=len(values))


def _long_texts(values: list[str], column: int) -> list[tuple[int, int, int, bool]]:
    """(index, column, length, non-blank) of each value longer than MIN_TEXT_CHARS."""
    if not values or max(map(len, values)) <= MIN_TEXT_CHARS:
        return []
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    return [(int(i), column, int(lengths[i]), bool(values[i].strip()))
            for i in np.flatnonzero(lengths > MIN_TEXT_CHARS)]


class _LineEnds:
    """Where the lines of `data` end (LF, CRLF or a lone CR), found once and only when a line number is needed."""

    def __init__(self, data: bytes):
        self.data = data
        self.returns = data.count(b"\r") if b"\r" in data else 0
        self.crlf = data.count(b"\r\n") if self.returns else 0

    @functools.cached_property
    def newlines(self) -> int:
        return self.data.count(b"\n")

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        array = np.frombuffer(self.data, dtype=np.uint8)
        offsets = np.flatnonzero(array == 10)
        if self.returns > self.crlf:  # lone CRs end lines too
            cr = np.flatnonzero(array == 13)
            lone = cr[(cr + 1 == len(array)) | (array[np.minimum(cr + 1, len(array) - 1)] != 10)]
            offsets = np.sort(np.concatenate([offsets, lone]))
        return offsets

    @property
    def lines(self) -> int:
        """Physical lines: line ends plus a last line without one."""
        ends = self.offsets
        return len(ends) + bool(self.data and (not len(ends) or ends[-1] != len(self.data) - 1))

    def line_at(self, position: int) -> int:
        """The 1-based line of one byte offset (counted directly: cheap for an offset near the start)."""
        head = self.data[:position]
        return head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1

    def line_of(self, positions) -> np.ndarray:
        """The 0-based line of each byte offset in `positions`."""
        return np.searchsorted(self.offsets, np.asarray(positions, dtype=np.int64), side="left")


_decoding = threading.local()


def _note_invalid(err: UnicodeDecodeError) -> tuple[str, int]:
    """Codec error handler: `errors="replace"` (one U+FFFD per bad sequence) that also notes where each one is."""
    _decoding.positions.append(err.start)
    return "\ufffd", err.end


codecs.register_error("hf_sentcl.note_invalid", _note_invalid)


def _decode(data: bytes) -> tuple[str, list[int]]:
    """The text (bad sequences replaced as `errors="replace"` does) and the byte offset of each bad sequence."""
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError:
        pass
    _decoding.positions = positions = []
    try:
        return data.decode("utf-8", "hf_sentcl.note_invalid"), positions
    finally:
        del _decoding.positions


@contextmanager
def _no_field_size_limit():
    """`csv` refuses fields over 131,072 characters by default; overlong texts are cut when loaded, not refused."""
    previous = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(previous)
