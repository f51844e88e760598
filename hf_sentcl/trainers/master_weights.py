"""The fp32 weights of a model trained under DeepSpeed: where training starts from, and what is saved and exported.

DeepSpeed's bf16/fp16 engines (ZeRO-2 and ZeRO-3) hold the module itself in 16 bits and keep the fp32 "master"
weights, which the optimizer updates, partitioned across the processes in the optimizer's state. Two things lose
precision on the way, and both are undone here:

- the engine casts the module to 16 bits before it creates the masters from it, so training would start from the
  pretrained weights rounded to bf16's 8 significant bits (a relative error of up to 2^-9: larger than the whole
  update of a run at ConSERT's learning rate of 5e-7). `restore_master_weights` sets the masters of a fresh run to
  the weights as they were before the cast (`weights_snapshot`, taken before training); a resumed run takes them
  from its checkpoint;
- saving the module (Trainer's default, or ZeRO-3's gathered 16-bit save) would publish the 16-bit copy cast back to
  fp32, although the fp32 weights exist. `master_state_dict` assembles the fp32 weights instead, as DeepSpeed's own
  consolidation (`zero_to_fp32`) would from a checkpoint:

- trained parameters: their fp32 master (`deepspeed.utils.safe_get_full_fp32_param`, a collective: every process
  calls it, in the same order);
- frozen parameters (no master: the backbone's pooler, LoRA's base weights, SG's frozen embedding layer): the value
  they had before the engine cast them (`weights_snapshot`), else the module's own value,
  gathered under ZeRO-3;
- buffers: the module's own.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn


def weights_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the parameters of `module`, by state-dict name, taken before DeepSpeed casts the module to 16
    bits: the trained ones are where `restore_master_weights` starts them from, the frozen ones never change (so these
    are their final values)."""
    return {name: p.detach().to("cpu", copy=True) for name, p in module.named_parameters()}


def restore_master_weights(module: nn.Module, snapshot: dict[str, torch.Tensor]) -> int:
    """Set the fp32 master weight of every trained parameter of an engine's `module` to its value in `snapshot`
    (each process sets its own partition; no communication) and drop those entries from `snapshot`; returns how
    many were set."""
    from deepspeed.utils import safe_set_full_fp32_param

    restored = 0
    for name, param in module.named_parameters():
        if param.requires_grad and name in snapshot:
            value = snapshot.pop(name).to(param.device)
            if hasattr(param, "ds_id"):
                _set_zero3_partition(param, value)
            else:
                safe_set_full_fp32_param(param, value)
            restored += 1
    return restored


def _set_zero3_partition(param: nn.Parameter, value: torch.Tensor) -> None:
    """Set this process's partition of a ZeRO-3 parameter's fp32 master to its slice of `value`. DeepSpeed's own
    `safe_set_full_fp32_param` cuts the last partition past the end of a parameter whose size the process count does
    not divide (its partitions are padded): the slice is taken from `value` padded the same way."""
    import torch.distributed as dist
    from deepspeed.utils import safe_set_local_fp32_param

    size = param.ds_tensor.numel()
    rank = dist.get_rank(group=getattr(param, "ds_process_group", None))
    flat = torch.nn.functional.pad(value.flatten(), (0, max(0, size * (rank + 1) - value.numel())))
    safe_set_local_fp32_param(param, flat.narrow(0, size * rank, size))


def _gathered(param: nn.Parameter):
    """A context in which a ZeRO-3 partitioned `param` holds its whole value (collective); a no-op otherwise."""
    if not hasattr(param, "ds_id"):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=None)


def master_state_dict(module: nn.Module, frozen: dict[str, torch.Tensor], keep: bool) -> dict[str, torch.Tensor]:
    """`module`'s state dict with the fp32 master weights of an engine's module (see the module docstring), on the
    CPU; every process must call it (the masters are partitioned), and only where `keep` is the result filled
    (process 0, which saves), so that the others hold no full copy."""
    from deepspeed.utils import safe_get_full_fp32_param

    state: dict[str, torch.Tensor] = {}
    assembled: dict[int, torch.Tensor] = {}  # tied weights: one tensor under each of their names
    for name, value in module.state_dict(keep_vars=True).items():
        if not isinstance(value, nn.Parameter):
            if keep:
                state[name] = value.detach().to("cpu", copy=True)
            continue
        if id(value) not in assembled:
            if value.requires_grad:
                full = safe_get_full_fp32_param(value)
                if full is None:
                    raise RuntimeError(f"DeepSpeed holds no fp32 master weight for the trained parameter '{name}'.")
            elif name in frozen:
                full = frozen[name]
            else:
                with _gathered(value):
                    full = value.detach().clone()
            assembled[id(value)] = full.detach().to("cpu", torch.float32) if keep else full.new_empty(0)
        if keep:
            state[name] = assembled[id(value)]
    return state
