"""ConSERT's knobs (Yan et al. 2021, sections 3-4). Defaults are the paper's: shuffle + feature cutoff, cutoff
rates 0.15 (tokens) / 0.2 (features), dropout 0.2, tau 0.1, alpha 0.15, batch 96, lr 5e-7 with 10% warm-up,
STS-B dev every 200 steps, the encoder's own dropout off.

The NLI keys live here rather than in `DataArguments` because ConSERT is the only method that reads labelled
pairs: other methods then reject them as unknown keys instead of ignoring them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_sentcl.augment.embedding import AUGMENTATIONS
from hf_sentcl.configs.arguments import MAX_LEARNING_RATE, SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments, temperature_field
from hf_sentcl.configs.perturbation import PerturbationArguments
from hf_sentcl.configs.validation import check_range

SUPERVISED_MODES = ("unsup", "sup", "joint", "sup-unsup", "joint-unsup")
#: chained modes: (first stage's mode, second stage's mode)
CHAINED_MODES = {"sup-unsup": ("sup", "unsup"), "joint-unsup": ("joint", "unsup")}
#: keys of the first stage of a chained mode (None: the stage uses the plain key)
STAGE_KEYS = ("supervised_learning_rate", "supervised_num_train_epochs", "supervised_batch_size")


@dataclass
class ConSERTConfig(PerturbationArguments, ContrastiveArguments, SentCLTrainingArguments):
    """ConSERT: two embedding-level augmentations of each sentence, NT-Xent over the 2N views; optionally NLI
    supervision (cross-entropy on (r1, r2, |r1 - r2|)), jointly or as a first stage.

    The IFM/BYOP margin knobs (`perturbation`, `margin`, ...) from `PerturbationArguments` apply to the NT-Xent.
    """

    augmentation1: Literal[AUGMENTATIONS] = field(
        default="shuffle", metadata={"help": "Augmentation T1 of the first view."}
    )
    augmentation2: Literal[AUGMENTATIONS] = field(
        default="feature_cutoff", metadata={"help": "Augmentation T2 of the second view."}
    )
    token_cutoff_rate: float = field(
        default=0.15, metadata={"help": "Fraction of a sentence's real tokens whose rows token_cutoff zeroes."}
    )
    feature_cutoff_rate: float = field(
        default=0.2, metadata={"help": "Fraction of the embedding dimensions feature_cutoff zeroes (real tokens only)."}
    )
    dropout_rate: float = field(
        default=0.2, metadata={"help": "Fraction of the real tokens' embedding elements 'dropout' zeroes."}
    )
    token_cutoff_masks_attention: bool = field(
        default=False,
        metadata={
            "help": "Also take cut tokens out of attention and pooling (Shen et al.'s cutoff). ConSERT's default "
            "False only zeroes their embeddings."
        },
    )
    temperature: float = temperature_field(0.1)
    supervised_mode: Literal[SUPERVISED_MODES] = field(
        default="unsup",
        metadata={
            "help": "unsup (NT-Xent on unlabeled text), sup (NLI cross-entropy), joint (L_ce + alpha * L_con on NLI), "
            "sup-unsup / joint-unsup (that NLI stage, then unsup on the unlabeled text, chained in one run)."
        },
    )
    alpha: float = field(default=0.15, metadata={"help": "Weight alpha of the contrastive loss in joint training."})
    adversarial: bool = field(
        default=False,
        metadata={
            "help": "Joint stages: add the FGV adversarial perturbation (gradient of the supervised loss w.r.t. the "
            "embedding output) to the second view."
        },
    )
    adversarial_epsilon: float = field(
        default=1.0, metadata={"help": "L2 norm of each sentence's adversarial perturbation (FGV step size)."}
    )
    encoder_dropout: bool = field(
        default=False,
        metadata={"help": "Keep the backbone's own dropout while training (ConSERT switches it off: False)."},
    )
    nli_source: str | None = field(
        default=None,
        metadata={
            "help": "NLI pairs of the supervised stage: 'senteval' (SNLI/ in the data directory), a folder in "
            "SentEval's SNLI layout, a csv/tsv/jsonl file (premise, hypothesis, label) or a `datasets` id."
        },
    )
    nli_splits: list[str] | None = field(
        default=None, metadata={"help": "Splits of a SentEval folder or `datasets` id, concatenated (default train)."}
    )
    nli_config: str | None = field(default=None, metadata={"help": "Configuration name of a `datasets` nli_source."})
    supervised_learning_rate: float | None = field(
        default=None,
        metadata={"help": "sup-unsup / joint-unsup: learning rate of the first (NLI) stage; default learning_rate."},
    )
    supervised_num_train_epochs: float | None = field(
        default=None,
        metadata={"help": "sup-unsup / joint-unsup: epochs of the first (NLI) stage; default num_train_epochs."},
    )
    supervised_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "sup-unsup / joint-unsup: global batch of the first (NLI) stage, over all processes (section "
            "4.3: SBERT's 16 for sup-unsup); split like global_train_batch_size. Default: the second stage's batch."
        },
    )
    # paper defaults of the shared training arguments
    per_device_train_batch_size: int = field(default=96, metadata={"help": "Sentences per process per step (96)."})
    learning_rate: float = field(default=5e-7, metadata={"help": "Peak learning rate (the paper's 5e-7, BERT)."})
    warmup_steps: float = field(default=0.1, metadata={"help": "Linear warm-up: a fraction (<1) or steps (10%)."})
    eval_steps: float | None = field(default=200, metadata={"help": "Steps between STS-B dev evaluations (200)."})
    save_steps: float = field(default=200, metadata={"help": "Steps between checkpoints (keep = eval_steps)."})

    def __post_init__(self):
        super().__post_init__()
        for key in ("token_cutoff_rate", "feature_cutoff_rate", "dropout_rate"):
            check_range(key, getattr(self, key), 0, 1, high_open=True)
        check_range("alpha", self.alpha, 0)
        check_range("supervised_learning_rate", self.supervised_learning_rate, 0, MAX_LEARNING_RATE, low_open=True)
        if self.adversarial and "joint" not in self.supervised_mode:
            raise ValueError(
                f"adversarial needs the supervised loss of a joint stage (supervised_mode joint or joint-unsup), "
                f"got supervised_mode '{self.supervised_mode}'."
            )
        check_range("adversarial_epsilon", self.adversarial_epsilon, 0, low_open=True)
        if self.supervised_mode == "unsup" and self.nli_source is not None:
            raise ValueError("nli_source is unused with supervised_mode 'unsup'; remove it or pick a supervised mode.")
        if self.supervised_mode != "unsup" and not self.nli_source:
            raise ValueError(
                f"supervised_mode '{self.supervised_mode}' trains on NLI pairs: set nli_source ('senteval', a folder, "
                "a csv/jsonl file or a `datasets` id)."
            )
        if self.supervised_mode == "sup" and self.perturbation is not None:
            raise ValueError("perturbation shifts the NT-Xent logits, but supervised_mode 'sup' has no NT-Xent.")
        if self.supervised_batch_size is not None and self.supervised_batch_size < 1:
            raise ValueError(f"supervised_batch_size must be a positive batch size, got {self.supervised_batch_size}.")
        stage_keys = [k for k in STAGE_KEYS if getattr(self, k)]
        if stage_keys and self.supervised_mode not in CHAINED_MODES:
            raise ValueError(
                f"{', '.join(stage_keys)} set the first stage of sup-unsup / joint-unsup; with supervised_mode "
                f"'{self.supervised_mode}' use learning_rate / num_train_epochs / per_device_train_batch_size."
            )
