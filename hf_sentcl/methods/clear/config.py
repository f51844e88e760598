"""CLEAR's knobs (Wu et al. 2020, "CLEAR: Contrastive Learning for Sentence Representation", sections 3-4).

Defaults are the paper's: 15% MLM masking with 80/10/10, L_total = L_MLM + L_CL with L_CL summed over the 2N views
(Eq. 2), word deletion 70%, span deletion
5 spans of 5% each, reordering 5 pairs of ~5% spans, substitution 30%. The paper gives neither the temperature nor
the shape of the projection head; the defaults here are SimCLR's head (Linear-ReLU-Linear to 128 dimensions,
which the paper says it borrows) and tau 0.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_sentcl.augment.text import parse_augmentation
from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments, temperature_field
from hf_sentcl.configs.perturbation import PerturbationArguments
from hf_sentcl.configs.validation import check_range
from hf_sentcl.losses.nt_xent import NT_XENT_REDUCTIONS

SCRATCH_SIZE_KEYS = (
    "scratch_hidden_size", "scratch_num_hidden_layers", "scratch_num_attention_heads", "scratch_intermediate_size"
)


@dataclass
class CLEARConfig(PerturbationArguments, ContrastiveArguments, SentCLTrainingArguments):
    """CLEAR: MLM on the original sentence plus NT-Xent between two augmented views of it.

    The IFM/BYOP margin knobs (`perturbation`, `margin`, ...) come from `PerturbationArguments` and shift the
    logits of the NT-Xent over 2N views.
    """

    augmentation: str = field(
        default="del_span+reorder",
        metadata={
            "help": "How both views are made (same type, different seeds): del_word, del_span, reorder, subs, or a "
            "sequence joined by '+' applied left to right, e.g. subs+del_span, del_span+reorder."
        },
    )
    augment_level: Literal["word", "token"] = field(
        default="word",
        metadata={"help": "Units the augmentations count and move: 'word' (whole words) or 'token' (subword tokens)."},
    )
    del_word_rate: float = field(default=0.7, metadata={"help": "del_word: fraction of units replaced by [DEL]."})
    del_span_count: int = field(default=5, metadata={"help": "del_span: number of deleted spans."})
    del_span_fraction: float = field(
        default=0.05, metadata={"help": "del_span: length of each span as a fraction of the sentence (min 1 unit)."}
    )
    reorder_pairs: int = field(default=5, metadata={"help": "reorder: number of span pairs swapped."})
    reorder_fraction: float = field(
        default=0.05, metadata={"help": "reorder: length of each span as a fraction of the sentence (min 1 unit)."}
    )
    subs_rate: float = field(
        default=0.3, metadata={"help": "subs: fraction of units replaced by a WordNet synonym (where one exists)."}
    )
    synonym_senses: int | None = field(
        default=None,
        metadata={
            "help": "subs: use the synonyms of only the first N (most frequent) WordNet senses of each part of "
            "speech; empty = every sense."
        },
    )
    wordnet_dir: str | None = field(
        default=None,
        metadata={"help": "subs: WordNet 3.0 database folder. Default: $WORDNET_DIR, else /usr/share/wordnet."},
    )
    temperature: float = temperature_field(0.1)
    mlm_probability: float = field(
        default=0.15, metadata={"help": "Fraction of the original sentence's tokens chosen for MLM (80/10/10)."}
    )
    mlm_weight: float = field(
        default=1.0, metadata={"help": "Weight of L_MLM in L_total = mlm_weight * L_MLM + L_CL (0 = no MLM)."}
    )
    cl_reduction: Literal[NT_XENT_REDUCTIONS] = field(
        default="sum",
        metadata={
            "help": "How L_CL combines the 2N views' NT-Xent terms: 'sum' (Eq. 2 of the paper: against the MLM "
            "term, which is a mean over masked tokens, L_CL then weighs 2N times its mean) or 'mean' (SimCLR's "
            "average, CL:MLM = 1:mlm_weight)."
        },
    )
    projection_size: int | None = field(
        default=None, metadata={"help": "Hidden width of the projection head g (default: the encoder's hidden size)."}
    )
    projection_dim: int = field(default=128, metadata={"help": "Output size of the projection head g."})
    from_scratch: bool = field(
        default=False,
        metadata={
            "help": "Pre-train a freshly initialised backbone (the paper's setting) with the architecture and "
            "tokenizer of model_name_or_path and the scratch_* sizes, instead of continuing its training."
        },
    )
    scratch_hidden_size: int | None = field(
        default=None, metadata={"help": "from_scratch: hidden size (default: the checkpoint's)."}
    )
    scratch_num_hidden_layers: int | None = field(
        default=None, metadata={"help": "from_scratch: number of transformer layers (default: the checkpoint's)."}
    )
    scratch_num_attention_heads: int | None = field(
        default=None, metadata={"help": "from_scratch: attention heads per layer (default: the checkpoint's)."}
    )
    scratch_intermediate_size: int | None = field(
        default=None, metadata={"help": "from_scratch: feed-forward width (default: the checkpoint's)."}
    )

    def __post_init__(self):
        super().__post_init__()
        try:
            parse_augmentation(self.augmentation)
        except ValueError as err:
            raise ValueError(f"key 'augmentation': {err}") from None
        for key in ("del_word_rate", "del_span_fraction", "reorder_fraction", "subs_rate"):
            if not 0 < getattr(self, key) < 1:
                raise ValueError(f"{key} must be in (0, 1), got {getattr(self, key)}.")
        for key in ("del_span_count", "reorder_pairs", "projection_dim", "synonym_senses", "projection_size",
                    *SCRATCH_SIZE_KEYS):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value}.")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}.")
        check_range("mlm_weight", self.mlm_weight, 0, hint="0 switches MLM off.")
        sizes = [key for key in SCRATCH_SIZE_KEYS if getattr(self, key) is not None]
        if sizes and not self.from_scratch:
            raise ValueError(f"{', '.join(sizes)} only apply with from_scratch: true; set it or remove them.")
        if self.dataloader_persistent_workers and self.dataloader_num_workers > 0:
            raise ValueError(
                "dataloader_persistent_workers: true keeps each worker's copy of the CLEAR collator from the first "
                "epoch, so views would repeat the epoch-0 seeds; set it to false."
            )

    def scratch_sizes(self) -> dict[str, int]:
        """The backbone config attributes a from-scratch run overrides, e.g. {'num_hidden_layers': 6}."""
        return {key.removeprefix("scratch_"): getattr(self, key) for key in SCRATCH_SIZE_KEYS
                if getattr(self, key) is not None}
