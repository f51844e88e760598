"""Run-folder checks made before a model loads: is output_dir writable, does it already hold a run, and which
checkpoint does `resume_from_checkpoint` mean.

A folder "holds a run" when it has any of `RUN_ENTRIES` (results, a saved encoder, checkpoints, an export, a
chained method's stage folder, a multi-seed run's seed folders). A new run into it is refused unless
`overwrite_output_dir: true` or the run resumes from a checkpoint inside it, so a rerun never replaces or rotates
away an earlier run's results, model, export or checkpoints by accident.

A checkpoint is complete when the trainer marked it so (`CHECKPOINT_COMPLETE`, written after every process has
written its files, see `ContrastiveTrainer._save_checkpoint`) and holds the files an exact resume needs. A
checkpoint without the mark was cut off while being written (a crash, a full disk) and is never resumed from.
A checkpoint is usable when it is complete and undamaged (`checkpoint_problems`): every file the mark lists has its
recorded size and crc32 (marks that have a crc32 for the *.safetensors only: the sizes of the rest), every
top-level *.safetensors file's header and length agree and every JSON file parses (marks written before the file
list existed: those two checks only). The format and its checks: `hf_sentcl.trainers.checkpoint_files`.

`resume_from_checkpoint` values: a checkpoint folder (refused when incomplete or damaged); `latest`/`true`: the
latest usable checkpoint of output_dir or of a chained method's stage folder, skipping damaged ones with a warning;
`auto` (requeued jobs): the same when there is one, else a fresh start, with `RunComplete` when output_dir holds a
finished run (`run_complete.json`); checkpoint folders that are all unusable (and a `preempted.json`) are removed
first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from hf_sentcl.common.layout import EXPORT_DIRNAME, PREEMPTED_JSON, RUN_COMPLETE_JSON, RUN_ENTRIES
from hf_sentcl.evaluation.report import write_json
from hf_sentcl.modeling.backbone import local_weight_bytes
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.registry import METHODS

logger = logging.getLogger("hf_sentcl")

#: `resume_from_checkpoint` values that mean "the latest complete checkpoint in output_dir"
LATEST = ("latest", "true")
#: `resume_from_checkpoint` value for requeued jobs: the latest usable checkpoint, else a fresh start
AUTO = "auto"


class RunComplete(Exception):
    """`resume_from_checkpoint: auto` into an output_dir whose run has finished: nothing to do (the CLI exits 0, or 1
    when `failed`: the finished run's export or push failed, and the message says how to redo it). Not a
    RecipeError: nothing is wrong with the recipe."""

    def __init__(self, message: str, failed: bool = False):
        super().__init__(message)
        self.failed = failed


#: what run_complete.json records of a finished run's failed export or push (`publish_run`'s keys)
PUBLISH_FAILURES = ("export_error", "push_error")


def clear_recorded_failure(export_dir: str | os.PathLike, key: str) -> bool:
    """After `hf-sentcl export`/`push` redid what a finished run's end failed at, into or from that run's own
    `export/` folder: drop `key` from the run's run_complete.json, so that a requeued `auto` run and a sweep see it
    complete. Returns whether a recorded failure was cleared."""
    export_dir = Path(export_dir)
    marker = export_dir.parent / RUN_COMPLETE_JSON
    if export_dir.name != EXPORT_DIRNAME or key not in recorded_failures(export_dir.parent):
        return False
    content = json.loads(marker.read_text())
    del content[key]
    write_json(marker, content)
    return True


def recorded_failures(output_dir: str | os.PathLike) -> dict[str, str]:
    """The export or push failures that output_dir's run_complete.json records (empty without the file, or for a
    run that exported and pushed as asked)."""
    try:
        marker = json.loads((Path(output_dir) / RUN_COMPLETE_JSON).read_text())
    except (OSError, ValueError):
        return {}
    return {key: str(marker[key]) for key in PUBLISH_FAILURES if isinstance(marker, dict) and marker.get(key)}


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


_DEEPSPEED_STATE = re.compile(r"^global_step\d+$")


def missing_checkpoint_files(checkpoint: Path) -> list[str]:
    """What an exact resume needs and `checkpoint` lacks (empty when it is complete).

    Accepts every layout the Trainer writes: DDP/one process (`optimizer.pt`, `scheduler.pt`, `model.safetensors`),
    DeepSpeed (a `global_stepN/` folder holding the weights, optimizer and scheduler states of every process, plus
    `scheduler.pt` when the Trainer's own scheduler is used) and FSDP (`optimizer.bin` for a full state dict, an
    `optimizer_0/` folder for a sharded one; the weights as `pytorch_model_fsdp*.bin` or `pytorch_model_fsdp_0/`).
    """
    names = {p.name for p in checkpoint.iterdir()} if checkpoint.is_dir() else set()
    folders = {n for n in names if (checkpoint / n).is_dir()}
    deepspeed = any(_DEEPSPEED_STATE.match(n) for n in folders)
    fsdp_sharded = any(n.startswith("pytorch_model_fsdp") for n in folders)
    missing = [] if "trainer_state.json" in names else ["trainer_state.json"]
    if not (deepspeed or names & {"optimizer.pt", "optimizer.bin"} or any(n.startswith("optimizer_") for n in folders)):
        missing.append("optimizer.pt (or DeepSpeed's global_stepN/, FSDP's optimizer.bin / optimizer_0/)")
    if "scheduler.pt" not in names and not deepspeed:
        missing.append("scheduler.pt")
    if not any(n.startswith("rng_state") and n.endswith(".pth") for n in names):
        missing.append("rng_state*.pth")
    weights = any(
        n.endswith((".safetensors", ".bin")) and not n.startswith(("optimizer", "rng_state")) for n in names - folders
    )
    if not (weights or deepspeed or fsdp_sharded):
        missing.append("model weights (model.safetensors)")
    if CHECKPOINT_COMPLETE not in names:
        missing.append(f"{CHECKPOINT_COMPLETE} (the completion mark: the checkpoint was cut off while being written)")
    return missing


def checkpoint_damage(checkpoint: Path) -> list[str]:
    """'file: defect' for every file of a marked checkpoint that does not match its mark (missing, another size, crc
    mismatch), whose safetensors framing is broken or that is JSON that does not parse; empty when it is undamaged.
    The check belongs to the checkpoint format (`hf_sentcl.trainers.checkpoint_files.checkpoint_damage`), imported
    only when a resume needs it: the commands that import this module for its other checks never load the
    trainers."""
    from hf_sentcl.trainers.checkpoint_files import checkpoint_damage as damage

    return damage(checkpoint)


def checkpoint_problems(checkpoint: Path) -> list[str]:
    """Why `checkpoint` cannot be resumed from (empty when it is usable): the files it lacks
    (`missing_checkpoint_files`), else its damage (`checkpoint_damage`)."""
    return _diagnose(checkpoint)[1]


def _diagnose(checkpoint: Path) -> tuple[str, list[str]]:
    """('incomplete', missing files) / ('damaged', defects) / ('', []) for a usable checkpoint. A file that vanishes
    or cannot be read meanwhile makes it damaged."""
    try:
        if missing := missing_checkpoint_files(checkpoint):
            return "incomplete", missing
        damage = checkpoint_damage(checkpoint)
        return ("damaged", damage) if damage else ("", [])
    except OSError as err:
        return "damaged", [f"unreadable: {err}"]


def latest_complete_checkpoint(folder: Path) -> Path | None:
    """The usable checkpoint-N of `folder` (`checkpoint_problems`) with the largest N; later ones that are not usable
    are skipped with a warning (transformers' `get_last_checkpoint` would take a half-written one)."""
    if not folder.is_dir():
        return None
    steps = sorted(
        ((int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))),
        reverse=True,
    )
    for _, path in steps:
        what, problems = _diagnose(path)
        if not problems:
            return path
        logger.warning("Skipping checkpoint '%s', it is %s: %s.", path, what, "; ".join(problems))
    return None


def run_entries(folder: Path) -> list[str]:
    """The entries of `folder` that show it holds a run (sorted names)."""
    if not folder.is_dir():
        return []
    return sorted({p.name for pattern in RUN_ENTRIES for p in folder.glob(pattern)})


def _stage_folders(output_dir: Path) -> list[Path]:
    return [output_dir / spec.stage_dirname for spec in METHODS.values() if spec.stage_dirname]


def resolve_resume(source: str, output_dir: Path, value: str | bool | None) -> str | None:
    """`resume_from_checkpoint` as a checked path (or None): `latest`/`true` pick the latest usable checkpoint of
    output_dir (or of its stage-1 folder, where a chained method's first stage was cut off); `auto` the same, or None
    where there is none, and raises `RunComplete` where output_dir holds a finished run; a path must be a usable
    checkpoint."""
    text = str(value).strip() if value is not None else ""
    if text.lower() in ("", "false", "none"):
        return None
    if text.lower() == AUTO and (output_dir / RUN_COMPLETE_JSON).is_file():
        failures = recorded_failures(output_dir)
        if failures:  # trained and evaluated, but what the run was to publish is missing: not "nothing to do"
            export = output_dir / EXPORT_DIRNAME
            redo = (f"Once the cause is fixed, export the trained encoder with `hf-sentcl export {output_dir} {export}`"
                    if "export_error" in failures else f"Push '{export}' with the command above")
            raise RunComplete(
                f"{source}: output_dir '{output_dir}' holds a finished run ({RUN_COMPLETE_JSON}) whose "
                f"{' and '.join(k.split('_')[0] for k in failures)} failed; training it again would not change that. "
                f"{' '.join(failures.values())} {redo}: that marks the run complete.",
                failed=True,
            )
        raise RunComplete(
            f"{source}: output_dir '{output_dir}' holds a finished run ({RUN_COMPLETE_JSON}: trained, evaluated and "
            "exported), nothing to do. To train it again, choose another output_dir, or drop "
            "'resume_from_checkpoint: auto' and set 'overwrite_output_dir: true'."
        )
    if text.lower() in (*LATEST, AUTO):
        found = next(filter(None, map(latest_complete_checkpoint, [output_dir, *_stage_folders(output_dir)])), None)
        if found is None and text.lower() != AUTO:
            raise RecipeError(
                f"{source}: key 'resume_from_checkpoint' is '{text}' but output_dir '{output_dir}' holds no complete "
                "checkpoint-N folder; start the run without resume_from_checkpoint, or name a checkpoint folder."
            )
        return None if found is None else str(found)
    path = Path(text).expanduser()
    if not path.is_dir():
        raise RecipeError(
            f"{source}: key 'resume_from_checkpoint': checkpoint folder '{text}' does not exist; name a checkpoint-N "
            f"folder of an earlier run, or use 'latest'."
        )
    missing = missing_checkpoint_files(path)
    if missing:
        raise RecipeError(
            f"{source}: key 'resume_from_checkpoint': checkpoint '{text}' is incomplete, it lacks "
            f"{', '.join(missing)}; resume from an earlier complete checkpoint ('latest' picks one)."
        )
    damage = checkpoint_problems(path)
    if damage:
        raise RecipeError(
            f"{source}: key 'resume_from_checkpoint': checkpoint '{text}' is damaged: {'; '.join(damage)}; resume "
            "from an earlier checkpoint ('latest' picks the latest usable one)."
        )
    return str(path)


def unusable_leftovers(output_dir: Path) -> list[Path] | None:
    """When output_dir holds no run but checkpoint-N folders (in it or in a chained method's stage folder) that are
    all unusable, plus perhaps a `preempted.json`: those paths (a fresh `auto` start removes them); None when it
    holds anything else of a run. Call it only when `latest_complete_checkpoint` found nothing."""
    leftovers = []
    for folder in (output_dir, *_stage_folders(output_dir)):
        entries = run_entries(folder)
        stages = {p.name for p in _stage_folders(folder)} if folder == output_dir else set()
        if any(not (_CHECKPOINT.match(name) or name in stages) for name in entries):
            return None
        leftovers += [folder / name for name in entries if _CHECKPOINT.match(name)]
        leftovers += [folder / PREEMPTED_JSON] if (folder / PREEMPTED_JSON).is_file() else []
    return leftovers


def remove_leftovers(leftovers: list[Path]) -> None:
    """Remove the unusable checkpoints (and preemption notes) a fresh `auto` start finds, with a warning."""
    if not leftovers:
        return
    logger.warning(
        "resume_from_checkpoint: auto found no usable checkpoint; removing %s and starting afresh.",
        ", ".join(f"'{p}'" for p in leftovers),
    )
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def check_writable(folder: Path, label: str) -> None:
    """Create `folder` if needed and write (then remove) a probe file in it; RecipeError starting with `label`
    (what names the folder: a recipe key, a CLI option) if that fails."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise RecipeError(f"{label}: cannot write into '{folder}': '{blocker}' is a file, not a folder.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise RecipeError(
            f"{label}: cannot write into '{folder}' ({err.strerror or err}); choose a folder you can write to, or "
            "fix its permissions."
        ) from None


def check_free_space(recipe: Recipe, output_dir: Path) -> None:
    """RecipeError when output_dir's disk cannot hold one checkpoint, the saved encoder and its export: estimated
    from the local backbone's weight files (fp32: a checkpoint with Adam's two moments is three times the weights).
    A lower bound, so a run is not lost at its first checkpoint; a Hub backbone not in the cache is not estimated."""
    weights = local_weight_bytes(recipe.model.model_name_or_path)
    if not weights:
        return
    checkpoint = weights * (1 if recipe.training.save_only_model else 3)
    needed = checkpoint + 2 * weights
    free = shutil.disk_usage(output_dir).free
    if free < needed:
        raise RecipeError(
            f"{recipe.source}: key 'output_dir': '{output_dir}' has {free / 2**20:.0f} MiB free, but one checkpoint, "
            f"the saved encoder and its export of this backbone take at least {needed / 2**20:.0f} MiB. Free some "
            "space or choose an output_dir on a larger disk."
        )


def refuse_existing_run(recipe: Recipe, output_dir: Path, entries: list[str]) -> None:
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    if str(recipe.training.resume_from_checkpoint).strip().lower() == AUTO:
        raise RecipeError(
            f"{recipe.source}: key 'output_dir': '{output_dir}' already holds a run ({shown}) but no usable "
            "checkpoint for 'resume_from_checkpoint: auto' to resume (see the warnings above). Choose another "
            "output_dir, or set 'overwrite_output_dir: true' to replace it."
        )
    raise RecipeError(
        f"{recipe.source}: key 'output_dir': '{output_dir}' already holds a run ({shown}). Choose another "
        "output_dir, resume it with '--resume_from_checkpoint latest', or set 'overwrite_output_dir: true' "
        "to replace it."
    )


def check_run_folder(recipe: Recipe) -> Recipe:
    """Check output_dir and resume_from_checkpoint before any work; returns the recipe with
    `resume_from_checkpoint` resolved to a checkpoint folder (or None). Raises RecipeError naming the key and
    what to do, and `RunComplete` for `auto` into a finished run. With `overwrite_output_dir: true`, earlier
    checkpoint-N folders are removed (the main process only) so that neither a later `latest` resume nor checkpoint
    rotation mixes them with the new run; the other files are replaced as the new run writes them. `auto` without a
    usable checkpoint removes unusable ones the same way (`unusable_leftovers`) and starts afresh."""
    args = recipe.training
    if not args.output_dir:
        return recipe  # validate_recipe names the missing key
    output_dir = Path(args.output_dir).expanduser()
    resume = resolve_resume(recipe.source, output_dir, args.resume_from_checkpoint)
    entries = run_entries(output_dir)
    is_resume_here = resume is not None and Path(resume).resolve().is_relative_to(output_dir.resolve())
    auto = resume is None and str(args.resume_from_checkpoint).strip().lower() == AUTO
    leftovers = unusable_leftovers(output_dir) if auto else None
    if leftovers is not None:
        entries = []  # only unusable checkpoints: removed below, a fresh start
    if entries and not is_resume_here and not args.overwrite_output_dir:
        refuse_existing_run(recipe, output_dir, entries)
    created = not output_dir.exists()
    check_writable(output_dir, f"{recipe.source}: key 'output_dir'")
    try:
        check_free_space(recipe, output_dir)
    except RecipeError:
        if created:  # leave no empty folder behind a refused run
            output_dir.rmdir()
        raise
    main_process = int(os.environ.get("RANK", "0")) == 0
    if leftovers and main_process:
        remove_leftovers(leftovers)
    if entries and args.overwrite_output_dir and not is_resume_here and main_process:
        for old in output_dir.glob("checkpoint-*"):
            if old.is_dir():
                shutil.rmtree(old)
    if resume == args.resume_from_checkpoint:
        return recipe
    return dataclasses.replace(recipe, training=dataclasses.replace(args, resume_from_checkpoint=resume))
