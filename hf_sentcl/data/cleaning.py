"""What one pass over a local training file found (`FileScan`) and the account of what loading it repairs and
drops (`DataCleaning`, reported in results.json under `train.data_cleaning` and logged once).

The policy per defect, and why, is in `hf_sentcl.data.checks`; the scan that fills a `FileScan` is
`hf_sentcl.data.block_scan` (blocks of whole lines) or `hf_sentcl.data.checks` (the whole-file fallback). Kept apart
from both so that the account, which the NLI reader and the corpus loader build for sources that are not scanned
files too, does not depend on how a file is read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("hf_sentcl")

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


def require_examples(scan: FileScan) -> FileScan:
    """`scan`, or ValueError naming the file when it holds no usable training example."""
    if scan.usable == 0:
        what = {"text": "non-blank lines", "csv": "rows below its header"}.get(scan.format, "JSON records")
        raise ValueError(f"{scan.label} '{scan.path}' has no usable training examples (no {what}).")
    return scan
