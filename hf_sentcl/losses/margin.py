"""Margin-perturbed InfoNCE: IFM (Robinson et al. 2021) and BYOP (bootstrap your own PLM).

Following BYOP's Eq. 3 (and section 4.1), the margin is applied to the cosine similarities *before* the
division by the temperature: a perturbed row i reads

    (sim(z_i, z'_i) +/- m_i) / tau      for the positive  ('p+' adds, 'p-' subtracts)
    (sim(z_i, z'_j) +/- m_i) / tau      for every negative j != i  ('n+' adds, 'n-' subtracts)

so in logit space the shift is m / tau. IFM is 'p-n+' (towards gradient ascent); BYOP uses descent directions
('p+', 'n-', 'p+n-', and the paper's grid also lists 'p-', 'p-n-'). The margin is a constant m (BYOP-C, IFM) or
the dynamic m_i = sim(z_i, z'_i) / (number of negatives of row i) (BYOP-D; the paper writes N - 1 for a batch
of N). `multi_task` returns 0.5 * (plain + perturbed), the "-M" variants and IFM's own l_total.

Because a softmax is unchanged when every logit of a row moves by the same amount, only the difference between
the positive and the negative shifts matters: 'p+' == 'n-', 'p-' == 'n+', 'p+n-' == 'p+' with 2m, 'p-n+' == 'p-'
with 2m, and 'p-n-' / 'p+n+' leave the loss exactly equal to plain InfoNCE (for constant and dynamic margins).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_sentcl.configs.perturbation import Perturbation, parse_perturbation
from hf_sentcl.losses.false_negatives import exclude_candidates
from hf_sentcl.losses.info_nce import cosine_logits, info_nce


def dynamic_margin(similarities: torch.Tensor, targets: torch.Tensor, detach: bool = True) -> torch.Tensor:
    """BYOP-D's margin per row: sim(anchor, positive) / (number of negatives in the row), shape (rows, 1).

    Negatives are the row's finite entries other than the target (masked entries, e.g. -inf self-similarities
    of a 2N-view NT-Xent, do not count); for SimCSE's N x N matrix that is the paper's N - 1.
    """
    positive = similarities.gather(1, targets[:, None])
    negatives = torch.isfinite(similarities).sum(dim=1, keepdim=True) - 1
    margin = positive / negatives.clamp_min(1).to(similarities.dtype)
    return margin.detach() if detach else margin


def perturb_similarities(
    similarities: torch.Tensor,
    targets: torch.Tensor,
    perturbation: str | Perturbation,
    margin: float | torch.Tensor,
) -> torch.Tensor:
    """Add +/- `margin` (a scalar or one value per row, shape (rows, 1)) to the positive entry (column
    `targets[i]`) and/or to every other entry of each row, as the spec says."""
    spec = parse_perturbation(perturbation)
    is_positive = F.one_hot(targets, similarities.shape[1]).to(similarities.dtype)
    direction = spec.positive * is_positive + spec.negative * (1 - is_positive)
    return similarities + direction * margin


def margin_cross_entropy(
    similarities: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    perturbation: str | Perturbation,
    margin: float = 0.0,
    dynamic: bool = False,
    multi_task: bool = False,
    detach_margin: bool = True,
    logit_bias: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of perturbed similarities / temperature against `targets` (mean over rows).

    Works on any in-batch InfoNCE written as a (rows, candidates) similarity matrix with one positive column per
    row, so other methods (e.g. an NT-Xent over 2N views with -inf on the diagonal) can reuse it.
    `logit_bias` is added after the division by the temperature (SimCSE's hard-negative weight); `exclude` takes
    candidates out of every row's denominator (and out of BYOP-D's count of negatives).
    """
    with torch.autocast(device_type=similarities.device.type, enabled=False):
        similarities = exclude_candidates(similarities.float(), exclude)
        m = dynamic_margin(similarities, targets, detach_margin) if dynamic else margin
        perturbed = perturb_similarities(similarities, targets, perturbation, m) / temperature
        if logit_bias is not None:
            perturbed = perturbed + logit_bias
        loss = F.cross_entropy(perturbed, targets)
        if multi_task:
            plain = similarities / temperature
            if logit_bias is not None:
                plain = plain + logit_bias
            loss = 0.5 * (F.cross_entropy(plain, targets) + loss)
        return loss


def margin_info_nce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    perturbation: str | Perturbation | None,
    margin: float = 0.0,
    dynamic: bool = False,
    multi_task: bool = False,
    detach_margin: bool = True,
    hard_negatives: torch.Tensor | None = None,
    hard_negative_weight: float = 0.0,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimCSE's InfoNCE with an IFM/BYOP margin: anchors z1[i], positives z2[i], negatives z2[j != i] (and every
    hard_negatives[j], which the 'n' term shifts too). With `perturbation=None`, or a zero constant margin, the
    result equals `info_nce` exactly.

    Args:
        perturbation: spec such as 'p+n-' (see `parse_perturbation`), or None for plain InfoNCE.
        margin: the constant margin m in similarity units (BYOP-C / IFM); ignored when `dynamic`.
        dynamic: use BYOP-D's m_i = sim(z1[i], z2[i]) / (number of negatives of row i).
        multi_task: return 0.5 * (plain + perturbed) (IFM's Eq. 3 and BYOP's "-M" variants).
        detach_margin: treat the dynamic margin as a constant (no gradient through it); see the README.
        exclude: (rows, candidates) false negatives to drop (`hf_sentcl.losses.false_negatives`).
    """
    if perturbation is None:
        return info_nce(z1, z2, temperature, hard_negatives, hard_negative_weight, exclude)
    if z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must have the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}.")
    if margin < 0:
        raise ValueError(f"margin must be >= 0 (the spec's +/- gives the direction), got {margin}.")
    similarities = cosine_logits(z1, z2, 1.0)
    bias = None
    if hard_negatives is not None:
        similarities = torch.cat([similarities, cosine_logits(z1, hard_negatives, 1.0)], dim=1)
        if hard_negative_weight:
            n = z1.shape[0]
            bias = torch.zeros_like(similarities)
            bias[:, n:] = hard_negative_weight * torch.eye(n, device=bias.device)
    targets = torch.arange(z1.shape[0], device=z1.device)
    return margin_cross_entropy(
        similarities, targets, temperature, perturbation, margin, dynamic, multi_task, detach_margin, bias, exclude
    )
