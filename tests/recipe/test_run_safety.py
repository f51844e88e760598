"""Run safety: run-folder checks before the model loads (exit 2, key named), a non-finite loss or a collapsed
model stops the run with nothing exported, results.json never holds NaN, `evaluate --output` is probed first."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from helpers import random_sentences

from hf_sentcl.cli.evaluate import main as evaluate_main
from hf_sentcl.cli.train import main
from hf_sentcl.evaluation.report import write_results
from hf_sentcl.methods.simcse.trainer import SimCSETrainer
from hf_sentcl.modeling.health import TrainingFailure, check_final_model, check_finite_loss


def write_recipe(path, **values):
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


@pytest.fixture
def values(tmp_path, tiny_bert_dir, senteval_dir):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=2)) + "\n")
    return dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        output_dir=tmp_path / "out", per_device_train_batch_size=4, max_seq_length=16, max_steps=2, save_steps=2,
        eval_steps=2, use_cpu="true", eval_before_training="false", eval_tasks="[]",
    )


def snapshot(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def no_model_load(monkeypatch):
    """Fail the test if the run gets as far as building the encoder."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr("hf_sentcl.pipeline.train.build_encoder", refuse)


@pytest.mark.parametrize("entry", ["results.json", "model.safetensors", "checkpoint-4", "export"])
def test_rerun_into_finished_run_refused(tmp_path, values, capsys, monkeypatch, entry):
    """An output_dir holding a run (results, model, checkpoint or export): exit 2 naming output_dir and the way
    out, before the model loads, and nothing in the folder changed."""
    out = values["output_dir"]
    target = out / entry
    target.parent.mkdir(parents=True)
    target.mkdir() if "." not in entry else target.write_text("{}")
    before = snapshot(out)
    no_model_load(monkeypatch)
    assert main([str(write_recipe(tmp_path / "r.yaml", **values))]) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "already holds a run" in err and "overwrite_output_dir" in err
    assert snapshot(out) == before


@pytest.mark.slow
def test_overwrite_output_dir_replaces_run(tmp_path, values):
    """overwrite_output_dir: true trains into the folder; the old run's checkpoints are removed first."""
    out = values["output_dir"]
    (out / "checkpoint-99").mkdir(parents=True)
    (out / "results.json").write_text("{}")
    assert main([str(write_recipe(tmp_path / "r.yaml", **values, overwrite_output_dir="true"))]) == 0
    assert not (out / "checkpoint-99").exists()
    assert json.loads((out / "results.json").read_text())["method"] == "simcse"


def test_unwritable_output_dir_refused(tmp_path, values, capsys, monkeypatch):
    """An output_dir that cannot be created (under a file): exit 2 naming the key, before the model loads."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    no_model_load(monkeypatch)
    recipe = write_recipe(tmp_path / "r.yaml", **{**values, "output_dir": blocker / "out"})
    assert main([str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "cannot write" in err and "Traceback" not in err


def test_output_dir_without_room_for_a_checkpoint_refused(tmp_path, values, capsys, monkeypatch, tiny_bert_dir):
    """A disk that cannot hold one checkpoint (weights + Adam's moments), the encoder and its export: exit 2 naming
    output_dir and both sizes, before the model loads (a full disk used to cost every step at the first save)."""
    weights = sum(p.stat().st_size for p in tiny_bert_dir.glob("*.safetensors"))
    free = 4 * weights  # one checkpoint (3x) + encoder + export = 5x the weights
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=free))
    no_model_load(monkeypatch)
    assert main([str(write_recipe(tmp_path / "r.yaml", **values))]) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and f"{free / 2**20:.0f} MiB free" in err and f"{5 * weights / 2**20:.0f} MiB" in err
    assert not values["output_dir"].exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=5 * weights))
    monkeypatch.setattr("hf_sentcl.pipeline.train.build_encoder",
                        lambda recipe: (_ for _ in ()).throw(RuntimeError("loaded")))
    with pytest.raises(RuntimeError, match="loaded"):  # enough room: the check passes and the run goes on
        main([str(write_recipe(tmp_path / "r.yaml", **values))])


@pytest.mark.parametrize("how", ["latest", "true", "nowhere"])
def test_resume_without_checkpoint_refused(tmp_path, values, capsys, monkeypatch, how):
    """`latest`/`true` with no complete checkpoint, or a path that does not exist: exit 2 naming the key."""
    no_model_load(monkeypatch)
    target = how if how != "nowhere" else str(tmp_path / "nowhere" / "checkpoint-3")
    assert main([str(write_recipe(tmp_path / "r.yaml", **values)), "--resume_from_checkpoint", target]) == 2
    err = capsys.readouterr().err
    assert "resume_from_checkpoint" in err and ("no complete" in err or "does not exist" in err)
    assert not values["output_dir"].exists() or not any(values["output_dir"].iterdir())


@pytest.mark.slow
def test_nonfinite_loss_stops_training_and_exports_nothing(tmp_path, values, capsys, monkeypatch):
    """A loss that turns NaN at the first step: exit 1 with the step named; no checkpoint, model, export or
    results written."""
    original = SimCSETrainer.contrastive_loss

    def nan_loss(self, views, *rest):  # rest: the text groups of the false-negative mask
        loss, components = original(self, views, *rest)
        return loss * float("nan"), components

    monkeypatch.setattr(SimCSETrainer, "contrastive_loss", nan_loss)
    assert main([str(write_recipe(tmp_path / "r.yaml", **values))]) == 1
    err = capsys.readouterr().err
    assert "training loss is nan at step 1" in err
    out = values["output_dir"]
    assert not any(p.name.startswith("checkpoint-") or p.name in ("export", "results.json", "model.safetensors")
                   for p in out.iterdir())


def test_check_finite_loss():
    check_finite_loss(torch.tensor(1.5), 0)
    for bad in (math.nan, math.inf):
        with pytest.raises(TrainingFailure, match="step 4"):
            check_finite_loss(torch.tensor(bad), 3)


def test_collapsed_or_nonfinite_model_refused():
    """Identical embeddings (collapse), NaN embeddings and NaN weights are refused; spread-out ones pass."""
    model = torch.nn.Linear(3, 3)
    rng = np.random.default_rng(0)
    check_final_model(model, rng.normal(size=(50, 8)))
    with pytest.raises(TrainingFailure, match="collapsed"):
        check_final_model(model, np.ones((50, 8)) + 1e-7 * rng.normal(size=(50, 8)))
    with pytest.raises(TrainingFailure, match="not finite"):
        check_final_model(model, np.full((50, 8), np.nan))
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(TrainingFailure, match="non-finite weights.*weight"):
        check_final_model(model, rng.normal(size=(50, 8)))


def test_results_json_refuses_nan(tmp_path):
    """results.json is strict JSON: a NaN score raises instead of writing a bare NaN."""
    with pytest.raises(ValueError):
        write_results(tmp_path, {"sts": {"STSBenchmark": float("nan")}}, "table")
    assert not (tmp_path / "results.json").exists() or "NaN" not in (tmp_path / "results.json").read_text()


def test_evaluate_output_checked_before_encoding(tmp_path, senteval_dir, capsys, monkeypatch):
    """evaluate --output into a folder that cannot be written: exit 2 naming --output, before the model loads."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr("hf_sentcl.modeling.SentenceEncoder.load", refuse)
    code = evaluate_main(["--model", "any", "--data-dir", str(senteval_dir), "--output", str(blocker / "r.json")])
    assert code == 2
    assert "--output" in capsys.readouterr().err
