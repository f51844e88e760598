"""Gathering embeddings across processes so in-batch negatives span the global batch."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(local: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate `local` from every process along `dim`, keeping the autograd graph for the local slice.

    Other processes' slices arrive without gradient; each process back-propagates only through its own slice.
    A loss computed on the gathered tensor therefore has to be multiplied by the world size before backward,
    because DDP averages gradients over processes (see `ContrastiveTrainer.compute_loss`).
    """
    size = world_size()
    if size == 1:
        return local
    slices = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(slices, local.contiguous())
    slices[dist.get_rank()] = local
    return torch.cat(slices, dim=dim)


def mean_over_processes(value: torch.Tensor) -> torch.Tensor:
    """The mean of `value` over every process (`value` itself outside a process group); every process must call it.

    Logged loss components computed from one process's examples (a masked-LM or NLI loss) then describe the global
    batch, as the Trainer's own logged loss does."""
    size = world_size()
    if size == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / size
