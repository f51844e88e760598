"""Pooling of token states into one sentence vector: the one definition of the pooling modes.

The encoder (`SentenceEncoder.forward`), the export (its plain-`AutoModel` check and the sentence-transformers
modules it builds) and the model card's usage snippet all take the modes and their computation from here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch


class Pooling(str, enum.Enum):
    """A pooling mode. The value is the name used in recipes and saved configs."""

    CLS = "cls"  # first token, through the head when one is active
    CLS_BEFORE_POOLER = "cls_before_pooler"  # first token, never through the head
    MEAN = "mean"
    MAX = "max"
    FIRST_LAST_AVG = "first_last_avg"  # mean over tokens of (first transformer layer + last layer) / 2
    LAST2_AVG = "last2_avg"  # mean over tokens of (second-to-last layer + last layer) / 2
    PROMPT = "prompt"  # the last layer's state at the [MASK] of the encoder's prompt template (modeling/prompt.py)

    @property
    def averaged_state(self) -> int | None:
        """For a layer average, the index of the hidden state averaged with the last one; None otherwise."""
        return {Pooling.FIRST_LAST_AVG: 1, Pooling.LAST2_AVG: -2}.get(self)

    @property
    def token_pooling(self) -> str:
        """How token states are reduced, as sentence-transformers' `Pooling` module names it: cls, mean or max
        (`prompt` for the [MASK] state, which sentence-transformers has no module for)."""
        if self is Pooling.PROMPT:
            return "prompt"
        if self in (Pooling.CLS, Pooling.CLS_BEFORE_POOLER):
            return "cls"
        return "max" if self is Pooling.MAX else "mean"


POOLING_MODES: tuple[str, ...] = tuple(mode.value for mode in Pooling)


def pooling_mode(value: str | Pooling, key: str = "pooling") -> Pooling:
    """`value` as a `Pooling`; a ValueError naming `key` and the known modes for anything else."""
    try:
        return Pooling(value)
    except ValueError:
        raise ValueError(f"Unknown {key} '{value}'. Choose one of: {', '.join(POOLING_MODES)}.") from None


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
