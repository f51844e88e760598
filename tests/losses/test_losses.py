"""InfoNCE against an independent float64 loop computation (log-sum-exp written out)."""

import math

import numpy as np
import pytest
import torch

from hf_sentcl.losses import cosine_logits, info_nce


def reference_info_nce(z1, z2, temperature, hard=None, weight=0.0) -> float:
    """SimCSE's loss with plain Python loops in float64: row i's logits are cos(z1_i, z2_j)/t for all j, then
    cos(z1_i, h_j)/t (+ weight when j == i); loss = mean_i [logsumexp_j logits_ij - logits_ii]."""
    a = np.asarray(z1, dtype=np.float64)
    b = np.asarray(z2, dtype=np.float64)
    h = None if hard is None else np.asarray(hard, dtype=np.float64)

    def cos(u, v):
        return float(np.dot(u, v) / (math.sqrt(np.dot(u, u)) * math.sqrt(np.dot(v, v))))

    total = 0.0
    n = a.shape[0]
    for i in range(n):
        logits = [cos(a[i], b[j]) / temperature for j in range(n)]
        if h is not None:
            logits += [cos(a[i], h[j]) / temperature + (weight if j == i else 0.0) for j in range(n)]
        top = max(logits)
        lse = top + math.log(sum(math.exp(x - top) for x in logits))
        total += lse - logits[i]
    return total / n


def random_views(n=6, d=5, seed=0, views=2):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=generator) for _ in range(views)]


@pytest.mark.parametrize("temperature", [0.05, 0.5, 1.0])
def test_info_nce_matches_loops(temperature):
    """Unsupervised InfoNCE equals the loop computation for several temperatures."""
    z1, z2 = random_views()
    loss = info_nce(z1, z2, temperature)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(reference_info_nce(z1, z2, temperature), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("weight", [0.0, 1.5, -2.0])
def test_info_nce_hard_negatives_matches_loops(weight):
    """With hard negatives (and a weight added to each anchor's own hard-negative logit) it equals the loops."""
    z1, z2, z3 = random_views(n=5, d=7, seed=1, views=3)
    loss = info_nce(z1, z2, 0.1, hard_negatives=z3, hard_negative_weight=weight)
    assert loss.item() == pytest.approx(reference_info_nce(z1, z2, 0.1, z3, weight), rel=1e-5, abs=1e-6)


def test_hard_negative_weight_changes_loss():
    """The weight matters: raising the own-hard-negative logit raises the loss."""
    z1, z2, z3 = random_views(n=4, d=3, seed=2, views=3)
    plain = info_nce(z1, z2, 0.1, z3, 0.0)
    weighted = info_nce(z1, z2, 0.1, z3, 1.0)
    assert weighted.item() > plain.item()
    assert info_nce(z1, z2, 0.1).item() < plain.item()  # extra negatives only add to the partition function


def test_info_nce_gradient_matches_autograd_of_reference():
    """The gradient w.r.t. z1 matches a finite-difference estimate of the loop computation."""
    z1, z2 = random_views(n=4, d=3, seed=3)
    z1 = z1.double().requires_grad_()
    info_nce(z1, z2.double(), 0.2).backward()
    eps = 1e-6
    base = z1.detach().numpy()
    numeric = np.zeros_like(base)
    for i in range(base.shape[0]):
        for k in range(base.shape[1]):
            plus, minus = base.copy(), base.copy()
            plus[i, k] += eps
            minus[i, k] -= eps
            numeric[i, k] = (reference_info_nce(plus, z2, 0.2) - reference_info_nce(minus, z2, 0.2)) / (2 * eps)
    np.testing.assert_allclose(z1.grad.numpy(), numeric, rtol=1e-4, atol=1e-6)


def test_perfect_alignment_gives_low_loss():
    """Orthogonal, identical views at a small temperature give a loss near zero; identical rows give log(n)."""
    z = torch.eye(4)
    assert info_nce(z, z, 0.05).item() < 1e-6
    same = torch.ones(4, 3)
    assert info_nce(same, same, 0.05).item() == pytest.approx(math.log(4), rel=1e-6)


def test_bf16_autocast_computes_in_fp32():
    """Under CPU bf16 autocast with bf16 inputs the loss is fp32 and equals the fp32 loss on the same values."""
    z1, z2, z3 = random_views(n=8, d=16, seed=4, views=3)
    z1b, z2b, z3b = (z.to(torch.bfloat16) for z in (z1, z2, z3))
    expected = reference_info_nce(z1b.float(), z2b.float(), 0.05, z3b.float(), 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = info_nce(z1b, z2b, 0.05, z3b, 0.5)
        logits = cosine_logits(z1b, z2b, 0.05)
    assert loss.dtype == torch.float32
    assert logits.dtype == torch.float32
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_cosine_logits_matches_loops():
    """cosine_logits is sim(a_i, b_j) / temperature."""
    a, b = random_views(n=3, d=4, seed=5)
    logits = cosine_logits(a, b, 0.5)
    for i in range(3):
        for j in range(3):
            expected = float(torch.dot(a[i], b[j]) / (a[i].norm() * b[j].norm())) / 0.5
            assert logits[i, j].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_shape_mismatch_is_error():
    """z1 and z2 of different shapes are rejected with both shapes in the message."""
    with pytest.raises(ValueError, match=r"\(4, 3\).*\(5, 3\)"):
        info_nce(torch.randn(4, 3), torch.randn(5, 3), 0.05)
