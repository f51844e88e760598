"""Exact resume with the default settings, one process: a run resumed from its checkpoint trains only the remaining
steps and ends with the same weights as the uninterrupted run (dropout on: the RNG states are restored too), a
checkpoint with nudged weights ends elsewhere, a half-written checkpoint is never taken as the latest, and the loss
curve covers the whole run.

The "crash" is a copy of the uninterrupted run's folder cut back to a checkpoint (deterministic and fast); the
real stops (SIGTERM/SIGUSR1 in each phase, SIGKILL), with one and two processes (the stop in a save with two), are
tests/pipeline/test_preemption.py (DDP among them); ZeRO-2 and ZeRO-3 are tests/pipeline/test_scaling.py."""

import json
import shutil

import pytest
import torch
from helpers import random_sentences
from launching import cut_back, nudge_checkpoint
from safetensors.torch import load_file

from hf_sentcl.cli.train import main
from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE


def write_recipe(path, **values):
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in values.items()))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_bert_dir, senteval_dir):
    """A 6-step SimCSE run (the backbone's dropout on) keeping every checkpoint (2, 4, 6); returns (recipe values,
    output)."""
    root = tmp_path_factory.mktemp("resume")
    corpus = root / "train.txt"
    corpus.write_text("\n".join(random_sentences(24, seed=5)) + "\n")
    values = dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        output_dir=root / "full", per_device_train_batch_size=4, max_seq_length=16, max_steps=6, save_steps=2,
        eval_steps=2, logging_steps=1, learning_rate="1e-3", use_cpu="true", seed=0, save_total_limit=None,
        eval_before_training="false", eval_tasks="[]", load_best_model_at_end="false",
    )
    assert main([str(write_recipe(root / "recipe.yaml", **values))]) == 0
    return values, root / "full"


def crashed_copy(full, destination, keep_step):
    """`full` as a run killed after checkpoint-`keep_step`: later checkpoints, results and model removed."""
    return cut_back(shutil.copytree(full, destination), keep_step)


def resume(tmp_path, values, output, how):
    recipe = write_recipe(tmp_path / "recipe.yaml", **{**values, "output_dir": output})
    return main([str(recipe), "--resume_from_checkpoint", str(how)])


def assert_same_weights(a, b):
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


@pytest.mark.slow
def test_default_checkpoints_hold_optimizer_scheduler_rng_and_mark(uninterrupted):
    _, full = uninterrupted
    names = {p.name for p in (full / "checkpoint-2").iterdir()}
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", CHECKPOINT_COMPLETE} <= names


@pytest.mark.slow
@pytest.mark.parametrize("how", ["path", "latest", "true"])
def test_resume_is_bit_identical(tmp_path, uninterrupted, how):
    """Resumed from checkpoint-4 (by path, `latest` or `true`): the same final weights bit for bit, and the
    results' loss_curve holds every step 1..6 with the uninterrupted run's values."""
    values, full = uninterrupted
    out = crashed_copy(full, tmp_path / "out", keep_step=4)
    assert resume(tmp_path, values, out, out / "checkpoint-4" if how == "path" else how) == 0
    assert_same_weights(full, out)
    train = json.loads((out / "results.json").read_text())["train"]
    assert (train["started_at_step"], train["steps_run"], train["global_step"]) == (4, 2, 6)  # steps 5-6 only
    curve = train["loss_curve"]
    reference = json.loads((full / "results.json").read_text())["train"]["loss_curve"]
    assert [e["step"] for e in curve] == list(range(1, 7))
    assert [e["loss"] for e in curve] == [e["loss"] for e in reference]


@pytest.mark.slow
def test_resume_starts_from_the_checkpoints_weights(tmp_path, uninterrupted):
    """The same checkpoint-4 with every weight moved by 1e-3 ends elsewhere: the resumed run trains from the
    checkpoint's weights (not from the backbone it names, nor from an earlier save)."""
    values, full = uninterrupted
    out = crashed_copy(full, tmp_path / "out", keep_step=4)
    assert nudge_checkpoint(out / "checkpoint-4") > 0
    assert resume(tmp_path, values, out, "latest") == 0
    a, b = load_file(full / "model.safetensors"), load_file(out / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-4


@pytest.mark.slow
def test_half_written_checkpoint_is_not_latest(tmp_path, uninterrupted):
    """checkpoint-4 without its completion mark (cut off while written): `latest` resumes from checkpoint-2 and
    still ends bit-identical; the half-written folder is not taken."""
    values, full = uninterrupted
    out = crashed_copy(full, tmp_path / "out", keep_step=4)
    (out / "checkpoint-4" / CHECKPOINT_COMPLETE).unlink()
    (out / "checkpoint-4" / "optimizer.pt").write_bytes(b"trunc")
    assert resume(tmp_path, values, out, "latest") == 0
    assert_same_weights(full, out)


@pytest.mark.slow  # its fixture trains the uninterrupted run
def test_incomplete_checkpoint_path_refused(tmp_path, uninterrupted, capsys):
    """A named checkpoint that lacks files: exit 2 naming the key and the missing files, nothing written."""
    values, full = uninterrupted
    out = crashed_copy(full, tmp_path / "out", keep_step=2)
    (out / "checkpoint-2" / "scheduler.pt").unlink()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert resume(tmp_path, values, out, out / "checkpoint-2") == 2
    err = capsys.readouterr().err
    assert "resume_from_checkpoint" in err and "scheduler.pt" in err and "Traceback" not in err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
