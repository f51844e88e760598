"""The encoder: config, model, pooling and projection heads."""

from hf_sentcl.configs.choices import POOLING_MODES, Pooling
from hf_sentcl.modeling.config import SentenceEncoderConfig
from hf_sentcl.modeling.encoder import SentenceEncoder

__all__ = ["POOLING_MODES", "Pooling", "SentenceEncoder", "SentenceEncoderConfig"]
