"""The method registry: recipe `method:` name -> config dataclass, trainer class and data layout."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    """How to build one method: its config class, its trainer (imported lazily) and its text columns."""

    name: str
    config_path: str
    trainer_path: str
    text_columns: tuple[str, ...]
    summary: str
    optional_text_columns: tuple[str, ...] = ()
    #: "module.function": recipe -> list of recipes trained one after another, each stage starting from the
    #: previous stage's exported encoder (default: the recipe alone)
    stages_path: str | None = None
    #: "module.function": recipe -> an object with `check()` (raises before any model loads) and
    #: `build(tokenizer) -> (dataset, num_views, collator)`, for examples that are more than text views (labels);
    #: or None, for the plain-text loader
    train_data_path: str | None = None

    @staticmethod
    def _load(path: str):
        module, _, attr = path.rpartition(".")
        return getattr(importlib.import_module(module), attr)

    def stages(self, recipe) -> list:
        """The recipe's training stages (one, unless the method chains several)."""
        return self._load(self.stages_path)(recipe) if self.stages_path else [recipe]

    def train_data(self, recipe):
        """The method's own training data for `recipe`, or None for the plain-text views."""
        return self._load(self.train_data_path)(recipe) if self.train_data_path else None

    @property
    def config_class(self) -> type:
        return self._load(self.config_path)

    @property
    def trainer_class(self) -> type:
        return self._load(self.trainer_path)


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> None:
    """Add a method so that recipes can name it."""
    METHODS[spec.name] = spec


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise KeyError(f"unknown method '{name}'. Choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


register_method(
    MethodSpec(
        name="simcse",
        config_path="hf_sentcl.configs.simcse.SimCSEConfig",
        trainer_path="hf_sentcl.trainers.simcse.SimCSETrainer",
        text_columns=("text",),
        summary="Unsupervised SimCSE: dropout views, in-batch InfoNCE (Gao et al. 2021).",
    )
)
register_method(
    MethodSpec(
        name="simcse_sup",
        config_path="hf_sentcl.configs.simcse.SupervisedSimCSEConfig",
        trainer_path="hf_sentcl.trainers.simcse.SupervisedSimCSETrainer",
        text_columns=("sent0", "sent1"),
        optional_text_columns=("hard_neg",),
        summary="Supervised SimCSE on (anchor, entailment[, contradiction]) pairs or triplets.",
    )
)
register_method(
    MethodSpec(
        name="self_guided",
        config_path="hf_sentcl.configs.self_guided.SelfGuidedConfig",
        trainer_path="hf_sentcl.trainers.self_guided.SelfGuidedTrainer",
        text_columns=("text",),
        summary="Self-guided contrastive learning, SG / SG-OPT: [CLS] vs. a frozen copy's layer views (Kim et al. 2021).",
    )
)
register_method(
    MethodSpec(
        name="consert",
        config_path="hf_sentcl.configs.consert.ConSERTConfig",
        trainer_path="hf_sentcl.trainers.consert.ConSERTTrainer",
        text_columns=("text",),
        summary="ConSERT: embedding-level augmentations, NT-Xent; NLI joint/chained settings (Yan et al. 2021).",
        stages_path="hf_sentcl.trainers.consert.consert_stages",
        train_data_path="hf_sentcl.trainers.consert.consert_train_data",
    )
)
register_method(
    MethodSpec(
        name="clear",
        config_path="hf_sentcl.configs.clear.CLEARConfig",
        trainer_path="hf_sentcl.trainers.clear.CLEARTrainer",
        text_columns=("text",),
        summary="CLEAR: MLM on the original + NT-Xent between two augmented views (Wu et al. 2020).",
    )
)
