"""The encoder: config, model, pooling and projection heads."""

from hf_sentcl.modeling.config import SentenceEncoderConfig
from hf_sentcl.modeling.encoder import SentenceEncoder
from hf_sentcl.modeling.pooling import POOLING_MODES, Pooling

__all__ = ["POOLING_MODES", "Pooling", "SentenceEncoder", "SentenceEncoderConfig"]
