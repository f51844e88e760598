"""What lets a run stop at any point and be requeued: the note of a preemption (`preempted.json`), the stop before
training when a signal came during setup, the completion mark (`run_complete.json`), and the scores before training
kept for the requeued launch (`eval_before.json`)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from pathlib import Path
from typing import Any

from hf_sentcl.common.distributed import any_process
from hf_sentcl.common.layout import EVAL_BEFORE_JSON, PREEMPTED_JSON, RUN_COMPLETE_JSON
from hf_sentcl.common.preemption import Preempted, current_watch
from hf_sentcl.evaluation.report import write_json
from hf_sentcl.evaluation.suites import SuiteResults
from hf_sentcl.recipe.parser import Recipe

logger = logging.getLogger("hf_sentcl")


def write_preemption_note(output_dir: str | Path, signal_name: str, when: str, step: int, max_steps: int | None,
                          checkpoint: str | Path | None, steps_run: dict[str, int]) -> None:
    """Write output_dir/preempted.json (see `note_preemption`); `checkpoint` None when the run stopped before it had
    one."""
    waited = current_watch().seconds_since_signal()
    write_json(Path(output_dir) / PREEMPTED_JSON, {
        "signal": signal_name, "when": when, "step": step, "max_steps": max_steps,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        **steps_run,  # where this launch started and the steps it ran
        "seconds_from_signal_to_note": None if waited is None else round(waited, 3),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })


def stop_if_signalled(recipe: Recipe, when: str) -> None:
    """Raise `Preempted` when any process of the run has noted a preemption signal (one all-reduce: every process
    calls this at the same point), after output_dir/preempted.json is written. Called where a run stops without
    losing anything: before training, so a signal during the checks, the model load or the evaluation before
    training ends the run in seconds instead of after one training step and a checkpoint."""
    watch = current_watch()
    if not any_process(watch.requested):
        return
    name = watch.received.name if watch.received is not None else "a preemption signal to another process"
    resume = recipe.training.resume_from_checkpoint
    step = int(Path(resume).name.rsplit("-", 1)[-1]) if resume else 0
    if recipe.training.should_save:
        write_preemption_note(recipe.training.output_dir, name, when, step, recipe.training.max_steps, resume,
                              {"started_at_step": step, "steps_run": 0})
    since = f"checkpoint '{resume}'" if resume else "the start"
    raise Preempted(
        f"preempted by {name} {when}; nothing was trained since {since}. Resume: rerun the same command with "
        "'resume_from_checkpoint: auto'.", name, step,
    )


def mark_run_complete(output_dir: str | Path, results: dict[str, Any]) -> dict[str, Any]:
    """Write output_dir/run_complete.json, the last file a run writes (a requeued `auto` run then has nothing to
    do), and drop the note of an earlier preemption; returns what it wrote."""
    export = results.get("export", {})
    record = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "global_step": results.get("train", {}).get("global_step"),
        **{key: export[key] for key in ("push_error", "export_error") if key in export},
    }
    write_json(Path(output_dir) / RUN_COMPLETE_JSON, record)
    (Path(output_dir) / PREEMPTED_JSON).unlink(missing_ok=True)
    return record


def before_evaluation_key(recipe: Recipe, eval_mixed: bool) -> dict[str, Any]:
    """What the scores before training depend on: the model and data settings, and the evaluation precision."""
    settings = {"model": dataclasses.asdict(recipe.model), "data": dataclasses.asdict(recipe.data),
                "mixed": eval_mixed}
    return json.loads(json.dumps(settings, default=str))


def read_before_scores(output_dir: str | Path, key: dict[str, Any]) -> SuiteResults | None:
    """The scores an earlier launch of this run measured before training, when they were measured with `key`."""
    try:
        kept = json.loads((Path(output_dir) / EVAL_BEFORE_JSON).read_text())
        if kept.get("key") != key:
            return None
        scores = SuiteResults(**kept["scores"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    logger.info("Scores before training reused from %s (measured by an earlier launch of this run).",
                Path(output_dir) / EVAL_BEFORE_JSON)
    return scores


def keep_before_scores(output_dir: str | Path, key: dict[str, Any], scores: SuiteResults) -> None:
    try:
        write_json(Path(output_dir) / EVAL_BEFORE_JSON, {"key": key, "scores": dataclasses.asdict(scores)})
    except (OSError, ValueError) as err:  # a cache: the run goes on without it
        logger.info("Scores before training not kept for a requeued run (%s).", err)
