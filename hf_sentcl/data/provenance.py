"""Where a training file's text came from, in a small JSON file beside it (`<file>.provenance.json`).

A local CSV says nothing about its origin, yet a leaderboard must know when a model was trained on a benchmark's
own data: triplets mined from STS-B's train pairs make STS-B not zero-shot. `hf-sentcl mine` writes the sidecar;
a run on the file copies its `mteb_datasets` into results.json's `training_data`, which the export turns into
`model_meta.py`'s `training_datasets`. Anyone who builds a training file by other means can write the same sidecar.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_sentcl.evaluation.report import read_json, write_json

#: the key that declares the MTEB datasets (task names -> splits) a training file was built from
MTEB_DATASETS_KEY = "mteb_datasets"
PROVENANCE_SUFFIX = ".provenance.json"

#: SentEval's STS-B split names -> MTEB's STSBenchmark split names
STSB_MTEB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def provenance_path(train_file: str | os.PathLike) -> Path:
    """The sidecar of `train_file`: the same path with `.provenance.json` appended."""
    path = Path(os.path.expandvars(str(train_file))).expanduser()
    return path.with_name(path.name + PROVENANCE_SUFFIX)


def write_provenance(
    train_file: str | os.PathLike, mteb_datasets: Mapping[str, Sequence[str]], **details: Any
) -> Path:
    """Write the sidecar of `train_file`: the MTEB datasets it was built from and free-form `details` (the tool, its
    inputs). Returns the sidecar's path."""
    record = {MTEB_DATASETS_KEY: {task: list(splits) for task, splits in mteb_datasets.items()}, **details}
    return write_json(provenance_path(train_file), record)


def read_provenance(train_file: str | os.PathLike) -> dict[str, Any]:
    """The sidecar of `train_file` as a dict, or {} when there is none. A sidecar that is not JSON raises ValueError,
    one that is not a JSON object TypeError, naming it (it would otherwise silently drop a declaration)."""
    path = provenance_path(train_file)
    if not path.is_file():
        return {}
    try:
        record = read_json(path)
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); fix or delete this provenance file.") from err
    if not isinstance(record, dict):
        raise TypeError(f"{path}: expected a JSON object with '{MTEB_DATASETS_KEY}', found {type(record).__name__}.")
    return record
