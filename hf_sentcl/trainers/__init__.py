"""`ContrastiveTrainer`, the `Trainer` subclass every method's trainer extends, and its plug-ins; a method's own
trainer is in its folder (`hf_sentcl.methods`), found by name through `hf_sentcl.registry`."""

from hf_sentcl.trainers.base import ContrastiveTrainer, ViewsOutput

__all__ = [
    "ContrastiveTrainer",
    "ViewsOutput",
]
