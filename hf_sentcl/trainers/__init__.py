"""One `Trainer` subclass per method; `registry` maps recipe `method:` names to (config, trainer)."""

from hf_sentcl.trainers.base import ContrastiveTrainer
from hf_sentcl.trainers.registry import METHODS, MethodSpec, get_method
from hf_sentcl.trainers.self_guided import SelfGuidedTrainer
from hf_sentcl.trainers.simcse import SimCSETrainer, SupervisedSimCSETrainer

__all__ = [
    "METHODS",
    "ContrastiveTrainer",
    "MethodSpec",
    "SelfGuidedTrainer",
    "SimCSETrainer",
    "SupervisedSimCSETrainer",
    "get_method",
]
