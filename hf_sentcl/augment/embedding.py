"""Embedding-level augmentations of ConSERT (Yan et al. 2021, section 3.2), applied inside the backbone by hooks.

ConSERT makes the two views of a sentence by transforming the output of the embedding layer (word + position +
token-type embeddings, after their LayerNorm) before the transformer layers:

- `none`: the embeddings as they are;
- `shuffle`: the position ids of the real tokens are permuted (the token ids keep their order), so the
  transformer sees the words in a shuffled order; padding keeps its position ids;
- `token_cutoff`: whole token rows are set to zero, floor(rate * real tokens) of them (rate 0.15);
- `feature_cutoff`: whole feature dimensions are set to zero on every real token, floor(rate * d) of them (0.2);
- `dropout`: single elements of the real tokens' rows are set to zero, floor(rate * real tokens * d) of them (0.2).

Counts are exact (floor of rate times the candidates) and the kept values are not rescaled, as in the authors'
cutoff code. Padding positions are never changed. The random draws of one forward pass are an
`AugmentationPlan`; `EmbeddingAugmenter` installs two hooks on a BERT-like backbone and applies the plan that is
active (`with augmenter.augment(...)`), without touching the model's code:

- a forward pre-hook on `embeddings.position_embeddings` permutes the position ids the embedding module computed
  itself, so BERT's 0..L-1 and RoBERTa's padding_idx+1.. numbering are both shuffled correctly;
- a forward hook on `embeddings` multiplies its output by the plan's 0/1 mask and adds the plan's perturbation
  (the adversarial view), and keeps the output for gradients.

Rows of the stacked batch are split into equal blocks, one augmentation name per block, so the two views of a
batch (and any further copies) go through ONE forward pass. The hooks do nothing when the backbone is in eval
mode or no plan is active.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

AUGMENTATIONS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "dropout")


@dataclass(frozen=True)
class AugmentationRates:
    """Fractions used by the cutoff and dropout augmentations (the paper's values as defaults)."""

    token_cutoff: float = 0.15
    feature_cutoff: float = 0.2
    dropout: float = 0.2
    #: also remove cut tokens from attention (and pooling); ConSERT only zeroes their embeddings
    token_cutoff_masks_attention: bool = False

    def __post_init__(self):
        for name in ("token_cutoff", "feature_cutoff", "dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} rate must be in [0, 1), got {value}.")


@dataclass
class AugmentationPlan:
    """The random draws of one forward pass over `rows` stacked sequences of length L.

    Attributes:
        names: the augmentation of each block of rows (blocks are equal and in order).
        attention_mask: (rows, L) mask to give the model (token cutoff may take tokens out of attention).
        position_order: (rows, L) long or None; token j of row r takes the position id of token
            `position_order[r, j]` (identity outside shuffled rows and on padding).
        keep: (rows, L, d) 0/1 multiplier of the embedding output, or None when no row is cut.
        perturbation: (rows, L, d) added to the embedding output after `keep` (adversarial views), or None.
        embedding_output: set by the hook to the (augmented) embedding output, for gradients w.r.t. it.
    """

    names: tuple[str, ...]
    attention_mask: torch.Tensor
    position_order: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    perturbation: torch.Tensor | None = None
    embedding_output: torch.Tensor | None = None


def check_augmentation(name: str, key: str = "augmentation") -> str:
    """Return `name` if it is one of `AUGMENTATIONS`, else raise naming `key`."""
    if name not in AUGMENTATIONS:
        raise ValueError(f"{key} must be one of {', '.join(AUGMENTATIONS)}, got '{name}'.")
    return name


def random_subset(candidates: torch.Tensor, rate: float) -> torch.Tensor:
    """Choose exactly floor(rate * n_r) of the n_r True entries of each row r of `candidates` (bool, (..., N)),
    uniformly at random; returns a bool tensor of the same shape, never True where `candidates` is False."""
    counts = torch.floor(candidates.sum(-1).double() * rate).long()
    keys = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, 2.0)
    order = keys.argsort(dim=-1)  # the chosen entries are the first counts[r] of a random order of the candidates
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    return ranks < counts.unsqueeze(-1)


def shuffled_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """(rows, L) index map that permutes the real tokens of each row among themselves, uniformly at random, and
    leaves padding in place (any padding side)."""
    real = attention_mask.bool()
    # Both sorts put the real positions first (in random order / in order), so slot k of one pairs with slot k of
    # the other; padding sorts last in the same ascending order in both, so it maps to itself.
    random_real = torch.rand(real.shape, device=real.device).masked_fill(~real, 2.0).argsort(dim=-1, stable=True)
    ordered_real = torch.where(real, 0, 1).argsort(dim=-1, stable=True)
    return torch.empty_like(ordered_real).scatter_(-1, ordered_real, random_real)


def fgv_perturbation(gradient: torch.Tensor, attention_mask: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Fast Gradient Value (Rozsa et al. 2016): epsilon * g / ||g||_2 per sentence, g the loss gradient w.r.t. the
    sentence's embedding output (real tokens only). Unlike FGSM it keeps the gradient's values, not its sign."""
    g = gradient.detach().float() * attention_mask.unsqueeze(-1).to(torch.float32)
    norm = g.flatten(1).norm(dim=1).clamp_min(1e-12)
    return (epsilon * g / norm.view(-1, 1, 1)).to(gradient.dtype)


def make_plan(
    names: Sequence[str],
    attention_mask: torch.Tensor,
    hidden_size: int,
    rates: AugmentationRates = AugmentationRates(),
    perturbation: torch.Tensor | None = None,
) -> AugmentationPlan:
    """Draw the augmentations for `attention_mask` (rows, L): row block k (of rows / len(names)) gets `names[k]`."""
    names = tuple(check_augmentation(n) for n in names)
    rows, length = attention_mask.shape
    if not names or rows % len(names):
        raise ValueError(f"{rows} rows cannot be split into {len(names)} equal augmentation blocks.")
    block = rows // len(names)
    real = attention_mask.bool()
    device = attention_mask.device
    position_order = keep = None
    mask = attention_mask  # with token_cutoff_masks_attention, cut tokens leave attention too
    for k, name in enumerate(names):
        rows_k = slice(k * block, (k + 1) * block)
        real_k = real[rows_k]
        if name == "none":
            continue
        if name == "shuffle":
            if position_order is None:
                position_order = torch.arange(length, device=device).expand(rows, length).clone()
            position_order[rows_k] = shuffled_order(real_k)
            continue
        if keep is None:
            keep = torch.ones(rows, length, hidden_size, dtype=torch.bool, device=device)
        if name == "token_cutoff":
            cut = random_subset(real_k, rates.token_cutoff)
            if rates.token_cutoff_masks_attention:
                if mask is attention_mask:
                    mask = attention_mask.clone()
                mask[rows_k] = mask[rows_k].masked_fill(cut, 0)
            keep[rows_k] &= ~cut.unsqueeze(-1)
        elif name == "feature_cutoff":
            every_column = torch.ones(block, hidden_size, dtype=torch.bool, device=device)
            columns = random_subset(every_column, rates.feature_cutoff)
            keep[rows_k] &= ~(columns.unsqueeze(1) & real_k.unsqueeze(-1))
        else:  # dropout
            elements = real_k.unsqueeze(-1).expand(block, length, hidden_size).reshape(block, -1)
            keep[rows_k] &= ~random_subset(elements, rates.dropout).view(block, length, hidden_size)
    return AugmentationPlan(names, mask, position_order, keep, perturbation)


def embedding_module(backbone: nn.Module) -> nn.Module:
    """The module whose output feeds the transformer layers (`backbone.embeddings` for BERT-like models)."""
    module = getattr(backbone, "embeddings", None)
    if not isinstance(module, nn.Module):
        raise ValueError(
            f"ConSERT augments the embedding layer's output, but {type(backbone).__name__} has no `embeddings` "
            "module (BERT, RoBERTa, MiniLM, ELECTRA, MPNet ... have one)."
        )
    return module


class EmbeddingAugmenter:
    """Hooks on a BERT-like backbone that apply the active `AugmentationPlan` (training mode only).

        augmenter = EmbeddingAugmenter(encoder.backbone)
        with augmenter.augment(["shuffle", "feature_cutoff"], attention_mask) as plan:
            out = encoder(input_ids=ids, attention_mask=plan.attention_mask)

    `rates` sets the cutoff/dropout fractions. `remove()` takes the hooks off again.
    """

    def __init__(self, backbone: nn.Module, rates: AugmentationRates = AugmentationRates()):
        self.rates = rates
        self.embeddings = embedding_module(backbone)
        self.hidden_size = backbone.config.hidden_size
        self.plan: AugmentationPlan | None = None
        self._handles = [self.embeddings.register_forward_hook(self._augment_output)]
        positions = getattr(self.embeddings, "position_embeddings", None)
        self.can_shuffle = isinstance(positions, nn.Module)
        if self.can_shuffle:
            self._handles.append(positions.register_forward_pre_hook(self._shuffle_positions))

    @contextmanager
    def augment(
        self, names: Sequence[str], attention_mask: torch.Tensor, perturbation: torch.Tensor | None = None
    ) -> Iterator[AugmentationPlan]:
        """Draw a plan for the stacked batch and apply it to the forward passes inside the `with` block."""
        if "shuffle" in names and not self.can_shuffle:
            raise ValueError(
                "augmentation 'shuffle' permutes position ids, but this backbone has no "
                "`embeddings.position_embeddings` (absolute position embeddings); choose another augmentation."
            )
        plan = make_plan(names, attention_mask, self.hidden_size, self.rates, perturbation)
        self.plan = plan
        try:
            yield plan
        finally:
            self.plan = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _active(self) -> AugmentationPlan | None:
        return self.plan if self.plan is not None and self.embeddings.training else None

    def _shuffle_positions(self, module: nn.Module, args: tuple) -> tuple | None:
        plan = self._active()
        if plan is None or plan.position_order is None:
            return None
        position_ids = args[0]
        order = plan.position_order
        self._check_rows(order.shape[0], position_ids.shape[-1], order.shape[1])
        shuffled = position_ids.expand(order.shape[0], -1).gather(1, order)
        return (shuffled, *args[1:])

    def _augment_output(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        plan = self._active()
        if plan is None:
            return None
        self._check_rows(plan.attention_mask.shape[0], output.shape[1], plan.attention_mask.shape[1], output.shape[0])
        if plan.keep is not None:
            output = output * plan.keep.to(output.dtype)
        if plan.perturbation is not None:
            output = output + plan.perturbation.to(output.dtype)
        plan.embedding_output = output
        return output

    @staticmethod
    def _check_rows(plan_rows: int, length: int, plan_length: int, rows: int | None = None) -> None:
        if length != plan_length or (rows is not None and rows != plan_rows):
            raise RuntimeError(
                f"the active augmentation plan is for {plan_rows} x {plan_length} tokens, but the backbone got "
                f"{rows if rows is not None else '?'} x {length}; draw the plan from the attention mask of the "
                "batch that is passed to the model."
            )
