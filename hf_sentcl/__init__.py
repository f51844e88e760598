"""hf_sentcl: contrastive sentence-embedding training on the Hugging Face stack."""

from hf_sentcl.modeling import SentenceEncoder, SentenceEncoderConfig

__version__ = "0.1.0"

__all__ = ["SentenceEncoder", "SentenceEncoderConfig", "__version__"]
