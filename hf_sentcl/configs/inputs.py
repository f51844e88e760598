"""What a run starts from: the backbone and its pooling (`ModelArguments`), the training text and the evaluation data
(`DataArguments`). Every field carries a help text; recipes are validated against them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS, HEAD_TYPES, POOLING_MODES, STS_MODES
from hf_sentcl.configs.sources import MIXING_POLICIES, listed_sources
from hf_sentcl.configs.validation import check_choices, check_range

#: the smallest useful truncation length: [CLS], one token, [SEP]
MIN_SEQ_LENGTH = 3


@dataclass
class ModelArguments:
    """Which backbone to start from and how the encoder pools."""

    model_name_or_path: str = field(
        default=EMBEDDED_MODEL_ALIAS,
        metadata={"help": f"Local path, Hub id, or '{EMBEDDED_MODEL_ALIAS}' for the offline default model."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer path or Hub id if it differs from model_name_or_path."}
    )
    pooling: Literal[POOLING_MODES] = field(
        default="cls", metadata={"help": "Pooling of the token states while training."}
    )
    pooling_layer: int = field(
        default=-1, metadata={"help": "Hidden-state index pooled by cls/mean/max (0 = embeddings, -1 = last)."}
    )
    head: Literal[HEAD_TYPES] = field(default="mlp", metadata={"help": "Projection head on the pooled vector."})
    head_at_inference: bool = field(
        default=False, metadata={"help": "Keep the head at evaluation and in the saved encoder (SimCSE: False)."}
    )
    inference_pooling: Literal[POOLING_MODES] | None = field(
        default=None,
        metadata={"help": "Pooling used for evaluation and saving, if it differs from training (e.g. last2_avg)."},
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention kernel passed to from_pretrained (eager, sdpa, ...)."}
    )
    unpadded: bool = field(
        default=True,
        metadata={
            "help": "Run BERT-family backbones padding-free (token-wise work on real tokens only) in training and "
            "encode; same results as the padded forward. false: always the backbone's padded forward."
        },
    )
    # 0 makes a run deterministic, e.g. to compare 1 and N processes (SimCSE then has no positive-pair noise).
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "Set every dropout probability of the backbone's config (hidden_dropout_prob, ...) to this "
            "value, in [0, 1). Unset keeps the checkpoint's."
        },
    )
    peft: dict | None = field(
        default=None,
        # target_modules defaults to peft's choice for the architecture (query/value for BERT and RoBERTa)
        metadata={
            "help": "Train LoRA adapters instead of the whole backbone: a mapping of peft.LoraConfig keys (r, "
            "lora_alpha, lora_dropout, target_modules, ...). The saved encoder has the adapters merged."
        },
    )

    def __post_init__(self):
        check_choices(self)
        check_range("dropout", self.dropout, 0, 1, high_open=True)
        if self.peft is not None:
            from hf_sentcl.configs.lora import check_lora_settings

            self.peft = check_lora_settings(self.peft)


@dataclass
class DataArguments:
    """Training text and evaluation data."""

    train_file: None | str | list = field(
        default=None,
        metadata={
            "help": "Training data: a .txt file with one sentence per line (unsupervised) or a .csv with "
            "sent0,sent1[,hard_neg] columns (supervised; or anchor,positive[,negative]). Environment variables are "
            "expanded. A list trains on several datasets (`mixing`): entries are paths or {path, columns}."
        },
    )
    dataset_name: None | str | list = field(
        default=None,
        metadata={"help": "A `datasets` id to train on instead of train_file; a list trains on several (`mixing`): "
                  "entries are ids or {name, config, split, columns}."},
    )
    mixing: Literal[MIXING_POLICIES] | None = field(
        default=None,
        metadata={
            "help": "With several datasets: 'proportional' (each batch from one dataset, chosen in proportion to its "
            "size; every batch of every dataset once per epoch) or 'round_robin' (one batch from each in turn, until "
            "the smallest runs out). Unset: proportional."
        },
    )
    unlabeled_sts: Literal["stsb", "all", "all-scored"] | None = field(
        default=None,
        metadata={
            "help": "Train on the unlabeled sentences of STS sets from the data directory instead of a file: "
            "'stsb' (STS-B train+dev+test, the SG-BERT setting), 'all' (every input row of the 7 STS tasks, scored "
            "or not: ConSERT's 89,192 texts, 48,699 distinct) or 'all-scored' (only the scored rows: 30,840)."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of dataset_name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of dataset_name to train on."})
    text_column: str = field(
        default="text", metadata={"help": "Column holding the sentence in a csv/json/`datasets` source (unsupervised)."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training examples (quick runs, benchmarks)."}
    )
    train_subset_size: int | None = field(
        default=None,
        metadata={
            "help": "Train on N examples drawn at random (by train_subset_seed) from the training data, any method: "
            "the few-shot setting of ConSERT's section 5.3 (see `hf-sentcl sweep --subset-sizes`)."
        },
    )
    train_subset_seed: int = field(
        default=0, metadata={"help": "Seed of the train_subset_size draw (independent of the training seed)."}
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read train_file or dataset_name as a stream (datasets' streaming=True): rows repaired, shuffled "
            "in a buffer of buffer_size rows and tokenised as training reads them, never held whole. Needs max_steps."
        },
    )
    buffer_size: int | None = field(
        default=None,
        metadata={"help": "streaming: rows held by the shuffle buffer (unset: 10,000). Larger shuffles better."},
    )
    max_seq_length: int = field(
        default=32, metadata={"help": "Truncation length of training sentences in tokens (3 to the model's limit)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes used to tokenise the training data."}
    )
    # A few fixed lengths (e.g. 8 with max_seq_length 32) bound the recompilations of torch_compile. Padding is
    # masked out, but dropout then draws its masks for a larger tensor, so a run is not bit-identical to one without.
    pad_to_multiple_of: int | None = field(
        default=None,
        metadata={
            "help": "Round every training batch's padded length up to a multiple of this (plain-text views). "
            "Unset: pad to the batch's longest sentence."
        },
    )
    sts_data_dir: str | None = field(
        default=None,
        metadata={"help": "SentEval-format data directory (STS/, SICK/, ...). Defaults to $HF_SENTCL_DATA."},
    )
    eval_tasks: list[str] = field(
        default_factory=lambda: ["sts"],
        metadata={
            "help": "Final evaluation suites, run before (with eval_before_training) and after training: 'sts' (7 STS "
            "tasks, Spearman), 'transfer' (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC logistic-regression probes, "
            "SentEval protocol; minutes on a CPU) and 'glue' (fine-tuning on GLUE tasks, glue_* keys; long)."
        },
    )
    sts_mode: Literal[STS_MODES] = field(default="all", metadata={"help": "How STS12-16 subsets are averaged."})
    eval_whitening: list[str] | None = field(
        default=None,
        metadata={
            "help": "Also score STS after whitening (Su et al. 2021), one entry per whitening: 'eval' (fit on every "
            "evaluation sentence), 'task' (each task's own) or a text file, optionally ':K' dimensions, e.g. [eval]."
        },
    )
    glue_tasks: list[str] = field(
        default_factory=lambda: ["sst2", "mrpc", "stsb"],
        metadata={"help": "eval_tasks 'glue': GLUE tasks to fine-tune on (see hf-sentcl glue)."},
    )
    glue_source: Literal["senteval", "hub"] = field(
        default="senteval", metadata={"help": "eval_tasks 'glue': 'senteval' (offline SST-2/MRPC/STS-B) or 'hub'."}
    )
    glue_seeds: list[int] = field(default_factory=lambda: [1], metadata={"help": "eval_tasks 'glue': seeds."})
    glue_epochs: float = field(default=3.0, metadata={"help": "eval_tasks 'glue': fine-tuning epochs per task."})
    glue_max_train_samples: int | None = field(
        default=None, metadata={"help": "eval_tasks 'glue': fine-tune on the first N train examples of each task."}
    )
    eval_before_training: bool = field(
        default=True, metadata={"help": "Also evaluate the untouched encoder, for the before/after table."}
    )
    eval_bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Encode evaluation sentences (dev and final) under mixed precision: bf16 where native, fp16 on a "
            "GPU without it (faster, ~0.1 pt). Unset: follow the training precision (mixed if it trains mixed)."
        },
    )

    def __post_init__(self):
        check_choices(self)
        sources = listed_sources(self.train_file, self.dataset_name, self.unlabeled_sts, self.dataset_config_name,
                                 self.dataset_split)  # a malformed list entry is refused now, named
        if self.mixing is not None and len(sources) < 2:
            raise ValueError(f"key 'mixing' is '{self.mixing}' but the recipe names {len(sources)} dataset(s); mixing "
                             "draws batches from several: list them under train_file / dataset_name, or remove it.")
        if self.train_subset_size is not None and self.train_subset_size < 1:
            raise ValueError(f"train_subset_size must be a positive number of examples, got {self.train_subset_size}.")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive number of tokens, got {self.pad_to_multiple_of}.")
        if self.max_seq_length < MIN_SEQ_LENGTH:  # the upper limit needs the model's config: run.validate_recipe
            raise ValueError(
                f"max_seq_length must be at least {MIN_SEQ_LENGTH} tokens ([CLS], a word, [SEP]), got "
                f"{self.max_seq_length}."
            )
        if self.buffer_size is not None and self.buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive number of rows, got {self.buffer_size}.")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"max_train_samples must be a positive number of examples, got {self.max_train_samples}.")
