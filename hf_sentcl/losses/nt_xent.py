"""NT-Xent over 2N views (SimCLR; ConSERT section 3.3, CLEAR section 3.3).

Every one of the 2N vectors is an anchor: its positive is the other view of the same sentence, the remaining
2N - 2 vectors are its negatives, and the 2N cross-entropy terms are averaged (`reduction="mean"`, SimCLR's and
ConSERT's form) or summed (`reduction="sum"`, CLEAR's Eq. 2: L_CL = sum over all positive pairs (i, j) of l(i, j)).
This differs from SimCSE's InfoNCE (`info_nce`), where only z1 anchors and only z2 supplies candidates.
"""

from __future__ import annotations

import torch

from hf_sentcl.losses.false_negatives import exclude_candidates
from hf_sentcl.losses.info_nce import cosine_logits
from hf_sentcl.losses.margin import Perturbation, margin_cross_entropy

#: how the 2N per-view terms combine
NT_XENT_REDUCTIONS = ("mean", "sum")


def nt_xent_similarities(z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (2N, 2N) cosine-similarity matrix of [z1; z2] with -inf on the diagonal (a vector is never its own
    candidate), and each row's target column (row i < N pairs with N + i, row N + i with i). fp32."""
    if z1.dim() != 2 or z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must both have shape (N, d), got {tuple(z1.shape)} and {tuple(z2.shape)}.")
    n = z1.shape[0]
    x = torch.cat([z1, z2], dim=0)
    similarities = cosine_logits(x, x, 1.0)
    self_mask = torch.eye(2 * n, dtype=torch.bool, device=similarities.device)
    similarities = similarities.masked_fill(self_mask, float("-inf"))
    targets = torch.arange(2 * n, device=similarities.device).roll(n)  # built on the device: no host-to-device copy
    return similarities, targets


def nt_xent(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    *,
    perturbation: str | Perturbation | None = None,
    margin: float = 0.0,
    dynamic: bool = False,
    multi_task: bool = False,
    detach_margin: bool = True,
    reduction: str = "mean",
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean (or, `reduction="sum"`, sum) over the 2N views of -log exp(sim(x_a, x_pos)/tau) / sum_{k != a}
    exp(sim(x_a, x_k)/tau).

    The other keyword arguments are the IFM/BYOP margin plug-in (see `margin_cross_entropy`); with
    `perturbation=None` the loss is plain NT-Xent. BYOP-D's dynamic margin divides by the row's 2N - 2 negatives.
    `exclude` (2N, 2N), rows and columns ordered [z1; z2], takes false negatives out of the denominators.
    """
    if reduction not in NT_XENT_REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(NT_XENT_REDUCTIONS)}, got '{reduction}'.")
    similarities, targets = nt_xent_similarities(z1, z2)
    similarities = exclude_candidates(similarities, exclude)
    if perturbation is None:
        with torch.autocast(device_type=similarities.device.type, enabled=False):
            loss = torch.nn.functional.cross_entropy(similarities / temperature, targets)
    else:
        if margin < 0:
            raise ValueError(f"margin must be >= 0 (the spec's +/- gives the direction), got {margin}.")
        loss = margin_cross_entropy(
            similarities, targets, temperature, perturbation, margin, dynamic, multi_task, detach_margin
        )
    return loss * len(targets) if reduction == "sum" else loss
