"""CLEAR's sentence augmentations (Wu et al. 2020, sections 3.3 and 4.1) on token sequences.

Each augmentation maps a sequence to a sequence of the same item type (token ids, token strings, or words
given as tuples of subword ids) and draws its randomness from the `numpy.random.Generator` it is handed, so a
view is a pure function of (sequence, seed):

- `del_word`: round(rate * n) units (70%) are replaced by the deletion token [DEL];
- `del_span`: `count` (5) non-overlapping spans of round(fraction * n) units (5%, at least 1) are each replaced by
  one [DEL] (Figure 2b);
- `reorder`: 2 * `pairs` (5 pairs) non-overlapping spans of round(fraction * n) units are drawn and swapped
  pairwise, the pairing at random (Figure 2c; equal span lengths, the paper's "roughly 5%");
- `subs`: round(rate * n) units (30%) that have a synonym are replaced by one of their synonyms (fewer when fewer
  units have one);
- `a+b`: `a`, then `b` on its output (e.g. `subs+del_span`, `del_span+reorder`).

n counts the units between special tokens. Special tokens ([CLS], [SEP], padding, <s>, </s>, ...) are never
deleted, moved or replaced: the sequence is cut at them and each run of ordinary units is augmented on its own
(a single sentence has one run). Consecutive [DEL] are merged into one after every step ("to avoid the model
easily distinguishing the two augmentations", section 3.3). The deletions always leave at least one unit of a
run, so a short sentence never becomes a bare [DEL] that every other short sentence would share.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np

TEXT_AUGMENTATIONS = ("del_word", "del_span", "reorder", "subs")
DELETIONS = ("del_word", "del_span")
#: the rates and counts of `SentenceAugmenter` (recipe keys of the same names)
AUGMENTATION_SETTINGS = (
    "del_word_rate", "del_span_count", "del_span_fraction", "reorder_pairs", "reorder_fraction", "subs_rate"
)

Unit = TypeVar("Unit", bound=Hashable)
SynonymFn = Callable[[Unit], Sequence[Unit]]


def parse_augmentation(spec: str) -> tuple[str, ...]:
    """'subs+del_span' -> ('subs', 'del_span'); raises ValueError naming the unknown or repeated part."""
    parts = tuple(part.strip() for part in str(spec).split("+"))
    unknown = [part for part in parts if part not in TEXT_AUGMENTATIONS]
    if unknown or not parts:
        raise ValueError(
            f"unknown augmentation {unknown or [spec]} in '{spec}': use one of {', '.join(TEXT_AUGMENTATIONS)} or "
            "a sequence joined by '+', e.g. 'subs+del_span' or 'del_span+reorder'."
        )
    if len(set(parts)) != len(parts):
        raise ValueError(f"augmentation '{spec}' repeats a step; name each of {', '.join(parts)} once.")
    return parts


def rounded_count(rate: float, n: int) -> int:
    """round(rate * n) with halves rounded up (Python's round() would send 2.5 to 2)."""
    return int(np.floor(rate * n + 0.5))


def merge_deletions(units: Sequence[Unit], deleted: Unit) -> list[Unit]:
    """Collapse every run of consecutive `deleted` units into one."""
    return [u for i, u in enumerate(units) if not (u == deleted and i > 0 and units[i - 1] == deleted)]


def sample_spans(n: int, count: int, length: int, rng: np.random.Generator) -> list[int]:
    """Sorted start positions of `count` non-overlapping spans of `length` in range(n), uniformly over all such
    placements (choose `count` of the n - count * (length - 1) slots, then spread them out)."""
    slots = n - count * (length - 1)
    if count < 0 or slots < count:
        raise ValueError(f"{count} spans of length {length} do not fit into {n} units.")
    picks = np.sort(rng.choice(slots, size=count, replace=False))
    return [int(p) + i * (length - 1) for i, p in enumerate(picks)]


def delete_words(units: Sequence[Unit], rate: float, deleted: Unit, rng: np.random.Generator) -> list[Unit]:
    """Replace round(rate * n) random units (at most n - 1) by `deleted`, then merge consecutive deletions."""
    n = len(units)
    k = min(rounded_count(rate, n), n - 1)
    if k <= 0:
        return list(units)
    chosen = set(rng.choice(n, size=k, replace=False).tolist())
    return merge_deletions([deleted if i in chosen else u for i, u in enumerate(units)], deleted)


def delete_spans(
    units: Sequence[Unit], count: int, fraction: float, deleted: Unit, rng: np.random.Generator
) -> list[Unit]:
    """Replace `count` non-overlapping spans of max(1, round(fraction * n)) units by one `deleted` each (fewer
    spans when they would not leave a unit standing), then merge consecutive deletions."""
    n = len(units)
    length = max(1, rounded_count(fraction, n))
    k = min(count, (n - 1) // length)
    if k <= 0:
        return list(units)
    starts = set(sample_spans(n, k, length, rng))
    out, i = [], 0
    while i < n:
        if i in starts:
            out.append(deleted)
            i += length
        else:
            out.append(units[i])
            i += 1
    return merge_deletions(out, deleted)


def reorder_spans(units: Sequence[Unit], pairs: int, fraction: float, rng: np.random.Generator) -> list[Unit]:
    """Draw 2 * `pairs` non-overlapping spans of max(1, round(fraction * n)) units (as many pairs as fit) and swap
    them pairwise, the pairs formed at random."""
    n = len(units)
    length = max(1, rounded_count(fraction, n))
    k = min(2 * pairs, n // length)
    k -= k % 2
    if k < 2:
        return list(units)
    starts = sample_spans(n, k, length, rng)
    order = rng.permutation(k)
    out = list(units)
    for a, b in zip(order[0::2], order[1::2]):
        sa, sb = starts[a], starts[b]
        out[sa:sa + length], out[sb:sb + length] = units[sb:sb + length], units[sa:sa + length]
    return out


def substitute_synonyms(
    units: Sequence[Unit], rate: float, synonyms: SynonymFn, rng: np.random.Generator
) -> list[Unit]:
    """Replace round(rate * n) random units that have synonyms (all of them when fewer have one) by a synonym
    drawn uniformly from `synonyms(unit)`."""
    options = [synonyms(u) for u in units]
    candidates = [i for i, found in enumerate(options) if found]
    k = min(rounded_count(rate, len(units)), len(candidates))
    out = list(units)
    for i in rng.choice(candidates, size=k, replace=False).tolist() if k else ():
        out[i] = options[i][int(rng.integers(len(options[i])))]
    return out


@dataclass(frozen=True)
class SentenceAugmenter:
    """One CLEAR augmentation (possibly a '+' sequence) with its settings.

    Call it with a sequence, the special items that must stay in place, and a generator:
    `augmenter(tokens, rng, special={"[CLS]", "[SEP]"})`. The two views of a sentence are two calls with
    generators seeded differently.

    Attributes:
        spec: the augmentation, e.g. 'del_word', 'subs+del_span', 'del_span+reorder'.
        deleted: the unit that stands for deleted text ([DEL]); needed by del_word / del_span.
        synonyms: unit -> its synonyms (same type as the unit); needed by subs.
    """

    spec: str
    deleted: Hashable | None = None
    synonyms: SynonymFn | None = None
    del_word_rate: float = 0.7
    del_span_count: int = 5
    del_span_fraction: float = 0.05
    reorder_pairs: int = 5
    reorder_fraction: float = 0.05
    subs_rate: float = 0.3

    def __post_init__(self):
        steps = parse_augmentation(self.spec)
        if self.deleted is None and any(step in DELETIONS for step in steps):
            raise ValueError(f"augmentation '{self.spec}' deletes text: give the deletion unit `deleted` ([DEL]).")
        if self.synonyms is None and "subs" in steps:
            raise ValueError(f"augmentation '{self.spec}' substitutes synonyms: give a `synonyms` function.")

    @cached_property  # parsed once: augment_run reads it for every sentence of every batch
    def steps(self) -> tuple[str, ...]:
        return parse_augmentation(self.spec)

    def augment_run(self, units: Sequence[Unit], rng: np.random.Generator) -> list[Unit]:
        """Apply every step in order to a run of ordinary (non-special) units."""
        out = list(units)
        for step in self.steps:
            if step == "del_word":
                out = delete_words(out, self.del_word_rate, self.deleted, rng)
            elif step == "del_span":
                out = delete_spans(out, self.del_span_count, self.del_span_fraction, self.deleted, rng)
            elif step == "reorder":
                out = reorder_spans(out, self.reorder_pairs, self.reorder_fraction, rng)
            else:
                out = substitute_synonyms(out, self.subs_rate, self.synonyms, rng)
        return merge_deletions(out, self.deleted) if self.deleted is not None else out

    def __call__(
        self, units: Sequence[Unit], rng: np.random.Generator, special: Collection[Unit] = ()
    ) -> list[Unit]:
        """Augment each run of units between `special` items; the special items keep their places."""
        out: list[Unit] = []
        run: list[Unit] = []
        for unit in units:
            if unit in special:
                out += self.augment_run(run, rng) if run else []
                out.append(unit)
                run = []
            else:
                run.append(unit)
        return out + (self.augment_run(run, rng) if run else [])
