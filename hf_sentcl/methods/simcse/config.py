"""SimCSE's knobs (Gao et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments
from hf_sentcl.configs.perturbation import PerturbationArguments


@dataclass
class SimCSEConfig(PerturbationArguments, ContrastiveArguments, SentCLTrainingArguments):
    """Unsupervised SimCSE: each sentence twice in one forward pass; dropout makes the two views.

    `temperature` comes from `ContrastiveArguments` (default 0.05, the paper's), the IFM/BYOP margin keys from
    `PerturbationArguments`.
    """


@dataclass
class SupervisedSimCSEConfig(SimCSEConfig):
    """Supervised SimCSE on (anchor, entailment, contradiction) triplets."""

    hard_negative_weight: float = field(
        default=0.0, metadata={"help": "Added to each anchor's own hard-negative logit (SimCSE's z3 weight)."}
    )
