"""Compiled training layers (recipe key `compile_layers`): each transformer layer's training forward, or its
token-wise part, through `torch.compile` (inductor, dynamic shapes).

What compiling buys is the token-wise work between the GEMMs: bias + GELU, dropout + residual + LayerNorm become a
few fused loops instead of one pass over memory per operation.

- On the unpadded route (`hf_sentcl.modeling.unpadded`, the CPU training step) the token-wise rest of each layer
  after attention (`layer_tail`: the attention's output block and the feed-forward block) runs compiled, one graph
  for every layer and every batch (the packed token count is a dynamic size). The attention itself stays eager: its
  gathers into per-head views and the fused Q/K/V GEMM are custom autograd functions, and compiling the whole layer
  measured slower (docs/benchmarks.md).
- On the padded and flattened routes the layer module's own forward runs compiled.

Only training forwards (module in training mode, gradients on) take the compiled path: evaluation and `encode`
stay eager, so the compilation happens once, at the first training steps, and never for the many shapes of
evaluation batches. Dropout draws its masks from torch's generator inside the graph as outside it (inductor's
`fallback_random`), so a compiled step equals the eager step with the same seed, masks included (to fp32 rounding),
and the cached step's eager first pass and compiled replay draw the same masks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: compiled forwards, one per layer class (the function takes the layer as its first argument, so every layer of
#: a backbone shares it; dynamo reuses the graph across them since module parameters are graph inputs)
_COMPILED: dict[object, Callable] = {}
_CLASSES: dict[type, type] = {}


class CompiledTrainingLayer:
    """Mixin put in front of a transformer layer's class by `compile_layers`: training forwards run compiled."""

    def forward(self, *args, **kwargs):
        base = layer_class(self)
        if runs_compiled(self):
            return compiled(base, base.forward)(self, *args, **kwargs)
        return base.forward(self, *args, **kwargs)


def layer_class(layer: CompiledTrainingLayer) -> type:
    """The class the layer had before `compile_layers` (the one after this mixin in its MRO)."""
    mro = type(layer).__mro__
    return mro[mro.index(CompiledTrainingLayer) + 1]


def compiled(key: object, function: Callable) -> Callable:
    """`torch.compile(function, dynamic=True)`, made once per `key`. Random numbers come from torch's own generator
    (inductor's `fallback_random`), so dropout draws the masks the eager layer would."""
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, dynamic=True, options={"fallback_random": True})
    return _COMPILED[key]


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated layers of the backbone inside `model` (BERT-family `encoder.layer`, DistilBERT's
    `transformer.layer`), in order."""
    return [layer for name, stack in model.named_modules() if isinstance(stack, nn.ModuleList)
            and name.split(".")[-2:] in (["encoder", "layer"], ["transformer", "layer"]) for layer in stack]


def compile_layers(model: nn.Module) -> int:
    """Make every transformer layer of `model` run its training forwards compiled (see the module docstring).

    Weights, the state dict and the saved config are unchanged. Returns the number of layers switched; raises
    ValueError when the model has no layer stack this knows."""
    stack = transformer_layers(model)
    if not stack:
        raise ValueError(
            f"compile_layers: {type(model).__name__} has no transformer layer stack (encoder.layer or "
            "transformer.layer) to compile; set compile_layers: false."
        )
    layers = [layer for layer in stack if not isinstance(layer, CompiledTrainingLayer)]
    for layer in layers:
        cls = type(layer)
        if cls not in _CLASSES:
            _CLASSES[cls] = type(f"CompiledTraining{cls.__name__}", (CompiledTrainingLayer, cls), {})
        layer.__class__ = _CLASSES[cls]
    if layers:
        logger.info("compile_layers: %d %s layers run their training forwards compiled (torch.compile, inductor); "
                    "the first training steps compile them.", len(layers), layer_class(layers[0]).__name__)
    return len(layers)


def uncompile_layers(model: nn.Module) -> None:
    """Undo `compile_layers` (eager layers again)."""
    for module in model.modules():
        if isinstance(module, CompiledTrainingLayer):
            module.__class__ = layer_class(module)


def runs_compiled(layer: nn.Module) -> bool:
    """Whether this forward of `layer` takes the compiled path (a switched layer, training, gradients on)."""
    return isinstance(layer, CompiledTrainingLayer) and layer.training and torch.is_grad_enabled()
