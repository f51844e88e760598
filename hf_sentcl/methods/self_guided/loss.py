"""Self-guided contrastive losses (Kim et al. 2021, "Self-Guided Contrastive Learning for BERT Sentence
Representations", section 3). The parameter-distance regularizer L_reg is not here: `hf_sentcl.modeling.peft`, a
lower layer, computes it too, so it is `hf_sentcl.losses.parameter_distance`.

Every loss takes vectors that have already gone through the projection head f: `c` (b, d) are the projected
sentence vectors f(c_i) of the tuned encoder, `h` the projected views f(h_{i,k}) of the frozen copy. phi(u, v) is
exp(cos(u, v) / tau). Similarities and the log-sum-exp run in fp32 with autocast off.

- `sg_loss`       L_base: NT-Xent over the 2b vectors {c_i} U {h_i} (one sampled view per sentence), c_i <-> h_i
                  paired, every other vector a negative, mean over the 2b terms.
- `sg_opt1_loss`  L_opt1 (Table 5 ablation): anchors c_i only; negatives c_j (j != i) and h_j (j != i).
- `sg_opt2_loss`  L_opt2 (Table 5 ablation): anchors c_i only; negatives h_j (j != i).
- `sg_opt_loss`   L_opt (SG-OPT, "opt3"): h has every view, (b, l+1, d); each (i, k) is a term with positive
                  h_{i,k} and negatives h_{m,n} for all m != i and all layers n (other views of sentence i are not
                  negatives), mean over the b(l+1) terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_sentcl.losses.false_negatives import exclude_candidates
from hf_sentcl.losses.info_nce import cosine_logits, info_nce
from hf_sentcl.losses.nt_xent import nt_xent


def _check_pair(c: torch.Tensor, h: torch.Tensor) -> None:
    if c.dim() != 2 or c.shape != h.shape:
        raise ValueError(f"c and h must both have shape (b, d), got {tuple(c.shape)} and {tuple(h.shape)}.")


def sg_loss(c: torch.Tensor, h: torch.Tensor, temperature: float, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """L_base (SG): NT-Xent over X = {c_i} U {h_i}; x_m's positive is its partner mu(x_m), the other 2b - 2
    vectors are its negatives, and the 2b cross-entropy terms are averaged. `exclude`: (2b, 2b) over [c; h]."""
    _check_pair(c, h)
    return nt_xent(c, h, temperature, exclude=exclude)


def sg_opt1_loss(
    c: torch.Tensor, h: torch.Tensor, temperature: float, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """L_opt1: -log phi(c_i, h_i) / (sum_{j != i} phi(c_i, c_j) + sum_j phi(c_i, h_j)), mean over the b anchors c_i.

    Views are no longer anchors (factor (4), h_i <-> h_j, disappears). `exclude`: (b, 2b) over [h, c]."""
    _check_pair(c, h)
    b = c.shape[0]
    to_views = cosine_logits(c, h, temperature)
    to_sentences = cosine_logits(c, c, temperature)
    with torch.autocast(device_type=c.device.type, enabled=False):
        to_sentences = to_sentences.masked_fill(torch.eye(b, dtype=torch.bool, device=c.device), float("-inf"))
        logits = exclude_candidates(torch.cat([to_views, to_sentences], dim=1), exclude)
        return F.cross_entropy(logits, torch.arange(b, device=c.device))


def sg_opt2_loss(
    c: torch.Tensor, h: torch.Tensor, temperature: float, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """L_opt2: -log phi(c_i, h_i) / sum_j phi(c_i, h_j), mean over i (L_opt1 without the c_i <-> c_j factor).
    `exclude`: (b, b) over h."""
    _check_pair(c, h)
    return info_nce(c, h, temperature, exclude=exclude)


def sg_opt_loss(
    c: torch.Tensor, h: torch.Tensor, temperature: float, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """L_opt (SG-OPT): for every sentence i and view k, -log phi(c_i, h_{i,k}) / (phi(c_i, h_{i,k}) +
    sum_{m != i} sum_n phi(c_i, h_{m,n})); mean over the b * num_views terms.

    Args:
        c: (b, d) projected sentence vectors.
        h: (b, num_views, d) projected views of every sentence (num_views = l + 1 when all layers give views).
        exclude: (b, b) sentences m whose every view leaves the denominator of sentence i's terms.
    """
    if c.dim() != 2 or h.dim() != 3 or h.shape[0] != c.shape[0] or h.shape[2] != c.shape[1]:
        raise ValueError(f"expected c (b, d) and h (b, views, d), got {tuple(c.shape)} and {tuple(h.shape)}.")
    b, views, _ = h.shape
    logits = cosine_logits(c, h.reshape(b * views, -1), temperature).view(b, b, views)
    with torch.autocast(device_type=c.device.type, enabled=False):
        own = torch.eye(b, dtype=torch.bool, device=c.device)
        if exclude is not None:
            own = own | exclude
        # (b, views): logit of c_i against its own views h_{i,k} (the diagonal: no boolean select, no host read)
        positives = logits.diagonal(dim1=0, dim2=1).T
        # The negatives are the same for every view k of sentence i: all views of every other sentence.
        negatives = logits.masked_fill(own.unsqueeze(-1), float("-inf")).reshape(b, b * views)
        negative_lse = torch.logsumexp(negatives, dim=1, keepdim=True)  # (b, 1)
        return (torch.logaddexp(positives, negative_lse) - positives).mean()
