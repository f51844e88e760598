"""Contrastive losses as pure functions of embedding tensors, so tests can check them by hand."""

from hf_sentcl.losses.info_nce import cosine_logits, info_nce

__all__ = ["cosine_logits", "info_nce"]
