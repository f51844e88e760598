"""SimCSE's knobs (Gao et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.perturbation import PerturbationArguments


@dataclass
class SimCSEConfig(PerturbationArguments, SentCLTrainingArguments):
    """Unsupervised SimCSE: each sentence twice in one forward pass; dropout makes the two views.

    The IFM/BYOP margin knobs (`perturbation`, `margin`, `margin_type`, `detach_margin`, `multi_task`) come from
    `PerturbationArguments`.
    """

    temperature: float = field(default=0.05, metadata={"help": "Softmax temperature tau of InfoNCE."})

    def __post_init__(self):
        super().__post_init__()
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}.")


@dataclass
class SupervisedSimCSEConfig(SimCSEConfig):
    """Supervised SimCSE on (anchor, entailment, contradiction) triplets."""

    hard_negative_weight: float = field(
        default=0.0, metadata={"help": "Added to each anchor's own hard-negative logit (SimCSE's z3 weight)."}
    )
