"""Alignment and uniformity of an embedding space (Wang & Isola 2020), measured on STS-B as SimCSE and BYOP do.

Both are computed on L2-normalised embeddings, lower is better for both:

    alignment  = E_{(x, y) ~ positive pairs} ||f(x) - f(y)||^alpha          (alpha = 2)
    uniformity = log E_{x, y ~ data, x != y} exp(-t ||f(x) - f(y)||^2)       (t = 2)

Positive pairs are STS-B pairs whose gold score is at least 4 (of 5); the data distribution is every distinct
sentence of the split.
"""

from __future__ import annotations

import math

import numpy as np

from hf_sentcl.evaluation.sts import STSEvaluator

POSITIVE_PAIR_THRESHOLD = 4.0


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Mean ||x_i - y_i||^alpha over row pairs of two (n, d) arrays, after L2 normalisation."""
    if len(x) == 0 or len(x) != len(y):
        raise ValueError(f"alignment needs two non-empty arrays with the same number of rows, got {len(x)}, {len(y)}.")
    return float((np.linalg.norm(_normalize(x) - _normalize(y), axis=1) ** alpha).mean())


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """log of the mean of exp(-t ||x_i - x_j||^2) over all pairs i < j, after L2 normalisation."""
    if len(x) < 2:
        raise ValueError(f"uniformity needs at least 2 embeddings, got {len(x)}.")
    from scipy.spatial.distance import pdist  # scipy on first use, not in every process's start
    from scipy.special import logsumexp

    squared = pdist(_normalize(x), metric="sqeuclidean")
    return float(logsumexp(-t * squared) - math.log(len(squared)))


def sts_alignment_uniformity(
    evaluator: STSEvaluator,
    embeddings: np.ndarray,
    task: str = "STSBenchmark",
    threshold: float = POSITIVE_PAIR_THRESHOLD,
) -> dict[str, float]:
    """{'alignment', 'uniformity'} of `task` from embeddings produced by `evaluator.embed` (no second encode).

    Alignment over the task's pairs with gold score >= `threshold` (NaN if there are none); uniformity over its
    distinct sentences.
    """
    if task not in evaluator.data:
        raise ValueError(f"the evaluator has no '{task}' data (tasks: {', '.join(evaluator.data)}).")
    first, second, sentences = [], [], {}
    for pairs in evaluator.data[task].values():
        e1, e2 = evaluator.pair_embeddings(embeddings, pairs)
        keep = pairs.scores >= threshold
        first.append(e1[keep])
        second.append(e2[keep])
        sentences.update(dict.fromkeys(pairs.sentences1 + pairs.sentences2))
    first, second = np.concatenate(first), np.concatenate(second)
    index = [evaluator.sentence_index[s] for s in sentences]
    return {
        # a tiny dev set may have no pair above the threshold: report NaN rather than stop training
        "alignment": alignment(first, second) if len(first) else math.nan,
        "uniformity": uniformity(embeddings[index]),
    }
