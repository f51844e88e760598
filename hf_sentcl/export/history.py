"""The history of the run an exported encoder comes from, for its model card: a `checkpoint-N` (or a run's
`output_dir`) exported with `hf-sentcl evaluate`'s results, or with none, would otherwise lose its method, base model,
training data, settings and citation.

The run folder is the checkpoint's parent (or the `output_dir` itself): its results.json records what the run was
(`HISTORY_KEYS`). A checkpoint's own `trainer_state.json` says how far training had gone when it was written: its
step, the run's length and the dev evaluations up to it. The run's scores and training summary describe the run's
final model, so for a checkpoint of another step they are replaced by the checkpoint's own (the "before training"
row, the base model's, stays).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_sentcl.common.layout import RESULTS_JSON
from hf_sentcl.evaluation.report import read_json

logger = logging.getLogger("hf_sentcl")

TRAINER_STATE = "trainer_state.json"

#: what a run's results.json says about how the model was made (not how well it does)
HISTORY_KEYS = ("method", "model_name_or_path", "recipe_settings", "training_data", "precision", "versions",
                "parallelism")

#: score keys of a results dict that describe one model; rows of `sts`/`transfer` other than "before" do
SCORE_KEYS = ("mteb_sts", "mteb_sts_seconds", "sts_by_dim")
ROW_SCORE_KEYS = ("sts", "transfer")

#: the dev metrics a checkpoint's log_history holds, as the card's dev table reads them
DEV_METRICS = ("eval_stsb_spearman", "eval_alignment", "eval_uniformity")


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None (with a warning naming the file) when it is unreadable or not an object."""
    try:
        value = read_json(path)
    except (OSError, ValueError) as err:
        logger.warning("Ignoring %s for the model card: %s", path, err)
        return None
    return value if isinstance(value, dict) else None


def checkpoint_training(checkpoint: Path) -> dict[str, Any] | None:
    """The card's `train` entry for a checkpoint, from its trainer_state.json: its step, the run's planned steps,
    the dev evaluations up to it and, when it was the best so far, its dev score. None without a readable state."""
    state = read_object(checkpoint / TRAINER_STATE)
    if state is None or not isinstance(state.get("global_step"), int):
        return None
    step = state["global_step"]
    curve = [
        {"step": entry["step"], **{k: entry[k] for k in DEV_METRICS if k in entry}}
        for entry in state.get("log_history") or []
        if isinstance(entry, dict) and "eval_stsb_spearman" in entry and entry.get("step", step + 1) <= step
    ]
    train: dict[str, Any] = {"global_step": step, "checkpoint": True, "dev_curve": curve}
    if isinstance(state.get("max_steps"), int) and state["max_steps"] > 0:
        train["max_steps"] = state["max_steps"]
    own = [entry for entry in curve if entry["step"] == step]
    if own and state.get("best_global_step") == step:
        train["best_step"], train["best_dev_stsb_spearman"] = step, own[0]["eval_stsb_spearman"]
    return train


def final_step(run: Mapping[str, Any]) -> int | None:
    """The step of the model a run's results.json scores: the best dev checkpoint it reloaded, else its last step."""
    train = run.get("train") or {}
    settings = run.get("recipe_settings") or {}
    if train.get("best_step") is not None and settings.get("load_best_model_at_end", True):
        return train["best_step"]
    return train.get("global_step")


def without_run_scores(results: dict[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """`results` less the scores it took from the run's results.json (equal to them): those are the final model's."""
    kept = dict(results)
    for key in SCORE_KEYS:
        if key in kept and kept[key] == run.get(key):
            del kept[key]
    for key in ROW_SCORE_KEYS:
        rows = kept.get(key)
        if isinstance(rows, Mapping) and rows and rows == run.get(key):
            kept[key] = {label: row for label, row in rows.items() if label == "before"}
            if not kept[key]:
                del kept[key]
    return kept


def with_run_history(results: Mapping[str, Any], source: str | Path | None) -> dict[str, Any]:
    """`results` completed with the history of the run that `source` (the folder the encoder was loaded from) is
    part of: the keys it lacks among `HISTORY_KEYS` from the run's results.json (its `model_name_or_path`, the base
    model, also over `hf-sentcl evaluate`'s, which names the evaluated folder), and for a `checkpoint-N` its own
    training state; `results` unchanged when `source` is no checkpoint or run folder."""
    folder = Path(source) if source else None
    if folder is None or not folder.is_dir():
        return dict(results)
    checkpoint = folder if (folder / TRAINER_STATE).is_file() else None
    run_dir = folder.parent if checkpoint else folder
    run = read_object(run_dir / RESULTS_JSON) if (run_dir / RESULTS_JSON).is_file() else None
    merged = dict(results)
    evaluated = results.get("source") == "evaluate"
    for key in HISTORY_KEYS if run else ():
        if key in run and (key not in merged or (evaluated and key == "model_name_or_path")):
            merged[key] = run[key]
    if checkpoint is None:
        if run and "train" in run and "train" not in merged:
            merged["train"] = run["train"]
        return merged
    progress = checkpoint_training(checkpoint)
    if progress is None:
        return merged
    if run and progress["global_step"] != final_step(run):  # the run's scores are another model's
        merged = without_run_scores(merged, run)
        merged["train"] = progress
    elif "train" not in merged:
        merged["train"] = progress
    return merged
