"""Model, data and shared training arguments. Every field carries a help text; recipes are validated against them."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from hf_sentcl.defaults import EMBEDDED_MODEL_ALIAS


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
    pooling: str = field(
        default="cls",
        metadata={"help": "Training-time pooling: cls, cls_before_pooler, mean, max, first_last_avg, last2_avg."},
    )
    pooling_layer: int = field(
        default=-1, metadata={"help": "Hidden-state index pooled by cls/mean/max (0 = embeddings, -1 = last)."}
    )
    head: str = field(default="mlp", metadata={"help": "Projection head on the pooled vector: 'mlp' or 'none'."})
    head_at_inference: bool = field(
        default=False, metadata={"help": "Keep the head at evaluation and in the saved encoder (SimCSE: False)."}
    )
    inference_pooling: str | None = field(
        default=None,
        metadata={"help": "Pooling used for evaluation and saving, if it differs from training (e.g. last2_avg)."},
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention kernel passed to from_pretrained (eager, sdpa, ...)."}
    )


@dataclass
class DataArguments:
    """Training text and evaluation data."""

    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training data: a .txt file with one sentence per line (unsupervised) or a .csv with "
            "sent0,sent1[,hard_neg] columns (supervised). Environment variables are expanded."
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "A `datasets` id to train on instead of train_file."}
    )
    unlabeled_sts: str | None = field(
        default=None,
        metadata={
            "help": "Train on the unlabeled sentences of STS sets from the data directory instead of a file: "
            "'stsb' (STS-B train+dev+test, the SG-BERT setting) or 'all' (the 7 STS tasks, the ConSERT setting)."
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
    max_seq_length: int = field(default=32, metadata={"help": "Truncation length of training sentences."})
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes used to tokenise the training data."}
    )
    sts_data_dir: str | None = field(
        default=None,
        metadata={"help": "SentEval-format data directory (STS/, SICK/, ...). Defaults to $HF_SENTCL_DATA."},
    )
    eval_tasks: list[str] = field(
        default_factory=lambda: ["sts"], metadata={"help": "Final evaluation suites to run: 'sts'."}
    )
    sts_mode: str = field(default="all", metadata={"help": "STS12-16 averaging: all, mean or wmean."})
    eval_before_training: bool = field(
        default=True, metadata={"help": "Also evaluate the untouched encoder, for the before/after table."}
    )
    eval_bf16: bool = field(
        default=False, metadata={"help": "Encode evaluation sentences under bf16 autocast (faster, ~0.1 pt)."}
    )


@dataclass
class SentCLTrainingArguments(TrainingArguments):
    """`TrainingArguments` with defaults suited to contrastive sentence-embedding training.

    Evaluation is STS-B dev Spearman (`eval_stsb_spearman`) every `eval_steps`, and the best checkpoint is kept.
    """

    output_dir: str | None = field(default=None, metadata={"help": "Where checkpoints, results and the encoder go."})
    per_device_train_batch_size: int = field(
        default=64, metadata={"help": "Sentences per process per step; the global batch sets the negatives."}
    )
    per_device_eval_batch_size: int = field(default=128, metadata={"help": "Sentences per encoding batch."})
    learning_rate: float = field(default=3e-5, metadata={"help": "Peak learning rate of AdamW."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training data."})
    eval_strategy: str = field(default="steps", metadata={"help": "When to run STS-B dev evaluation."})
    eval_steps: float | None = field(default=125, metadata={"help": "Steps between STS-B dev evaluations."})
    save_strategy: str = field(default="steps", metadata={"help": "When to save checkpoints (follows eval)."})
    save_steps: float = field(default=125, metadata={"help": "Steps between checkpoints (keep = eval_steps)."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept besides the best one."})
    load_best_model_at_end: bool = field(default=True, metadata={"help": "Reload the best dev checkpoint at the end."})
    metric_for_best_model: str | None = field(
        default="stsb_spearman", metadata={"help": "Dev metric that picks the best checkpoint."}
    )
    greater_is_better: bool | None = field(default=True, metadata={"help": "Whether a higher metric is better."})
    logging_steps: float = field(default=10, metadata={"help": "Steps between loss logs."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep False: the collator needs the tokenised views."}
    )
    report_to: None | str | list[str] = field(default="none", metadata={"help": "Trackers: none, tensorboard, ..."})
    save_only_model: bool = field(
        default=True, metadata={"help": "Checkpoints hold the weights only (no optimizer state)."}
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the exported encoder at the end."})

    def __post_init__(self):
        # bf16 on a machine without an accelerator means CPU autocast; TrainingArguments wants that said.
        if self.bf16 and not self.use_cpu and not _has_accelerator():
            self.use_cpu = True
        super().__post_init__()


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
