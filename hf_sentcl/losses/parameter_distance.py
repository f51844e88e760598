"""The parameter-distance regularizer of self-guided contrastive learning (Kim et al. 2021, section 3): L_reg = sum
over the parameters the tuned and the frozen encoder share of ||theta_T - theta_F||^2. Here rather than in the
self-guided method's folder (`hf_sentcl.methods.self_guided`) because `hf_sentcl.modeling.peft.weight_distance`, a
lower layer, computes it for a plain (not LoRA-wrapped) encoder."""

from __future__ import annotations

import torch
from torch import nn


class _SquaredDistance(torch.autograd.Function):
    """sum_i ||tuned_i - frozen_i||^2 that keeps no differences for backward: the gradient 2 (tuned_i - frozen_i)
    is recomputed from the parameters themselves, so the regularizer costs no activation memory (for BERT-base
    the differences would be another 85M floats)."""

    @staticmethod
    def forward(ctx, count: int, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.count = count
        ctx.save_for_backward(*tensors)
        dtype = torch.promote_types(tensors[0].dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        total = torch.zeros((), dtype=dtype, device=tensors[0].device)
        for tuned, frozen in zip(tensors[:count], tensors[count:]):
            total += (tuned.to(dtype) - frozen.to(dtype)).pow(2).sum()
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        tensors, count = ctx.saved_tensors, ctx.count
        grads = [
            (2 * grad_output * (tuned - frozen.to(tuned.dtype))).to(tuned.dtype) if needs_grad else None
            for tuned, frozen, needs_grad in zip(tensors[:count], tensors[count:], ctx.needs_input_grad[1 : 1 + count])
        ]
        return (None, *grads, *([None] * count))


def parameter_distance(tuned: nn.Module, frozen: nn.Module, trainable_only: bool = True) -> torch.Tensor:
    """L_reg = sum over the parameters both modules share (by name and shape) of ||theta_tuned - theta_frozen||^2.

    Gradient flows into `tuned` only, and no per-parameter difference is kept for backward. With `trainable_only`
    (the default) parameters that `tuned` does not train are skipped: they still equal the frozen copy's, so their
    terms are exactly zero and computing them (the embedding matrix, for SG's frozen layer 0) would only cost
    time. The sum is accumulated in fp32.
    """
    reference = dict(frozen.named_parameters())
    pairs = [
        (param, reference[name].detach())
        for name, param in tuned.named_parameters()
        if name in reference
        and reference[name].shape == param.shape
        and (param.requires_grad or not trainable_only)
    ]
    if not pairs:
        return torch.zeros((), device=next(tuned.parameters()).device)
    return _SquaredDistance.apply(len(pairs), *(p for p, _ in pairs), *(f for _, f in pairs))
