"""The layer x pooling study: every cell against the encoder configured for that layer and pooling, one backbone
forward per batch, and `hf-sentcl analyze layers` writing its CSV and heatmap."""

import csv
import math

import numpy as np
import pytest
import torch

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.analyze import main
from hf_sentcl.evaluation.layers import LAYER_POOLINGS, best_cell, layer_pooling_scores, pool_every_layer
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.modeling.pooling import masked_max, masked_mean

TINY_LAYERS = 2  # tests/helpers.py TINY_DIMS


def test_pool_every_layer_by_hand():
    """Cell (k, j) is hidden state k pooled with LAYER_POOLINGS[j]: [CLS] row, mean and max over real tokens."""
    torch.manual_seed(0)
    states = tuple(torch.randn(2, 4, 3) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = pool_every_layer(states, mask)
    assert out.shape == (2, 3, len(LAYER_POOLINGS), 3)
    for k, state in enumerate(states):
        for i in range(2):
            real = state[i, : int(mask[i].sum())]
            torch.testing.assert_close(out[i, k, 0], state[i, 0])
            torch.testing.assert_close(out[i, k, 1], real.mean(dim=0))
            torch.testing.assert_close(out[i, k, 2], real.max(dim=0).values)
    torch.testing.assert_close(out[:, 1, 1], masked_mean(states[1], mask))
    torch.testing.assert_close(out[:, 2, 2], masked_max(states[2], mask))


@pytest.mark.slow
def test_every_cell_matches_the_configured_encoder(tiny_bert_dir, senteval_dir):
    """Each cell equals the STS-B score of an encoder set to that pooling_layer and pooling (an independent path
    through SentenceEncoder.forward); [CLS] of the embedding layer is the same vector for every sentence: NaN."""
    evaluator = STSEvaluator(senteval_dir, tasks=("STSBenchmark",), split="dev")
    encoder = SentenceEncoder.load(str(tiny_bert_dir))
    scores = layer_pooling_scores(encoder, evaluator, batch_size=8)
    assert scores.shape == (TINY_LAYERS + 1, len(LAYER_POOLINGS))
    assert math.isnan(scores[0, 0])
    for k in range(TINY_LAYERS + 1):
        for j, mode in enumerate(LAYER_POOLINGS):
            if (k, mode) == (0, "cls"):
                continue
            reference = SentenceEncoder.load(str(tiny_bert_dir), pooling=mode, pooling_layer=k)
            assert scores[k, j] == pytest.approx(evaluator(reference)["STSBenchmark"], abs=1e-4), (k, mode)
    assert best_cell(scores, LAYER_POOLINGS)[2] == pytest.approx(np.nanmax(scores))


def test_one_backbone_forward_per_batch(tiny_bert_dir, senteval_dir):
    """All layers and poolings come from a single forward pass of the backbone per batch."""
    evaluator = STSEvaluator(senteval_dir, tasks=("STSBenchmark",), split="test")
    encoder = SentenceEncoder.load(str(tiny_bert_dir))
    calls = []
    handle = encoder.backbone.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    try:
        layer_pooling_scores(encoder, evaluator, batch_size=4)
    finally:
        handle.remove()
    assert len(calls) == math.ceil(len(evaluator.sentences()) / 4)


def test_layers_command_writes_csv_and_heatmap(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    """The CLI writes a CSV with one row per hidden state 0..l and one column per pooling ((l + 1) x 3 cells)
    and a PNG heatmap, and prints the best cell."""
    out = tmp_path / "study"
    argv = ["layers", "--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), "--split", "test",
            "--output-dir", str(out), "--device", "cpu", "--batch-size", "8"]
    assert main(argv) == 0
    with (out / "layers_test.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["layer", *LAYER_POOLINGS]
    assert [r[0] for r in rows[1:]] == [str(k) for k in range(TINY_LAYERS + 1)]
    cells = [float(v) for r in rows[1:] for v in r[1:]]
    assert len(cells) == (TINY_LAYERS + 1) * 3
    assert all(math.isnan(v) or -100 <= v <= 100 for v in cells)
    png = out / "layers_test.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "Best cell: hidden state" in capsys.readouterr().out


def test_layers_command_without_data(tmp_path, tiny_bert_dir, monkeypatch, capsys):
    """No data directory: exit 2 with the how-to message."""
    monkeypatch.delenv("HF_SENTCL_DATA", raising=False)
    assert main(["layers", "--model", str(tiny_bert_dir), "--output-dir", str(tmp_path)]) == 2
    assert "HF_SENTCL_DATA" in capsys.readouterr().err


def test_layers_command_refuses_an_unwritable_output_dir_before_loading(tmp_path, senteval_dir, capsys):
    """--output-dir under a file: exit 2 naming the option, before the model loads (this model does not exist)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["layers", "--model", str(tmp_path / "no-model"), "--data-dir", str(senteval_dir),
            "--output-dir", str(blocker / "study")]
    assert main(argv) == 2
    assert "--output-dir: cannot write into" in capsys.readouterr().err
