"""Where a batch's real tokens sit, for the unpadded forward (`hf_sentcl.modeling.unpadded`) and the flattened
route (`hf_sentcl.modeling.backbone_forward`).

`RowMap` maps the rows of a packed tensor to its padded view; packing and unpacking are both `index_select` gathers,
each the other's backward. `Packing` holds every map one forward needs, computed once and shared by every layer:
the real tokens (rounded up to a multiple of `TOKEN_BUCKET` with padding positions so that tensor sizes repeat),
each token's rows in the per-head (b * heads, L, head_dim) views of Q, K and V, and the key-padding masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: packed token counts are rounded up to a multiple of this with padding positions (see `Packing`)
TOKEN_BUCKET = 64


@dataclass(frozen=True)
class RowMap:
    """Where the rows of a packed tensor sit in its padded view: `rows[i]` is the padded row of packed row i,
    `sources[j]` the packed row that padded row j holds. On padding that is a zero row past the end, or with
    `zero_padding=False` packed row 0: any finite row serves where the consumer masks padding exactly (attention's
    keys and values get weight 0, padded queries' outputs are dropped) and saves appending the zero row.

    Both directions are gathers (`index_select`, parallel and contiguous on CPU): packing gathers `rows`, unpacking
    gathers `sources`, and each one's backward is the other (padding's gradient is dropped)."""

    rows: torch.Tensor
    sources: torch.Tensor
    zero_padding: bool = True

    @classmethod
    def of(cls, rows: torch.Tensor, padded_rows: int, zero_padding: bool = True) -> RowMap:
        filler = len(rows) if zero_padding else 0
        sources = torch.full((padded_rows,), filler, dtype=rows.dtype, device=rows.device)
        return cls(rows, sources.index_copy_(0, rows, torch.arange(len(rows), device=rows.device)), zero_padding)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """(padded rows, ...) -> (packed rows, ...)."""
        return _Pack.apply(padded, self)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(packed rows, ...) -> (padded rows, ...), zeros (or the filler row) on padding."""
        return _Unpack.apply(packed, self)


def with_zero_row(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat([packed, packed.new_zeros(1, *packed.shape[1:])])


class _Pack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded: torch.Tensor, row_map: RowMap) -> torch.Tensor:
        ctx.row_map = row_map
        return padded.index_select(0, row_map.rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return with_zero_row(grad).index_select(0, ctx.row_map.sources), None


class _Unpack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed: torch.Tensor, row_map: RowMap) -> torch.Tensor:
        ctx.row_map = row_map
        return (with_zero_row(packed) if row_map.zero_padding else packed).index_select(0, row_map.sources)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.index_select(0, ctx.row_map.rows), None


def real_tokens(attention_mask: torch.Tensor) -> RowMap:
    """The real tokens of a (b, L) attention mask in its flattened (b * L) rows."""
    return RowMap.of(attention_mask.flatten().nonzero().flatten(), attention_mask.numel())


@dataclass(frozen=True)
class Packing:
    """Where a batch's real tokens sit, computed once per forward and shared by every layer.

    The packed rows are the real tokens plus padding positions up to a multiple of `TOKEN_BUCKET` (1% more
    token-wise work on MiniLM's batches). Every packed tensor's size otherwise changes every step, and glibc's heap
    fragments on that: over 60 SimCSE steps the process grew from 1.7 to 2.4 GB (and kept growing) against 1.9 GB
    flat with the buckets. The extra positions are computed like tokens but, being padding, are masked as keys and
    zeroed in the output (`output` holds the real tokens only).

    `tokens`: the packed positions in the (b * L) flattened batch; `heads`: token t's head h (packed row t * heads + h)
    in the (b * heads * L) rows of a (b, heads, L, head_dim) tensor; `qkv`: token t's projection s (Q, K, V) and
    head h in the rows of three such tensors (padding holds a copy of a real row: attention masks it exactly);
    `bias`: the additive key-padding mask (b * heads, 1, L) of the explicit attention, `keep` the same as SDPA's
    bool (b, 1, 1, L)."""

    batch: int
    length: int
    num_heads: int
    tokens: RowMap
    output: RowMap
    heads: RowMap
    qkv: RowMap
    bias: torch.Tensor
    keep: torch.Tensor

    @classmethod
    def of(cls, attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> Packing:
        batch, length = attention_mask.shape
        output = packed = real_tokens(attention_mask)
        tokens = output.rows
        fill = min(-len(tokens) % TOKEN_BUCKET, batch * length - len(tokens))
        if fill:
            tokens = torch.cat([tokens, (attention_mask.flatten() == 0).nonzero().flatten()[:fill]])
            packed = RowMap.of(tokens, batch * length)
        sequence, position = tokens.div(length, rounding_mode="floor"), tokens.remainder(length)
        head = torch.arange(num_heads, device=tokens.device)
        head_rows = (sequence[:, None] * num_heads + head) * length + position[:, None]  # (T, heads)
        per_projection = batch * num_heads * length
        keep = attention_mask.bool()[:, None, None, :]
        bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
        bias = bias.expand(batch, num_heads, 1, length).reshape(batch * num_heads, 1, length)
        return cls(batch, length, num_heads, packed, output, RowMap.of(head_rows.flatten(), per_projection),
                   stacked_heads(head_rows, 3, per_projection), bias, keep)

    def key_value(self) -> RowMap:
        """As `qkv` for two stacked projections, K | V (the first-position layer's)."""
        return stacked_heads(self.heads.rows.view(-1, self.num_heads), 2, self.batch * self.num_heads * self.length)


def stacked_heads(head_rows: torch.Tensor, count: int, per_projection: int) -> RowMap:
    """Token t's projection s (of `count` stacked ones, in their column order) and head h in the rows of `count`
    (b * heads, L, head_dim) tensors; `head_rows`: (T, heads), each token's head rows in one such tensor.
    Padding holds a copy of a real row: attention masks it exactly."""
    offsets = torch.arange(count, device=head_rows.device)[:, None] * per_projection
    return RowMap.of((offsets + head_rows[:, None, :]).flatten(), count * per_projection, zero_padding=False)
