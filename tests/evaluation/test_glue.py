"""GLUE fine-tuning: the metrics against hand computations, the SentEval copies of SST-2 / MRPC / STS-B, a tiny
model fine-tuned on a tiny task, the CLI and the `glue` evaluation suite."""

import json
import math

import numpy as np
import pytest
from helpers import random_sentences, write_tiny_glue

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.glue import main
from hf_sentcl.common.stats import seed_stats
from hf_sentcl.evaluation.glue import (
    GLUE_TASKS,
    MRPC_DEV_SIZE,
    GlueEvaluator,
    GlueSettings,
    accuracy_and_f1,
    check_tasks,
    load_senteval_glue,
    matthews,
    pearson_and_spearman,
)


# ------------------------------------------------------------------------------------------------ metrics
def test_accuracy_and_f1_by_hand():
    labels = np.array([1, 1, 0, 0, 1, 0])
    predicted = np.array([1, 0, 0, 1, 1, 0])
    tp, fp, fn = 2, 1, 1
    f1 = 2 * tp / (2 * tp + fp + fn)
    metrics = accuracy_and_f1(labels, predicted)
    assert metrics["accuracy"] == pytest.approx(100 * 4 / 6)
    assert metrics["f1"] == pytest.approx(100 * f1)
    assert metrics["score"] == pytest.approx((100 * 4 / 6 + 100 * f1) / 2)


def test_matthews_by_hand():
    labels = np.array([1, 1, 1, 0, 0, 0, 1, 0])
    predicted = np.array([1, 1, 0, 0, 0, 1, 1, 0])
    tp, tn, fp, fn = 3, 3, 1, 1
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews(labels, predicted)["matthews"] == pytest.approx(100 * mcc)


def test_pearson_and_spearman_by_hand():
    gold = np.array([0.0, 1.0, 2.5, 4.0, 5.0])
    predicted = np.array([0.1, 0.5, 0.4, 0.9, 1.0])
    gc, pc = gold - gold.mean(), predicted - predicted.mean()
    pearson = (gc @ pc) / math.sqrt((gc @ gc) * (pc @ pc))
    ranks = np.array([1, 3, 2, 4, 5], dtype=float) - 3  # predicted's ranks, centred; gold's are 1..5
    spearman = (ranks @ (np.arange(1, 6) - 3)) / (ranks @ ranks)
    metrics = pearson_and_spearman(gold, predicted)
    assert metrics["pearson"] == pytest.approx(100 * pearson)
    assert metrics["spearman"] == pytest.approx(100 * spearman)
    assert metrics["score"] == pytest.approx(50 * (pearson + spearman))


def test_task_score_and_seed_stats():
    assert GLUE_TASKS["sst2"].score(np.array([1, 0]), np.array([1, 1]))["score"] == 50.0
    assert GLUE_TASKS["cola"].score(np.array([1, 0, 1, 0]), np.array([1, 0, 1, 0]))["score"] == pytest.approx(100)
    stats = seed_stats([80.0, 82.0, 84.0])
    assert stats["mean"] == 82.0 and stats["std"] == pytest.approx(2.0) and seed_stats([1.0])["std"] is None


def test_unknown_tasks_and_sources_are_named():
    with pytest.raises(ValueError, match="sst3"):
        check_tasks(["sst3"], "senteval")
    with pytest.raises(ValueError, match="cola.*hub"):
        check_tasks(["cola"], "senteval")
    with pytest.raises(ValueError, match="source"):
        check_tasks(["cola"], "web")
    check_tasks(["cola", "mnli"], "hub")


# ------------------------------------------------------------------------------------------------ data
@pytest.mark.slow
def test_senteval_copies(real_data_dir):
    """SST-2 and STS-B: GLUE's train/dev sizes; MRPC: a seeded 408-pair dev split of the train file."""
    sst2 = load_senteval_glue(real_data_dir, "sst2")
    assert (len(sst2.train), len(sst2.dev["validation"])) == (67349, 872)
    assert set(sst2.train["label"]) == {0, 1}
    stsb = load_senteval_glue(real_data_dir, "stsb")
    assert (len(stsb.train), len(stsb.dev["validation"])) == (5749, 1500)
    mrpc = load_senteval_glue(real_data_dir, "mrpc")
    assert (len(mrpc.train), len(mrpc.dev["validation"])) == (4076 - MRPC_DEV_SIZE, MRPC_DEV_SIZE)
    again = load_senteval_glue(real_data_dir, "mrpc")
    assert again.dev["validation"]["sentence1"] == mrpc.dev["validation"]["sentence1"]


@pytest.mark.slow
def test_tiny_model_fine_tunes_on_a_tiny_task(tmp_path, tiny_bert_dir):
    """SST-2-shaped task whose label is a word in the sentence: the loss falls below chance and the dev accuracy
    is well above it; the encoder passed in is not changed; two seeds give mean and std."""
    data = write_tiny_glue(tmp_path / "data")
    settings = GlueSettings(tasks=("sst2",), seeds=(1, 2), epochs=15, learning_rate=1e-3, batch_size=8)
    encoder = SentenceEncoder.load(str(tiny_bert_dir))
    before = {k: v.clone() for k, v in encoder.backbone.state_dict().items()}
    results = GlueEvaluator(data, settings)(encoder, device="cpu")
    runs = results["sst2"]["runs"]
    assert [r["seed"] for r in runs] == [1, 2]
    assert all(r["train_loss"] < math.log(2) for r in runs)
    assert results["sst2"]["score"]["mean"] >= 75.0 and results["sst2"]["score"]["std"] is not None
    assert all(np.array_equal(v, before[k]) for k, v in encoder.backbone.state_dict().items())


@pytest.mark.slow
def test_regression_task_and_cli(tmp_path, tiny_bert_dir, capsys):
    data = write_tiny_glue(tmp_path / "data")
    output = tmp_path / "glue.json"
    argv = ["--model", str(tiny_bert_dir), "--tasks", "stsb,mrpc", "--data-dir", str(data), "--epochs", "1",
            "--batch-size", "16", "--max-train-samples", "16", "--device", "cpu", "--output", str(output)]
    assert main(argv) == 0
    results = json.loads(output.read_text())
    assert set(results["tasks"]) == {"stsb", "mrpc"} and results["settings"]["max_train_samples"] == 16
    assert {"pearson", "spearman", "score"} <= set(results["tasks"]["stsb"]["runs"][0]["metrics"])
    assert results["tasks"]["mrpc"]["train_examples"] == 16
    assert "| stsb | mrpc | Avg |" in output.with_suffix(".md").read_text()
    assert main(["--model", str(tiny_bert_dir), "--tasks", "cola", "--data-dir", str(data)]) == 2
    assert "cola" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_log_has_no_bars_without_a_terminal(tmp_path, tiny_bert_dir, capfd):
    """Into a log file (stderr not a terminal) the command writes lines, not redrawn bars: no weight-loading,
    tokenising or training bars (each of the 9 fine-tunings of a real run would add several)."""
    import datasets
    import transformers

    datasets.enable_progress_bars()  # as in a fresh process, whatever earlier tests turned off
    transformers.utils.logging.enable_progress_bar()
    data = write_tiny_glue(tmp_path / "data")
    argv = ["--model", str(tiny_bert_dir), "--tasks", "sst2", "--data-dir", str(data), "--epochs", "1",
            "--max-train-samples", "16", "--device", "cpu"]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    assert "| sst2 | Avg |" in out
    assert not [mark for mark in ("\r", "\x1b[A", "it/s]", "examples/s]") if mark in err], err[-2000:]


def test_glue_suite_fine_tunes_where_the_encoder_is(tmp_path, tiny_bert_dir, monkeypatch):
    """`evaluate --tasks glue --device cpu` on a GPU machine: the suite passes the encoder's device to the fine-tuning
    (it passed none, and GLUE fine-tuned on the GPU)."""
    from hf_sentcl.evaluation.suites import EvaluationSuites

    devices = []
    monkeypatch.setattr(GlueEvaluator, "__call__", lambda self, encoder, device=None: devices.append(device) or {})
    suites = EvaluationSuites(write_tiny_glue(tmp_path / "data"), ["glue"], glue=GlueSettings(tasks=("sst2",)))
    suites(SentenceEncoder.load(str(tiny_bert_dir)).to("cpu"))
    assert devices == ["cpu"]


def test_cli_refuses_an_unwritable_output_before_fine_tuning(tmp_path, capsys):
    """--output under a file: exit 2 naming the option, before the model loads (this model does not exist)."""
    data = write_tiny_glue(tmp_path / "data")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["--model", str(tmp_path / "no-model"), "--tasks", "sst2", "--data-dir", str(data),
            "--output", str(blocker / "glue.json")]
    assert main(argv) == 2
    assert "--output: cannot write into" in capsys.readouterr().err


@pytest.mark.slow
def test_glue_suite_after_training(tmp_path, tiny_bert_dir):
    """eval_tasks [sts, glue]: the run fine-tunes the untouched and the trained backbone on the GLUE tasks and
    writes both into results.json; bad glue_* keys are refused before any model loads."""
    from helpers import write_full_senteval

    from hf_sentcl.pipeline.train import run
    from hf_sentcl.recipe.checks import validate_recipe
    from hf_sentcl.recipe.parser import RecipeError, parse_recipe

    data = write_full_senteval(tmp_path / "data")
    write_tiny_glue(tmp_path / "glue")
    (data / "SST").symlink_to(tmp_path / "glue" / "SST")
    train = tmp_path / "train.txt"
    train.write_text("\n".join(random_sentences(16, seed=5)) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\npooling: cls\ntrain_file: {train}\n"
        f"sts_data_dir: {data}\noutput_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 8\nmax_steps: 2\n"
        "eval_strategy: 'no'\nsave_strategy: 'no'\nload_best_model_at_end: false\nuse_cpu: true\n"
        "eval_tasks: [sts, glue]\nglue_tasks: [sst2]\nglue_epochs: 1\nglue_max_train_samples: 16\n"
    )
    results = run(parse_recipe(recipe))
    assert set(results["glue"]) == {"before", "after"}
    assert results["glue"]["after"]["sst2"]["train_examples"] == 16
    assert "| sst2 | Avg |" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(RecipeError, match="glue"):
        validate_recipe(parse_recipe(recipe, ["--glue_tasks", "cola"]))
