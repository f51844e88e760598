"""The training sources a recipe names: `train_file` and `dataset_name` each take one source (a string, as always) or
a list of them, and `unlabeled_sts` one set of STS sentences. Read from the recipe's values alone (no file or Hub
access), so a malformed entry is refused while the recipe is parsed, naming the key, the entry and the fix.

A list entry is a string (a local path or an `hf://datasets/...` file under `train_file`, a `datasets` id under
`dataset_name`) or a mapping: `{path: ..., columns: {...}}` for a file, `{name: ORG/NAME, config: ..., split: ...,
columns: {...}}` for a Hub dataset. `columns` maps the method's column to the dataset's own
(`{sent0: premise, sent1: hypothesis}`; one dataset column may feed two method columns: `{sent0: text, sent1: text}`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

#: how a run with several training sources draws its batches (sentence-transformers' `MultiDatasetBatchSamplers`)
MIXING_POLICIES = ("proportional", "round_robin")

#: the keys of a list entry, per recipe key
ENTRY_KEYS = {"train_file": ("path", "columns"), "dataset_name": ("name", "config", "split", "columns")}
#: the key of an entry mapping that names the file or dataset
LOCATION_KEY = {"train_file": "path", "dataset_name": "name"}


@dataclass(frozen=True)
class TrainingSource:
    """One dataset a run trains on: where it is read from, its short stable name (the `loss_<name>` it logs) and the
    method columns it renames."""

    key: str  #: the recipe key that names it: train_file, dataset_name or unlabeled_sts
    location: str  #: the file (local path or hf:// file), the `datasets` id, or the unlabeled_sts choice
    name: str = ""
    config: str | None = None  #: dataset_name: its configuration
    split: str = "train"  #: dataset_name: its split
    #: method column -> the dataset's column, as the recipe maps them (sorted pairs: frozen and hashable)
    columns: tuple[tuple[str, str], ...] = ()
    #: the entry's position in the recipe's list (0-based), None for a single string
    index: int | None = None

    @property
    def column_map(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def entry(self) -> str:
        """How errors name it: `train_file entry 1 ('b.csv')`, or `train_file 'b.csv'` for a single value."""
        where = f"{self.key} entry {self.index}" if self.index is not None else self.key
        return f"{where} ('{self.location}')"


def _entries(key: str, value: Any) -> list[tuple[int | None, Any]]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"key '{key}' is an empty list; name at least one file or dataset, or remove the key.")
        return list(enumerate(value))
    return [(None, value)]


def _parse_entry(key: str, index: int | None, entry: Any, defaults: dict[str, Any]) -> TrainingSource:
    """One entry of `key`'s list as a `TrainingSource` (name left empty); ValueError naming the entry and the fix."""
    where = f"key '{key}'" + (f" entry {index} ({entry!r})" if index is not None else "")
    allowed, location_key = ENTRY_KEYS[key], LOCATION_KEY[key]
    if isinstance(entry, str):
        entry = {location_key: entry}
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: an entry is a string or a mapping with the keys {', '.join(allowed)}; got "
                         f"{type(entry).__name__}.")
    if unknown := [k for k in entry if k not in allowed]:
        raise ValueError(f"{where}: unknown entry key(s) {', '.join(map(repr, unknown))}; an entry of '{key}' takes "
                         f"{', '.join(allowed)}.")
    location = entry.get(location_key)
    if not isinstance(location, str) or not location.strip():
        raise ValueError(f"{where}: '{location_key}' must name the {'file' if key == 'train_file' else 'dataset id'}.")
    columns = entry.get("columns") or {}
    if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
        raise ValueError(f"{where}: 'columns' maps the method's column to the dataset's, e.g. "
                         f"{{sent0: premise, sent1: hypothesis}}; got {columns!r}.")
    for name in ("config", "split"):
        if name in entry and not isinstance(entry[name], str):
            raise ValueError(f"{where}: '{name}' must be a string, got {entry[name]!r}.")
    return TrainingSource(key, location, config=entry.get("config", defaults.get("config")),
                          split=entry.get("split", defaults.get("split", "train")),
                          columns=tuple(sorted(columns.items())), index=index)


def short_name(source: TrainingSource) -> str:
    """A file's stem or a Hub id's last part (with its config), reduced to letters, digits, '_', '-' and '.'."""
    if source.key == "dataset_name":
        base = source.location.rstrip("/").split("/")[-1] + (f"_{source.config}" if source.config else "")
    elif source.key == "train_file":
        base = PurePosixPath(source.location.split("@")[-1] if "://" in source.location else source.location).stem
    else:
        base = f"unlabeled_sts_{source.location}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_") or "dataset"


def with_names(sources: list[TrainingSource]) -> tuple[TrainingSource, ...]:
    """`sources` with their short names, de-duplicated in order (`wiki`, `wiki_2`, ...)."""
    named, seen = [], set()
    for source in sources:
        base = name = short_name(source)
        number = 1
        while name in seen:
            number += 1
            name = f"{base}_{number}"
        seen.add(name)
        named.append(TrainingSource(source.key, source.location, name, source.config, source.split, source.columns,
                                    source.index))
    return tuple(named)


def listed_sources(train_file: Any, dataset_name: Any, unlabeled_sts: str | None,
                   dataset_config_name: str | None = None, dataset_split: str = "train") -> tuple[TrainingSource, ...]:
    """Every training source the values name, in recipe order (train_file's, then dataset_name's), each named
    (`with_names`); ValueError for a malformed entry or for unlabeled_sts beside a list. How many a run may have is
    `the_training_sources`' rule, not this one's."""
    defaults = {"config": dataset_config_name, "split": dataset_split}
    sources = [_parse_entry(key, index, entry, defaults)
               for key, value in (("train_file", train_file), ("dataset_name", dataset_name))
               for index, entry in _entries(key, value)]
    if unlabeled_sts is not None:
        if isinstance(train_file, list) or isinstance(dataset_name, list):
            raise ValueError("key 'unlabeled_sts' cannot be mixed with a list of datasets (train_file or "
                             "dataset_name); train on the STS sentences alone, or list files and datasets only.")
        sources.append(TrainingSource("unlabeled_sts", unlabeled_sts))
    return with_names(sources)


def the_training_sources(data: Any) -> tuple[TrainingSource, ...]:
    """The training sources of the data arguments `data`: one of train_file / dataset_name / unlabeled_sts as a single
    value, or the entries of train_file's and dataset_name's lists (several datasets in one run); ValueError when
    none or several single values are set."""
    sources = listed_sources(data.train_file, data.dataset_name, data.unlabeled_sts, data.dataset_config_name,
                             data.dataset_split)
    keys = [k for k in ("train_file", "dataset_name", "unlabeled_sts") if getattr(data, k) is not None]
    listed = isinstance(data.train_file, list) or isinstance(data.dataset_name, list)
    if len(keys) != 1 and not listed:
        raise ValueError(
            f"set exactly one of 'train_file', 'dataset_name', 'unlabeled_sts' (the training text), or list several "
            f"datasets under train_file / dataset_name; got {keys or 'none'}."
        )
    return sources
