"""One `Trainer` subclass per method (the registry of names is `hf_sentcl.registry`)."""

from hf_sentcl.trainers.base import ContrastiveTrainer, ViewsOutput
from hf_sentcl.trainers.clear import CLEARTrainer

__all__ = [
    "CLEARTrainer",
    "ContrastiveTrainer",
    "ViewsOutput",
]
