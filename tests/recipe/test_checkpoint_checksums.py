"""The completion mark's crc32 covers every file a resume reads, not only the *.safetensors weights.

A flipped byte in optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json (a real tiny run's checkpoint) or in
a DeepSpeed checkpoint's `global_stepN/` model and optimizer states (a fabricated one): `latest` and `auto` skip the
checkpoint with a warning naming the file and 'crc mismatch' and take the previous one; naming it is refused. A
trainer_state.json that is not JSON (same size, so the sizes pass) is skipped as 'not valid JSON' under a new mark and
an older one without crc32s, and a requeued `auto` run resumes from the previous checkpoint instead of ending in a
JSONDecodeError traceback. Older marks (sizes, no crc32s) keep working.
"""

from __future__ import annotations

import json
import logging
import shutil
import zlib
from pathlib import Path

import pytest
from helpers import random_sentences

from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
from hf_sentcl.recipe.parser import RecipeError
from hf_sentcl.recipe.run_folder import checkpoint_problems, latest_complete_checkpoint, resolve_resume
from hf_sentcl.trainers.checkpoint_files import write_completion_mark


def write_recipe(path: Path, **values) -> Path:
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in values.items()))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert_dir, senteval_dir):
    """A real 2-step run keeping checkpoint-1 and checkpoint-2; returns (recipe values, output_dir)."""
    from hf_sentcl.cli.train import main

    root = tmp_path_factory.mktemp("trained")
    corpus = root / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=2)) + "\n")
    values = dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        per_device_train_batch_size=4, max_seq_length=16, max_steps=2, save_steps=1, eval_steps=1,
        use_cpu="true", seed=0, eval_before_training="false", eval_tasks="[]", save_total_limit=None,
        load_best_model_at_end="false",
    )
    assert main([str(write_recipe(root / "recipe.yaml", **values, output_dir=root / "out"))]) == 0
    return values, root / "out"


def checkpoints_of(trained, destination: Path) -> Path:
    """A run cut off after checkpoint-2: a copy of the trained run's two checkpoints."""
    for name in ("checkpoint-1", "checkpoint-2"):
        shutil.copytree(trained[1] / name, destination / name)
    return destination


def flip_a_byte(path: Path) -> None:
    """Change one byte of `path`, its size unchanged: in a JSON file the last digit (the file stays valid JSON, so
    only the crc32 tells), elsewhere a bit of the middle byte."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".json":
        at = max(i for i, byte in enumerate(data) if chr(byte).isdigit())
        data[at] = ord("1") if data[at] != ord("1") else ord("2")
        json.loads(bytes(data))
    else:
        data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def not_json_same_size(path: Path) -> None:
    """Replace `path` by text of the same size that is not JSON (a file overwritten by a log line, say)."""
    size = path.stat().st_size
    path.write_bytes(("{'global_step': 2, oops" + " " * size)[:size].encode())


def assert_skipped_and_refused(out: Path, defect: str, caplog) -> None:
    """`latest` and `auto` take checkpoint-1, warning with checkpoint-2 and `defect`; naming checkpoint-2 is
    refused with `defect`."""
    for how in ("latest", "auto"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
            assert latest_complete_checkpoint(out) == out / "checkpoint-1"
            assert resolve_resume("r.yaml", out, how) == str(out / "checkpoint-1")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings and all(str(out / "checkpoint-2") in w and defect in w for w in warnings), warnings
    with pytest.raises(RecipeError, match="resume_from_checkpoint.*is damaged") as refused:
        resolve_resume("r.yaml", out, str(out / "checkpoint-2"))
    assert defect in str(refused.value)
    assert checkpoint_problems(out / "checkpoint-1") == []


# ------------------------------------------------------------------------------------------------ a real checkpoint
@pytest.mark.slow
def test_the_mark_has_a_crc32_for_every_file(trained):
    """Every file of a real checkpoint (weights, optimizer, scheduler, rng state, trainer state, config, tokenizer,
    training args) is in the mark with its size and crc32."""
    checkpoint = trained[1] / "checkpoint-2"
    files = {p.relative_to(checkpoint).as_posix(): p for p in checkpoint.rglob("*")
             if p.is_file() and p.name != CHECKPOINT_COMPLETE}
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"} <= set(files)
    recorded = json.loads((checkpoint / CHECKPOINT_COMPLETE).read_text())["files"]
    assert recorded == {name: {"size": p.stat().st_size, "crc32": zlib.crc32(p.read_bytes())}
                        for name, p in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
                                  "training_args.bin"])
def test_flipped_byte_in_a_real_checkpoint_is_skipped(tmp_path, trained, caplog, name):
    out = checkpoints_of(trained, tmp_path / "out")
    flip_a_byte(out / "checkpoint-2" / name)
    assert_skipped_and_refused(out, f"{name}: crc mismatch", caplog)


@pytest.mark.slow
@pytest.mark.parametrize("old_mark", [False, True], ids=["mark", "old-mark-sizes-only"])
def test_trainer_state_not_json_is_skipped(tmp_path, trained, caplog, old_mark):
    """trainer_state.json replaced by non-JSON of the same size: skipped as 'not valid JSON' (also under a mark
    with sizes but no crc32s, as older checkpoints have)."""
    out = checkpoints_of(trained, tmp_path / "out")
    if old_mark:
        strip_crcs(out / "checkpoint-2")
    not_json_same_size(out / "checkpoint-2" / "trainer_state.json")
    assert_skipped_and_refused(out, "trainer_state.json: not valid JSON", caplog)


@pytest.mark.slow
def test_auto_resume_passes_over_a_non_json_trainer_state(tmp_path, trained, capsys, caplog):
    """A requeued `auto` run whose latest checkpoint has a non-JSON trainer_state.json resumes from checkpoint-1
    and finishes (no JSONDecodeError traceback); its new checkpoint-2 is whole again."""
    from hf_sentcl.cli.train import main

    values, _ = trained
    out = checkpoints_of(trained, tmp_path / "out")
    not_json_same_size(out / "checkpoint-2" / "trainer_state.json")
    recipe = write_recipe(tmp_path / "recipe.yaml", **values, output_dir=out)
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        assert main([str(recipe), "--resume_from_checkpoint", "auto"]) == 0
    assert "trainer_state.json: not valid JSON" in caplog.text
    assert "JSONDecodeError" not in capsys.readouterr().err
    assert checkpoint_problems(out / "checkpoint-2") == []


def strip_crcs(checkpoint: Path) -> None:
    """The mark as older checkpoints have it: every file with its size, no crc32 (except the *.safetensors')."""
    mark = json.loads((checkpoint / CHECKPOINT_COMPLETE).read_text())
    for name, entry in mark["files"].items():
        if not name.endswith(".safetensors"):
            entry.pop("crc32", None)
    (checkpoint / CHECKPOINT_COMPLETE).write_text(json.dumps(mark))


@pytest.mark.slow
def test_an_older_mark_with_sizes_only_still_works(tmp_path, trained):
    """A mark with sizes and no crc32s: the checkpoint is usable; a cut-short optimizer.pt is still caught by its
    size."""
    out = checkpoints_of(trained, tmp_path / "out")
    strip_crcs(out / "checkpoint-2")
    assert checkpoint_problems(out / "checkpoint-2") == []
    optimizer = out / "checkpoint-2" / "optimizer.pt"
    size = optimizer.stat().st_size
    optimizer.write_bytes(optimizer.read_bytes()[:-10])
    assert checkpoint_problems(out / "checkpoint-2") == [f"optimizer.pt: truncated: {size - 10:,} of {size:,} bytes"]


# ------------------------------------------------------------------------------------------------ DeepSpeed's layout
DEEPSPEED_STATES = ("mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                    "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")


def deepspeed_checkpoint(folder: Path, step: int) -> Path:
    """A checkpoint folder laid out as the Trainer writes one under DeepSpeed ZeRO (2 processes), its binary files
    random bytes, with the completion mark."""
    states = folder / f"global_step{step}"
    states.mkdir(parents=True)
    rng = __import__("random").Random(step)
    for name in DEEPSPEED_STATES:
        (states / name).write_bytes(rng.randbytes(4096))
    for name in ("rng_state_0.pth", "rng_state_1.pth", "scheduler.pt"):
        (folder / name).write_bytes(rng.randbytes(1024))
    (folder / "latest").write_text(f"global_step{step}")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    write_completion_mark(folder, step)
    return folder


@pytest.mark.parametrize("name", DEEPSPEED_STATES[:2])
def test_flipped_byte_in_deepspeed_states_is_skipped(tmp_path, caplog, name):
    out = tmp_path / "out"
    for step in (1, 2):
        deepspeed_checkpoint(out / f"checkpoint-{step}", step)
    assert checkpoint_problems(out / "checkpoint-2") == []
    flip_a_byte(out / "checkpoint-2" / "global_step2" / name)
    assert_skipped_and_refused(out, f"global_step2/{name}: crc mismatch", caplog)
