"""The Matryoshka plug-in against a hand computation: the method's loss at each re-normalised prefix, weighted."""

import numpy as np
import pytest
import torch

from hf_sentcl.configs.validation import check_matryoshka
from hf_sentcl.losses import info_nce
from hf_sentcl.losses.matryoshka import matryoshka_loss

TAU = 0.05


def hand_info_nce(z1: np.ndarray, z2: np.ndarray) -> float:
    a = z1 / np.linalg.norm(z1, axis=1, keepdims=True)
    b = z2 / np.linalg.norm(z2, axis=1, keepdims=True)
    logits = a @ b.T / TAU
    logits -= logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(logits).sum(axis=1)) - np.diag(logits)))


def test_weighted_sum_over_prefixes():
    rng = np.random.default_rng(0)
    z1, z2 = rng.normal(size=(5, 12)), rng.normal(size=(5, 12))
    dims, weights = [12, 8, 3], [1.0, 0.5, 2.0]
    expected = sum(w * hand_info_nce(z1[:, :d], z2[:, :d]) for d, w in zip(dims, weights))
    views = torch.tensor(np.stack([z1, z2]))
    loss, parts = matryoshka_loss(lambda v: (info_nce(v[0], v[1], TAU), {"x": v.sum()}), views, dims, weights)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert parts["loss_dim3"].item() == pytest.approx(hand_info_nce(z1[:, :3], z2[:, :3]), rel=1e-6)
    assert "x" in parts  # the full-size term's own components are kept


def test_prefix_losses_differ_from_the_full_one():
    """The comparison above can fail: a prefix's loss is not the full vector's."""
    rng = np.random.default_rng(1)
    z1, z2 = rng.normal(size=(5, 12)), rng.normal(size=(5, 12))
    assert hand_info_nce(z1[:, :3], z2[:, :3]) != pytest.approx(hand_info_nce(z1, z2), rel=1e-3)


@pytest.mark.parametrize(
    "dims, weights, width, message",
    [
        ([], None, None, "non-empty"),
        ([64, 0], None, None, "positive"),
        ([64, 64], None, None, "twice"),
        ([512, 64], None, 384, "larger than the embedding"),
        ([64, 32], [1.0], None, "one positive weight"),
        (None, [1.0], None, "without matryoshka_dims"),
    ],
)
def test_bad_settings_name_the_key(dims, weights, width, message):
    with pytest.raises(ValueError, match=message):
        check_matryoshka(dims, weights, width)
