"""Recipe dataclasses: model, data, and one TrainingArguments subclass per method."""

from hf_sentcl.configs.arguments import DataArguments, ModelArguments, SentCLTrainingArguments
from hf_sentcl.configs.clear import CLEARConfig

__all__ = [
    "CLEARConfig",
    "DataArguments",
    "ModelArguments",
    "SentCLTrainingArguments",
]
