"""The encoder: config, model, pooling and projection heads."""

from hf_sentcl.modeling.config import POOLING_MODES, SentenceEncoderConfig
from hf_sentcl.modeling.encoder import SentenceEncoder

__all__ = ["POOLING_MODES", "SentenceEncoder", "SentenceEncoderConfig"]
