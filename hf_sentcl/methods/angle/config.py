"""AnglE's recipe keys (Li and Li 2023): the weight and scale of each of its three terms, and where its scored pairs
come from when they are not a `train_file`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.validation import check_choices, check_range
from hf_sentcl.methods.angle.loss import AUTHORS_DEFAULTS

#: the SentEval train splits with gold scores that `sts_train` reads
STS_TRAIN_TASKS = ("stsb", "sickr")


@dataclass
class AnglEConfig(SentCLTrainingArguments):
    """AnglE on scored pairs: loss = cosine_weight * CoSENT + ibn_weight * in-batch + angle_weight * angle. Defaults
    are the authors' code's (`AUTHORS_DEFAULTS`), its scales written as temperatures (1 / scale)."""

    cosine_weight: float = field(default=AUTHORS_DEFAULTS["cosine_weight"],
                                 metadata={"help": "Weight of the cosine (CoSENT) term (>= 0)."})
    ibn_weight: float = field(default=AUTHORS_DEFAULTS["ibn_weight"],
                              metadata={"help": "Weight of the in-batch negative term (>= 0)."})
    angle_weight: float = field(default=AUTHORS_DEFAULTS["angle_weight"],
                                metadata={"help": "Weight of the angle term (>= 0)."})
    cosine_tau: float = field(default=AUTHORS_DEFAULTS["cosine_tau"], metadata={
        "help": "Temperature of the cosine term: similarity differences are divided by it (> 0; the authors' "
        "scale 20 = 0.05)."})
    ibn_tau: float = field(default=AUTHORS_DEFAULTS["ibn_tau"], metadata={
        "help": "Temperature of the in-batch term: similarities are divided by it (> 0)."})
    angle_tau: float = field(default=AUTHORS_DEFAULTS["angle_tau"], metadata={
        "help": "Temperature of the angle term: angle differences are divided by it (> 0)."})
    sts_train: Literal[STS_TRAIN_TASKS] | None = field(
        default=None,
        metadata={"help": "Train on a SentEval STS train split with its gold scores, read from the data folder "
                  "(sts_data_dir / HF_SENTCL_DATA / the Hub): 'stsb' (STS-B train, 5,749 pairs) or 'sickr' "
                  "(SICK train, 4,500). Unset: `train_file` / `dataset_name` with columns sent0, sent1, score."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choices(self)
        for name in ("cosine_weight", "ibn_weight", "angle_weight"):
            check_range(name, getattr(self, name), 0)
        if not (self.cosine_weight or self.ibn_weight or self.angle_weight):
            raise ValueError("cosine_weight, ibn_weight and angle_weight are all 0: nothing would train.")
        for name in ("cosine_tau", "ibn_tau", "angle_tau"):
            check_range(name, getattr(self, name), 0, low_open=True)

    def angle_loss_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `angle_objective`."""
        return {name: getattr(self, name) for name in
                ("cosine_weight", "ibn_weight", "angle_weight", "cosine_tau", "ibn_tau", "angle_tau")}
