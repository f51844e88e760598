"""One training forward split into sub-batches of similar length, so that short sentences are not padded to the
longest one of the batch (`length_buckets`).

A random batch of Wikipedia sentences at max_len 32 is about a third padding: the encoder's linear layers and
attention compute on every padded position. Sorting the batch's rows by length and encoding them in a few
consecutive groups, each cut to its own longest row, removes most of that work. The rows are put back in their
original order afterwards, so the loss sees the same batch and the same in-batch negatives. Padding is masked
everywhere (attention, pooling), so each row's embedding is the same function of its tokens; only the dropout
masks differ, because dropout draws them per group (fewer, differently shaped tensors).
"""

from __future__ import annotations

import torch


def forward_in_length_buckets(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, buckets: int
) -> torch.Tensor:
    """`model(input_ids=..., attention_mask=...).embeddings` over `buckets` length-sorted groups of the rows of the
    (rows, length) inputs, each group cut after its last real token; returns (rows, dim) in the input order.

    Only trailing padding columns are cut (position ids stay those of the full batch), so left-padded inputs are
    encoded at full length.
    """
    if buckets < 1:
        raise ValueError(f"length_buckets must be >= 1, got {buckets}.")
    real = attention_mask.bool()
    # width of each row = 1 + position of its last real token (0 for an all-padding row)
    positions = torch.arange(1, real.shape[1] + 1, device=real.device)
    widths = (real * positions).amax(dim=1)
    order = torch.argsort(widths, stable=True)
    groups = [group for group in order.tensor_split(buckets) if len(group)]
    group_widths = widths[torch.stack([group[-1] for group in groups])].clamp(min=1).tolist()  # one host read
    outputs = [
        model(input_ids=input_ids[group, :width], attention_mask=attention_mask[group, :width]).embeddings
        for group, width in zip(groups, group_widths)
    ]
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(outputs)[inverse]
