"""Matryoshka Representation Learning (Kusupati et al. 2022) as a plug-in for any contrastive loss.

The method's own loss is added at each leading prefix `x[..., :d]` of the embeddings, for every d in
`matryoshka_dims`, each term weighted (default 1) and summed, as sentence-transformers' `MatryoshkaLoss` does. Every
loss here compares cosine similarities, so each prefix is re-normalised by the loss itself. A model trained so
can be used at any of these sizes by keeping the first d dimensions (`SentenceTransformer(..., truncate_dim=d)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def matryoshka_loss(
    loss_fn: LossFn, vectors: torch.Tensor, dims: Sequence[int], weights: Sequence[float] | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """sum_d w_d * loss_fn(vectors[..., :d]) and the components to log: every term as `loss_dim{d}` (and the
    components the full-size term reports). `loss_fn` takes embeddings whose last axis is the embedding."""
    weights = [1.0] * len(dims) if weights is None else list(weights)
    total, components = None, {}
    for d, weight in sorted(zip(dims, weights), reverse=True):
        loss, parts = loss_fn(vectors[..., :d])
        if d == vectors.shape[-1]:
            components.update(parts)
        components[f"loss_dim{d}"] = loss
        total = weight * loss if total is None else total + weight * loss
    return total, components
