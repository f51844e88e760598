"""Alignment and uniformity (Wang & Isola 2020) against loop computations, on STS-B dev, and in the trainer."""

import itertools
import math

import numpy as np
import pytest
from helpers import FakeEncoder, random_sentences, write_stsb

from hf_sentcl.evaluation.alignment import alignment, sts_alignment_uniformity, uniformity
from hf_sentcl.evaluation.sts import STSEvaluator


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / math.sqrt(float(v @ v))


def loop_alignment(x, y):
    return sum(float(np.sum((unit(a) - unit(b)) ** 2)) for a, b in zip(x, y)) / len(x)


def loop_uniformity(x):
    pairs = list(itertools.combinations(range(len(x)), 2))
    return math.log(sum(math.exp(-2 * float(np.sum((unit(x[i]) - unit(x[j])) ** 2))) for i, j in pairs) / len(pairs))


def test_alignment_and_uniformity_match_loops():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(9, 5)), rng.normal(size=(9, 5))
    assert alignment(x, y) == pytest.approx(loop_alignment(x, y), rel=1e-10)
    assert uniformity(x) == pytest.approx(loop_uniformity(x), rel=1e-10)


def test_known_values():
    """Identical directions align perfectly (0), opposite ones give 4; two orthogonal unit vectors: log e^-4."""
    x = np.array([[1.0, 0.0], [0.0, 3.0]])
    assert alignment(x, 2 * x) == pytest.approx(0.0, abs=1e-12)
    assert alignment(x, -x) == pytest.approx(4.0)
    assert uniformity(x) == pytest.approx(-4.0)
    collapsed = np.ones((5, 3))
    assert uniformity(collapsed) == pytest.approx(0.0, abs=1e-12)  # the worst value


def test_bad_input_rejected():
    with pytest.raises(ValueError, match="same number of rows"):
        alignment(np.ones((2, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="at least 2"):
        uniformity(np.ones((1, 3)))


@pytest.fixture
def stsb_dev(tmp_path):
    """STS-B dev with 6 pairs (scores 4.0 and 4.8 are positives; 3.99 is not; one sentence repeats) + vectors."""
    s = random_sentences(10, seed=5)  # in-vocabulary words, so the tiny BERT gives distinct embeddings
    rows = [(s[0], s[1], 4.0), (s[2], s[3], 3.99), (s[4], s[5], 4.8), (s[0], s[6], 1.0), (s[7], s[8], 0.0),
            (s[9], s[2], 2.5)]
    write_stsb(tmp_path, "dev", rows)
    rng = np.random.default_rng(1)
    vectors = {sentence: rng.normal(size=4) for sentence in s}
    return STSEvaluator(tmp_path, tasks=("STSBenchmark",), split="dev"), vectors, s


def test_sts_alignment_uniformity_selects_pairs_and_sentences(stsb_dev):
    """Alignment over pairs with gold >= 4 (inclusive), uniformity over the 10 distinct sentences, from the
    evaluator's single embedding matrix."""
    evaluator, vectors, s = stsb_dev
    embeddings = evaluator.embed(FakeEncoder(vectors))
    values = sts_alignment_uniformity(evaluator, embeddings)
    expected_alignment = loop_alignment([vectors[s[0]], vectors[s[4]]], [vectors[s[1]], vectors[s[5]]])
    assert values["alignment"] == pytest.approx(expected_alignment, rel=1e-6)
    assert values["uniformity"] == pytest.approx(loop_uniformity([vectors[x] for x in s]), rel=1e-6)
    assert math.isnan(sts_alignment_uniformity(evaluator, embeddings, threshold=5.0)["alignment"])
    with pytest.raises(ValueError, match="no 'SICKRelatedness' data"):
        sts_alignment_uniformity(evaluator, embeddings, task="SICKRelatedness")


def test_score_from_embeddings_equals_call(stsb_dev):
    """embed + score is what __call__ does: one encode call, the same Spearman."""
    evaluator, vectors, _ = stsb_dev
    encoder = FakeEncoder(vectors)
    embeddings = evaluator.embed(encoder, batch_size=3, bf16=True)
    assert len(encoder.calls) == 1 and encoder.calls[0]["batch_size"] == 3 and encoder.calls[0]["bf16"] is True
    assert evaluator.score(embeddings) == evaluator(FakeEncoder(vectors))


def test_trainer_logs_alignment_and_uniformity_from_one_encode(tiny_bert_dir, tmp_path, stsb_dev):
    """Every method's evaluate() reports eval_alignment / eval_uniformity next to eval_stsb_spearman, computed
    from the same single encode pass, and logs them in the history."""
    from datasets import Dataset

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.data import ViewCollator, tokenize_views
    from hf_sentcl.methods.simcse.config import SimCSEConfig
    from hf_sentcl.methods.simcse.trainer import SimCSETrainer

    evaluator, _, _ = stsb_dev
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    calls = []
    original = encoder.encode
    encoder.encode = lambda sentences, **kw: calls.append(len(sentences)) or original(sentences, **kw)
    args = SimCSEConfig(output_dir=str(tmp_path / "out"), use_cpu=True, eval_strategy="no", save_strategy="no",
                        load_best_model_at_end=False, disable_tqdm=True, per_device_train_batch_size=4)
    dataset = tokenize_views(Dataset.from_dict({"text": ["a cat", "a dog"]}), encoder.tokenizer, ("text",), 16)
    trainer = SimCSETrainer(model=encoder, args=args, train_dataset=dataset,
                            data_collator=ViewCollator(encoder.tokenizer), dev_evaluator=evaluator)
    metrics = trainer.evaluate()
    assert calls == [10]
    embeddings = evaluator.embed(encoder)
    expected = sts_alignment_uniformity(evaluator, embeddings)
    assert metrics["eval_alignment"] == pytest.approx(expected["alignment"], rel=1e-6)
    assert metrics["eval_uniformity"] == pytest.approx(expected["uniformity"], rel=1e-6)
    assert not math.isnan(metrics["eval_stsb_spearman"])
    assert metrics["eval_stsb_spearman"] == pytest.approx(evaluator.score(embeddings)["STSBenchmark"])
    assert {"eval_alignment", "eval_uniformity"} <= set(trainer.state.log_history[-1])
