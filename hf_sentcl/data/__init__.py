"""Training corpora (via `datasets`), SentEval-format readers and collators."""

from hf_sentcl.data.collators import LabelledViewCollator, ViewCollator
from hf_sentcl.data.corpus import add_length_column, load_training_dataset, tokenize_views

__all__ = [
    "LabelledViewCollator",
    "ViewCollator",
    "add_length_column",
    "load_training_dataset",
    "tokenize_views",
]
