"""Contrastive losses as pure functions of embedding tensors, so tests can check them by hand."""

from hf_sentcl.configs.perturbation import parse_perturbation
from hf_sentcl.losses.info_nce import cosine_logits, info_nce
from hf_sentcl.losses.margin import margin_cross_entropy, margin_info_nce
from hf_sentcl.losses.nt_xent import nt_xent, nt_xent_similarities
from hf_sentcl.losses.pair_classification import pair_classification_loss, pair_features
from hf_sentcl.losses.parameter_distance import parameter_distance

__all__ = [
    "cosine_logits",
    "info_nce",
    "margin_cross_entropy",
    "margin_info_nce",
    "nt_xent",
    "nt_xent_similarities",
    "pair_classification_loss",
    "pair_features",
    "parameter_distance",
    "parse_perturbation",
]
