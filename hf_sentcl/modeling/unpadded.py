"""Padding-free ("unpadded") forward of BERT-family backbones: token-wise work on the real tokens only.

In a padded batch every token-wise operation of a BERT layer (Q/K/V projections, attention output projection,
feed-forward block, LayerNorm, dropout, GELU) also runs on the padding, a third of the positions in shuffled
batches of short sentences. `unpadded_forward` packs the real tokens once (the flat indices of the attention
mask's ones), runs the embedding module and every layer's linear / LayerNorm / feed-forward modules on a
(total_tokens, hidden) tensor, and scatters Q, K, V to the padded (batch, heads, max_len, head_dim) view only for
the attention product, which runs through the backbone's own attention function (SDPA, the CPU fast-dropout SDPA
of `fast_dropout`, or eager) with the key-padding mask; its output is gathered back to the packed tokens.

It calls the backbone's own modules (their parameters, hooks-free forwards, `FastDropout` where it is installed,
LoRA layers inside a PEFT model), so weights, saving and export are unaffected, and the math is the padded path's
(equal to fp32 rounding with dropout 0; with dropout the same rate applies to every real element). The hidden
states are returned padded (zeros on padding), so pooling and every consumer stay as they are.

Which route a forward takes is `choose_route`:
- `unpadded`: this module (BERT, RoBERTa, XLM-R, CamemBERT with eager / SDPA attention) on the CPU. The packed
  shape depends on how many tokens are real, so packing reads that count on the host: free on a CPU, a stall in
  every forward on a GPU, where the padded SDPA path runs instead (and the training step makes no host read);
- `flattened`: on CUDA with a FlashAttention kernel (`attn_implementation: flash_attention_2`), transformers' own
  padding-free route: the batch flattened as `DataCollatorWithFlattening` does (one row of tokens, position ids
  restarting per sequence at `position_ids_start`, `cu_seq_lens_*` for the varlen kernel);
- `padded`: the backbone's own forward, for other architectures or attention kernels (one log line says why).

An embedding module carrying hooks (ConSERT's augmentations, which expect the padded (rows, L, d) output and
position ids) is run on the padded batch and its output packed; the layers still run unpadded.
"""

from __future__ import annotations

import logging
import weakref
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

logger = logging.getLogger(__name__)

#: backbones whose layers are BERT's (embeddings, encoder.layer[i].attention.self.query/key/value, ...)
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")
#: attention functions that take a padded (b, heads, L, d) view and a mask: the unpadded route's
PADDED_VIEW_ATTENTION = ("eager", "sdpa", "sdpa_fast_dropout")
ROUTES = ("unpadded", "flattened", "padded")

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
    if route == "padded" and backbone not in _logged:
        _logged.add(backbone)
        logger.info("Padded encoder path for %s: %s (the unpadded path covers BERT-family backbones with eager or "
                    "SDPA attention).", type(base_model(backbone)).__name__, why)
    return route


# ---------------------------------------------------------------------- packing
def pack(states: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """(b, L, ...) -> (total_tokens, ...): the rows at the flat `indices` of the real tokens."""
    return states.flatten(0, 1).index_select(0, indices)


def unpack(tokens: torch.Tensor, indices: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """(total_tokens, ...) -> (b, L, ...), zeros on padding (the inverse of `pack` on the real tokens)."""
    padded = tokens.new_zeros(batch * length, *tokens.shape[1:])
    return padded.index_copy(0, indices, tokens).view(batch, length, *tokens.shape[1:])


def default_position_ids(embeddings: nn.Module, input_ids: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """The (b, L) position ids the embedding module would compute itself: RoBERTa-style ones from the token ids
    (padding_idx + 1, ... on real tokens), BERT's 0 .. L-1 otherwise."""
    padding_idx = getattr(embeddings, "padding_idx", None)
    create = getattr(embeddings, "create_position_ids_from_input_ids", None)
    if create is not None and input_ids is not None and isinstance(padding_idx, int):
        return create(input_ids, padding_idx)
    device = input_ids.device if input_ids is not None else embeddings.position_ids.device
    return torch.arange(shape[1], device=device).expand(shape[0], -1)


def has_row_hooks(embeddings: nn.Module) -> bool:
    """Whether the embedding module or a submodule other than its word-embedding table has forward (pre-)hooks:
    those see (rows, L) position ids or a (rows, L, d) output (ConSERT's augmentations). Hooks on the table act
    token by token (transformers' `enable_input_require_grads`, which gradient checkpointing installs)."""
    table = getattr(embeddings, "word_embeddings", None)
    return any(m._forward_hooks or m._forward_pre_hooks for m in embeddings.modules() if m is not table)


def packed_embeddings(model: nn.Module, indices: torch.Tensor, input_ids, token_type_ids, position_ids,
                      inputs_embeds) -> torch.Tensor:
    """The embedding output of the real tokens, (total_tokens, hidden). Computed on the packed tokens (one row of
    total_tokens, each with its own position id), or on the padded batch and then packed when the module carries
    hooks (they see the shapes of the padded forward) or the input is `inputs_embeds`."""
    embeddings = model.embeddings
    if inputs_embeds is not None or has_row_hooks(embeddings):
        padded = embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                            inputs_embeds=inputs_embeds)
        return pack(padded, indices)
    if position_ids is None:
        position_ids = default_position_ids(embeddings, input_ids, input_ids.shape)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    row = {"input_ids": input_ids, "token_type_ids": token_type_ids, "position_ids": position_ids.expand_as(input_ids)}
    row = {key: pack(value, indices).unsqueeze(0) for key, value in row.items()}
    return embeddings(**row).squeeze(0)


# ---------------------------------------------------------------------- one layer
def padding_mask(attention_mask: torch.Tensor, attention: str, dtype: torch.dtype) -> torch.Tensor:
    """The (b, 1, 1, L) key-padding mask in the form the attention function takes: bool (True = attend) for SDPA,
    additive (0 / dtype min) for eager."""
    keep = attention_mask.bool()[:, None, None, :]
    if attention == "eager":
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
    return keep


def unpadded_attention(self_attention: nn.Module, hidden: torch.Tensor, indices: torch.Tensor,
                       shape: tuple[int, int], mask: torch.Tensor) -> torch.Tensor:
    """BERT self-attention on packed tokens: Q/K/V on the tokens, the product on the padded view, the context
    gathered back to (total_tokens, hidden) (before the output projection)."""
    batch, length = shape
    heads, head_size = self_attention.num_attention_heads, self_attention.attention_head_size
    qkv = torch.cat([self_attention.query(hidden), self_attention.key(hidden), self_attention.value(hidden)], -1)
    qkv = unpack(qkv, indices, batch, length).view(batch, length, 3, heads, head_size).permute(2, 0, 3, 1, 4)
    implementation = self_attention.config._attn_implementation
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    context, _ = interface(
        self_attention, qkv[0], qkv[1], qkv[2], mask,
        dropout=self_attention.dropout.p if self_attention.training else 0.0, scaling=self_attention.scaling,
    )
    return pack(context.reshape(batch, length, heads * head_size), indices)


def unpadded_layer(layer: nn.Module, hidden: torch.Tensor, indices: torch.Tensor, shape: tuple[int, int],
                   mask: torch.Tensor) -> torch.Tensor:
    """One BERT layer on packed tokens (its own attention, output and feed-forward modules)."""
    context = unpadded_attention(layer.attention.self, hidden, indices, shape, mask)
    attended = layer.attention.output(context, hidden)  # dense, dropout, LayerNorm(. + residual)
    return layer.output(layer.intermediate(attended), attended)


def unpadded_forward(
    backbone: nn.Module,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    output_hidden_states: bool = False,
) -> BaseModelOutput:
    """The backbone's forward with token-wise work on real tokens only; padded (b, L, d) states, zeros on padding.

    `hidden_states` (embedding output first) when `output_hidden_states`. The pooler is not run (no pooling reads
    it). Layers are checkpointed (non-reentrant) when the backbone has gradient checkpointing on and trains."""
    model = base_model(backbone)
    batch, length = attention_mask.shape
    indices = attention_mask.flatten().nonzero().flatten()
    hidden = packed_embeddings(model, indices, input_ids, token_type_ids, position_ids, inputs_embeds)
    mask = padding_mask(attention_mask, model.config._attn_implementation or "eager", hidden.dtype)
    states = [hidden] if output_hidden_states else None
    for layer in model.encoder.layer:
        run = partial(unpadded_layer, layer, indices=indices, shape=(batch, length), mask=mask)
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            hidden = checkpoint(run, hidden, use_reentrant=False)
        else:
            hidden = run(hidden)
        if states is not None:
            states.append(hidden)
    padded = None if states is None else tuple(unpack(s, indices, batch, length) for s in states)
    last = padded[-1] if padded is not None else unpack(hidden, indices, batch, length)
    return BaseModelOutput(last_hidden_state=last, hidden_states=padded)


# ---------------------------------------------------------------------- the CUDA varlen route
def flattened_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids_start: int = 0) -> dict:
    """What `DataCollatorWithFlattening(return_flash_attn_kwargs=True, position_ids_start=...)` makes of the
    batch's real tokens, built on the batch's device: input_ids and position_ids (1, total_tokens),
    cu_seq_lens_q/k (int32) and max_length_q/k."""
    lengths = attention_mask.sum(dim=1)
    indices = attention_mask.flatten().nonzero().flatten()
    positions = attention_mask.cumsum(dim=1) - 1 + position_ids_start
    cu_seq_lens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    return {
        "input_ids": pack(input_ids, indices).unsqueeze(0),
        "position_ids": pack(positions, indices).unsqueeze(0),
        "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens, "max_length_q": longest, "max_length_k": longest,
    }


def position_ids_start(backbone: nn.Module) -> int:
    """The first position id of a sequence: padding_idx + 1 for RoBERTa-style embeddings, 0 for BERT's."""
    embeddings = base_model(backbone).embeddings
    padding_idx = getattr(embeddings, "padding_idx", None)
    has_offset = hasattr(embeddings, "create_position_ids_from_input_ids") and isinstance(padding_idx, int)
    return padding_idx + 1 if has_offset else 0


def flattened_forward(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      output_hidden_states: bool = False) -> BaseModelOutput:
    """transformers' padding-free route (FlashAttention varlen over one flattened row); padded states back."""
    flat = flattened_batch(input_ids, attention_mask, position_ids_start(backbone))
    outputs = backbone(**flat, output_hidden_states=output_hidden_states, return_dict=True)
    indices = attention_mask.flatten().nonzero().flatten()
    batch, length = attention_mask.shape
    states = outputs.hidden_states if output_hidden_states else (outputs.last_hidden_state,)
    padded = tuple(unpack(s.squeeze(0), indices, batch, length) for s in states)
    return BaseModelOutput(last_hidden_state=padded[-1], hidden_states=padded if output_hidden_states else None)


def run_backbone(backbone: nn.Module, unpadded: bool = True, *, input_ids=None, attention_mask=None,
                 token_type_ids=None, position_ids=None, inputs_embeds=None, output_hidden_states=False):
    """The backbone's forward by the route `backbone_route` picks (`unpadded=False`, or forward hooks on the
    backbone module itself: its own padded forward).
    Returns an output with padded `last_hidden_state` and (when asked) `hidden_states`."""
    reference = input_ids if input_ids is not None else inputs_embeds
    route = backbone_route(backbone, reference.device, unpadded) if attention_mask is not None else "padded"
    if backbone._forward_hooks or backbone._forward_pre_hooks:
        route = "padded"  # hooks on the backbone expect its own forward to run
    if route == "flattened" and (token_type_ids is not None or position_ids is not None or input_ids is None):
        route = "padded"  # the flattened batch carries its own positions and no token types
    if route == "unpadded":
        return unpadded_forward(backbone, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                output_hidden_states)
    if route == "flattened":
        return flattened_forward(backbone, input_ids, attention_mask, output_hidden_states)
    extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
    if position_ids is not None:
        extra["position_ids"] = position_ids
    return backbone(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                    output_hidden_states=output_hidden_states, return_dict=True, **extra)
