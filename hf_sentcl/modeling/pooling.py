"""Pooling of token states into one sentence vector: the one computation of the pooling modes (the modes themselves,
`Pooling`, are recipe vocabulary in `hf_sentcl.configs.choices`).

The encoder (`SentenceEncoder.forward`), the export (its plain-`AutoModel` check and the sentence-transformers
modules it builds) and the model card's usage snippet all take the modes' computation from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_sentcl.configs.choices import Pooling, pooling_mode


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
    mode: str | Pooling,
    layer: int = -1,
) -> torch.Tensor:
    """Pool a backbone's hidden states (embedding output first, last layer last) into (b, d) sentence vectors.

    `layer` picks the state that cls/mean/max read; layer averages always read their two states. `cls` and
    `cls_before_pooler` both take the first token here; whether a head follows is the encoder's business.
    """
    mode = pooling_mode(mode)
    if mode is Pooling.PROMPT:
        raise ValueError("prompt pooling reads the [MASK] position of the token ids: use prompt.mask_states.")
    if mode.averaged_state is not None:
        return masked_mean((hidden_states[mode.averaged_state] + hidden_states[-1]) / 2, attention_mask)
    states = hidden_states[layer]
    if mode.token_pooling == "cls":
        return states[:, 0]
    return masked_mean(states, attention_mask) if mode.token_pooling == "mean" else masked_max(states, attention_mask)
