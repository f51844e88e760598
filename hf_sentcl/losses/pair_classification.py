"""Sentence-pair classification loss of SBERT and ConSERT's supervised settings (ConSERT Eq. 2).

f = Concat(r1, r2, |r1 - r2|), L_ce = CrossEntropy(W f + b, y), with a linear classifier W, b over the NLI
classes. Features, logits and the cross-entropy are computed in fp32 even under autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pair_features(r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """Concat(r1, r2, |r1 - r2|): (N, 3d) from two (N, d) batches of sentence embeddings."""
    if r1.dim() != 2 or r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must both have shape (N, d), got {tuple(r1.shape)} and {tuple(r2.shape)}.")
    return torch.cat([r1, r2, (r1 - r2).abs()], dim=-1)


def pair_classification_loss(
    r1: torch.Tensor,
    r2: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of the logits W Concat(r1, r2, |r1 - r2|) + b against `labels`; returns (loss, logits).

    Args:
        r1, r2: (N, d) embeddings of the first and second sentences.
        labels: (N,) class indices.
        weight: (classes, 3d) classifier weight W; bias: (classes,) or None.
    """
    with torch.autocast(device_type=r1.device.type, enabled=False):
        features = pair_features(r1.float(), r2.float())
        logits = F.linear(features, weight.float(), None if bias is None else bias.float())
        return F.cross_entropy(logits, labels), logits
