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


class ProjectionHead(nn.Module):
    """SimCLR-style projector f used by self-guided contrastive learning (Kim et al. 2021, footnote 4):
    Linear(d, width) - GELU - Linear(width, width) - GELU, width 4096 in the paper. Training-only.

    `init_std` draws the weights from N(0, init_std) with zero biases (the SG-BERT code uses the backbone's
    `initializer_range`); None keeps PyTorch's default initialisation.
    """

    def __init__(self, hidden_size: int, width: int = 4096, init_std: float | None = None):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, width), nn.GELU()
        )
        if init_std is not None:
            for layer in (self.layers[0], self.layers[2]):
                nn.init.normal_(layer.weight, std=init_std)
                nn.init.zeros_(layer.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)
