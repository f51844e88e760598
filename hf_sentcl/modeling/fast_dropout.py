"""Dropout for CPU training that draws its masks in bulk.

On CPU, torch's dropout samples one Bernoulli variable per element (`bernoulli_`): for SimCSE on MiniLM that is a
quarter of a bf16 training step. Here the random bits come in bulk: 64-bit words from a PCG64 generator (numpy's,
1.9x the rate of torch's own `random_()` on one core, and torch's CPU generator fills serially either way), seeded
for each mask by one draw of torch's default generator, so `torch.manual_seed` and the cached step's saved random
states reproduce the masks. Each word is cut into four 16-bit numbers and an element is dropped when its number
falls below p * 65536: the same dropout (each element dropped independently with probability p rounded to a
multiple of 1/65536, survivors scaled by the exact inverse keep rate). The comparison writes the mask straight in
the input's dtype (a bool mask would be cast to it by every multiply, forward and backward); in fp32 it holds the
scale too, so applying it is one multiply each way. On other devices the native (fused) dropout is kept.

`use_fast_dropout(model)` puts it in place in a model: every `nn.Dropout` module becomes a `FastDropout`, and a
model whose config selects SDPA attention gets the attention function `sdpa_fast_dropout`, which runs attention
explicitly with fast dropout on the probabilities while training on CPU and is plain SDPA everywhere else.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

#: resolution of the drop probability: p is rounded to a multiple of 1 / _LEVELS
_LEVELS = 1 << 16
ATTENTION_NAME = "sdpa_fast_dropout"
#: dtypes that compute `x * scale` in their own precision: there the mask can carry the scale with the same result
_SCALED_MASK_DTYPES = (torch.float32, torch.float64)


@torch.compiler.disable  # numpy's generator runs eagerly, so a compiled layer draws the masks the eager one does
def _random_words(count: int) -> torch.Tensor:
    """`count` int64 words of uniform random bits (CPU) from a PCG64 generator seeded by torch's default one."""
    seed = int(torch.empty((), dtype=torch.int64).random_())
    return torch.from_numpy(np.random.PCG64(seed).random_raw(count).view(np.int64))


def _keep_mask(shape: torch.Size, p: float, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, float]:
    """(mask, scale): a `dtype` mask that keeps each element with probability 1 - q, q = round(p * 65536) / 65536,
    and the survivors' scale 1 / (1 - q). The mask holds 0 / scale where `dtype` multiplies by the scale in its own
    precision (fp32), else 0 / 1 and the caller multiplies by `scale` (bf16 and fp16 do that in fp32: rounding the
    scale into the mask would change the survivors' values)."""
    dropped = round(p * _LEVELS)
    count = shape.numel()
    numbers = _random_words((count + 3) // 4).to(device).view(torch.int16)  # uniform over -32768 .. 32767
    mask = torch.empty(len(numbers), dtype=dtype, device=device)
    torch.ge(numbers, dropped - _LEVELS // 2, out=mask)
    mask = mask[:count].view(shape)
    scale = _LEVELS / (_LEVELS - dropped)
    return (mask.mul_(scale), 1.0) if dtype in _SCALED_MASK_DTYPES else (mask, scale)


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale (scale 1: a mask that carries it), keeping only the mask for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return _mask_and_scale(x, mask, scale)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return _mask_and_scale(grad_output, mask, ctx.scale), None, None


def _mask_and_scale(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    if scale == 1.0:
        return x * mask
    # one pass instead of (x * mask).mul_(scale): for bf16 / fp16 addcmul computes 0 + scale * x * mask in fp32 and
    # rounds once, the same values (the mask is 0 or 1) at 0.6-0.7x the time
    return torch.addcmul(x.new_zeros(()), x, mask, value=scale)


def fast_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with bulk-drawn masks on CPU (see the module docstring)."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}.")
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or round(p * _LEVELS) == _LEVELS:
        return nn.functional.dropout(x, p, training)
    mask, scale = _keep_mask(x.shape, p, x.dtype, x.device)
    return _MaskedScale.apply(x, mask, scale)


class FastDropout(nn.Dropout):
    """`nn.Dropout` (same p, same state dict, same train/eval switch) with `fast_dropout` on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return fast_dropout(x, self.p, self.training)


def attention_probabilities(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """softmax(scores) over the keys, in `dtype`, computed in fp32 as transformers' eager attention does.

    For bf16 scores on CPU torch's softmax computes in fp32 and rounds once: the same values as
    `softmax(dtype=float32).to(bf16)` (tested), without two full-size casts forward and two backward."""
    if scores.dtype == dtype == torch.bfloat16 and scores.device.type == "cpu":
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)


def sdpa_fast_dropout(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention for `AttentionInterface`: SDPA, except bidirectional attention while training on CPU (with or
    without dropout), which is computed explicitly (softmax(q k^T * scaling + mask) then `fast_dropout`, as SDPA's
    own math path does): SDPA's CPU backward is 7x the explicit product's in bf16 at MiniLM's shapes (1.4x in
    fp32). Training forwards without gradients (the cached step's first pass) take the same route as their replay."""
    explicit = (
        (dropout > 0 or getattr(module, "training", False))
        and query.device.type == "cpu"
        and query.shape[1] == key.shape[1]
        and not kwargs.get("is_causal", getattr(module, "is_causal", False))
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
    )
    if not explicit:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    probabilities = fast_dropout(attention_probabilities(scores, query.dtype), dropout)
    output = torch.matmul(probabilities, value).transpose(1, 2).contiguous()
    return output, None


AttentionInterface.register(ATTENTION_NAME, sdpa_fast_dropout)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


def _switch(model: nn.Module, dropout_from: type, dropout_to: type, attention_from: str, attention_to: str) -> int:
    """Re-class every `dropout_from` module as `dropout_to` and move configs on `attention_from` to `attention_to`."""
    switched = 0
    for module in model.modules():
        if type(module) is dropout_from:
            module.__class__ = dropout_to
            switched += 1
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == attention_from:
            config._attn_implementation = attention_to
    return switched


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every `nn.Dropout` of `model` for a `FastDropout` and move SDPA attention to `sdpa_fast_dropout`.

    Weights, probabilities and the saved config are unchanged. Returns the number of dropout modules swapped."""
    return _switch(model, nn.Dropout, FastDropout, "sdpa", ATTENTION_NAME)


def restore_native_dropout(model: nn.Module) -> None:
    """Undo `use_fast_dropout` (native dropout modules, SDPA attention)."""
    _switch(model, FastDropout, nn.Dropout, ATTENTION_NAME, "sdpa")
