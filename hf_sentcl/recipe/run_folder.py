"""Run-folder checks made before a model loads: is output_dir writable, does it already hold a run, and which
checkpoint does `resume_from_checkpoint` mean.

A folder "holds a run" when it has any of `RUN_ENTRIES` (results, a saved encoder, checkpoints, an export, a
chained method's stage folder, a multi-seed run's seed folders). A new run into it is refused unless
`overwrite_output_dir: true` or the run resumes from a checkpoint inside it, so a rerun never replaces or rotates
away an earlier run's results, model, export or checkpoints by accident.

A checkpoint is complete when the trainer marked it so (`CHECKPOINT_COMPLETE`, written after every process has
written its files, see `ContrastiveTrainer._save_checkpoint`) and holds the files an exact resume needs. A
checkpoint without the mark was cut off while being written (a crash, a full disk) and is never resumed from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path

from hf_sentcl.common.layout import RUN_ENTRIES
from hf_sentcl.methods import METHODS
from hf_sentcl.modeling.backbone import local_weight_bytes
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
from hf_sentcl.recipe.parser import Recipe, RecipeError

#: `resume_from_checkpoint` values that mean "the latest complete checkpoint in output_dir"
LATEST = ("latest", "true")


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


def latest_complete_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint-N of `folder` with the largest N (transformers' `get_last_checkpoint` would also
    take a half-written one)."""
    if not folder.is_dir():
        return None
    steps = sorted(
        ((int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))),
        reverse=True,
    )
    return next((path for _, path in steps if not missing_checkpoint_files(path)), None)


def run_entries(folder: Path) -> list[str]:
    """The entries of `folder` that show it holds a run (sorted names)."""
    if not folder.is_dir():
        return []
    return sorted({p.name for pattern in RUN_ENTRIES for p in folder.glob(pattern)})


def resolve_resume(source: str, output_dir: Path, value: str | bool | None) -> str | None:
    """`resume_from_checkpoint` as a checked path (or None): `latest`/`true` pick the latest complete checkpoint of
    output_dir (or of its stage-1 folder, where a chained method's first stage was cut off); a path must be a
    complete checkpoint."""
    text = str(value).strip() if value is not None else ""
    if text.lower() in ("", "false", "none"):
        return None
    if text.lower() in LATEST:
        stages = [output_dir / spec.stage_dirname for spec in METHODS.values() if spec.stage_dirname]
        found = next(filter(None, map(latest_complete_checkpoint, [output_dir, *stages])), None)
        if found is None:
            raise RecipeError(
                f"{source}: key 'resume_from_checkpoint' is '{text}' but output_dir '{output_dir}' holds no complete "
                "checkpoint-N folder; start the run without resume_from_checkpoint, or name a checkpoint folder."
            )
        return str(found)
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
    return str(path)


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


def check_run_folder(recipe: Recipe) -> Recipe:
    """Check output_dir and resume_from_checkpoint before any work; returns the recipe with
    `resume_from_checkpoint` resolved to a checkpoint folder (or None). Raises RecipeError naming the key and
    what to do. With `overwrite_output_dir: true`, earlier checkpoint-N folders are removed (the main process
    only) so that neither a later `latest` resume nor checkpoint rotation mixes them with the new run; the
    other files are replaced as the new run writes them."""
    args = recipe.training
    if not args.output_dir:
        return recipe  # validate_recipe names the missing key
    output_dir = Path(args.output_dir).expanduser()
    resume = resolve_resume(recipe.source, output_dir, args.resume_from_checkpoint)
    entries = run_entries(output_dir)
    is_resume_here = resume is not None and Path(resume).resolve().is_relative_to(output_dir.resolve())
    if entries and not is_resume_here and not args.overwrite_output_dir:
        shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
        raise RecipeError(
            f"{recipe.source}: key 'output_dir': '{output_dir}' already holds a run ({shown}). Choose another "
            "output_dir, resume it with '--resume_from_checkpoint latest', or set 'overwrite_output_dir: true' "
            "to replace it."
        )
    created = not output_dir.exists()
    check_writable(output_dir, f"{recipe.source}: key 'output_dir'")
    try:
        check_free_space(recipe, output_dir)
    except RecipeError:
        if created:  # leave no empty folder behind a refused run
            output_dir.rmdir()
        raise
    if entries and args.overwrite_output_dir and not is_resume_here and int(os.environ.get("RANK", "0")) == 0:
        for old in output_dir.glob("checkpoint-*"):
            if old.is_dir():
                shutil.rmtree(old)
    if resume == args.resume_from_checkpoint:
        return recipe
    return dataclasses.replace(recipe, training=dataclasses.replace(args, resume_from_checkpoint=resume))
