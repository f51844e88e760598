"""The backbone's forward by its route (`run_backbone`, what `SentenceEncoder` and SG's trainer call), and the
CUDA varlen route, transformers' own padding-free forward over one flattened row (`flattened_forward`).

`run_backbone` asks `hf_sentcl.modeling.routes` for the route and overrides it where the batch decides (a batch
nearly without padding, forward hooks on the backbone, token types or position ids the flattened batch cannot
carry), then runs the unpadded forward (`hf_sentcl.modeling.unpadded`), the flattened one, the padded one with its
last layer at the first positions only, or the backbone's own forward. Every route returns padded hidden states.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from hf_sentcl.modeling.packing import RowMap, real_tokens
from hf_sentcl.modeling.routes import DENSE_SHARE, backbone_route, base_model, unsupported_reason
from hf_sentcl.modeling.unpadded import padded_first_token_forward, unpadded_forward


# ---------------------------------------------------------------------- the CUDA varlen route
def flattened_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids_start: int = 0,
                    tokens: RowMap | None = None) -> dict:
    """What `DataCollatorWithFlattening(return_flash_attn_kwargs=True, position_ids_start=...)` makes of the
    batch's real tokens (`tokens`: their `real_tokens` map, when the caller has it), built on the batch's device:
    input_ids and position_ids (1, total_tokens), cu_seq_lens_q/k (int32) and max_length_q/k."""
    tokens = tokens if tokens is not None else real_tokens(attention_mask)
    lengths = attention_mask.sum(dim=1)
    positions = attention_mask.cumsum(dim=1) - 1 + position_ids_start
    cu_seq_lens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    return {
        "input_ids": tokens.pack(input_ids.flatten()).unsqueeze(0),
        "position_ids": tokens.pack(positions.flatten()).unsqueeze(0),
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
    tokens = real_tokens(attention_mask)
    flat = flattened_batch(input_ids, attention_mask, position_ids_start(backbone), tokens)
    outputs = backbone(**flat, output_hidden_states=output_hidden_states, return_dict=True)
    states = outputs.hidden_states if output_hidden_states else (outputs.last_hidden_state,)
    padded = tuple(tokens.unpack(s.squeeze(0)).view(*attention_mask.shape, -1) for s in states)
    return BaseModelOutput(last_hidden_state=padded[-1], hidden_states=padded if output_hidden_states else None)


# ---------------------------------------------------------------------- the route of a forward
def run_backbone(backbone: nn.Module, unpadded: bool = True, *, input_ids=None, attention_mask=None,
                 token_type_ids=None, position_ids=None, inputs_embeds=None, output_hidden_states=False,
                 first_token_only=False):
    """The backbone's forward by the route `backbone_route` picks (`unpadded=False`, or forward hooks on the
    backbone module itself: its own padded forward).
    Returns an output with padded `last_hidden_state` and (when asked) `hidden_states`. `first_token_only` (the
    caller reads `last_hidden_state[:, 0]` only): the unpadded and padded routes of BERT-family backbones compute
    that position alone in the last layer and return (b, 1, d); the flattened route and other backbones return
    every position."""
    reference = input_ids if input_ids is not None else inputs_embeds
    route = backbone_route(backbone, reference.device, unpadded) if attention_mask is not None else "padded"
    own_forward = bool(backbone._forward_hooks or backbone._forward_pre_hooks)
    if own_forward:
        route = "padded"  # hooks on the backbone expect its own forward to run
    if route == "unpadded" and attention_mask.sum() >= DENSE_SHARE * attention_mask.numel():
        route = "padded"  # almost no padding to skip (this route runs on the CPU: the host read is free)
    if route == "flattened" and (token_type_ids is not None or position_ids is not None or input_ids is None):
        route = "padded"  # the flattened batch carries its own positions and no token types
    if (route == "padded" and first_token_only and not (own_forward or output_hidden_states)
            and attention_mask is not None and unsupported_reason(backbone) is None):
        return padded_first_token_forward(backbone, input_ids, attention_mask, token_type_ids, position_ids,
                                          inputs_embeds)
    if route == "unpadded":
        return unpadded_forward(backbone, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                output_hidden_states, first_token_only)
    if route == "flattened":
        return flattened_forward(backbone, input_ids, attention_mask, output_hidden_states)
    extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
    if position_ids is not None:
        extra["position_ids"] = position_ids
    return backbone(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                    output_hidden_states=output_hidden_states, return_dict=True, **extra)
