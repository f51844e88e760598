"""The keys every contrastive objective shares, as a dataclass mixin (like `PerturbationArguments`).

A method's config inherits it before `SentCLTrainingArguments`; a method whose paper uses another temperature
re-declares the field with `temperature_field(default)`, so the help text and the check stay here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_sentcl.configs.validation import check_range

TEMPERATURE_HELP = "Temperature tau: cosine similarities are divided by it inside the contrastive loss (> 0)."


def temperature_field(default: float) -> Any:
    """The `temperature` field with a method's default."""
    return field(default=default, metadata={"help": TEMPERATURE_HELP})


@dataclass
class ContrastiveArguments:
    """Keys shared by every contrastive loss."""

    temperature: float = temperature_field(0.05)

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        # .inf would make every logit 0 (nothing trains), 0 or .nan gives NaN weights
        check_range("temperature", self.temperature, 0, low_open=True, hint="Typical values: 0.01-0.1.")
