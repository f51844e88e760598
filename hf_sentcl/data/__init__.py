"""Training corpora (via `datasets`), SentEval-format readers and collators."""

from hf_sentcl.data.collators import ViewCollator
from hf_sentcl.data.corpus import load_training_dataset, tokenize_views

__all__ = ["ViewCollator", "load_training_dataset", "tokenize_views"]
