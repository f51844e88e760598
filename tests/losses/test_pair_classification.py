"""ConSERT's supervised NLI loss on (r1, r2, |r1-r2|) against a hand computation."""

import math

import pytest
import torch

from hf_sentcl.losses import pair_classification_loss


# ------------------------------------------------------------------------------------------ supervised loss
def test_pair_classification_loss_matches_hand_computation():
    """L_ce = -log softmax(W [r1, r2, |r1 - r2|] + b)[y], mean over pairs, in float64 loops; fp32 under autocast."""
    g = torch.Generator().manual_seed(10)
    r1, r2 = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    weight, bias = torch.randn(3, 12, generator=g), torch.randn(3, generator=g)
    labels = torch.tensor([0, 2, 1, 1, 0])
    expected = 0.0
    for i in range(5):
        a, b = [float(v) for v in r1[i]], [float(v) for v in r2[i]]
        features = a + b + [abs(x - y) for x, y in zip(a, b)]
        logits = [sum(float(weight[c, j]) * features[j] for j in range(12)) + float(bias[c]) for c in range(3)]
        top = max(logits)
        expected += -(logits[labels[i]] - top) + math.log(sum(math.exp(v - top) for v in logits))
    expected /= 5
    loss, logits = pair_classification_loss(r1, r2, labels, weight, bias)
    assert logits.shape == (5, 3)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast, _ = pair_classification_loss(r1, r2, labels, weight, bias)
    assert under_autocast.dtype == torch.float32 and under_autocast.item() == pytest.approx(expected, rel=1e-5)
