"""Gathering embeddings across processes so in-batch negatives span the global batch, and waiting for process 0's
long solo work without running into the process group's timeout."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

#: how long the other processes wait for process 0's solo work (an evaluation, writing a stage's export)
SOLO_WORK_TIMEOUT = datetime.timedelta(hours=12)
_waiting_group = None


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


def gather_padded(local: torch.Tensor, pad_value: int = 0) -> torch.Tensor:
    """Concatenate `local` (rows, ..., length) from every process along dim 0, its last axis padded with
    `pad_value` to the longest of all processes (token batches are padded to their own longest text). No gradient;
    the lengths are read on the host, one small collective."""
    size = world_size()
    if size == 1:
        return local
    length = torch.tensor([local.shape[-1]], device=local.device)
    lengths = [torch.empty_like(length) for _ in range(size)]
    dist.all_gather(lengths, length)
    longest = int(torch.cat(lengths).max())
    padded = torch.nn.functional.pad(local, (0, longest - local.shape[-1]), value=pad_value).contiguous()
    slices = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(slices, padded)
    return torch.cat(slices, dim=0)


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


def _long_wait_group():
    """A gloo group over every process whose collectives may wait `SOLO_WORK_TIMEOUT` (the default group's timeout,
    `ddp_timeout`, is sized for training steps, not for an evaluation suite on one process)."""
    global _waiting_group
    if _waiting_group is None:
        _waiting_group = dist.new_group(backend="gloo", timeout=SOLO_WORK_TIMEOUT)
    return _waiting_group


@contextlib.contextmanager
def others_wait_for_main_process() -> Iterator[bool]:
    """Every process enters; the block's body is for process 0 (the yielded flag says whether this is it), and
    the others wait at the end in a barrier of a long-timeout group, not in the next collective of the default
    group (e.g. DDP's or FSDP's preparation), which would give up after `ddp_timeout`."""
    if world_size() == 1:
        yield True
        return
    group = _long_wait_group()
    try:
        yield dist.get_rank() == 0
    finally:
        dist.barrier(group=group)


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on any process (`flag` itself outside a process group); every process must call it.
    On the long-wait group: a process may arrive after another's solo work."""
    if world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=_long_wait_group())
    return bool(value.item())


def finish_processes(status: int) -> int:
    """End of a run on every process: wait for the others (process 0's final evaluation and export may take long),
    agree on one exit status (the largest: a failure or preemption anywhere is the launch's), and take the process
    group down, so no process leaves while a peer still talks to it (gloo then aborts the leaver: 'terminate called
    without an active exception'). With several processes it exits with the agreed status instead of returning."""
    if world_size() == 1:
        return status
    code = torch.tensor([status], dtype=torch.int64)
    dist.all_reduce(code, op=dist.ReduceOp.MAX, group=_long_wait_group())
    dist.destroy_process_group()
    # gloo's threads can still abort a process in its static destructors at interpreter exit ('terminate called
    # without an active exception', seen in CI after a complete run): everything is written, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code.item()))
