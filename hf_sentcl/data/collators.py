"""Collation of pre-tokenised views into one padded (batch, views, length) tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from hf_sentcl.data.corpus import VIEW_PREFIX


@dataclass
class ViewCollator:
    """Pad every view of every example to the batch's longest sequence (dynamic padding).

    Returns `input_ids` and `attention_mask` of shape (batch, num_views, length); trainers flatten the views
    into one forward pass.
    """

    tokenizer: PreTrainedTokenizerBase
    num_views: int = 1
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        flat = [{"input_ids": f[f"{VIEW_PREFIX}{v}"]} for v in range(self.num_views) for f in features]
        padded = self.tokenizer.pad(flat, return_tensors="pt", pad_to_multiple_of=self.pad_to_multiple_of)
        batch = len(features)
        return {
            key: padded[key].view(self.num_views, batch, -1).transpose(0, 1).contiguous()
            for key in ("input_ids", "attention_mask")
        }
