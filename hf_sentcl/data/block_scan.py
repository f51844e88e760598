"""The scans of .txt, .csv/.tsv and .jsonl training files in blocks of whole lines (`TEXT_BLOCK_BYTES`): a
million-line corpus is never held whole, nor its rows kept as Python objects, so the scan's memory does not grow
with the file beyond a few flags per line.

Each block decodes as the whole file would (a block ends at a line end, which no multi-byte UTF-8 sequence
contains), and a training CSV holds one row per line, so a well-formed file scans block by block as it does whole.
What a block scan cannot read so (a JSON list, a CSV whose rows are not its lines) raises `ReadWhole`, and
`hf_sentcl.data.checks` reads that file whole, to refuse it naming the line.
"""

from __future__ import annotations

import csv
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hf_sentcl.data.cleaning import FileScan, require_examples
from hf_sentcl.data.csv_rows import header_names, strict_rows, table_cells, table_scan
from hf_sentcl.data.text_lines import (
    MAX_INVALID_UTF8_FRACTION,
    LineEnds,
    blank_flags,
    decode_utf8,
    line_count,
    lone_returns_as_newlines,
    no_text,
    not_utf8,
    overlong_texts,
    split_lines,
)

#: bytes read per block by the scans of .txt, .csv/.tsv and .jsonl files (see `blocks_of_lines`)
TEXT_BLOCK_BYTES = 8 * 2**20


def blocks_of_lines(path: Path) -> Iterator[bytes]:
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


class ReadWhole(Exception):
    """Raised by a block scan for a file it leaves to the whole-file scan (`hf_sentcl.data.checks`)."""


@dataclass
class BlockScan(ABC):
    """The running totals of a scan over blocks of whole lines (`blocks_of_lines`): a million-line corpus is never
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
        """Scan every block of `path`, then check and build the result (ValueError as the whole-file scan words it)."""
        for data in blocks_of_lines(path):
            self.add(data, path, label)
        return require_examples(self.result(path, label, self._checked_encoding(path, label)))

    @abstractmethod
    def add(self, data: bytes, path: Path, label: str) -> None:
        """Scan one block of whole lines (the last may lack its line end)."""

    @abstractmethod
    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        """The `FileScan` of the whole file; `common`: the repaired defects (`_checked_encoding`)."""

    def _text(self, data: bytes) -> tuple[str, LineEnds, np.ndarray]:
        """One block's text (bad sequences replaced), its line ends and the 0-based lines in it with NULs, counted
        into the totals; `lines` is the caller's to advance."""
        text, bad_bytes = decode_utf8(data)
        ends = LineEnds(data)
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
                raise not_utf8(path, label, line, byte, (bad, self.lines))
            invalid = (bad, line)
        if not self.has_text:
            raise no_text(path, label, empty=not self.lines)
        return {"invalid_utf8": invalid, "nul": (self.nul_lines, self.first_nul),
                "line_ends": (self.returns, self.first_return)}


@dataclass
class TextScan(BlockScan):
    """A .txt file, one example per line."""

    blanks: list[np.ndarray] = field(default_factory=list)
    long_texts: list[tuple[int, int, int, bool]] = field(default_factory=list)

    def add(self, data: bytes, path: Path, label: str) -> None:
        text, ends, nul_lines = self._text(data)
        lines = split_lines(text, ends, nul_lines)
        self.blanks.append(blank_flags(lines))
        self.long_texts += [(row + self.lines, *rest) for row, *rest in overlong_texts(lines, 0)]
        self.lines += len(lines)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        blank = np.concatenate(self.blanks)
        return FileScan(path, label, "text", self.lines, self.lines - int(blank.sum()), ("text",), **common,
                        blank_cells=(blank,), blank_rows=blank, long_texts=tuple(self.long_texts))


@dataclass
class TableScan(BlockScan):
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
        text = lone_returns_as_newlines(text, ends)
        if self.header is None:
            text = text.removeprefix("\ufeff")  # a byte-order mark (Excel's "UTF-8 CSV"), which pandas skips too
        lines = line_count(text)
        try:
            rows = strict_rows(text, self.delimiter)
        except csv.Error:
            raise ReadWhole from None
        if len(rows) != lines:
            raise ReadWhole
        self.lines += lines
        if self.header is None:
            self.header = header_names(rows)
            self.columns = [[] for _ in self.header]
            rows = rows[1:]
        fields, columns, long_texts = table_cells(rows, len(self.header), "\x00" in text)
        for blanks, column in zip(self.columns, columns):
            blanks.append(column)
        self.long_texts += [(row + self.rows, *rest) for row, *rest in long_texts]
        self.fields.append(fields)
        self.rows += len(rows)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        fields = np.concatenate(self.fields) if self.fields else np.zeros(0, dtype=np.int64)
        columns = [np.concatenate(blanks) for blanks in self.columns]
        return table_scan(path, label, self.header or (), fields, columns, self.long_texts, None, self.delimiter,
                           common)


@dataclass
class JsonLinesScan(BlockScan):
    """A .jsonl file (or a .json file of JSON lines): its non-blank lines counted (its reader, pyarrow's, refuses
    what it cannot parse). A JSON list is left to the whole-file scan: its parser needs it whole."""

    records: int = 0
    started: bool = False  # past the file's first non-blank character

    def add(self, data: bytes, path: Path, label: str) -> None:
        text, ends, _ = self._text(data)
        if self.first_bad is not None:  # pyarrow cannot repair: refused at the first bad byte
            raise not_utf8(path, label, *self.first_bad)
        text = lone_returns_as_newlines(text.replace("\x00", ""), ends)
        if not self.started and text.strip():
            self.started = True
            if text.lstrip().startswith("["):
                raise ReadWhole
        self.records += sum(map(bool, map(str.strip, text.split("\n"))))
        self.lines += line_count(text)

    def result(self, path: Path, label: str, common: dict[str, tuple[int, int]]) -> FileScan:
        return FileScan(path, label, "json", self.records, self.records, **common)
