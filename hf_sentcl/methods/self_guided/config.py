"""Knobs of self-guided contrastive learning, SG and SG-OPT (Kim et al. 2021). Defaults are the paper's
(Table 8: tau 0.01, lambda 0.1; section 3: max-pooled views of every layer, 4096-wide projection head)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments, temperature_field
from hf_sentcl.configs.validation import check_range

SELF_GUIDED_OBJECTIVES = ("sg", "opt1", "opt2", "sg-opt")
VIEW_POOLINGS = ("max", "mean")


@dataclass
class SelfGuidedConfig(ContrastiveArguments, SentCLTrainingArguments):
    """SG / SG-OPT: the tuned encoder's last-layer [CLS] is pulled towards pooled hidden layers of a frozen copy."""

    objective: Literal[SELF_GUIDED_OBJECTIVES] = field(
        default="sg-opt",
        metadata={
            "help": "Loss: 'sg' (L_base, NT-Xent over {c} U {h}, one sampled view per sentence), 'opt1' and 'opt2' "
            "(the section 3.2 ablation steps), or 'sg-opt' (L_opt, every layer's view at once)."
        },
    )
    temperature: float = temperature_field(0.01)
    regularizer_weight: float = field(
        default=0.1,
        metadata={"help": "lambda: weight of sum ||theta_T - theta_F||^2 between the tuned and the frozen encoder."},
    )
    view_pooling: Literal[VIEW_POOLINGS] = field(
        default="max", metadata={"help": "Pooling p of a frozen layer's real tokens into a view h_{i,k}: max or mean."}
    )
    view_layers: list[int] | None = field(
        default=None,
        metadata={
            "help": "Hidden states of the frozen copy that give views (0 = embedding output, l = last layer; "
            "negative indices count from the end). Default: all of 0..l."
        },
    )
    # The paper describes BERT_F as fixed (default False: eval mode); the authors' released code leaves it in train
    # mode, because its loss module's train() reaches the copy.
    frozen_dropout: bool = field(
        default=False,
        metadata={"help": "Run the frozen copy BERT_F with its dropout on (weights still frozen)."},
    )
    projection_head: bool = field(
        default=True,
        metadata={"help": "Apply the projection head f to c and h (False is Table 5's '- projection head' ablation)."},
    )
    projection_size: int = field(
        default=4096, metadata={"help": "Width of both linear layers of the projection head."}
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop after this many STS-B dev evaluations without improvement (the paper uses 10 with "
            "eval_steps 50). Unset: no early stopping."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_range("regularizer_weight", self.regularizer_weight, 0)
        if self.projection_size < 1:
            raise ValueError(f"projection_size must be positive, got {self.projection_size}.")
        layers = self.view_layers
        if layers is not None and (not layers or len(set(layers)) != len(layers)):
            raise ValueError(f"view_layers must be a non-empty list of distinct layer indices, got {layers}.")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience must be >= 1, got {self.early_stopping_patience}.")
        if self.early_stopping_patience is not None and (
            self.metric_for_best_model is None or self.eval_strategy == "no"
        ):
            raise ValueError(
                "early_stopping_patience needs periodic evaluation: set eval_strategy (steps) and "
                "metric_for_best_model."
            )
