"""CLEAR's data pipeline: words from subword ids, WordNet synonyms as subword ids, and the collator that builds
the two augmented views (and the masked original for MLM) of every sentence while batches are collated.

Augmentation runs on words, not subword tokens: a word is a word-initial subword token plus its continuations
(WordPiece `##` pieces; for byte-level BPE and SentencePiece vocabularies, tokens without the `Ġ` / `▁` word
marker, so there a word is a whitespace-delimited word with its punctuation). Synonym substitution needs words,
the paper's rates count "tokens" of one vocabulary for all augmentations (so `subs+del_span` must use one unit),
and deleting or moving a lone `##ing` piece would leave a fragment that tells the views apart - the cue the paper
removes by merging consecutive [DEL]. `level='token'` works on single subword tokens instead.

Seeding: the view v (1, 2) of example i in epoch e is augmented with numpy's generator seeded by
`SeedSequence([seed, epoch, i, v])`, and the MLM mask of example i with a torch generator seeded from
`[seed, epoch, i, 0]`. Views are therefore reproducible under the run's seed, differ between the two views and
between epochs, and do not depend on batch composition, the number of data-loader workers or processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
from datasets import Dataset
from tokenizers import decoders
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from hf_sentcl.augment.text import AUGMENTATION_SETTINGS, DELETIONS, SentenceAugmenter, parse_augmentation
from hf_sentcl.augment.wordnet import WordNet
from hf_sentcl.data.collators import pad_token_ids, require_pad_token
from hf_sentcl.data.corpus import VIEW_PREFIX

DELETE_TOKEN = "[DEL]"
EXAMPLE_INDEX = "example_index"
LEVELS = ("word", "token")
#: shorter words are letters, initials or word pieces, whose WordNet entries are noise ("c" -> "hundred")
MIN_WORD_LENGTH = 3
#: word-initial markers of byte-level BPE (RoBERTa, GPT-2) and SentencePiece (XLM-R, ALBERT) vocabularies
WORD_MARKERS = ("Ġ", "▁")

Word = tuple[int, ...]


def add_delete_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """Add [DEL] to the tokenizer as a special token (once) and return its id. The model's embedding matrix
    must then be resized to `len(tokenizer)`."""
    if DELETE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [DELETE_TOKEN]})
    return tokenizer.convert_tokens_to_ids(DELETE_TOKEN)


def protected_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids augmentation never deletes, moves or replaces and MLM never masks: the tokenizer's special tokens
    ([CLS], [SEP], [PAD], <s>, </s>, ...), except [DEL], which stands for deleted text."""
    return frozenset(tokenizer.all_special_ids) - {tokenizer.get_vocab().get(DELETE_TOKEN)}


def word_marker(backend, tokens: Sequence[str]) -> str | None:
    """The word-initial marker of a byte-level BPE or SentencePiece vocabulary (from the tokenizer's decoder, else
    the marker most tokens start with), or None."""
    decoder = getattr(backend, "decoder", None)
    if isinstance(decoder, decoders.ByteLevel):
        return "Ġ"
    if isinstance(decoder, decoders.Metaspace):
        return decoder.replacement
    counts = {m: sum(t.startswith(m) for t in tokens) for m in WORD_MARKERS}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


class WordSegmenter:
    """Groups a sequence of subword ids into words (tuples of ids); special and added tokens are words alone."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, level: str = "word"):
        if level not in LEVELS:
            raise ValueError(f"augment_level must be one of {', '.join(LEVELS)}, got '{level}'.")
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        backend = getattr(tokenizer, "backend_tokenizer", None)
        prefix = getattr(getattr(backend, "model", None), "continuing_subword_prefix", None) or None
        marker = word_marker(backend, tokens)
        alone = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        #: continues[id]: the token continues the word before it
        self.continues = np.array(
            [
                level == "word" and i not in alone and (
                    t.startswith(prefix) if prefix else (not t.startswith(marker)) if marker else False
                )
                for i, t in enumerate(tokens)
            ],
            dtype=bool,
        )
        self.alone = frozenset(alone)

    def __call__(self, ids: Sequence[int]) -> list[Word]:
        words: list[list[int]] = []
        for i, token in enumerate(ids):
            if words and self.continues[token] and ids[i - 1] not in self.alone:
                words[-1].append(token)
            else:
                words.append([token])
        return [tuple(w) for w in words]


class WordNetSynonyms:
    """word (tuple of subword ids) -> its WordNet synonyms, each re-tokenised into subword ids.

    Only alphabetic words of 3+ letters outside scikit-learn's English stop-word list are substituted (WordNet
    would turn "a" into "angstrom", "in" into "indium" and "c" into "hundred"), and only by single-word, lower-case
    lemmas (multi-word lemmas and proper nouns are skipped, and so are synonyms the vocabulary can only spell with
    [UNK]); a capitalised word gets a capitalised synonym. Results are cached per word.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, wordnet: WordNet, max_senses: int | None = None):
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS  # only CLEAR's substitution pays its import

        self.tokenizer = tokenizer
        self.wordnet = wordnet
        self.max_senses = max_senses
        self.stop_words = ENGLISH_STOP_WORDS
        self._cache: dict[Word, list[Word]] = {}

    def words(self, text: str) -> list[str]:
        """Synonyms of one word as text (no tokenizer involved)."""
        word = text.strip()
        if len(word) < MIN_WORD_LENGTH or not word.isalpha() or word.lower() in self.stop_words:
            return []
        found = [s for s in self.wordnet.synonyms(word, self.max_senses) if s.isalpha() and s.islower()]
        return [s.capitalize() for s in found] if word[0].isupper() else found

    def __call__(self, unit: Word) -> list[Word]:
        if unit not in self._cache:
            text = self.tokenizer.decode(list(unit))
            lead = text[: len(text) - len(text.lstrip())]  # byte-level BPE keeps the word's leading space
            encoded = [tuple(self.tokenizer(lead + s, add_special_tokens=False)["input_ids"]) for s in self.words(text)]
            self._cache[unit] = [ids for ids in encoded if self.tokenizer.unk_token_id not in ids]
        return self._cache[unit]


def with_example_index(dataset: Dataset) -> Dataset:
    """Add the `example_index` column the collator seeds views with (kept if present)."""
    if EXAMPLE_INDEX in dataset.column_names:
        return dataset
    return dataset.add_column(EXAMPLE_INDEX, list(range(len(dataset))))


def seed_for(*entropy: int) -> np.random.SeedSequence:
    """A seed from several integers (run seed, epoch, example, view); unlike hash(), stable across processes."""
    return np.random.SeedSequence([int(e) for e in entropy])


@dataclass
class CLEARCollator:
    """Collate tokenised sentences into CLEAR's batch: per sentence the masked original (for MLM, when
    `mlm_probability` is set) and two augmented views, padded together.

    Returns `input_ids` and `attention_mask` of shape (batch, views, length), views = [masked original,] view 1,
    view 2, `mlm_labels` (batch, length): the original id at masked positions, -100 elsewhere, and `mlm_positions`
    (batch, K): the masked positions of each row (`masked_positions`). Masking is
    BERT's 15% with 80/10/10 ([MASK] / random token / unchanged), done by transformers'
    `DataCollatorForLanguageModeling`; special tokens are never masked.

    Attributes:
        augmenter: the augmentation, working on the units `segmenter` makes.
        epoch: set by the trainer at the start of each epoch (`CLEARTrainer`), so views change between epochs.
        max_length: views longer than this (synonyms can add subword tokens) lose the tokens before their last.
    """

    tokenizer: PreTrainedTokenizerBase
    augmenter: SentenceAugmenter
    segmenter: WordSegmenter
    seed: int = 0
    mlm_probability: float | None = 0.15
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    epoch: int = 0
    special: frozenset[int] = field(init=False)

    def __post_init__(self):
        require_pad_token(self.tokenizer)
        self.special = protected_ids(self.tokenizer)
        self._special_words = frozenset((i,) for i in self.special)
        self._masker = (
            DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.mlm_probability)
            if self.mlm_probability else None
        )
        if self._masker is not None:  # reseeded per example by `mask`
            self._masker.generator = torch.Generator()

    @classmethod
    def from_args(
        cls, tokenizer: PreTrainedTokenizerBase, args, max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> CLEARCollator:
        """The collator a `CLEARConfig` describes. Adds [DEL] to `tokenizer` when the augmentation deletes and
        loads WordNet when it substitutes."""
        steps = parse_augmentation(args.augmentation)
        deleted = (add_delete_token(tokenizer),) if set(steps) & set(DELETIONS) else None
        synonyms = None
        if "subs" in steps:
            synonyms = WordNetSynonyms(tokenizer, WordNet(args.wordnet_dir), args.synonym_senses)
        settings = {key: getattr(args, key) for key in AUGMENTATION_SETTINGS}
        augmenter = SentenceAugmenter(args.augmentation, deleted=deleted, synonyms=synonyms, **settings)
        return cls(
            tokenizer, augmenter, WordSegmenter(tokenizer, args.augment_level), seed=args.seed,
            mlm_probability=args.mlm_probability if args.mlm_weight > 0 else None, max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
        )

    @property
    def num_views(self) -> int:
        return 3 if self._masker is not None else 2

    def augment(self, ids: Sequence[int], index: int, view: int) -> list[int]:
        """View `view` (1 or 2) of example `index` in the current epoch."""
        rng = np.random.default_rng(seed_for(self.seed, self.epoch, index, view))
        words = self.augmenter(self.segmenter(ids), rng, special=self._special_words)
        out = [token for word in words for token in word]
        if self.max_length and len(out) > self.max_length:
            out = out[: self.max_length - 1] + out[-1:]
        return out

    def mask(self, ids: Sequence[int], index: int) -> tuple[list[int], list[int]]:
        """MLM input and labels for the original sentence of example `index`."""
        seed = int(seed_for(self.seed, self.epoch, index, 0).generate_state(1)[0])
        self._masker.generator.manual_seed(seed)
        inputs = torch.tensor([ids])
        special = torch.tensor([[token in self.special for token in ids]])
        masked, labels = self._masker.torch_mask_tokens(inputs, special_tokens_mask=special)
        return masked[0].tolist(), labels[0].tolist()

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if any(EXAMPLE_INDEX not in f for f in features):
            raise KeyError(f"CLEARCollator needs an '{EXAMPLE_INDEX}' column; add it with with_example_index().")
        originals = [f[f"{VIEW_PREFIX}0"] for f in features]
        indices = [int(f[EXAMPLE_INDEX]) for f in features]
        views = [[self.augment(ids, i, v) for ids, i in zip(originals, indices)] for v in (1, 2)]
        labels = None
        if self._masker is not None:
            masked, labels = zip(*(self.mask(ids, i) for ids, i in zip(originals, indices)))
            views.insert(0, list(masked))
        input_ids, attention_mask = pad_token_ids(
            [ids for view in views for ids in view], self.tokenizer.pad_token_id, self.tokenizer.padding_side,
            self.pad_to_multiple_of,
        )
        batch = len(features)
        out = {
            key: value.view(len(views), batch, -1).transpose(0, 1).contiguous()
            for key, value in (("input_ids", input_ids), ("attention_mask", attention_mask))
        }
        # the sentence before augmentation: what names it for `false_negatives: mask` (two views of a repeated
        # sentence are the same sentence, whatever the augmentations drew)
        out["source_ids"], out["source_mask"] = pad_token_ids(
            originals, self.tokenizer.pad_token_id, self.tokenizer.padding_side, self.pad_to_multiple_of
        )
        if labels is not None:  # aligned with the masked originals (view 0), -100 on padding
            mlm_labels = torch.full_like(out["input_ids"][:, 0], -100)
            mlm_labels[out["attention_mask"][:, 0].bool()] = torch.tensor(list(chain.from_iterable(labels)))
            out["mlm_labels"] = mlm_labels
            out["mlm_positions"] = masked_positions(mlm_labels)
        return out


def masked_positions(mlm_labels: torch.Tensor) -> torch.Tensor:
    """(batch, K) indices of each row's masked tokens (labels != -100), K the most any row has, padded with a
    position whose label is -100: the trainer gathers the MLM head's inputs at them without a host read."""
    masked = mlm_labels != -100
    k = int(masked.sum(dim=1).max()) if len(mlm_labels) else 0
    # masked positions first (stable), then the unmasked ones as padding
    order = torch.argsort((~masked).to(torch.int8), dim=1, stable=True)
    return order[:, :k].contiguous()
