"""InfoNCE over in-batch negatives (SimCSE, unsupervised and supervised)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_sentcl.losses.false_negatives import exclude_candidates


def cosine_logits(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cosine-similarity matrix sim(a_i, b_j) / temperature, always computed in fp32 (autocast off)."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        a = F.normalize(a.float(), dim=-1)
        b = F.normalize(b.float(), dim=-1)
        return a @ b.T / temperature


def info_nce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    hard_negatives: torch.Tensor | None = None,
    hard_negative_weight: float = 0.0,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimCSE's InfoNCE: row i of z1 is the anchor, z2[i] its positive, every other z2[j] (and every
    hard_negatives[j], if given) a negative. Mean cross-entropy over rows.

    `hard_negative_weight` is added (in logit space, as in SimCSE) to each anchor's own hard negative
    sim(z1[i], hard_negatives[i]) / temperature. `exclude` (rows, candidates; the hard-negative columns after the
    in-batch ones) takes candidates out of the denominator (`hf_sentcl.losses.false_negatives`).
    """
    if z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must have the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}.")
    logits = cosine_logits(z1, z2, temperature)
    if hard_negatives is not None:
        hard = cosine_logits(z1, hard_negatives, temperature)
        if hard_negative_weight:
            hard = hard + hard_negative_weight * torch.eye(hard.shape[0], hard.shape[1], device=hard.device)
        logits = torch.cat([logits, hard], dim=1)
    logits = exclude_candidates(logits, exclude)
    targets = torch.arange(z1.shape[0], device=z1.device)
    with torch.autocast(device_type=z1.device.type, enabled=False):
        return F.cross_entropy(logits, targets)
