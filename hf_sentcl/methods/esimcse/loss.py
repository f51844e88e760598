"""ESimCSE's objective (Wu et al. 2022, Eq. 4) as a pure function: SimCSE's InfoNCE whose denominator also holds
the embeddings of a queue,

    l_i = -log  e^{sim(h_i, h_i+)/tau} / ( sum_j e^{sim(h_i, h_j+)/tau} + sum_m e^{sim(h_i, q_m)/tau} )

with h_i the sentence, h_j+ the batch's word-repeated sentences and q_m the M queue entries (momentum-encoder
embeddings of earlier batches). It is `hf_sentcl.losses.margin_info_nce` with the queue as extra negative columns
after the batch's own, so the IFM/BYOP margin applies to the queue's logits as to the batch's negatives.
"""

from __future__ import annotations

import torch

from hf_sentcl.losses import margin_info_nce


def queue_info_nce(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    temperature: float,
    queue: torch.Tensor | None = None,
    queue_valid: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
    perturbation: str | None = None,
    **margin_kwargs,
) -> torch.Tensor:
    """Mean over the rows of l_i above: anchors[i] against positives[i], every other positives[j] and every valid
    queue row as negatives; cosine similarities in fp32.

    `queue`: (M, dim) extra negatives, or None; `queue_valid`: (M,) bool, False for entries not yet filled (left
    out of every denominator, so no host read of the fill level); `exclude`: (rows, rows) in-batch false negatives
    (`hf_sentcl.losses.false_negatives`), which never touch the queue's columns. `perturbation` and `margin_kwargs`
    are `margin_info_nce`'s IFM/BYOP margin (None: plain InfoNCE).
    """
    if queue is None or len(queue) == 0:
        return margin_info_nce(anchors, positives, temperature, perturbation, exclude=exclude, **margin_kwargs)
    if queue.shape[-1] != anchors.shape[-1]:
        raise ValueError(f"queue entries have {queue.shape[-1]} dimensions, the embeddings {anchors.shape[-1]}")
    rows = len(anchors)
    if exclude is not None or queue_valid is not None:
        in_batch = exclude if exclude is not None else anchors.new_zeros((rows, len(positives)), dtype=torch.bool)
        queued = anchors.new_zeros((rows, len(queue)), dtype=torch.bool)
        if queue_valid is not None:
            queued = queued | ~queue_valid.to(device=anchors.device, dtype=torch.bool)[None, :]
        exclude = torch.cat([in_batch, queued], dim=1)
    return margin_info_nce(
        anchors, positives, temperature, perturbation, hard_negatives=queue.to(anchors.device), exclude=exclude,
        **margin_kwargs,
    )
