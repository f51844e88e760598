"""AnglE's loss terms: against sentence-transformers' CoSENTLoss / AnglELoss, and against hand computations with plain
Python loops on tiny batches (ties in the scores included)."""

import math

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import AnglELoss, CoSENTLoss

from hf_sentcl.methods.angle.loss import (
    AUTHORS_DEFAULTS,
    angle_loss,
    angle_objective,
    cosent_loss,
    in_batch_loss,
    pair_cosine,
)

# 4 pairs, dim 4; pairs 0 and 2 tie
A = [[0.3, -1.2, 0.8, 0.5], [1.1, 0.4, -0.3, 0.9], [-0.7, 0.2, 1.5, -0.4], [0.6, 0.9, 0.1, -1.3]]
B = [[0.5, -0.9, 0.2, 1.0], [-0.8, 1.3, 0.6, 0.1], [0.4, -0.5, 1.1, 0.7], [1.2, 0.3, -0.6, -0.2]]
SCORES = [3.0, 1.5, 3.0, 0.0]
LABELS = [1.0, 0.0, 1.0, 1.0]


def tensors(*rows):
    return [torch.tensor(r, dtype=torch.float64) for r in rows]


def cos(u, v):
    dot = sum(x * y for x, y in zip(u, v))
    return dot / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))


def angle_value(u, v):
    """sum over k of (u_k + i u'_k) * conj(v_k + i v'_k) / (|u| |v|), then |real + imaginary|."""
    half = len(u) // 2
    total = sum(complex(u[k], u[half + k]) * complex(v[k], v[half + k]).conjugate() for k in range(half))
    total /= math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v))
    return abs(total.real + total.imag)


def ranking(values, scores, tau):
    total = 0.0
    for i in range(len(values)):
        for j in range(len(values)):
            if scores[i] > scores[j]:
                total += math.exp((values[j] - values[i]) / tau)
    return math.log(1.0 + total)


def in_batch(a, b, labels, tau, excluded=()):
    texts, n = a + b, len(a)
    total = 0.0
    for r in range(2 * n):
        if int(labels[r % n]) == 0:
            continue
        partner = (r + n) % (2 * n)
        others = [c for c in range(2 * n) if c != r and (r, c) not in excluded]
        denominator = sum(math.exp(cos(texts[r], texts[c]) / tau) for c in others)
        total -= cos(texts[r], texts[partner]) / tau - math.log(denominator)
    return total / (2 * n)


def random_batch(n=8, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, dim, generator=g, dtype=torch.float64)
    b = torch.randn(n, dim, generator=g, dtype=torch.float64)
    scores = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0, 0.9, 0.3, 0.7], dtype=torch.float64)[:n]
    return a, b, scores


@pytest.mark.parametrize("dim", [6, 7])
def test_cosent_and_angle_match_sentence_transformers(dim):
    a, b, scores = random_batch(dim=dim)
    cosent, angle = CoSENTLoss(None), AnglELoss(None)
    expected_cosent = cosent.compute_loss_from_embeddings([a, b], scores)
    expected_angle = angle.compute_loss_from_embeddings([a, b], scores)
    torch.testing.assert_close(cosent_loss(pair_cosine(a, b), scores, 1 / cosent.scale), expected_cosent)
    torch.testing.assert_close(angle_loss(a, b, scores, 1 / angle.scale), expected_angle)


@pytest.mark.parametrize("tau", [0.05, 0.5, 2.0])
def test_cosent_by_hand(tau):
    a, b, scores = tensors(A, B, SCORES)
    expected = ranking([cos(u, v) for u, v in zip(A, B)], SCORES, tau)
    assert math.isclose(cosent_loss(pair_cosine(a, b), scores, tau).item(), expected, rel_tol=1e-12)


@pytest.mark.parametrize("tau", [0.05, 0.5, 2.0])
def test_angle_by_hand(tau):
    a, b, scores = tensors(A, B, SCORES)
    expected = ranking([angle_value(u, v) for u, v in zip(A, B)], SCORES, tau)
    assert math.isclose(angle_loss(a, b, scores, tau).item(), expected, rel_tol=1e-12)


def test_angle_value_is_not_symmetric():
    a, b, scores = tensors(A, B, SCORES)
    assert not math.isclose(angle_loss(a, b, scores, 0.5).item(), angle_loss(b, a, scores, 0.5).item())


def test_tied_scores_form_no_pair():
    a, b, _ = tensors(A, B, SCORES)
    tied = torch.full((4,), 2.0, dtype=torch.float64)
    assert cosent_loss(pair_cosine(a, b), tied, 0.05).item() == 0.0
    assert angle_loss(a, b, tied, 0.05).item() == 0.0


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_in_batch_by_hand(tau):
    a, b, labels = tensors(A, B, LABELS)
    assert math.isclose(in_batch_loss(a, b, labels, tau).item(), in_batch(A, B, LABELS, tau), rel_tol=1e-12)


def test_in_batch_truncates_graded_scores_like_the_authors():
    """0.7 and -0.9 truncate to 0 (negative pairs), 2.5 and 1.0 to non-zero (positive pairs)."""
    a, b, graded = tensors(A, B, [0.7, 2.5, -0.9, 1.0])
    expected = in_batch(A, B, [0, 2, 0, 1], 0.5)
    assert math.isclose(in_batch_loss(a, b, graded, 0.5).item(), expected, rel_tol=1e-12)


def test_in_batch_exclude_leaves_the_denominator_but_never_the_partner():
    a, b, labels = tensors(A, B, LABELS)
    exclude = torch.zeros(8, 8, dtype=torch.bool)
    exclude[0, 2] = exclude[6, 1] = True
    exclude[0, 4] = exclude[3, 7] = True  # partners: ignored
    expected = in_batch(A, B, LABELS, 0.5, excluded={(0, 2), (6, 1)})
    assert math.isclose(in_batch_loss(a, b, labels, 0.5, exclude=exclude).item(), expected, rel_tol=1e-12)


def test_objective_is_the_weighted_sum_of_its_terms():
    a, b, scores = tensors(A, B, SCORES)
    weights = {"cosine_weight": 0.7, "ibn_weight": 1.3, "angle_weight": 0.02}
    taus = {"cosine_tau": 0.05, "ibn_tau": 0.1, "angle_tau": 0.5}
    total, terms = angle_objective(a, b, scores, **weights, **taus)
    assert set(terms) == {"cosine", "in_batch", "angle"}
    torch.testing.assert_close(terms["cosine"], cosent_loss(pair_cosine(a, b), scores, 0.05))
    torch.testing.assert_close(terms["in_batch"], in_batch_loss(a, b, scores, 0.1))
    torch.testing.assert_close(terms["angle"], angle_loss(a, b, scores, 0.5))
    torch.testing.assert_close(total, 0.7 * terms["cosine"] + 1.3 * terms["in_batch"] + 0.02 * terms["angle"])


def test_objective_defaults_are_the_authors():
    a, b, scores = tensors(A, B, SCORES)
    assert AUTHORS_DEFAULTS == {
        "cosine_weight": 0.0,
        "ibn_weight": 1.0,
        "angle_weight": 0.02,
        "cosine_tau": 0.05,
        "ibn_tau": 0.05,
        "angle_tau": 0.05,
    }
    torch.testing.assert_close(angle_objective(a, b, scores)[0], angle_objective(a, b, scores, **AUTHORS_DEFAULTS)[0])


def test_a_zero_weight_drops_its_term():
    """With a zero row the angle value is NaN; weight 0 must leave it out, not multiply it by 0."""
    a, b, scores = tensors(A, B, SCORES)
    a[1] = 0.0
    total, terms = angle_objective(
        a, b, scores, cosine_weight=1.0, ibn_weight=0.5, angle_weight=0.0, cosine_tau=0.5, ibn_tau=0.5, angle_tau=0.5
    )
    assert math.isnan(terms["angle"].item())
    torch.testing.assert_close(total, terms["cosine"] + 0.5 * terms["in_batch"])
    total, terms = angle_objective(
        a, b, scores, cosine_weight=0.0, ibn_weight=0.0, angle_weight=1.0, cosine_tau=0.5, ibn_tau=0.5, angle_tau=0.5
    )
    assert math.isnan(total.item())


@pytest.mark.parametrize("weights", [(-1.0, 1.0, 1.0), (0.0, 0.0, 0.0)])
def test_objective_rejects_negative_or_all_zero_weights(weights):
    a, b, scores = tensors(A, B, SCORES)
    with pytest.raises(ValueError):
        angle_objective(a, b, scores, cosine_weight=weights[0], ibn_weight=weights[1], angle_weight=weights[2])


def test_gradients_flow_through_every_term():
    a, b, scores = tensors(A, B, SCORES)
    a.requires_grad_(True)
    b.requires_grad_(True)
    total, terms = angle_objective(
        a, b, scores, cosine_weight=1.0, ibn_weight=1.0, angle_weight=1.0, cosine_tau=0.5, ibn_tau=0.5, angle_tau=0.5
    )
    assert not any(term.requires_grad for term in terms.values())
    total.backward()
    for grad in (a.grad, b.grad):
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    for term in (
        cosent_loss(pair_cosine(a, b), scores, 0.5),
        angle_loss(a, b, scores, 0.5),
        in_batch_loss(a, b, scores, 0.5),
    ):
        grads = torch.autograd.grad(term, (a, b))
        assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
