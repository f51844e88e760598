"""Recipe dataclasses: model, data, and the training arguments every method's config extends (a method's own config
is in its folder, `hf_sentcl.methods`)."""

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.inputs import DataArguments, ModelArguments

__all__ = [
    "DataArguments",
    "ModelArguments",
    "SentCLTrainingArguments",
]
