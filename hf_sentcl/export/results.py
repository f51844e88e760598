"""The results a model card is written from: a run's results.json or `hf-sentcl evaluate --output`, read, checked
and brought to one shape (`load_results`), and what they say about the model's Hub id and training data."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub.utils import HFValidationError, validate_repo_id

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.data.provenance import MTEB_DATASETS_KEY
from hf_sentcl.evaluation.mteb import MTEB_STS_DATASETS
from hf_sentcl.evaluation.report import (
    RUN_LABELS,
    read_json,
)
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS
from hf_sentcl.export.plan import ExportError

#: the label of the one row of results from `hf-sentcl evaluate`
EVALUATED = "evaluated"


ROW_LABELS = {**RUN_LABELS, EVALUATED: "this model"}


#: results.json keys the card reads (the rest, e.g. loss curves, stays out of the export)
CARD_KEYS = (
    "source", "method", "model_name_or_path", "pooling", "sts_mode", "sick_split", "sts", "transfer", "mteb_sts",
    "mteb_sts_seconds", "train", "recipe_settings", "training_data", "precision", "versions", "parallelism",
    "sts_by_dim", "hyperparameters", "mteb_evaluated",
)


#: the keys of results.json's `parallelism` (`effective_parallelism`) the card states, with their types
PARALLELISM_KEYS = {
    "processes": int, "strategy": str, "device": str, "precision": str, "per_device_train_batch_size": int,
    "global_train_batch_size": int,
}


#: the Hub dataset of an `hf://datasets/ORG/NAME[@REVISION]/PATH` address, wherever it appears in a description
HUB_DATASET_URI = re.compile(r"hf://datasets/([\w.-]+/[\w.-]+?)(?:@[^/\s']*)?/")


# the MTEB tasks' Hub datasets -> their task names (a `dataset_name` that is one of them trains on that task's data)
MTEB_TASK_BY_DATASET = {dataset: task for dataset, task, _revision in MTEB_STS_DATASETS.values()}

#: results.json's `training_data.source` of a ConSERT sup / joint stage (`hf_sentcl.data.nli.NLITrainData`)
NLI_SOURCE_KEY = "nli_source"


#: the plan and results a card was rendered from, beside README.md; it names local paths, so a push leaves it out
#: (`hf_sentcl.hub.upload.LOCAL_ONLY_FILES`)
CARD_INPUTS = "hf_sentcl_card.json"


# unlabeled_sts setting -> the STS tasks whose texts were trained on ("all-scored": the scored pairs only)
UNLABELED_STS_TASKS = {
    "stsb": ["STSBenchmark"], "all": list(MTEB_STS_DATASETS), "all-scored": list(MTEB_STS_DATASETS),
}


# ------------------------------------------------------------------------------------------------ results files
def _check_scores(path: Path, where: str, scores: Any, known: Sequence[str]) -> dict[str, float]:
    """`scores` as {task: finite number}, with at least one task of `known`; ValueError naming the file if not."""
    if not isinstance(scores, Mapping) or not any(t in scores for t in known):
        raise ValueError(f"Results file '{path}': {where} holds none of the tasks {', '.join(known)}.")
    bad = {k: v for k, v in scores.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    if bad:
        raise ValueError(f"Results file '{path}': {where} has scores that are not finite numbers: {bad}.")
    return {k: float(v) for k, v in scores.items()}


def _from_evaluate(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The output of `hf-sentcl evaluate --output` in the shape of a run's results (one row)."""
    results: dict[str, Any] = {
        "source": "evaluate",
        "model_name_or_path": raw["model"],
        "pooling": raw.get("pooling"),
        "pooling_layer": raw.get("pooling_layer"),
        "sts_mode": raw.get("sts_mode", "all"),
        "sick_split": raw.get("sick_split", "test"),
    }
    if "sts" in raw["tasks"]:
        sts = {k: v for k, v in raw.items() if k in (*STS_TASKS, "Avg")}
        results["sts"] = {EVALUATED: _check_scores(path, "the STS scores", sts, STS_TASKS)}
    if "transfer" in raw["tasks"]:
        results["transfer"] = {EVALUATED: _check_scores(path, "key 'transfer'", raw.get("transfer"), TRANSFER_TASKS)}
    return results


def _from_run(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    """A run's results.json, checked, with only the keys the card reads."""
    results = {k: raw[k] for k in CARD_KEYS if k in raw}
    for key, known in (("sts", STS_TASKS), ("transfer", TRANSFER_TASKS)):
        rows = results.get(key) or {}
        if not isinstance(rows, Mapping):
            raise ValueError(f"Results file '{path}': key '{key}' should map run labels to scores.")
        flat = rows and not all(isinstance(v, Mapping) for v in rows.values())  # {task: acc}, as older runs wrote
        rows = {EVALUATED: rows} if flat else rows
        results[key] = {label: _check_scores(path, f"key '{key}.{label}'", v, known) for label, v in rows.items()}
        if not results[key]:
            del results[key]
    if results.get("mteb_sts"):
        results["mteb_sts"] = _check_scores(path, "key 'mteb_sts'", results["mteb_sts"], STS_TASKS)
    if "parallelism" in results:
        _check_parallelism(path, results["parallelism"])
    return results


def _check_parallelism(path: Path, parallelism: Any) -> None:
    """ValueError naming the file and key when results.json's `parallelism` lacks what the card states."""
    if not isinstance(parallelism, Mapping):
        raise ValueError(f"Results file '{path}': key 'parallelism' should be an object, not {parallelism!r}.")
    for key, kind in PARALLELISM_KEYS.items():
        value = parallelism.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 1):
            expected = "a positive integer" if kind is int else "a string"
            raise ValueError(f"Results file '{path}': key 'parallelism.{key}' should be {expected}, not {value!r}.")


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read the results a card is written from: a run's `results.json` or the JSON of `hf-sentcl evaluate
    --output` (STS and/or transfer). Both come back in the run's shape: `sts`/`transfer` map a row label
    (`before`, `after` or `evaluated`) to scores. ValueError saying why for a file that holds no usable scores.
    """
    path = Path(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"Results file '{path}' holds a JSON {type(raw).__name__}, not an object of results.")
    if "model" in raw and "tasks" in raw:
        results = _from_evaluate(path, raw)
    elif "sts" in raw or "method" in raw:
        results = _from_run(path, raw)
    else:
        raise ValueError(
            f"Results file '{path}' is neither a run's results.json (keys 'method', 'sts') nor the output of "
            "`hf-sentcl evaluate --output` (keys 'model', 'tasks'); its keys are "
            f"{sorted(raw)[:8]}."
        )
    if not any(results.get(k) for k in ("sts", "transfer", "mteb_sts")):
        raise ValueError(
            f"Results file '{path}' holds no STS or transfer scores, so the card would have no results; evaluate "
            "the model (`hf-sentcl evaluate ... --output FILE`) and pass that file with --results."
        )
    return results


def hub_model_id(name_or_path: str | None) -> str | None:
    """The Hub id of a base model name (the embedded alias maps to its Hub original); None for local paths."""
    if not name_or_path:
        return None
    if name_or_path == EMBEDDED_MODEL_ALIAS:
        return "sentence-transformers/all-MiniLM-L6-v2"
    if name_or_path.startswith((".", "/", "~")) or Path(name_or_path).exists():
        return None
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return None
    return name_or_path


def training_datasets(results: Mapping[str, Any]) -> list[str] | None:
    """Hub dataset ids of the training data, only as the run declared them: a `dataset_name` that is a Hub id, the
    STS sets of `unlabeled_sts`, an `hf://datasets/ORG/NAME/...` file (`train_file`, an NLI file), an NLI
    `datasets` id, and those of each dataset of a mixed run. Never guessed from a local file's name: a user's own
    `wiki1m_subset.txt` is not SimCSE's dataset."""
    data = results.get("training_data") or {}
    source, name = data.get("source"), str(data.get("name") or "")
    if source == "dataset_name" and is_hub_dataset_id(name):
        return [name]
    if source == "unlabeled_sts":
        tasks = UNLABELED_STS_TASKS.get(name, [])
        return [MTEB_STS_DATASETS[t][0] for t in tasks] or None
    if source in ("train_file", NLI_SOURCE_KEY) and (uri := HUB_DATASET_URI.search(name)):
        return [uri.group(1)]
    if source == NLI_SOURCE_KEY and (hub := re.fullmatch(r"dataset '([^']+)'.*", name)) and is_hub_dataset_id(hub[1]):
        return [hub.group(1)]
    if source == "mixed":  # several datasets, each as a single one of its key would be declared
        found = [training_datasets({"training_data": {"source": entry["key"], "name": entry["name"]}})
                 for entry in data.get("datasets", [])]
        return list(dict.fromkeys(d for ids in found if ids for d in ids)) or None
    return None


def is_hub_dataset_id(name: str) -> bool:
    """Whether `name` is a Hub dataset id (`org/name` or a canonical `name`) rather than a local folder or file."""
    if not name or name.startswith((".", "/", "~")) or Path(name).expanduser().exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ MTEB's view
def declared_mteb_datasets(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """`training_data.mteb_datasets` of a results file: the MTEB datasets (task names) the training text was taken
    from, with their splits, e.g. {"STSBenchmark": ["train"]} for triplets mined from STS-B's train pairs. A plain
    list of names means the splits are not known. Nothing recognises a local file's origin by itself: whoever
    makes the file (e.g. `hf-sentcl mine` from `stsb:train`) declares it, and the run copies it into results.json."""
    declared = data.get(MTEB_DATASETS_KEY) or {}
    if isinstance(declared, str) or not isinstance(declared, (Mapping, list, tuple)):
        raise ExportError(
            f"training_data.{MTEB_DATASETS_KEY} should map MTEB task names to their splits (e.g. "
            f'{{"STSBenchmark": ["train"]}}) or list the names, not {declared!r}.'
        )
    if not isinstance(declared, Mapping):
        return {str(name): [] for name in declared}
    return {str(name): [str(split) for split in (splits or [])] for name, splits in declared.items()}


def own_mteb_training_tasks(results: Mapping[str, Any]) -> set[str] | None:
    """The MTEB task names whose data this training run used (not its base model's): the STS sets of
    `unlabeled_sts`, an MTEB dataset named by `dataset_name`, and what `training_data.mteb_datasets` declares.
    An empty set when the run's data is known and none of it is an MTEB dataset (e.g. Wikipedia text, NLI pairs);
    None when the results do not say what the model was trained on."""
    data = results.get("training_data")
    if not data:
        return None
    tasks = set(declared_mteb_datasets(data))
    if data.get("source") == "unlabeled_sts":
        tasks |= {MTEB_STS_DATASETS[t][1] for t in UNLABELED_STS_TASKS.get(data.get("name"), [])}
    if data.get("source") == "dataset_name" and data.get("name") in MTEB_TASK_BY_DATASET:
        tasks.add(MTEB_TASK_BY_DATASET[data["name"]])
    return tasks


def training_lineage(results: Mapping[str, Any], limit: int = 8) -> list[Mapping[str, Any]]:
    """`results`, then the results of the model it was trained from, as long as that base is a local hf_sentcl
    export (its `CARD_INPUTS` file holds them): e.g. ConSERT's sup-unsup stage 2, trained from stage 1's export on
    NLI. The last entry's `model_name_or_path` is the original base model."""
    lineage, seen = [results], set()
    while len(lineage) < limit:
        base = lineage[-1].get("model_name_or_path")
        if not base or base == EMBEDDED_MODEL_ALIAS:
            break
        inputs = Path(base).expanduser() / CARD_INPUTS
        if not inputs.is_file() or inputs.resolve() in seen:
            break
        seen.add(inputs.resolve())
        lineage.append(read_json(inputs).get("results") or {})
    return lineage


def mteb_training_tasks(results: Mapping[str, Any]) -> set[str] | None:
    """The MTEB task names whose data went into the model, over its hf_sentcl lineage (`training_lineage`), without
    the original base model's (which mteb adds through `adapted_from`); None when the results do not say."""
    lineage = training_lineage(results)
    own = [own_mteb_training_tasks(r) for r in lineage]
    if own[0] is None:
        return None
    return set().union(*(tasks for tasks in own if tasks))


def base_model_id(results: Mapping[str, Any]) -> str | None:
    """The Hub id of the model that training started from, through the hf_sentcl lineage (`training_lineage`)."""
    return hub_model_id(training_lineage(results)[-1].get("model_name_or_path"))


def training_data_outside_mteb(results: Mapping[str, Any]) -> list[str]:
    """Plain descriptions of the lineage's training data that no MTEB task name covers (Wikipedia text, NLI pairs,
    a local file without a declaration), for the comment mteb's own registry files give such data; local folders
    are reduced to their names."""
    notes = []
    for entry in training_lineage(results):
        data = entry.get("training_data") or {}
        if not data or own_mteb_training_tasks(entry) and data.get("source") in ("unlabeled_sts", "dataset_name"):
            continue
        declared = declared_mteb_datasets(data)
        name = re.sub(r"'(/[^']*)'", lambda m: f"'{Path(m.group(1)).name}'", str(data.get("name")))
        hub = training_datasets(entry)
        where = f", Hub dataset {', '.join(hub)}" if hub else ""
        if declared:
            taken = ", ".join(f"{task} ({'+'.join(splits) or 'splits not given'})" for task, splits in declared.items())
            notes.append(f"{name} ({data.get('source')}{where}): built from MTEB's {taken}")
        else:
            notes.append(f"{name} ({data.get('source')}{where})")
    return list(dict.fromkeys(notes))
