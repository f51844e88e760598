"""One `Trainer` subclass per method; `registry` maps recipe `method:` names to (config, trainer)."""

from hf_sentcl.trainers.base import ContrastiveTrainer, ViewsOutput
from hf_sentcl.trainers.clear import CLEARTrainer
from hf_sentcl.trainers.consert import ConSERTTrainer
from hf_sentcl.trainers.registry import METHODS, MethodSpec, get_method
from hf_sentcl.trainers.self_guided import SelfGuidedTrainer
from hf_sentcl.trainers.simcse import SimCSETrainer, SupervisedSimCSETrainer

__all__ = [
    "CLEARTrainer",
    "ConSERTTrainer",
    "METHODS",
    "ContrastiveTrainer",
    "MethodSpec",
    "SelfGuidedTrainer",
    "SimCSETrainer",
    "SupervisedSimCSETrainer",
    "ViewsOutput",
    "get_method",
]
