"""ESimCSE's recipe keys (Wu et al. 2022): the word-repetition rate of the positive view, the momentum of the
encoder copy that fills the queue, and the queue's size. `temperature` comes from `ContrastiveArguments` (0.05, the
paper's), the IFM/BYOP margin keys from `PerturbationArguments` (the queue's entries are negatives like the batch's,
and the margin's 'n' term shifts them too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments
from hf_sentcl.configs.perturbation import PerturbationArguments
from hf_sentcl.configs.validation import check_range

#: the paper's BERT-base setting (section 4.1 and the ablations of section 5): dup_rate 0.32, momentum 0.995, and a
#: queue of 2.5 x the batch of 64 (the authors' run.sh: neg_size 160)
PAPER_DEFAULTS = {"dup_rate": 0.32, "momentum": 0.995, "queue_size": 160}


@dataclass
class ESimCSEConfig(PerturbationArguments, ContrastiveArguments, SentCLTrainingArguments):
    """Unsupervised ESimCSE: the sentence (dropout) against its word-repeated copy (dropout), with the batch's other
    repeated sentences and a queue of a momentum encoder's embeddings as negatives."""

    dup_rate: float = field(default=PAPER_DEFAULTS["dup_rate"], metadata={
        "help": "Word repetition: the number of subword tokens repeated in the positive view is drawn uniformly from "
        "0..max(2, int(dup_rate * N)), N the sentence's tokens without [CLS]/[SEP] (in [0, 1]; paper: 0.32)."})
    momentum: float = field(default=PAPER_DEFAULTS["momentum"], metadata={
        "help": "Momentum lambda of the encoder copy that fills the queue: after every optimizer step its weights "
        "become lambda * themselves + (1 - lambda) * the encoder's (in [0, 1]; paper: 0.995)."})
    queue_size: int = field(default=PAPER_DEFAULTS["queue_size"], metadata={
        "help": "Number of momentum-encoder embeddings kept as extra negatives, oldest dropped first (>= 0; 0: no "
        "momentum contrast). The paper's best is 2.5 x the batch size: 160 for its batch of 64."})

    def __post_init__(self):
        super().__post_init__()
        check_range("dup_rate", self.dup_rate, 0, 1)
        check_range("momentum", self.momentum, 0, 1)
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int):
            raise ValueError(f"queue_size must be a whole number of embeddings, got {self.queue_size!r}.")
        check_range("queue_size", self.queue_size, 0, hint="It counts embeddings (2.5 x the global batch is the "
                    "paper's best).")
