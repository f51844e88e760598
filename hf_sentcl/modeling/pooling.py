"""Pooling of token states into one sentence vector. Pure functions of tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of `states` (b, L, d) over the positions where `attention_mask` (b, L) is 1."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def masked_max(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Element-wise max of `states` (b, L, d) over real tokens; padding never wins."""
    fill = torch.finfo(states.dtype).min
    return states.masked_fill(attention_mask.unsqueeze(-1) == 0, fill).max(dim=1).values


def pool(
    hidden_states: Sequence[torch.Tensor],
    attention_mask: torch.Tensor,
    mode: str,
    layer: int = -1,
) -> torch.Tensor:
    """Pool a backbone's hidden states (embedding output first, last layer last) into (b, d) sentence vectors.

    `cls` and `cls_before_pooler` both take the first token here; the difference (whether a head follows) is the
    encoder's business.
    """
    if mode in ("cls", "cls_before_pooler"):
        return hidden_states[layer][:, 0]
    if mode == "mean":
        return masked_mean(hidden_states[layer], attention_mask)
    if mode == "max":
        return masked_max(hidden_states[layer], attention_mask)
    if mode == "first_last_avg":
        return masked_mean((hidden_states[1] + hidden_states[-1]) / 2, attention_mask)
    if mode == "last2_avg":
        return masked_mean((hidden_states[-2] + hidden_states[-1]) / 2, attention_mask)
    raise ValueError(f"Unknown pooling mode '{mode}'.")
