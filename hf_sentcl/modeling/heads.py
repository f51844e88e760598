"""Projection heads put on top of pooled sentence vectors."""

from __future__ import annotations

import torch
from torch import nn


class MLPHead(nn.Module):
    """SimCSE's projector: Linear(d, d) followed by tanh (the same shape as BERT's pooler)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(features))
