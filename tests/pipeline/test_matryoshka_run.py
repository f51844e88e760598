"""A Matryoshka run end to end: per-size STS before and after training in results.json and the report, the saved
encoder keeps its sizes, and the export loads in sentence-transformers at a smaller size with the same vectors."""

import json

import numpy as np
import pytest
from helpers import random_sentences, write_recipe

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main
from hf_sentcl.evaluation.sts import STS_TASKS

pytestmark = pytest.mark.slow


def test_matryoshka_run_scores_and_exports_every_size(tmp_path, tiny_bert_dir, senteval_dir):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(24, seed=3)) + "\n")
    out = tmp_path / "out"
    values = dict(
        method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus), sts_data_dir=str(senteval_dir),
        output_dir=str(out), pooling="mean", head="none", per_device_train_batch_size=4, max_seq_length=16,
        max_steps=4, eval_strategy="no", save_strategy="no", load_best_model_at_end=False, learning_rate="1e-3",
        use_cpu=True, seed=0, matryoshka_dims=["32", "16", "8"],
    )
    assert main([str(write_recipe(tmp_path, **values))]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["sts_by_dim"]) == {"before", "after"}
    for label, by_dim in results["sts_by_dim"].items():
        assert set(by_dim) == {"16", "8"}  # the full size (32) is the main table's row
        assert set(by_dim["8"]) == set(STS_TASKS) | {"Avg"}
        assert by_dim["8"] != results["sts"][label]
    assert "| after training, first 8 dims |" in (out / "results.md").read_text()

    encoder = SentenceEncoder.from_pretrained(out)
    assert encoder.config.matryoshka_dims == [32, 16, 8]
    export = out / "export"
    card = (export / "README.md").read_text()
    assert "Smaller embeddings (Matryoshka)" in card and "truncate_dim=8" in card and "first 16 dims" in card

    from sentence_transformers import SentenceTransformer

    sentences = random_sentences(6, seed=9)
    ours = encoder.encode(sentences)[:, :16]
    theirs = SentenceTransformer(str(export), device="cpu", truncate_dim=16).encode(sentences)
    assert theirs.shape == (6, 16)

    def cosines(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return x @ x.T

    np.testing.assert_allclose(cosines(theirs), cosines(ours), atol=1e-5)
