"""The precision keys of a recipe resolved into TrainingArguments' flags: `precision` (auto/fp32/bf16/fp16), the
launcher's `mixed_precision`, and whether evaluation encodes mixed (docs/precision.md). What the hardware offers is
`hf_sentcl.common.hardware`'s to say."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hf_sentcl.common.hardware import cuda_available, resolve_precision

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from hf_sentcl.configs.inputs import DataArguments

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
    device = "cpu" if args.use_cpu else "cuda" if cuda_available() else "xpu"
    chosen = resolve_precision(args.precision, device)
    if flags and flags != chosen:
        raise ValueError(
            f"precision: {args.precision} gives {chosen}, but '{flags}' is true (in the recipe or the accelerate "
            "config); keep one of them."
        )
    args.bf16, args.fp16 = chosen == "bf16", chosen == "fp16"
    args.resolved_precision = chosen
