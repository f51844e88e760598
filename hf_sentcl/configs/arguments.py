"""The training arguments every method shares (`SentCLTrainingArguments`). Every field carries a help text; recipes are
validated against them. The model and data arguments are in `hf_sentcl.configs.inputs`."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from hf_sentcl.common.hardware import (
    cpu_compiler_problem,
    cpu_has_native_bf16,
    cuda_available,
    has_accelerator,
    has_tf32,
)
from hf_sentcl.common.preemption import signal_numbers
from hf_sentcl.configs.choices import FALSE_NEGATIVE_MODES, GUIDE_MARGIN_STRATEGIES
from hf_sentcl.configs.precision import apply_precision, follow_launcher_precision
from hf_sentcl.configs.validation import check_choices, check_matryoshka, check_range

logger = logging.getLogger("hf_sentcl")

#: learning rates above this are refused: AdamW on a pretrained encoder diverges long before (typical: 1e-6 to
#: 1e-4), and even plain SGD on a tiny test model stays below it
MAX_LEARNING_RATE = 10.0


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
        if not self.use_cpu and not has_accelerator():
            self.use_cpu = True
        apply_precision(self)
        if self.tf32 and not has_tf32():
            # the papers' GPU recipes set it; on other machines it is a no-op worth one line, not a warning
            logger.info("tf32: no CUDA GPU with TF32 here; the key has no effect on this machine.")
            self.tf32 = None
        super().__post_init__()
        if self.bf16 and self.use_cpu and not cpu_has_native_bf16():
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
        if self.compile_layers and (self.use_cpu or not cuda_available()) and (problem := cpu_compiler_problem()):
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
