"""A training file's bytes as text and lines: UTF-8 decoding that notes where each bad sequence is, where lines end
(LF, CRLF or a lone CR, as Python's `open`, `datasets` and `pandas` read them), a .txt file's lines, blank and
overlong texts, and the refusals of a file that is not UTF-8 or holds no text.

The block scans (`hf_sentcl.data.block_scan`) and the whole-file scan (`hf_sentcl.data.checks`) both read a file
through these, so a block and the whole file count the same lines, bytes and texts.
"""

from __future__ import annotations

import codecs
import functools
import threading
from pathlib import Path

import numpy as np

from hf_sentcl.data.cleaning import MIN_TEXT_CHARS

#: more lines than this with invalid UTF-8 bytes: the file is refused as not UTF-8 (fewer are repaired)
MAX_INVALID_UTF8_FRACTION = 0.01


class LineEnds:
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


def decode_utf8(data: bytes) -> tuple[str, list[int]]:
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


def split_lines(text: str, ends: LineEnds, nul_lines: np.ndarray) -> list[str]:
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


def lone_returns_as_newlines(text: str, ends: LineEnds) -> str:
    """`text` with its line ends as LF where it has lone CRs (`csv` reads CRLF itself, but a lone CR outside its
    count of lines; the JSON-lines count splits at LF)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if ends.returns > ends.crlf else text


def line_count(text: str) -> int:
    """Physical lines of LF-ended `text`, a last line without its LF included."""
    return text.count("\n") + (not text.endswith("\n"))


def blank_flags(values: list[str]) -> np.ndarray:
    """Per value: nothing but whitespace?"""
    return ~np.fromiter(map(bool, map(str.strip, values)), dtype=bool, count=len(values))


def overlong_texts(values: list[str], column: int) -> list[tuple[int, int, int, bool]]:
    """(index, column, length, non-blank) of each value longer than MIN_TEXT_CHARS."""
    if not values or max(map(len, values)) <= MIN_TEXT_CHARS:
        return []
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    return [(int(i), column, int(lengths[i]), bool(values[i].strip()))
            for i in np.flatnonzero(lengths > MIN_TEXT_CHARS)]


def not_utf8(path: Path, label: str, line: int, byte: int, share: tuple[int, int] | None = None) -> ValueError:
    """The refusal of a file that is not UTF-8: `line` holds the first bad `byte`; `share`: (bad lines, lines) when
    the file is refused for too many of them (a file that can be repaired otherwise)."""
    why = "" if share is None else (
        f" ({share[0]:,} of {share[1]:,} lines have invalid bytes: more than {MAX_INVALID_UTF8_FRACTION:.0%}, so "
        "the file is in another encoding)")
    return ValueError(f"{label} '{path}' is not UTF-8 text: line {line} has the byte {byte:#04x}, which is not valid "
                      f"UTF-8{why}. Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`).")


def no_text(path: Path, label: str, empty: bool) -> ValueError:
    state = "empty" if empty else "blank lines only"
    return ValueError(f"{label} '{path}' has no usable training text ({state}); give a file with one example per line.")
