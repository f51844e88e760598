"""Prompt-based sentence vectors (PromptBERT, Jiang et al. 2022): the sentence x is written into a template such as
`This sentence : "[X]" means [MASK] .` and its vector is the last hidden state at the template's [MASK] token.

A template is plain text with one `[X]` (where the sentence goes) and one `[MASK]` (replaced by the tokenizer's own
mask token: `[MASK]` for BERT, `<mask>` for RoBERTa). The text before and after `[X]` is tokenised on its own, as
the authors' code does, and the sentence's tokens (without special tokens) go between; the tokenizer's special
tokens of a single sequence ([CLS] ... [SEP], <s> ... </s>) frame the whole. The encoder keeps the template in its
config (`SentenceEncoderConfig.prompt_template`), so `encode`, evaluation and a reloaded checkpoint embed with it.

Template denoising (the training-time correction of PromptBERT's unsupervised objective) runs the template with
the sentence left out but with the position ids the template's tokens have when a sentence of n tokens is in it:
`template_only` builds those inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"


def check_template(template: str, key: str = "template") -> None:
    """ValueError naming `key` unless `template` has exactly one `[X]` and one `[MASK]`."""
    for slot, role in ((SENTENCE_SLOT, "where the sentence goes"), (MASK_SLOT, "whose state is the vector")):
        count = template.count(slot) if isinstance(template, str) else 0
        if count != 1:
            raise ValueError(
                f"key '{key}': the template {template!r} must contain {slot} ({role}) exactly once, found {count}; "
                'e.g. \'This sentence : "[X]" means [MASK] .\''
            )


def check_mask_token(tokenizer, where: str = "") -> int:
    """The tokenizer's mask token id; ValueError when it has none (prompt pooling reads the [MASK] state)."""
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise ValueError(
            f"The tokenizer{where} ({type(tokenizer).__name__}) has no mask token, so a prompt template has no "
            "[MASK] position to read; use a masked-language-model backbone (BERT, RoBERTa, ...)."
        )
    return mask_id


@dataclass(frozen=True)
class TemplateTokens:
    """A template as token ids: `prefix` (leading special tokens + the text before [X]) and `suffix` (the text after
    [X] + trailing special tokens); the sentence's own tokens go between them."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.prefix) + len(self.suffix)

    @classmethod
    def of(cls, tokenizer, template: str) -> TemplateTokens:
        """Tokenise `template` (checked) with `tokenizer`; ValueError without a mask token."""
        check_template(template)
        mask = tokenizer.convert_ids_to_tokens(check_mask_token(tokenizer))
        before, after = template.replace(MASK_SLOT, mask).split(SENTENCE_SLOT)
        lead, trail = special_frame(tokenizer)
        plain = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"] if text else []  # noqa: E731
        return cls(tuple(lead + plain(before)), tuple(plain(after) + trail))

    def wrap(self, sentence_ids: Iterable[int]) -> list[int]:
        return [*self.prefix, *sentence_ids, *self.suffix]


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a single sequence ([CLS] / [SEP] for BERT)."""
    probe = "a"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    raise ValueError(f"Cannot tell where {type(tokenizer).__name__} puts its special tokens around a sentence.")


def tokenize_with_template(
    tokenizer, sentences: Sequence[str], template: str, max_length: int | None = None
) -> list[list[int]]:
    """Token ids of each sentence written into `template`; the sentence (never the template) is cut so that the
    whole fits `max_length` tokens."""
    parts = TemplateTokens.of(tokenizer, template)
    room = None if max_length is None else max(max_length - len(parts), 0)
    ids = tokenizer(list(sentences), add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return [parts.wrap(row if room is None else row[:room]) for row in ids]


def position_offset(backbone: torch.nn.Module) -> int:
    """The first position id of a sequence: padding_idx + 1 for RoBERTa-style embeddings, else 0."""
    padding_idx = getattr(getattr(backbone, "embeddings", None), "padding_idx", None)
    return padding_idx + 1 if isinstance(padding_idx, int) else 0


def sentence_tokens(ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: torch.Tensor) -> torch.Tensor:
    """(rows, L) bool: the positions that hold a sentence's own tokens (real, and not a special token)."""
    return attention_mask.bool() & ~torch.isin(ids, special_ids.to(ids.device))


def wrap_ids(
    ids: torch.Tensor, attention_mask: torch.Tensor, parts: TemplateTokens, special_ids: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Re-write a tokenised batch ((rows, L), e.g. [CLS] x [SEP] pad) into the template: (ids, attention mask,
    sentence lengths n), right-padded with `pad_id` to len(parts) + L columns (a bound known from the shape, so
    nothing is read on the host: no sync on a GPU). The sentence's tokens keep their order."""
    keep = sentence_tokens(ids, attention_mask, special_ids)
    lengths = keep.sum(dim=1)
    width = len(parts) + ids.shape[1]
    out = torch.full((len(ids), width + 1), pad_id, dtype=ids.dtype, device=ids.device)
    prefix = torch.tensor(parts.prefix, dtype=ids.dtype, device=ids.device)
    suffix = torch.tensor(parts.suffix, dtype=ids.dtype, device=ids.device)
    out[:, : len(prefix)] = prefix
    target = torch.where(keep, len(prefix) + keep.long().cumsum(dim=1) - 1, width)  # column `width`: discarded
    out.scatter_(1, target, ids)
    columns = len(prefix) + lengths[:, None] + torch.arange(len(suffix), device=ids.device)[None, :]
    out.scatter_(1, columns, suffix.expand(len(ids), -1))
    out = out[:, :width]
    mask = (torch.arange(width, device=ids.device)[None, :] < (lengths + len(parts))[:, None]).to(attention_mask.dtype)
    return out, mask, lengths


def template_only(
    parts: TemplateTokens, lengths: torch.Tensor, offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The template with the sentence left out, one row per length n in `lengths`: (ids, position ids), both
    (rows, len(parts)). The prefix sits at positions offset + 0..P-1 and the suffix at offset + P + n + 0..S-1,
    the positions it has when a sentence of n tokens fills [X] (PromptBERT's template denoising)."""
    device = lengths.device
    ids = torch.tensor(parts.prefix + parts.suffix, device=device).expand(len(lengths), -1)
    positions = offset + torch.arange(len(parts), device=device)[None, :].repeat(len(lengths), 1)
    positions[:, len(parts.prefix) :] += lengths[:, None]
    return ids, positions


def mask_states(states: torch.Tensor, input_ids: torch.Tensor, mask_token_id: int, check: bool = True) -> torch.Tensor:
    """(rows, d): each row's state at its first `mask_token_id` token; with `check`, ValueError for a row without one
    (a host read: the training step, whose rows the trainer templated itself, passes False)."""
    if mask_token_id is None:
        raise ValueError("pooling 'prompt' needs a prompt template: the encoder has none (SentenceEncoder.use_prompt; "
                         "method promptbert sets it from its 'template' key).")
    is_mask = input_ids == mask_token_id
    if check and not bool(is_mask.any(dim=1).all()):
        raise ValueError(
            "prompt pooling: an input row has no mask token; the sentences must be written into the encoder's "
            "prompt template (SentenceEncoder.encode does this)."
        )
    position = is_mask.long().argmax(dim=1)
    return states[torch.arange(len(states), device=states.device), position]
