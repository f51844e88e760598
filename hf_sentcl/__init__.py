"""hf_sentcl: contrastive sentence-embedding training on the Hugging Face stack."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hf_sentcl.modeling import SentenceEncoder, SentenceEncoderConfig

__version__ = "0.1.0"

__all__ = ["SentenceEncoder", "SentenceEncoderConfig", "__version__"]


def __getattr__(name: str):
    """`SentenceEncoder` and `SentenceEncoderConfig` load torch and transformers on first use, not with the package:
    `hf-sentcl --help` and `hf-sentcl data` answer without them (10 s of imports on a 2-core CPU)."""
    if name in ("SentenceEncoder", "SentenceEncoderConfig"):
        from hf_sentcl import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module 'hf_sentcl' has no attribute '{name}'")
