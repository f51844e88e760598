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


def check_matryoshka(dims: Sequence[int] | None, weights: Sequence[float] | None, width: int | None = None) -> None:
    """Raise ValueError naming `matryoshka_dims` / `matryoshka_weights` when they do not describe prefixes:
    positive, distinct sizes (at most `width`, the embedding size, when known) and one positive weight each."""
    if dims is None:
        if weights is not None:
            raise ValueError("matryoshka_weights is set without matryoshka_dims; set both or neither.")
        return
    dims = list(dims)
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(
            f"matryoshka_dims must be a non-empty list of positive sizes, e.g. [384, 256, 128, 64]; got {dims}."
        )
    if len(set(dims)) != len(dims):
        raise ValueError(f"matryoshka_dims lists a size twice: {dims}.")
    if width is not None and max(dims) > width:
        raise ValueError(
            f"matryoshka_dims: {max(dims)} is larger than the embedding ({width} dimensions); use sizes <= {width}."
        )
    if weights is not None and (len(weights) != len(dims) or any(w <= 0 for w in weights)):
        raise ValueError(
            f"matryoshka_weights must give one positive weight per matryoshka_dims entry ({len(dims)}); "
            f"got {list(weights)}."
        )


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
