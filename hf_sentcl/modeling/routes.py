"""Which route a backbone's forward takes (`choose_route`, `backbone_route`), and why when it falls back to padding.

- `unpadded`: `hf_sentcl.modeling.unpadded` (BERT, RoBERTa, XLM-R, CamemBERT with eager / SDPA attention) on the
  CPU, for batches with more than 10% padding (`DENSE_SHARE`; fuller ones, such as `encode`'s length-sorted batches,
  run padded). The packed shape depends on how many tokens are real, so packing reads that count on the host: free
  on a CPU, a stall in every forward on a GPU, where the padded SDPA path runs instead (and the training step makes
  no host read);
- `flattened`: on CUDA with a FlashAttention kernel (`attn_implementation: flash_attention_2`), transformers' own
  padding-free route: the batch flattened as `DataCollatorWithFlattening` does (one row of tokens, position ids
  restarting per sequence at `position_ids_start`, `cu_seq_lens_*` for the varlen kernel; see
  `hf_sentcl.modeling.backbone_forward`);
- `padded`: the backbone's own forward, for other architectures or attention kernels (one log line says why).

The decision only: the routes themselves are `hf_sentcl.modeling.unpadded` and `hf_sentcl.modeling.backbone_forward`,
whose `run_backbone` takes the route chosen here (every module of those routes reads `base_model` from here).
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: backbones whose layers are BERT's (embeddings, encoder.layer[i].attention.self.query/key/value, ...)
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
#: attention functions that take a padded (b, heads, L, d) view and a mask: the unpadded route's
PADDED_VIEW_ATTENTION = ("eager", "sdpa", "sdpa_fast_dropout")
ROUTES = ("unpadded", "flattened", "padded")
#: batches whose real tokens fill at least this share of the positions run padded: packing costs about what it
#: saves there (`encode` sorts sentences by length, so its batches are nearly full)
DENSE_SHARE = 0.9

_logged: weakref.WeakSet = weakref.WeakSet()


def base_model(backbone: nn.Module) -> nn.Module:
    """The transformers model inside `backbone` (a PEFT wrapper's base model, whose LoRA layers stay in place)."""
    return backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone


def unsupported_reason(backbone: nn.Module) -> str | None:
    """Why `backbone` cannot run unpadded or flattened (None: it can)."""
    config = getattr(base_model(backbone), "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type '{model_type}' is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if config.is_decoder or getattr(config, "add_cross_attention", False):
        return "it is configured as a decoder"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type '{config.position_embedding_type}' is not absolute"
    if is_fully_sharded(backbone):
        return "its layers are FSDP units, whose weights are gathered only by their own forward"
    return None


def is_fully_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 (`fully_shard`) wraps `module` or one of its submodules."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def choose_route(reason: str | None, device_type: str, attn_implementation: str | None) -> tuple[str, str | None]:
    """The route of a forward (see the module docstring) and, for `padded`, why.

    `reason`: `unsupported_reason` of the backbone; `attn_implementation`: its config's `_attn_implementation`."""
    if reason is not None:
        return "padded", reason
    attention = attn_implementation or "eager"
    if attention.startswith("flash_attention") or attention.endswith("flash-attn"):
        if device_type == "cuda":
            return "flattened", None
        return "padded", f"attention '{attention}' runs on CUDA only"
    if attention in PADDED_VIEW_ATTENTION:
        if device_type == "cpu":
            return "unpadded", None
        # the real tokens' count decides the packed shape: reading it is a host sync in every forward on a GPU
        return "padded", f"on {device_type} without a varlen kernel, SDPA runs on the padded view"
    return "padded", f"attention '{attention}' has no unpadded route here"


def backbone_route(backbone: nn.Module, device: torch.device, enabled: bool = True) -> str:
    """`choose_route` for `backbone` on `device`; logs one line per backbone when it falls back to padding."""
    if not enabled:
        return "padded"
    config = getattr(base_model(backbone), "config", None)
    route, why = choose_route(unsupported_reason(backbone), device.type, getattr(config, "_attn_implementation", None))
    # not while torch.compile traces: a log call there splits the graph (and CUDA graphs with it)
    if route == "padded" and not torch.compiler.is_compiling() and backbone not in _logged:
        _logged.add(backbone)
        logger.info("Padded encoder path for %s: %s (the unpadded path covers BERT-family backbones with eager or "
                    "SDPA attention).", type(base_model(backbone)).__name__, why)
    return route
