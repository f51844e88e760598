"""Model, data and shared training arguments. Every field carries a help text; recipes are validated against them."""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Literal

from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from hf_sentcl.common.preemption import signal_numbers
from hf_sentcl.configs.validation import check_choices, check_range
from hf_sentcl.evaluation.sts import STS_MODES
from hf_sentcl.losses.false_negatives import FALSE_NEGATIVE_MODES, GUIDE_MARGIN_STRATEGIES
from hf_sentcl.losses.matryoshka import check_matryoshka
from hf_sentcl.modeling.backbone import EMBEDDED_MODEL_ALIAS
from hf_sentcl.modeling.compiled import cpu_compiler_problem
from hf_sentcl.modeling.config import HEAD_TYPES
from hf_sentcl.modeling.pooling import POOLING_MODES
from hf_sentcl.modeling.precision import cpu_has_native_bf16, resolve_precision

logger = logging.getLogger("hf_sentcl")

#: the smallest useful truncation length: [CLS], one token, [SEP]
MIN_SEQ_LENGTH = 3
#: learning rates above this are refused: AdamW on a pretrained encoder diverges long before (typical: 1e-6 to
#: 1e-4), and even plain SGD on a tiny test model stays below it
MAX_LEARNING_RATE = 10.0


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
            from hf_sentcl.modeling.peft import check_lora_settings

            self.peft = check_lora_settings(self.peft)


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
        if self.train_subset_size is not None and self.train_subset_size < 1:
            raise ValueError(f"train_subset_size must be a positive number of examples, got {self.train_subset_size}.")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive number of tokens, got {self.pad_to_multiple_of}.")
        if self.max_seq_length < MIN_SEQ_LENGTH:  # the upper limit needs the model's config: run.validate_recipe
            raise ValueError(
                f"max_seq_length must be at least {MIN_SEQ_LENGTH} tokens ([CLS], a word, [SEP]), got "
                f"{self.max_seq_length}."
            )
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"max_train_samples must be a positive number of examples, got {self.max_train_samples}.")


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
    learning_rate: float = field(
        default=3e-5, metadata={"help": f"Peak learning rate of AdamW, in (0, {MAX_LEARNING_RATE:g}]."}
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training data."})
    eval_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "When to run STS-B dev evaluation."}
    )
    eval_steps: float | None = field(default=125, metadata={"help": "Steps between STS-B dev evaluations."})
    save_strategy: SaveStrategy | str = field(
        default="steps", metadata={"help": "When to save checkpoints (follows eval)."}
    )
    save_steps: float = field(default=125, metadata={"help": "Steps between checkpoints (keep = eval_steps)."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept besides the best one."})
    load_best_model_at_end: bool = field(default=True, metadata={"help": "Reload the best dev checkpoint at the end."})
    metric_for_best_model: str | None = field(
        default="stsb_spearman", metadata={"help": "Dev metric that picks the best checkpoint."}
    )
    greater_is_better: bool | None = field(default=True, metadata={"help": "Whether a higher metric is better."})
    logging_steps: float = field(default=10, metadata={"help": "Steps between loss logs."})
    # The filter reads every step's loss on the host (a device sync per step on GPU).
    precision: Literal["auto", "fp32", "bf16", "fp16"] | None = field(
        default=None,
        metadata={
            "help": "Training precision: auto (bf16 where the hardware has it natively, fp16 on GPUs without it, "
            "fp32 on other CPUs), fp32, bf16 or fp16 (docs/precision.md). Unset: the bf16/fp16 keys decide."
        },
    )
    compile_layers: bool = field(
        default=False,
        # off: on a 2-core CPU the compilation (~15-40 s) costs more than it saves in a short run (docs/benchmarks.md)
        metadata={
            "help": "Run each transformer layer's training forward (on the CPU's unpadded route: its token-wise "
            "part after attention) through torch.compile (inductor, dynamic shapes; evaluation stays eager; the "
            "same dropout masks as eager for a seed): fused dropout/GELU/LayerNorm around the GEMMs, after a "
            "one-off compilation at the first steps. Unlike transformers' torch_compile (the whole model, broken "
            "up at the unpadded route's host reads), this compiles the repeated layer only."
        },
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep False: the collator needs the tokenised views."}
    )
    report_to: None | str | list[str] = field(default="none", metadata={"help": "Trackers: none, tensorboard, ..."})
    save_only_model: bool = field(
        default=False,
        metadata={
            "help": "Checkpoints hold the weights only. Off (default): they also hold the optimizer, scheduler and "
            "RNG states, so resume_from_checkpoint continues exactly as an uninterrupted run would."
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Resume training from this checkpoint-N folder; 'latest' / true: the latest complete checkpoint "
            "in output_dir; 'auto': that checkpoint if there is one, else a fresh start, and nothing to do (exit 0) "
            "when output_dir holds a finished run (exit 1 when its export or push had failed): the setting for "
            "requeued jobs (docs/reliability.md). Checked "
            "before the model loads (hf_sentcl.recipe.run_folder)."
        },
    )
    preemption_signals: list[str] | None = field(
        default=None,
        # SLURM sends SIGTERM on preemption and `--signal=B:USR1@120` ahead of the time limit; Kubernetes SIGTERM.
        metadata={
            "help": "Signals that make the run write a checkpoint at the next step boundary and stop with exit "
            "status 75, to be resumed by the same command (docs/reliability.md). Unset: SIGTERM and SIGUSR1; [] "
            "leaves every signal's default action (SIGTERM kills the run)."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Allow a new run into an output_dir that already holds a run (results, model, checkpoints, "
            "export); its checkpoints are removed first. Off: such a run is refused unless it resumes from it."
        },
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the exported encoder at the end."})
    license: str | None = field(
        default=None,
        metadata={"help": "License of the trained model for its card's metadata and MTEB files: a Hub license id "
                  "(apache-2.0, mit, cc-by-4.0, ...) or a URL. Default: none stated."},
    )
    language: list[str] | None = field(
        default=None,
        metadata={"help": "Language(s) of the model for its card's metadata, ISO codes, e.g. [en]. Default: the base "
                  "model card's."},
    )
    export: bool = field(
        default=True,
        metadata={
            "help": "Export the trained encoder to output_dir/export (with its card, and the MTEB-protocol STS "
            "scores its card and MTEB files carry) at the end. false while iterating: the run ends after its "
            "results; `hf-sentcl export OUTPUT_DIR` exports it later. push_to_hub needs it."
        },
    )
    # Off: every trained weight gets a gradient each step (the trainer freezes the backbone's unused pooler), and
    # methods apply heads and regularizers outside the encoder's forward, which the search would reject
    # ('marked ready twice').
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "DDP's search for parameters unused by the forward (keep off)."}
    )
    global_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Sentences per step over all processes (the in-batch negatives); sets per_device_train_batch_size "
            "to this / the number of processes, which must divide it."
        },
    )
    mini_batch_size: int | None = field(
        default=None,
        # GradCache: mini-batches are encoded first without activations, then again with the same dropout masks
        # to back-propagate, so a large batch of negatives fits in the memory of a small one (same gradients).
        metadata={
            "help": "Cached (GradCache) step: encode each process's batch in mini-batches of this many examples. "
            "Unset: one forward over the batch."
        },
    )
    length_buckets: int | None = field(
        default=None,
        # The in-batch negatives stay the same; dropout draws its masks per sub-batch, so a run is not bit-identical
        # to one without it. ConSERT and CLEAR encode their views in their own way and refuse it.
        metadata={
            "help": "Encode each training batch in this many length-sorted sub-batches, each padded to its own "
            "longest sentence (less padding compute; e.g. 4 on CPU). Unset: one forward."
        },
    )
    false_negatives: Literal[FALSE_NEGATIVE_MODES] = field(
        default="keep",
        # exact token ids after truncation; a duplicate is dropped from the denominator, not made a positive
        metadata={
            "help": "'mask': take in-batch candidates whose text is identical to the anchor's or its positive's "
            "(same token ids after truncation) out of the loss's denominator (docs/false-negatives.md). "
            "'guide': take out those that guide_model scores closer to the anchor than the anchor's own positive "
            "(less guide_margin), as sentence-transformers' GISTEmbedLoss. "
            "'keep': every other row is a negative, as in the papers."
        },
    )
    guide_model: str | None = field(
        default=None,
        # frozen, no gradient, in the training precision; its own pooling and length (a sentence-transformers folder)
        metadata={
            "help": "With 'false_negatives: guide': the encoder that scores the in-batch candidates: a folder, a "
            "Hub id or 'embedded:all-MiniLM-L6-v2'. It embeds each step's texts (before augmentation) once."
        },
    )
    guide_margin: float = field(
        default=0.0,
        metadata={
            "help": "With 'false_negatives: guide': how far below the positive's guide score a candidate may score "
            "and still be dropped (0: only candidates scored above the positive)."
        },
    )
    guide_margin_strategy: Literal[GUIDE_MARGIN_STRATEGIES] = field(
        default="absolute",
        metadata={
            "help": "'absolute': drop candidates scoring above positive - guide_margin; 'relative': above "
            "positive - |positive| * guide_margin (sentence-transformers' margin_strategy)."
        },
    )
    matryoshka_dims: list[int] | None = field(
        default=None,
        metadata={
            "help": "Matryoshka embeddings: add the method's loss on each leading prefix of the embedding of these "
            "sizes (each re-normalised), e.g. [384, 256, 128, 64] (docs/matryoshka.md). Unset: full size only."
        },
    )
    matryoshka_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weight of each matryoshka_dims term, in the same order (default: 1 each)."},
    )
    fast_dropout: bool = field(
        default=True,
        # 16 random bits per element, p rounded to a multiple of 1/65536; ~20-30% faster bf16 steps on CPU. GPU
        # dropout is fused already.
        metadata={
            "help": "On CPU, draw the backbone's dropout masks in bulk instead of with torch's per-element sampler "
            "(same dropout, faster). False: torch's own dropout."
        },
    )
    logging_nan_inf_filter: bool = field(
        default=False,
        # Trainer's default (True) reads every micro-step's loss on the host (a GPU sync per step) to drop NaN/inf
        # from the logged mean; here a NaN/inf loss stops training instead (hf_sentcl.modeling.health).
        metadata={
            "help": "Trainer's filter of NaN/inf losses from the logged mean; off because a non-finite loss stops "
            "training here anyway and the filter reads the loss on the host every step."
        },
    )
    export_adapter: bool = field(
        default=False,
        metadata={
            "help": "With a 'peft' section: also save the trained LoRA adapter alone in <output_dir>/adapter "
            "(PeftModel.from_pretrained loads it); the encoder is always saved with the adapters merged."
        },
    )

    def __post_init__(self):
        follow_launcher_precision(self)
        # Without an accelerator, say use_cpu: TrainingArguments then runs bf16 as CPU autocast, and under
        # torchrun / accelerate launch sets up multi-CPU data parallelism (otherwise every process trains alone).
        if not self.use_cpu and not _has_accelerator():
            self.use_cpu = True
        apply_precision(self)
        if self.tf32 and not _has_tf32():
            # the papers' GPU recipes set it; on other machines it is a no-op worth one line, not a warning
            logger.info("tf32: no CUDA GPU with TF32 here; the key has no effect on this machine.")
            self.tf32 = None
        super().__post_init__()
        if self.bf16 and self.use_cpu and not _cpu_has_bf16():
            warnings.warn(
                "bf16: this CPU has no native bf16 instructions (avx512_bf16 / AMX), so bf16 autocast is emulated and "
                "trains slower than fp32; set 'bf16: false' on this machine.",
                stacklevel=2,
            )
        check_choices(self)
        check_range(
            "learning_rate", self.learning_rate, 0, MAX_LEARNING_RATE, low_open=True,
            hint="Typical values for fine-tuning a pretrained encoder: 1e-6 to 1e-4.",
        )
        if self.length_buckets is not None and self.length_buckets < 1:
            raise ValueError(f"length_buckets must be a positive number of sub-batches, got {self.length_buckets}.")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be a positive number of examples, got {self.mini_batch_size}.")
        if self.compile_layers and (self.use_cpu or not _cuda()) and (problem := cpu_compiler_problem()):
            raise ValueError(problem)
        check_matryoshka(self.matryoshka_dims, self.matryoshka_weights)
        check_guide_settings(self)
        if self.preemption_signals is not None:
            signal_numbers(self.preemption_signals)  # ValueError naming a name that is not a catchable signal
        if self.push_to_hub and not self.export:
            raise ValueError("push_to_hub: true uploads the export, but export is false; set export: true (or drop "
                             "push_to_hub and push later with `hf-sentcl push`).")
        if self.global_train_batch_size is not None:
            self.per_device_train_batch_size = per_device_batch_size(self.global_train_batch_size, self.world_size)


def check_guide_settings(args) -> None:
    """`false_negatives: guide` needs a `guide_model`, and the guide keys mean nothing without it: ValueError naming
    the key. The model itself is looked for when the trainer loads it, before training."""
    guided = args.false_negatives == "guide"
    if guided and not args.guide_model:
        raise ValueError(
            "false_negatives: 'guide' needs guide_model, the encoder that scores the candidates (e.g. "
            "'embedded:all-MiniLM-L6-v2', a folder or a Hub id)."
        )
    if not guided and args.guide_model:
        raise ValueError(
            f"guide_model '{args.guide_model}' is set but false_negatives is '{args.false_negatives}'; set "
            "'false_negatives: guide' to use it, or remove guide_model."
        )
    if not math.isfinite(args.guide_margin):
        raise ValueError(f"guide_margin must be a finite number, got {args.guide_margin}.")


def per_device_batch_size(global_batch: int, processes: int) -> int:
    """The per-process batch that gives `global_batch` sentences (in-batch negatives) over `processes` processes."""
    if global_batch < 1 or global_batch % processes:
        raise ValueError(
            f"global_train_batch_size={global_batch} cannot be split evenly over {processes} process(es); use a "
            f"multiple of {processes} (or change the number of processes)."
        )
    return global_batch // processes


LAUNCHER_PRECISION_ENV = "ACCELERATE_MIXED_PRECISION"


def follow_launcher_precision(args: TrainingArguments) -> None:
    """Take mixed precision from `accelerate launch` (its config's `mixed_precision`) unless the recipe sets it.

    The launcher exports its choice; TrainingArguments would honour it for autocast but leave `bf16`/`fp16` False,
    so evaluation and the model card would not know. A recipe that asks for the other precision is an error
    rather than a silent choice. `mixed_precision: 'no'` in a launcher config means: follow the recipe.
    """
    launcher = os.environ.get(LAUNCHER_PRECISION_ENV, "no").lower()
    if launcher not in ("bf16", "fp16"):
        return
    other = "fp16" if launcher == "bf16" else "bf16"
    if getattr(args, other):
        raise ValueError(
            f"key '{other}' is true but the accelerate config launches with mixed_precision '{launcher}'; remove "
            f"'{other}' from the recipe or use a config with the precision you want (e.g. ddp.yaml, which follows "
            "the recipe)."
        )
    setattr(args, launcher, True)


def eval_mixed_precision(data: DataArguments, training: TrainingArguments) -> bool:
    """Whether evaluation (dev and final) encodes under mixed precision: `eval_bf16` when set, otherwise whether
    training is mixed (its resolved precision is bf16 or fp16). The dtype is `mixed_eval_dtype`'s."""
    if data.eval_bf16 is not None:
        return data.eval_bf16
    return bool(training.bf16 or training.fp16)


def apply_precision(args: TrainingArguments) -> None:
    """Resolve the `precision` key (when set) into TrainingArguments' bf16/fp16 flags and `resolved_precision`.

    A launcher's mixed precision (`follow_launcher_precision`) stands for `auto`; a pinned precision that disagrees
    with it, or with bf16/fp16 keys also set, is an error rather than a silent choice."""
    flags = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    if args.precision is None:
        args.resolved_precision = flags or "fp32"
        return
    if args.precision == "auto" and flags:  # set by the launcher (or the recipe): they decide
        args.resolved_precision = flags
        return
    device = "cpu" if args.use_cpu else "cuda" if _cuda() else "xpu"
    chosen = resolve_precision(args.precision, device)
    if flags and flags != chosen:
        raise ValueError(
            f"precision: {args.precision} gives {chosen}, but '{flags}' is true (in the recipe or the accelerate "
            "config); keep one of them."
        )
    args.bf16, args.fp16 = chosen == "bf16", chosen == "fp16"
    args.resolved_precision = chosen


def _cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 arithmetic (what makes CPU bf16 autocast faster than fp32)."""
    return cpu_has_native_bf16()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_tf32() -> bool:
    """Whether TF32 matmuls exist here (a CUDA GPU of compute capability 8.0 or newer)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
