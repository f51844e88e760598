"""Padding-free ("unpadded") forward of BERT-family backbones: token-wise work on the real tokens only.

In a padded batch every token-wise operation of a BERT layer (Q/K/V projections, attention output projection,
feed-forward block, LayerNorm, dropout, GELU) also runs on the padding, a third of the positions in shuffled
batches of short sentences. `unpadded_forward` packs the real tokens once (the flat indices of the attention
mask's ones, rounded up to a multiple of `TOKEN_BUCKET` with padding positions so that tensor sizes repeat),
runs the embedding module and every layer's linear / LayerNorm / feed-forward modules on a (total_tokens, hidden)
tensor, and only the attention product sees the padded shape:
- Q, K and V come from one GEMM (`_StackedProjection`, whose hidden-state gradient in fp32 is the three layers' to the
  bit) and are gathered straight into per-head (b * heads, L, head_dim) views (`RowMap`: packing and unpacking are
  both `index_select` gathers, each the other's backward);
- the product runs explicitly while training (and for eager attention): the key-padding mask is added inside
  the score GEMM, softmax in fp32, the module's own dropout (`FastDropout` where installed); SDPA with the
  key-padding mask for inference (its CPU backward is slow);
- the context is gathered back to the packed tokens for the output projection.

When the caller reads only each sequence's first position of the last layer ([CLS] pooling, `first_token_only`),
the last layer computes keys and values for every token but the query, attention product, output projection and
feed-forward block for one row per sequence (`first_token_layer`): for a 6-layer MiniLM that skips about a seventh
of the encoder's GEMM work, for a 12-layer BERT about a fourteenth. The padded route does the same for BERT-family
backbones (`padded_first_token_forward`).

It calls the backbone's own modules (their parameters, hooks-free forwards, `FastDropout` where it is installed,
LoRA layers inside a PEFT model), so weights, saving and export are unaffected, and the math is the padded path's
(equal to fp32 rounding with dropout 0; with dropout the same rate applies to every real element). The hidden
states are returned padded (zeros on padding), so pooling and every consumer stay as they are.

Where the real tokens sit (`RowMap`, `Packing`) is `hf_sentcl.modeling.packing`; which route a forward takes
(unpadded on the CPU, transformers' flattened route on CUDA with FlashAttention, or padded) is
`hf_sentcl.modeling.routes`, and `hf_sentcl.modeling.backbone_forward.run_backbone` takes it.

An embedding module carrying hooks (ConSERT's augmentations, which expect the padded (rows, L, d) output and
position ids) is run on the padded batch and its output packed; the layers still run unpadded.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from hf_sentcl.modeling.compiled import compiled, runs_compiled
from hf_sentcl.modeling.fast_dropout import attention_probabilities
from hf_sentcl.modeling.packing import Packing, RowMap, with_zero_row
from hf_sentcl.modeling.routes import base_model


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


def packed_embeddings(model: nn.Module, tokens: RowMap, input_ids, token_type_ids, position_ids,
                      inputs_embeds) -> torch.Tensor:
    """The embedding output of the packed tokens, (total_tokens, hidden). Computed on the packed tokens (one row of
    total_tokens, each with its own position id), or on the padded batch and then packed when the module carries
    hooks (they see the shapes of the padded forward) or the input is `inputs_embeds`."""
    embeddings = model.embeddings
    if inputs_embeds is not None or has_row_hooks(embeddings):
        padded = embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                            inputs_embeds=inputs_embeds)
        return tokens.pack(padded.flatten(0, 1))
    if position_ids is None:
        position_ids = default_position_ids(embeddings, input_ids, input_ids.shape)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    row = {"input_ids": input_ids, "token_type_ids": token_type_ids, "position_ids": position_ids.expand_as(input_ids)}
    row = {key: tokens.pack(value.flatten()).unsqueeze(0) for key, value in row.items()}
    return embeddings(**row).squeeze(0)


def gemm_dtype(default: torch.dtype) -> torch.dtype:
    """The dtype this route's GEMMs run in: autocast's when it is on (this route runs on the CPU), else `default`."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else default


class _StackedProjection(torch.autograd.Function):
    """Q | K | V = hidden @ [Wq; Wk; Wv]^T + [bq; bk; bv] as one GEMM, and one GEMM for the weight gradients (or
    K | V, or any stack of linear layers on the same input).

    The hidden states come in once per projection (the same tensor each time): input i receives the gradient of
    projection count-1-i, so in full precision autograd adds them up in the order it adds the linear layers' own
    (value, key, query), and the hidden-state gradient is the padded path's to the last bit, not a count-deep
    product's (which rounds differently). Under autocast (bf16 on CPU) the hidden state and the stacked weight are
    cast once, kept in that dtype for backward, and the hidden-state gradient is one count-deep GEMM (fp32
    accumulation): one gradient per projection in bf16 would each be cast to fp32 and added, the padded path's
    rounding, at twice the elementwise work.

    Arguments: the input `count` times, then each projection's weight and bias in stacking order."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, count, *inputs_and_parameters):
        hidden, parameters = inputs_and_parameters[0], inputs_and_parameters[count:]
        weights, biases = parameters[0::2], parameters[1::2]
        dtype = gemm_dtype(hidden.dtype)
        ctx.mixed = dtype != hidden.dtype
        hidden, weight = hidden.to(dtype), torch.cat(weights).to(dtype)
        ctx.sizes = [w.shape[0] for w in weights]
        ctx.save_for_backward(hidden, weight)
        return torch.addmm(torch.cat(biases).to(dtype), hidden, weight.t())

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        grad = grad.to(hidden.dtype)
        grad_weights = grad.t().mm(hidden).split(ctx.sizes)
        grad_biases = grad.sum(0).split(ctx.sizes)
        if ctx.mixed:
            input_grads = [grad.mm(weight)] + [None] * (len(ctx.sizes) - 1)
        else:
            parts = zip(grad.split(ctx.sizes, dim=1), weight.split(ctx.sizes))
            input_grads = reversed([part.mm(w) for part, w in parts])
        return None, *input_grads, *(g for pair in zip(grad_weights, grad_biases) for g in pair)


def stacked_projection(projections: tuple[nn.Module, ...], hidden: torch.Tensor) -> torch.Tensor:
    """The projections of packed tokens side by side, (total_tokens, sum of their widths): one GEMM when they are
    plain linear layers, the modules' own forwards otherwise (LoRA layers inside a PEFT model, hooked modules)."""
    if all(type(m) is nn.Linear and m.bias is not None and not (m._forward_hooks or m._forward_pre_hooks)
           for m in projections):
        parameters = (p for m in projections for p in (m.weight, m.bias))
        return _StackedProjection.apply(len(projections), *[hidden] * len(projections), *parameters)
    return torch.cat([m(hidden) for m in projections], -1)


def attend(self_attention: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           packing: Packing) -> torch.Tensor:
    """Attention on the padded (b * heads, L, head_dim) views, (b * heads, L, head_dim) out (queries: any number
    of leading positions of each sequence, (b * heads, Lq, head_dim), and as many out).

    Training (this route runs on CPU only) or eager attention: explicit, the mask added inside the score GEMM, then
    softmax (`attention_probabilities`) and the module's own dropout (`FastDropout` where installed), as the
    padded path's attention functions do. SDPA for inference: its CPU backward is the slow part (7x the explicit
    product's in bf16 at MiniLM's shapes, 1.4x in fp32), so training without dropout (ConSERT's encoder,
    `attention_probs_dropout_prob: 0`) takes the explicit product too, and so does the cached step's first pass
    (no gradients), which must match its replay."""
    dropout = self_attention.dropout
    implementation = self_attention.config._attn_implementation or "eager"
    if not self_attention.training and implementation != "eager":
        heads = (packing.batch, packing.num_heads)
        context = nn.functional.scaled_dot_product_attention(
            query.view(*heads, -1, query.shape[-1]), key.view(*heads, *key.shape[1:]),
            value.view(*heads, *value.shape[1:]), attn_mask=packing.keep, scale=self_attention.scaling)
        return context.reshape(query.shape)
    bias = packing.bias.to(query.dtype)
    scores = torch.baddbmm(bias, query, key.transpose(1, 2), alpha=self_attention.scaling)
    return torch.bmm(dropout(attention_probabilities(scores, value.dtype)), value)


def per_head(projections: tuple[nn.Module, ...], hidden: torch.Tensor, packing: Packing,
             rows: RowMap) -> tuple[torch.Tensor, ...]:
    """The stacked `projections` of the packed tokens, each unpacked straight into its per-head padded view
    (b * heads, L, head_dim); `rows`: the stack's map (`packing.qkv`, `packing.key_value()`)."""
    projected = stacked_projection(projections, hidden)
    head_size = projected.shape[-1] // (len(projections) * packing.num_heads)
    stacked = rows.unpack(projected.view(-1, head_size))
    return stacked.view(len(projections), packing.batch * packing.num_heads, packing.length, head_size).unbind(0)


def per_head_qkv(self_attention: nn.Module, hidden: torch.Tensor, packing: Packing) -> tuple[torch.Tensor, ...]:
    """Q, K and V of the packed tokens, each in its per-head padded view (b * heads, L, head_dim)."""
    projections = (self_attention.query, self_attention.key, self_attention.value)
    return per_head(projections, hidden, packing, packing.qkv)


def unpadded_attention(self_attention: nn.Module, hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    """BERT self-attention on packed tokens: Q/K/V on the tokens, unpacked straight into per-head padded views
    for the product, the context packed back to (total_tokens, hidden) (before the output projection)."""
    query, key, value = per_head_qkv(self_attention, hidden, packing)
    context = attend(self_attention, query, key, value, packing)
    return packing.heads.pack(context.reshape(-1, query.shape[-1])).view(hidden.shape[0], -1)


def layer_tail(layer: nn.Module, context: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The token-wise rest of a BERT layer after attention: the attention's output block (dense, dropout,
    LayerNorm(. + residual)) and the feed-forward block; what `compile_layers` compiles on this route."""
    attended = layer.attention.output(context, hidden)
    return layer.output(layer.intermediate(attended), attended)


def _tail_of(layer: nn.Module):
    return compiled("layer_tail", layer_tail) if runs_compiled(layer) else layer_tail


def unpadded_layer(layer: nn.Module, hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    """One BERT layer on packed tokens (its own attention, output and feed-forward modules)."""
    context = unpadded_attention(layer.attention.self, hidden, packing)
    return _tail_of(layer)(layer, context, hidden)


def first_token_layer(layer: nn.Module, hidden: torch.Tensor, packing: Packing) -> torch.Tensor:
    """One BERT layer's output at each sequence's first position only, (b, hidden): what [CLS] pooling reads of
    the last layer. Keys and values come from every token; the query, the attention product, the output
    projection and the feed-forward block run on b rows instead of the packed tokens (zeros where the first
    position is padding). The query module runs as itself (hooks on it see those b rows); keys and values are one
    stacked GEMM when their modules are plain linear layers."""
    self_attention = layer.attention.self
    first = packing.output.sources[:: packing.length]  # the packed row of each first position, or the zero row
    real = len(packing.output.rows)
    first_hidden = with_zero_row(hidden[:real]).index_select(0, first)
    key, value = per_head((self_attention.key, self_attention.value), hidden, packing, packing.key_value())
    query = self_attention.query(first_hidden).view(key.shape[0], 1, key.shape[-1])
    context = attend(self_attention, query, key, value, packing).view(packing.batch, -1)
    out = _tail_of(layer)(layer, context, first_hidden)
    return out.masked_fill(first[:, None] == real, 0.0)


def unpadded_forward(
    backbone: nn.Module,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    output_hidden_states: bool = False,
    first_token_only: bool = False,
) -> BaseModelOutput:
    """The backbone's forward with token-wise work on real tokens only; padded (b, L, d) states, zeros on padding.

    `hidden_states` (embedding output first) when `output_hidden_states`. `first_token_only`: the last layer runs
    for each sequence's first position only (`first_token_layer`) and `last_hidden_state` is (b, 1, d), all that
    [CLS] pooling reads; not with `output_hidden_states`. The pooler is not run (no pooling reads it). Layers are
    checkpointed (non-reentrant) when the backbone has gradient checkpointing on and trains."""
    if first_token_only and output_hidden_states:
        raise ValueError("first_token_only skips the last layer's other positions: it cannot return hidden_states.")
    model = base_model(backbone)
    batch, length = attention_mask.shape
    packing = Packing.of(attention_mask, model.config.num_attention_heads, gemm_dtype(model.dtype))
    hidden = packed_embeddings(model, packing.tokens, input_ids, token_type_ids, position_ids, inputs_embeds)
    states = [hidden] if output_hidden_states else None
    layers = model.encoder.layer
    for index, layer in enumerate(layers):
        last_first_token = first_token_only and index == len(layers) - 1
        run = partial(first_token_layer if last_first_token else unpadded_layer, layer, packing=packing)
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            hidden = checkpoint(run, hidden, use_reentrant=False)
        else:
            hidden = run(hidden)
        if states is not None:
            states.append(hidden)
    if first_token_only:
        return BaseModelOutput(last_hidden_state=hidden.unsqueeze(1))
    real = len(packing.output.rows)
    padded = tuple(packing.output.unpack(s[:real]).view(batch, length, -1) for s in (states or [hidden]))
    return BaseModelOutput(last_hidden_state=padded[-1], hidden_states=padded if states is not None else None)


# ---------------------------------------------------------------------- the padded route, first positions only
def padded_first_token_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """One BERT layer's output at each sequence's first position, (b, 1, d), on the padded route: the query of
    that position against every key and value, through the model's own attention function (`mask`: the layers'
    4-D mask, or None), then the output and feed-forward blocks on b rows."""
    self_attention = layer.attention.self
    batch, length, _ = hidden.shape
    per_head = (self_attention.num_attention_heads, self_attention.attention_head_size)
    first = hidden[:, :1]
    query = self_attention.query(first).view(batch, 1, *per_head).transpose(1, 2)
    key, value = (m(hidden).view(batch, length, *per_head).transpose(1, 2)
                  for m in (self_attention.key, self_attention.value))
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self_attention.config._attn_implementation,
                                                      eager_attention_forward)
    context, _ = attention(self_attention, query, key, value, None if mask is None else mask[:, :, :1],
                           dropout=self_attention.dropout.p if self_attention.training else 0.0,
                           scaling=self_attention.scaling)
    return _tail_of(layer)(layer, context.reshape(batch, 1, -1), first)


def padded_first_token_forward(backbone: nn.Module, input_ids, attention_mask, token_type_ids=None,
                               position_ids=None, inputs_embeds=None) -> BaseModelOutput:
    """The backbone's padded forward with its last layer at the first positions only: `last_hidden_state` (b, 1,
    d). Runs the embedding module and the layers as the backbone's own forward does (its 4-D mask from
    transformers' `create_bidirectional_mask`); BERT-family backbones (`unsupported_reason` None) only."""
    model = base_model(backbone)
    hidden = model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                              inputs_embeds=inputs_embeds)
    mask = create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=attention_mask)
    *lower, last = model.encoder.layer
    for layer in lower:
        hidden = layer(hidden, mask)
    return BaseModelOutput(last_hidden_state=padded_first_token_layer(last, hidden, mask))
