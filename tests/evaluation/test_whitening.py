"""Whitening (Su et al. 2021): the fitted transform against a hand computation, identity covariance on the fitting
set, the fitting corpora of the STS evaluation, and the `--whitening` flag of `hf-sentcl evaluate`."""

import json

import numpy as np
import pytest
from helpers import FakeEncoder

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.evaluate import main
from hf_sentcl.evaluation.sts import STSEvaluator, cosine_rows, spearman_x100
from hf_sentcl.evaluation.whitening import Whitening, WhiteningSpec, task_sentences, whitened_sts_scores


def anisotropic(n=200, d=6, seed=0):
    """Correlated embeddings with a large common offset (the anisotropy whitening removes)."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(d, d)) * np.linspace(0.1, 3.0, d)
    return rng.normal(size=(n, d)) @ mixing + 5.0


def test_whitened_embeddings_have_zero_mean_and_identity_covariance():
    x = anisotropic()
    z = Whitening.fit(x)(x)
    assert np.allclose(z.mean(axis=0), 0, atol=1e-10)
    assert np.allclose(z.T @ z / len(z), np.eye(x.shape[1]), atol=1e-8)


def test_fit_matches_a_hand_computation():
    """mu = mean; Sigma = (x - mu)^T (x - mu) / n; Sigma = U S U^T; W = U S^-1/2, first k columns."""
    x = anisotropic(n=50, d=5, seed=1)
    mu = x.sum(axis=0) / len(x)
    sigma = (x - mu).T @ (x - mu) / len(x)
    values, vectors = np.linalg.eigh(sigma)  # ascending: the SVD's order is the reverse
    order = np.argsort(values)[::-1][:3]
    expected = (x - mu) @ (vectors[:, order] / np.sqrt(values[order]))
    got = Whitening.fit(x, dims=3)(x)
    assert got.shape == (50, 3)
    # eigenvectors are defined up to sign: compare column by column
    for k in range(3):
        sign = np.sign(got[:, k] @ expected[:, k])
        assert np.allclose(got[:, k], sign * expected[:, k], atol=1e-8)
    assert np.allclose(got.T @ got / len(x), np.eye(3), atol=1e-8)


def test_transform_applies_the_fitted_mean_and_matrix_to_new_rows():
    x, y = anisotropic(seed=2), anisotropic(n=7, seed=3)
    whiten = Whitening.fit(x)
    assert np.allclose(whiten(y), (y - x.mean(axis=0)) @ whiten.matrix)


def test_degenerate_inputs_are_errors():
    with pytest.raises(ValueError, match="at least 2"):
        Whitening.fit(np.ones((1, 4)))
    with pytest.raises(ValueError, match="identical"):
        Whitening.fit(np.ones((5, 4)))
    with pytest.raises(ValueError, match="dims"):
        Whitening.fit(anisotropic(), dims=99)
    # a rank-deficient fit keeps only the directions with variance instead of dividing by zero
    x = anisotropic(d=4)
    flat = np.hstack([x, x[:, :1] * 2])
    assert Whitening.fit(flat).matrix.shape == (5, 4)


def fake_encoder_for(evaluator, seed=0):
    rng = np.random.default_rng(seed)
    return FakeEncoder({s: rng.normal(size=8) + 3.0 for s in evaluator.sentences()})


def test_sts_scores_after_whitening_on_the_evaluation_sentences(senteval_dir):
    """fit 'eval': one transform fitted on every evaluation sentence, then the usual cosine Spearman."""
    evaluator = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"))
    embeddings = evaluator.embed(fake_encoder_for(evaluator))
    scores = whitened_sts_scores(evaluator, embeddings, WhiteningSpec("eval"))
    z = Whitening.fit(embeddings)(embeddings)
    pairs = evaluator.data["STSBenchmark"]["test"]
    expected = spearman_x100(pairs.scores, cosine_rows(*evaluator.pair_embeddings(z, pairs)))
    assert scores["STSBenchmark"] == pytest.approx(expected)
    assert scores["STSBenchmark"] != pytest.approx(evaluator.score(embeddings)["STSBenchmark"])


def test_task_fit_uses_each_tasks_own_sentences(senteval_dir):
    evaluator = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"))
    embeddings = evaluator.embed(fake_encoder_for(evaluator, seed=1))
    scores = whitened_sts_scores(evaluator, embeddings, WhiteningSpec("task", dims=4))
    own = evaluator.rows(embeddings, task_sentences(evaluator, "STS12"))
    assert len(own) < len(embeddings)
    expected = evaluator.score(Whitening.fit(own, 4)(embeddings))["STS12"]
    assert scores["STS12"] == pytest.approx(expected)
    assert scores["Avg"] == pytest.approx((scores["STS12"] + scores["STSBenchmark"]) / 2)


def test_file_fit_encodes_the_files_lines(tmp_path, senteval_dir):
    evaluator = STSEvaluator(senteval_dir, tasks=("STSBenchmark",))
    encoder = fake_encoder_for(evaluator, seed=2)
    fit_sentences = evaluator.sentences()[:12]
    path = tmp_path / "fit.txt"
    path.write_text("\n".join(fit_sentences) + "\n\n")
    embeddings = evaluator.embed(encoder)
    scores = whitened_sts_scores(evaluator, embeddings, WhiteningSpec(str(path)), encoder)
    assert encoder.calls[-1]["sentences"] == fit_sentences
    whiten = Whitening.fit(evaluator.rows(embeddings, fit_sentences))
    assert scores["STSBenchmark"] == pytest.approx(evaluator.score(whiten(embeddings))["STSBenchmark"])


def test_spec_check_names_the_bad_value(tmp_path):
    with pytest.raises(ValueError, match="nope.txt"):
        WhiteningSpec(str(tmp_path / "nope.txt")).check()
    with pytest.raises(ValueError, match="dims"):
        WhiteningSpec("eval", 0).check()


def test_evaluate_cli_reports_plain_and_whitened_scores(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    output = tmp_path / "out.json"
    argv = ["--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), "--sts-tasks", "STS12,STSBenchmark",
            "--device", "cpu", "--pooling", "mean", "--output", str(output)]
    assert main([*argv, "--whitening", "eval:16", "--whitening", "task"]) == 0
    results = json.loads(output.read_text())
    evaluator = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"))
    embeddings = evaluator.embed(SentenceEncoder.load(str(tiny_bert_dir), pooling="mean"))
    expected = evaluator.score(Whitening.fit(embeddings, 16)(embeddings))
    eval16 = results["whitened"]["whitened (fit: all evaluation sentences, k=16)"]
    assert (eval16["fit"], eval16["dims"]) == ("eval", 16)
    assert eval16["STSBenchmark"] == pytest.approx(expected["STSBenchmark"], abs=1e-3)
    task = results["whitened"]["whitened (fit: each task's sentences)"]
    assert task["STS12"] == pytest.approx(
        whitened_sts_scores(evaluator, embeddings, WhiteningSpec("task"))["STS12"], abs=1e-3)
    assert results["STSBenchmark"] == pytest.approx(evaluator.score(embeddings)["STSBenchmark"], abs=1e-3)
    table = output.with_suffix(".md").read_text()
    assert "whitened (fit: all evaluation sentences, k=16)" in table and "each task's sentences" in table
    assert main([*argv, "--whitening", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err


def test_spec_parse():
    assert WhiteningSpec.parse("eval") == WhiteningSpec("eval", None)
    assert WhiteningSpec.parse("task:128") == WhiteningSpec("task", 128)
    with pytest.raises(ValueError, match="dims"):
        WhiteningSpec.parse("eval:0")
