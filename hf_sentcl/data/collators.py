"""Collation of pre-tokenised views into one padded (batch, views, length) tensor."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from hf_sentcl.data.corpus import VIEW_PREFIX, float_scores, tokenize_views


def pad_token_ids(
    sequences: list[list[int]],
    pad_token_id: int,
    padding_side: str = "right",
    pad_to_multiple_of: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token-id lists into `input_ids` and `attention_mask` (n, length) int64 tensors, as `tokenizer.pad` does.

    `tokenizer.pad` builds a Python dict per sequence and pads list by list; this fills one tensor through a
    boolean mask of the real-token positions (row-major order = the order of the concatenated ids), about ten
    times faster on a training batch, which matters because collation runs on the training loop's thread.
    """
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}.")
    lengths = torch.tensor([len(ids) for ids in sequences], dtype=torch.long)
    longest = int(lengths.max()) if len(sequences) else 0
    if pad_to_multiple_of and longest % pad_to_multiple_of:
        longest += pad_to_multiple_of - longest % pad_to_multiple_of
    positions = torch.arange(longest)
    if padding_side == "right":
        real = positions < lengths[:, None]
    else:
        real = positions >= (longest - lengths)[:, None]
    input_ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    input_ids[real] = torch.tensor(list(chain.from_iterable(sequences)), dtype=torch.long)
    return input_ids, real.long()


def require_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse a tokenizer without a pad token: training batches could not be padded."""
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"The tokenizer ({type(tokenizer).__name__}) has no pad token, so batches cannot be padded; "
            "set tokenizer.pad_token (e.g. to its eos or unk token) before training."
        )


@dataclass
class ViewCollator:
    """Pad every view of every example to the batch's longest sequence (dynamic padding).

    Returns `input_ids` and `attention_mask` of shape (batch, num_views, length); trainers flatten the views
    into one forward pass. Padding follows the tokenizer (`pad_token_id`, `padding_side`) and gives the same tensors
    as `tokenizer.pad`; `pad_to_multiple_of` rounds the length up (fewer distinct shapes, e.g. for torch.compile).
    """

    tokenizer: PreTrainedTokenizerBase
    num_views: int = 1
    pad_to_multiple_of: int | None = None

    def __post_init__(self):
        require_pad_token(self.tokenizer)
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive length, got {self.pad_to_multiple_of}.")

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        sequences = [f[f"{VIEW_PREFIX}{v}"] for v in range(self.num_views) for f in features]  # view-major
        input_ids, attention_mask = pad_token_ids(
            sequences, self.tokenizer.pad_token_id, self.tokenizer.padding_side, self.pad_to_multiple_of
        )
        batch = len(features)
        return {
            key: value.view(self.num_views, batch, -1).transpose(0, 1).contiguous()
            for key, value in (("input_ids", input_ids), ("attention_mask", attention_mask))
        }


@dataclass
class LabelledViewCollator(ViewCollator):
    """`ViewCollator` that also returns each example's label as a `labels` tensor of shape (batch,): class indices
    (NLI, `torch.long`) or scores (`torch.float32`, a method's `score_column`)."""

    label_column: str = "labels"
    label_dtype: torch.dtype = torch.long

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = super().__call__(features)
        batch["labels"] = torch.tensor([f[self.label_column] for f in features], dtype=self.label_dtype)
        return batch


def tokenized_views(
    rows: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    columns: tuple[str, ...],
    max_seq_length: int,
    score_column: str | None = None,
    source: str = "train_dataset",
    num_proc: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> tuple[Dataset, ViewCollator]:
    """`rows`' text `columns` tokenised into views, with their collator; with `score_column`, its values (numbers,
    `float_scores`, `source` naming them in an error) as float `labels` and the collator that returns them. The one
    path of the plain loader, a method's own data and a trainer used directly."""
    dataset = tokenize_views(rows.select_columns(list(columns)), tokenizer, columns, max_seq_length, num_proc)
    if score_column is None:
        return dataset, ViewCollator(tokenizer, num_views=len(columns), pad_to_multiple_of=pad_to_multiple_of)
    dataset = dataset.add_column("labels", float_scores(rows, score_column, source))
    return dataset, LabelledViewCollator(tokenizer, len(columns), pad_to_multiple_of, label_dtype=torch.float32)
