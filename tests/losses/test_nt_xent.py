"""`nt_xent`, the 2N-view NT-Xent (SimCLR; ConSERT Eq. 1), against independent float64 loop computations, with and
without the IFM/BYOP margin plug-in; SG's L_base is the same loss."""

import math

import numpy as np
import pytest
import torch

from hf_sentcl.losses import info_nce, nt_xent, nt_xent_similarities
from hf_sentcl.methods.self_guided.loss import sg_loss


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cos(u, v) -> float:
    return float(np.dot(u, v) / (math.sqrt(np.dot(u, u)) * math.sqrt(np.dot(v, v))))


def ref_nt_xent(z1, z2, tau, shift=None) -> float:
    """Mean over the 2N views a of -log exp(l_pos) / sum_{k != a} exp(l_k), l = (cos + shift) / tau, in float64.

    `shift(a, k, positive, row_positive_cos)` returns the margin added to cos(x_a, x_k) (None: no margin)."""
    x = np.concatenate([np.asarray(z1, np.float64), np.asarray(z2, np.float64)])
    n = len(z1)
    total = 0.0
    for a in range(2 * n):
        partner = a + n if a < n else a - n
        pos_cos = cos(x[a], x[partner])
        logits = {}
        for k in range(2 * n):
            if k == a:
                continue
            value = cos(x[a], x[k])
            if shift is not None:
                value += shift(a, k, k == partner, pos_cos)
            logits[k] = value / tau
        top = max(logits.values())
        total += -(logits[partner] - top) + math.log(sum(math.exp(v - top) for v in logits.values()))
    return total / (2 * n)


@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
@pytest.mark.parametrize("n", [2, 7])
def test_nt_xent_matches_float64_loop(tau, n):
    """Every one of the 2N views is an anchor; its positive is the other view, the other 2N - 2 are negatives."""
    z1, z2 = randn(n, 9, seed=n), randn(n, 9, seed=100 + n)
    assert nt_xent(z1, z2, tau).item() == pytest.approx(ref_nt_xent(z1, z2, tau), rel=1e-5, abs=1e-6)


def test_nt_xent_is_not_simcse_info_nce():
    """NT-Xent also anchors z2 and counts same-side vectors as negatives, so it differs from SimCSE's InfoNCE."""
    z1, z2 = randn(6, 5, seed=1), randn(6, 5, seed=2)
    assert abs(nt_xent(z1, z2, 0.1).item() - info_nce(z1, z2, 0.1).item()) > 1e-2


def test_similarity_matrix_layout():
    """[z1; z2] cosine matrix, -inf on the diagonal, targets i <-> N + i."""
    z1, z2 = randn(3, 4, seed=3), randn(3, 4, seed=4)
    similarities, targets = nt_xent_similarities(z1, z2)
    assert similarities.shape == (6, 6) and similarities.dtype == torch.float32
    assert torch.isinf(similarities.diagonal()).all()
    assert targets.tolist() == [3, 4, 5, 0, 1, 2]
    assert similarities[0, 4].item() == pytest.approx(cos(z1[0].numpy(), z2[1].numpy()), rel=1e-6)


@pytest.mark.parametrize("spec,sign_pos,sign_neg", [("p+", 1, 0), ("n-", 0, -1), ("p-n+", -1, 1), ("p+n-", 1, -1)])
def test_constant_margin_shifts_cosines_before_temperature(spec, sign_pos, sign_neg):
    """BYOP-C / IFM: (cos + sign * m) / tau for the positive and / or every negative of each of the 2N rows."""
    z1, z2, m, tau = randn(5, 6, seed=7), randn(5, 6, seed=8), 0.05, 0.1
    expected = ref_nt_xent(z1, z2, tau, lambda a, k, positive, _: m * (sign_pos if positive else sign_neg))
    got = nt_xent(z1, z2, tau, perturbation=spec, margin=m).item()
    assert got == pytest.approx(expected, rel=1e-5)
    assert abs(got - nt_xent(z1, z2, tau).item()) > 1e-3


def test_dynamic_margin_divides_by_the_rows_negatives():
    """BYOP-D on NT-Xent: m_a = cos(x_a, x_pos) / (2N - 2), the row's negatives (the -inf self entry is not one)."""
    n, tau = 4, 0.1
    z1, z2 = randn(n, 6, seed=9), randn(n, 6, seed=10)
    expected = ref_nt_xent(z1, z2, tau, lambda a, k, positive, pos_cos: -pos_cos / (2 * n - 2) if not positive else 0)
    assert nt_xent(z1, z2, tau, perturbation="n-", dynamic=True).item() == pytest.approx(expected, rel=1e-5)


def test_multi_task_is_the_mean_of_plain_and_perturbed():
    z1, z2 = randn(4, 3, seed=11), randn(4, 3, seed=12)
    plain = ref_nt_xent(z1, z2, 0.2)
    perturbed = ref_nt_xent(z1, z2, 0.2, lambda a, k, positive, _: 0.1 if positive else 0.0)
    got = nt_xent(z1, z2, 0.2, perturbation="p+", margin=0.1, multi_task=True).item()
    assert got == pytest.approx(0.5 * (plain + perturbed), rel=1e-5)


def test_sg_loss_equals_nt_xent():
    """SG's L_base is the same NT-Xent over {c} U {h}."""
    c, h = randn(6, 8, seed=13), randn(6, 8, seed=14)
    assert sg_loss(c, h, 0.01).item() == pytest.approx(nt_xent(c, h, 0.01).item(), rel=1e-7)


def test_fp32_under_bf16_autocast_and_gradient():
    """Under CPU bf16 autocast the loss is fp32 and equals the fp32 value; gradients reach both inputs."""
    z1, z2 = randn(8, 16, seed=15).requires_grad_(), randn(8, 16, seed=16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nt_xent(z1, z2, 0.1)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(nt_xent(z1, z2, 0.1).item(), rel=1e-6)
    loss.backward()
    assert z1.grad.abs().sum() > 0 and z2.grad.abs().sum() > 0


def test_bad_shapes_and_margin():
    with pytest.raises(ValueError, match=r"\(N, d\)"):
        nt_xent(randn(4, 3), randn(5, 3), 0.1)
    with pytest.raises(ValueError, match="margin must be >= 0"):
        nt_xent(randn(4, 3), randn(4, 3), 0.1, perturbation="p+", margin=-0.1)
