"""AnglE's objective (Li and Li 2023, "AnglE-optimized Text Embeddings", arXiv:2309.12871) as pure functions.

AnglE trains on scored pairs (a_k, b_k, score_k) with a weighted sum of three terms, as the authors' code does
(github.com/SeanLee97/AnglE, angle_emb/loss.py at v0.6.1, `AngleLoss` with `dataset_format="A"`):
- cosine: CoSENT's ranking loss on the pairs' cosine similarities;
- in_batch: a softmax over the batch's other texts with each positive pair's partner as the target;
- angle: the same ranking loss on an "angle difference" computed from each embedding split into a real and an
  imaginary half (complex division), which does not saturate where the cosine's gradient vanishes.

Temperatures here divide: a term's logits are similarity / tau. The authors' `*_tau` arguments (and
sentence-transformers' `scale`) multiply, so their 20.0 is tau = 1 / 20 = 0.05 here.

The ranking terms use only the order of the gold scores (any scale); a tie between two pairs contributes nothing.
The in-batch term uses the scores as labels: see `in_batch_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: The authors' `AngleLoss` defaults (angle_emb v0.5.5 to v0.6.1, and `angle-trainer`'s flags), taus as 1 / tau.
AUTHORS_DEFAULTS = {
    "cosine_weight": 0.0,
    "ibn_weight": 1.0,
    "angle_weight": 0.02,
    "cosine_tau": 1 / 20.0,
    "ibn_tau": 1 / 20.0,
    "angle_tau": 1 / 20.0,
}


def _flat_scores(scores: Tensor, batch: int) -> Tensor:
    scores = scores.reshape(-1)
    if scores.numel() != batch:
        raise ValueError(f"expected {batch} scores (one per pair), got {scores.numel()}")
    return scores


def _ranking_loss(values: Tensor, scores: Tensor, tau: float) -> Tensor:
    """log(1 + sum over (i, j) with scores[i] > scores[j] of exp((values[j] - values[i]) / tau)): every pair of
    pairs ranked the wrong way by `values` (a similarity) is penalised; ties in `scores` form no pair."""
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    scores = _flat_scores(scores, values.numel())
    values = values.reshape(-1)
    logits = (values[None, :] - values[:, None]) / tau  # [i, j] = (v_j - v_i) / tau
    higher = scores[:, None] > scores[None, :]
    logits = logits.masked_fill(~higher, float("-inf"))
    # the appended zero is the "1 +" inside the log, as in the authors' code and sentence-transformers
    return torch.logsumexp(torch.cat((logits.new_zeros(1), logits.reshape(-1))), dim=0)


def pair_cosine(a: Tensor, b: Tensor) -> Tensor:
    """(batch,) cosine similarity of each pair (a[k], b[k]), as the authors' code computes it (L2-normalize, dot)."""
    a = torch.nn.functional.normalize(a, p=2, dim=-1)
    b = torch.nn.functional.normalize(b, p=2, dim=-1)
    return (a * b).sum(dim=-1)


def pair_angle_difference(a: Tensor, b: Tensor) -> Tensor:
    """(batch,) AnglE's normalized angle difference of each pair, the value its angle term ranks.

    Follows the authors' `angle_loss` (pooling "sum", their default): the first half of each embedding is the real
    part, the second the imaginary part; a[k] / b[k] by complex division with the denominator |b[k]|^2 summed over
    all dimensions, both parts rescaled by |b[k]| / |a[k]| (so divided by |a[k]| |b[k]| overall), then the absolute
    value of the sum of all real and imaginary parts. This equals sentence-transformers 6.2's `pairwise_angle_sim`,
    |cos(a, b) + sum(im_a re_b - re_a im_b) / (|a| |b|)|, up to rounding. It is not symmetric in a and b, and grows
    with similarity (it is the cosine plus a sine-like term), so it is ranked like a similarity.

    Where the two differ, an odd dimension: the authors' halves then have unequal sizes and their code fails; this
    follows sentence-transformers and appends a zero coordinate, which changes no norm or dot product.
    """
    if a.shape[-1] % 2:
        a = torch.nn.functional.pad(a, (0, 1))
        b = torch.nn.functional.pad(b, (0, 1))
    re_a, im_a = torch.chunk(a, 2, dim=-1)
    re_b, im_b = torch.chunk(b, 2, dim=-1)
    norm_a = a.norm(dim=-1, keepdim=True)
    norm_b = b.norm(dim=-1, keepdim=True)
    denominator = norm_b**2 * (norm_a / norm_b)
    real = (re_a * re_b + im_a * im_b) / denominator
    imaginary = (im_a * re_b - re_a * im_b) / denominator
    return torch.abs(real.sum(dim=-1) + imaginary.sum(dim=-1))


def cosent_loss(similarities: Tensor, scores: Tensor, tau: float) -> Tensor:
    """CoSENT's ranking loss, AnglE's cosine term: log(1 + sum over pairs i, j with scores[i] > scores[j] of
    exp((s_j - s_i) / tau)), s the (batch,) pair similarities; it pushes each higher-scored pair above each lower one.

    Same as the authors' `cosine_loss` (their `tau` = 1 / tau here) and sentence-transformers' CoSENTLoss
    (`scale` = 1 / tau); both use this logsumexp form with a zero appended.
    """
    return _ranking_loss(similarities, scores, tau)


def angle_loss(a: Tensor, b: Tensor, scores: Tensor, tau: float) -> Tensor:
    """AnglE's angle term: the CoSENT ranking form on `pair_angle_difference(a, b)` instead of the cosine.

    It follows the authors' code (and sentence-transformers' AnglELoss, which matches it): the pair with the higher
    score should have the larger value. The paper's Eq. 3 writes the subtraction the other way round (angle
    differences to be small for similar pairs); the code is the reference here.
    """
    return _ranking_loss(pair_angle_difference(a, b), scores, tau)


def in_batch_loss(a: Tensor, b: Tensor, scores: Tensor, tau: float, exclude: Tensor | None = None) -> Tensor:
    """AnglE's in-batch negative term, the authors' `in_batch_negative_loss`: contrastive learning on the positive
    pairs, with every other text of the batch as a negative.

    The 2B texts [a; b] are scored against each other by cosine / tau (the authors' `tau` = 1 / tau here), each
    text's own column left out. A row whose pair is positive has its partner (a[k] for b[k] and b[k] for a[k]) as
    the single target of a cross-entropy over the other 2B - 1 texts, both sides and negative pairs' texts included;
    a row of a negative pair has no target and adds 0. The loss is the mean over all 2B rows, zeros included.

    A pair is positive when its score truncated toward zero is non-zero: the authors cast labels with `.int()`, so
    the term is meant for 0/1 labels; with graded scores only |score| >= 1 counts (their README's STS-B example feeds
    0-5 scores, so pairs scored below 1 are its negatives; binarize [0, 1] scores first).
    Their target matrix matches column j to row i by j * label_j == partner(i) * label_i, which with integer labels
    above 1 can also match unrelated columns; that artifact is not reproduced (identical for 0/1 labels). As in
    their code, a sentence repeated in the batch stays a negative of its twin unless `exclude` removes it.

    `exclude`: optional (2B, 2B) bool over rows and columns [a; b], True where a candidate leaves a row's
    denominator (a false negative); a row's partner column is never excluded.
    """
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    batch = a.shape[0]
    positive = _flat_scores(scores, batch).to(torch.int64) != 0
    texts = torch.nn.functional.normalize(torch.cat((a, b)), p=2, dim=-1)
    logits = texts @ texts.T / tau
    rows = torch.arange(2 * batch, device=a.device)
    partner = rows.roll(batch)
    drop = rows[:, None] == rows[None, :]
    if exclude is not None:
        drop = drop | (exclude & (rows[None, :] != partner[:, None]))
    log_probs = torch.log_softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    target_log_probs = log_probs.gather(1, partner[:, None]).squeeze(1)
    return -(target_log_probs * positive.repeat(2)).sum() / (2 * batch)


def angle_objective(
    a: Tensor,
    b: Tensor,
    scores: Tensor,
    *,
    cosine_weight: float = AUTHORS_DEFAULTS["cosine_weight"],
    ibn_weight: float = AUTHORS_DEFAULTS["ibn_weight"],
    angle_weight: float = AUTHORS_DEFAULTS["angle_weight"],
    cosine_tau: float = AUTHORS_DEFAULTS["cosine_tau"],
    ibn_tau: float = AUTHORS_DEFAULTS["ibn_tau"],
    angle_tau: float = AUTHORS_DEFAULTS["angle_tau"],
    exclude: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """AnglE's loss: cosine_weight * cosent + ibn_weight * in_batch + angle_weight * angle, and the three terms
    (detached) by name "cosine", "in_batch", "angle" for logging. A weight of 0 leaves its term out of the sum.

    Defaults are the authors' `AngleLoss` defaults since angle_emb v0.5.5 (2025-01) and through v0.6.1, also
    `angle-trainer`'s flags: cosine_w=0.0, ibn_w=1.0, angle_w=0.02, cosine_tau=ibn_tau=angle_tau=20.0 (a scale,
    so tau 0.05 here). Their class docstring still says 1.0 for every weight, which the code does not use. Earlier
    releases: v0.1.0 w1=w2=w3=1.0 with angle_tau=1.0 (tau 1.0 here); v0.4.0 all weights 1.0, all taus 20.0;
    v0.4.12 cosine_w=0.0, ibn_w=20.0, angle_w=1.0. Their README's format-A example uses cosine_w=1.0, ibn_w=1.0,
    angle_w=0.02, taus 20. `exclude` is passed to `in_batch_loss`.
    """
    weights = {"cosine": cosine_weight, "in_batch": ibn_weight, "angle": angle_weight}
    if any(weight < 0 for weight in weights.values()) or not any(weights.values()):
        raise ValueError(f"AnglE weights must be >= 0 and not all 0, got {weights}")
    terms = {
        "cosine": cosent_loss(pair_cosine(a, b), scores, cosine_tau),
        "in_batch": in_batch_loss(a, b, scores, ibn_tau, exclude=exclude),
        "angle": angle_loss(a, b, scores, angle_tau),
    }
    total = sum(weights[name] * term for name, term in terms.items() if weights[name] != 0)
    return total, {name: term.detach() for name, term in terms.items()}
