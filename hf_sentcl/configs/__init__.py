"""Recipe dataclasses: model, data, and one TrainingArguments subclass per method."""

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.clear import CLEARConfig
from hf_sentcl.configs.inputs import DataArguments, ModelArguments
from hf_sentcl.configs.self_guided import SelfGuidedConfig
from hf_sentcl.configs.simcse import SimCSEConfig, SupervisedSimCSEConfig

__all__ = [
    "CLEARConfig",
    "DataArguments",
    "ModelArguments",
    "SelfGuidedConfig",
    "SentCLTrainingArguments",
    "SimCSEConfig",
    "SupervisedSimCSEConfig",
]
