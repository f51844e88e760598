"""Run plots: training curves, the STS-B gold-vs-cosine scatter, the layer heatmap; and a tiny training run that
writes them (with STS and transfer evaluation) into its output directory, its export and its model card."""

import functools
import json

import numpy as np
import pytest
from helpers import FakeEncoder, random_sentences, write_full_senteval, write_recipe, write_stsb, write_transfer_tasks
from PIL import Image

from hf_sentcl.cli.train import main as run_main
from hf_sentcl.evaluation.plots import (
    STS_SCATTER,
    TRAINING_CURVES,
    plot_layer_heatmap,
    plot_sts_scatter,
    plot_training_curves,
    stsb_predictions,
)
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.evaluation.suites import EvaluationSuites

HISTORY = (
    [{"loss": 2.0 - 0.1 * s, "learning_rate": 1e-3, "step": s} for s in range(1, 11)]
    + [{"eval_stsb_spearman": 60.0 + s, "eval_alignment": 0.5 - s / 100, "eval_uniformity": -2 - s / 10, "step": s}
       for s in (5, 10)]
    + [{"train_runtime": 3.0, "train_loss": 1.5, "step": 10}]
)


def width(path):
    with Image.open(path) as image:
        return image.size[0]


@pytest.mark.slow
def test_training_curves_panels_follow_the_log(tmp_path):
    """Loss, dev Spearman and alignment/uniformity give three panels; a loss-only log one; an empty log none."""
    full = plot_training_curves(HISTORY, tmp_path / "full.png")
    loss_only = plot_training_curves([e for e in HISTORY if "loss" in e], tmp_path / "loss.png")
    assert full.is_file() and loss_only.is_file()
    assert width(full) > 2.5 * width(loss_only)
    assert plot_training_curves([{"train_runtime": 1.0, "step": 3}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_stsb_predictions_by_hand(tmp_path):
    """Gold scores in file order and cosine similarities of each pair's vectors, from the evaluator's embeddings."""
    rows = [("a b", "c d", 1.0), ("e f", "g h", 4.5), ("a b", "g h", 2.25)]
    write_stsb(tmp_path, "test", rows)
    vectors = {"a b": np.array([1.0, 0.0]), "c d": np.array([1.0, 1.0]), "e f": np.array([0.0, 2.0]),
               "g h": np.array([-1.0, 0.0])}
    evaluator = STSEvaluator(tmp_path, tasks=("STSBenchmark",))
    predictions = stsb_predictions(evaluator, evaluator.embed(FakeEncoder(vectors)))
    assert predictions["gold"] == [1.0, 4.5, 2.25]
    np.testing.assert_allclose(predictions["cosine"], [1 / np.sqrt(2), 0.0, -1.0])
    with pytest.raises(ValueError, match="STS12"):
        stsb_predictions(evaluator, np.zeros((4, 2)), task="STS12")


@pytest.mark.slow
def test_scatter_and_heatmap_files(tmp_path):
    """The scatter has a panel per label; nothing to draw gives None; a heatmap needs one column per pooling."""
    rng = np.random.default_rng(0)
    values = {"gold": rng.uniform(0, 5, 50).tolist(), "cosine": rng.uniform(-1, 1, 50).tolist()}
    one = plot_sts_scatter({"after training": values}, tmp_path / "one.png")
    two = plot_sts_scatter({"before training": values, "after training": values}, tmp_path / "two.png")
    assert width(two) > 1.6 * width(one)
    assert plot_sts_scatter({}, tmp_path / "empty.png") is None
    heatmap = plot_layer_heatmap(np.array([[np.nan, 50.0, 60.0], [40.0, 70.0, 65.0]]), ("cls", "mean", "max"),
                                 tmp_path / "heat.png")
    assert heatmap.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="shape"):
        plot_layer_heatmap(np.zeros((2, 2)), ("cls", "mean", "max"), tmp_path / "bad.png")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("senteval-run")
    write_full_senteval(root)
    return write_transfer_tasks(root)


@pytest.mark.slow
def test_tiny_run_writes_plots_transfer_and_card(tmp_path, tiny_bert_dir, data_dir, monkeypatch):
    """A 6-step SimCSE run with eval_tasks [sts, transfer]: plots in output_dir/plots and copied into the export,
    shown in the model card next to the before/after transfer table; results.json lists the plots and holds the
    transfer rows and details. (The probes use 3 folds here instead of 10 to keep the test fast.)"""
    monkeypatch.setattr("hf_sentcl.pipeline.train.EvaluationSuites", functools.partial(EvaluationSuites, kfold=3))
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(24, seed=3)) + "\n")
    out = tmp_path / "out"
    recipe = write_recipe(
        tmp_path, method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(data_dir), output_dir=str(out), per_device_train_batch_size=4, max_seq_length=16,
        eval_steps=2, save_steps=2, logging_steps=1, learning_rate="1e-3", use_cpu=True, seed=0,
        eval_tasks=["sts", "transfer"],
    )
    assert run_main([str(recipe)]) == 0

    results = json.loads((out / "results.json").read_text())
    assert results["plots"] == {TRAINING_CURVES: f"plots/{TRAINING_CURVES}", STS_SCATTER: f"plots/{STS_SCATTER}"}
    for name in (TRAINING_CURVES, STS_SCATTER):
        assert (out / "plots" / name).read_bytes()[:4] == b"\x89PNG"
        assert (out / "export" / "plots" / name).read_bytes() == (out / "plots" / name).read_bytes()
    assert set(results["transfer"]) == {"before", "after"}
    assert set(results["transfer"]["after"]) == {"MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC", "MRPC_F1", "Avg"}
    assert results["transfer_details"]["after"]["MR"]["ntrain"] == 24

    card = (out / "export" / "README.md").read_text()
    assert f"](plots/{TRAINING_CURVES})" in card and f"](plots/{STS_SCATTER})" in card
    assert "### Transfer tasks" in card and "| before training |" in card and "| after training |" in card
    assert "| SST-2 |" in (out / "results.md").read_text()
