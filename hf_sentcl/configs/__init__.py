"""Recipe dataclasses: model, data, and the training arguments every method's config extends (a method's own config
is in its folder, `hf_sentcl.methods`)."""

from hf_sentcl.configs.arguments import DataArguments, ModelArguments, SentCLTrainingArguments

__all__ = [
    "DataArguments",
    "ModelArguments",
    "SentCLTrainingArguments",
]
