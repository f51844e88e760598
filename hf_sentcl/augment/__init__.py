"""Data augmentations: embedding-level (ConSERT) and text-level (CLEAR)."""

from hf_sentcl.augment.embedding import AUGMENTATIONS, AugmentationPlan, AugmentationRates, EmbeddingAugmenter
from hf_sentcl.augment.text import TEXT_AUGMENTATIONS, SentenceAugmenter, parse_augmentation
from hf_sentcl.augment.wordnet import WordNet, WordNetError

__all__ = [
    "AUGMENTATIONS", "TEXT_AUGMENTATIONS", "AugmentationPlan", "AugmentationRates", "EmbeddingAugmenter",
    "SentenceAugmenter", "WordNet", "WordNetError", "parse_augmentation",
]
