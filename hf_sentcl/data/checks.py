"""Checks of a local training file's content, before any model loads: a supported extension, UTF-8 text, and at
least one usable example. `count_train_examples` also returns how many there are, so a recipe can compare them
with its batch (`hf_sentcl.recipe.checks.validate_recipe`).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from pathlib import Path

#: file extension -> `datasets` builder
FILE_BUILDERS = {"txt": "text", "text": "text", "csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json"}


def count_train_examples(path: Path) -> int:
    """Return the number of usable examples in the local training file `path` (.txt: non-blank lines; .csv/.tsv:
    non-blank rows below the header; .jsonl/.json: JSON lines, or the items of one JSON list).

    Raises ValueError naming the file (and line) when the extension is unsupported, the bytes are not UTF-8, or
    there is no usable example. The result is cached per file version, so checking twice reads the file once.
    """
    stat = path.stat()
    return _count(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _count(path_text: str, mtime_ns: int, size: int) -> int:
    path = Path(path_text)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FILE_BUILDERS:
        raise ValueError(
            f"train_file '{path}': unsupported extension '{path.suffix or '(none)'}'; use one of "
            f"{', '.join('.' + s for s in FILE_BUILDERS)}."
        )
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"train_file '{path}' is not UTF-8 text: line {line} has the byte {data[err.start]:#04x}, which is not "
            "valid UTF-8. Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
        ) from None
    if not text.strip():
        state = "empty" if not text else "blank lines only"
        raise ValueError(
            f"train_file '{path}' has no usable training text ({state}); give a file with one example per line."
        )
    builder = FILE_BUILDERS[suffix]
    if builder == "csv":
        rows = list(csv.reader(io.StringIO(text), delimiter="\t" if suffix == "tsv" else ","))
        count = sum(1 for row in rows[1:] if any(cell.strip() for cell in row))
        what = "rows below its header"
    elif builder == "json" and text.lstrip().startswith("["):
        try:
            count = len(json.loads(text))
        except json.JSONDecodeError as err:
            raise ValueError(f"train_file '{path}': not valid JSON (line {err.lineno}: {err.msg}).") from None
        what = "items in its JSON list"
    else:
        count = sum(1 for line in text.splitlines() if line.strip())
        what = "non-blank lines"
    if count == 0:
        raise ValueError(f"train_file '{path}' has no usable training examples (no {what}).")
    return count
