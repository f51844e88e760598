"""ESimCSE's word repetition (Wu et al. 2022, section 3.1) on token ids: the positive view of a sentence is the
sentence with a few randomly chosen subword tokens duplicated in place, so that the two views of a positive pair
differ in length (SimCSE's dropout pairs share theirs, which biases the encoder towards length).

For a sentence of N repeatable tokens (its real tokens without the special tokens [CLS]/[SEP], <s>/</s>, padding):

    dup_len ~ uniform integer in [0, max(2, int(dup_rate * N))]        (the paper's Eq. 1)
    dup_set = dup_len distinct positions drawn uniformly among the N   (Eq. 2)

and every token at a position of dup_set is followed by a copy of itself. dup_len is capped at N (positions are
drawn without replacement; the paper's max(2, .) can exceed N for a sentence of 0-1 tokens) and, when
`max_length` is given, at the room left below it, so no token is ever cut off.

Every random draw comes from torch's global generator of the ids' device (`torch.rand`), so a replayed random
state (the cached step, `hf_sentcl.trainers.cached`) repeats the same tokens. Nothing is read on the host (no sync
on a GPU): the output's width is a bound computed from the input's shape (`repeated_width`), not the longest row.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def as_id_tensor(ids: torch.Tensor | Iterable[int], like: torch.Tensor) -> torch.Tensor:
    """`ids` as a 1-d tensor of `like`'s dtype on its device (a tensor already there is used as it is)."""
    if isinstance(ids, torch.Tensor):
        return ids.to(device=like.device, dtype=like.dtype)
    return torch.tensor(sorted(set(ids)), dtype=like.dtype, device=like.device)


def repeated_width(length: int, dup_rate: float, max_length: int | None = None) -> int:
    """The width of the repeated batch for input width `length`: room for the most tokens any row can repeat,
    min(length, max(2, int(dup_rate * length))), within `max_length` (a bound known without reading the data)."""
    width = length + min(length, max(2, int(dup_rate * length)))
    return width if max_length is None else min(width, max(max_length, length))


def repetition_counts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    dup_rate: float,
    special_ids: torch.Tensor | Iterable[int] = (),
    max_length: int | None = None,
) -> torch.Tensor:
    """(rows, length) 0/1/2 per position: how many times each token appears in the repeated view (0: padding, 2: a
    repeated token). Draws dup_len and dup_set as the module docstring says, one row at a time in parallel."""
    real = attention_mask.bool()
    candidates = real & ~torch.isin(input_ids, as_id_tensor(special_ids, input_ids))
    n = candidates.sum(dim=1)
    # int(dup_rate * N) as the paper writes it (double precision, as Python's float product)
    upper = (n.double() * dup_rate).floor().long().clamp_min(2).minimum(n)
    if max_length is not None:
        upper = upper.minimum((max_length - real.sum(dim=1)).clamp_min(0))
    draw = torch.rand(len(input_ids), dtype=torch.float64, device=input_ids.device)
    dup_len = (draw * (upper + 1)).floor().long().minimum(upper)
    # a uniformly random subset of dup_len candidates: the dup_len smallest of i.i.d. uniform keys
    keys = torch.rand(input_ids.shape, device=input_ids.device).masked_fill(~candidates, 2.0)
    rank = keys.argsort(dim=1).argsort(dim=1)
    chosen = candidates & (rank < dup_len[:, None])
    return real.long() + chosen.long()


def repeat_tokens(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, counts: torch.Tensor, pad_id: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write every real token `counts` times in place: (rows, width) ids and attention mask, right-padded with
    `pad_id` (`width` must hold every row's new length). Real tokens keep their order (left-padded input comes out
    right-padded). Scattered, with a spare column for what is not written, so no mask is read on the host."""
    counts = counts * attention_mask.bool()
    lengths = counts.sum(dim=1)
    start = counts.cumsum(dim=1) - counts  # where each token's first copy goes
    ids = torch.full((len(input_ids), width + 1), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    for nth in (1, 2):
        target = torch.where(counts >= nth, start + nth - 1, width)  # column `width`: the spare one
        ids.scatter_(1, target, input_ids)
    ids = ids[:, :width]
    mask = (torch.arange(width, device=input_ids.device)[None, :] < lengths[:, None]).to(attention_mask.dtype)
    return ids, mask


def word_repetition(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    dup_rate: float,
    special_ids: torch.Tensor | Iterable[int] = (),
    pad_id: int = 0,
    max_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ESimCSE's positive view of a (rows, length) batch of token ids: (ids, attention mask) of the sentences with
    a few tokens repeated in place (module docstring), right-padded with `pad_id` to `repeated_width(length, ...)`.

    `special_ids` are never repeated (the tokenizer's [CLS]/[SEP], <s>/</s>, padding), nor is any position the
    attention mask marks as padding. The ids come already truncated to `max_seq_length` (as in the authors' code,
    which tokenizes with truncation and then repeats, so the repeated view may be up to dup_len tokens longer);
    `max_length` (e.g. the backbone's number of positions) caps the new length by repeating fewer tokens.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"expected (rows, length) ids and mask, got {tuple(input_ids.shape)} and "
                         f"{tuple(attention_mask.shape)}")
    if dup_rate < 0:
        raise ValueError(f"dup_rate must be >= 0, got {dup_rate}")
    counts = repetition_counts(input_ids, attention_mask, dup_rate, special_ids, max_length)
    width = repeated_width(input_ids.shape[1], dup_rate, max_length)
    return repeat_tokens(input_ids, attention_mask, counts, pad_id, width)
