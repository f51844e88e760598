"""Duplicate texts as false negatives: which in-batch candidates to take out of a contrastive denominator.

In-batch negatives assume every other row is another sentence. A corpus that repeats a sentence, or NLI triplets
that repeat a premise, put the same text on two rows, and the loss then pushes a sentence away from itself.
With `false_negatives: mask` every loss here drops those candidates from the softmax (a -inf logit), so they are
neither positives nor negatives.

"Identical" means identical token ids after truncation: texts that differ only beyond `max_seq_length` are the
same input to the encoder, and the comparison is exact (no hashing), across processes once the ids are gathered.

Rows whose anchors have the same text form a group; the group's positives are the positive texts of all its rows
(a premise repeated with a second entailment has two). A candidate c is a false negative of row i (never i's own
target) when c's text equals
- the text of i's anchor, or
- the text of a positive of i's group (i's own positive, or another positive of the same anchor).
Only the text decides, not the column c sits in: a text that is one row's positive and another row's hard negative
is masked in both columns for every row whose group has it as a positive.

With `false_negatives: guide` a frozen guide encoder decides instead, as sentence-transformers' GISTEmbedLoss does:
each text view is named by the guide's unit embedding, and a candidate c (never row i's own target t_i) leaves row
i's denominator when the guide scores it closer to i's anchor than i's own positive, less a margin:
- absolute: g(a_i, c) > g(a_i, t_i) - margin
- relative: g(a_i, c) > g(a_i, t_i) - |g(a_i, t_i)| * margin
where g is the guide's cosine. The same layout functions below build either mask: their arguments are (rows,) text
groups, or (rows, guide dim) guide embeddings together with a `GuideMargin`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_sentcl.configs.choices import GUIDE_MARGIN_STRATEGIES


@dataclass(frozen=True)
class GuideMargin:
    """`false_negatives: guide`'s rule: how far below a row's own positive score a candidate's guide score may be
    and still be taken for a false negative."""

    margin: float = 0.0
    strategy: str = "absolute"

    def __post_init__(self) -> None:
        if self.strategy not in GUIDE_MARGIN_STRATEGIES:
            raise ValueError(
                f"guide_margin_strategy '{self.strategy}': use one of {', '.join(GUIDE_MARGIN_STRATEGIES)}."
            )

    def threshold(self, positive: torch.Tensor) -> torch.Tensor:
        """The guide score above which a candidate is a false negative, from the row's positive score."""
        if self.strategy == "absolute":
            return positive - self.margin
        return positive - positive.abs() * self.margin


def guided_mask(
    anchors: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor, rule: GuideMargin
) -> torch.Tensor:
    """(rows, candidates) bool, True where the guide scores a candidate above `rule.threshold` of the row's own
    positive score (the module docstring); the target column never. `anchors` (rows, d) and `candidates`
    (candidates, d) are unit-length guide embeddings; the scores are computed in fp32."""
    scores = anchors.float() @ candidates.float().T
    positive = scores.gather(1, targets[:, None])  # from the same matrix: a duplicate of the positive ties exactly
    columns = torch.arange(len(candidates), device=candidates.device)
    return (scores > rule.threshold(positive)) & (columns[None, :] != targets[:, None])


def text_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One integer per row of `input_ids` (rows, length), equal for two rows exactly when their real tokens are
    the same (padding, its side and its length play no part). Rows may come from batches padded differently."""
    tokens = torch.where(attention_mask.bool(), input_ids + 1, 0)
    # left padding: move the real tokens first, so padding on either side compares equal
    order = torch.argsort((tokens == 0).to(torch.int8), dim=1, stable=True)
    tokens = tokens.gather(1, order)
    return torch.unique(tokens, dim=0, return_inverse=True)[1]


def false_negative_mask(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    candidates: torch.Tensor,
    targets: torch.Tensor,
    guide: GuideMargin | None = None,
) -> torch.Tensor:
    """(rows, candidates) bool, True where a candidate is a false negative of the row (see the module docstring).

    Args:
        anchors, positives: (rows,) text groups of each row's anchor and positive (`text_groups`); every row of the
            batch, since another row with the same anchor adds to a row's positives.
        candidates: (candidates,) text groups of the similarity matrix's columns, whatever their role.
        targets: (rows,) each row's positive column, never masked.
        guide: with `false_negatives: guide`, the margin rule; anchors, positives and candidates are then the
            guide's (rows, d) embeddings, and `positives` is not needed (the target column gives the positive).
    """
    if guide is not None:
        return guided_mask(anchors, candidates, targets, guide)
    same_anchor = anchors[:, None] == anchors[None, :]  # (rows, rows): rows of one group
    positive_text = positives[:, None] == candidates[None, :]  # (rows, candidates): the candidate is row m's positive
    # a candidate is a positive of row i's group when some row m of the group has it as its positive; a 0/1 matmul
    # (counts are whole numbers >= 1 where true, so "> 0" is exact in any precision)
    group_positive = (same_anchor.float() @ positive_text.float()) > 0
    same = (candidates[None, :] == anchors[:, None]) | group_positive
    columns = torch.arange(len(candidates), device=candidates.device)
    return same & (columns[None, :] != targets[:, None])


def paired_texts_mask(first: torch.Tensor, second: torch.Tensor, guide: GuideMargin | None = None) -> torch.Tensor:
    """The (2N, 2N) mask for an in-batch loss over the texts [first; second] of N pairs, each text's target its
    partner (AnglE's in-batch term): `first`, `second` are the (N,) text groups (or guide embeddings with `guide`)
    of each pair's two sentences. A text's own column is no candidate (the loss leaves it out), so it is not
    counted as masked."""
    rows = torch.cat([first, second])
    columns = torch.arange(len(rows), device=rows.device)
    mask = false_negative_mask(rows, torch.cat([second, first]), rows, columns.roll(len(first)), guide)
    return mask & (columns[:, None] != columns[None, :])


def exclude_candidates(logits: torch.Tensor, exclude: torch.Tensor | None) -> torch.Tensor:
    """`logits` with the excluded candidates at -inf (out of the softmax's denominator); unchanged without a mask."""
    return logits if exclude is None else logits.masked_fill(exclude, float("-inf"))


def count_masked(exclude: torch.Tensor | None) -> torch.Tensor:
    """How many (row, candidate) pairs a mask removes, as a tensor (no host read)."""
    if exclude is None:
        return torch.zeros(())
    return exclude.sum()


def info_nce_mask(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    hard_negatives: torch.Tensor | None = None,
    guide: GuideMargin | None = None,
) -> torch.Tensor:
    """The mask for SimCSE's InfoNCE: rows are anchors, columns the positives [then the hard negatives], row i's
    target column i. Arguments are (rows,) text groups (or guide embeddings with `guide`); a hard-negative column is
    masked exactly as a positive column with the same text would be."""
    candidates = positives if hard_negatives is None else torch.cat([positives, hard_negatives])
    targets = torch.arange(len(anchors), device=anchors.device)
    return false_negative_mask(anchors, positives, candidates, targets, guide)


def nt_xent_mask(groups: torch.Tensor, guide: GuideMargin | None = None) -> torch.Tensor:
    """The (2N, 2N) mask for NT-Xent over [z1; z2] where both views of example i come from the text of group
    `groups[i]` (N,) (or guide embedding, (N, d) with `guide`): every view of a duplicate sentence leaves the
    denominator."""
    both = torch.cat([groups, groups])
    targets = torch.arange(len(both), device=groups.device).roll(len(groups))
    return false_negative_mask(both, both, both, targets, guide)
