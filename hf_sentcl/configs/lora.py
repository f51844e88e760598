"""A recipe's `peft:` mapping checked as LoRA settings (peft.LoraConfig keys), before any model loads.

peft is imported here only when a recipe has a `peft:` section (`ModelArguments` imports this module then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from peft import LoraConfig

#: LoraConfig fields a recipe does not set: the encoder wraps a bare backbone and manages these itself
MANAGED_KEYS = ("task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
                "inference_mode")
LORA_KEYS = tuple(f.name for f in dataclasses.fields(LoraConfig) if f.init and f.name not in MANAGED_KEYS)


def check_lora_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a recipe's `peft:` mapping (raises ValueError naming `peft.<key>`); returns it as a plain dict."""
    if not isinstance(settings, Mapping):
        raise ValueError(f"peft must be a mapping of LoRA settings (r, lora_alpha, ...), got {settings!r}.")
    settings = dict(settings)
    unknown = sorted(set(settings) - set(LORA_KEYS))
    if unknown:
        managed = [k for k in unknown if k in MANAGED_KEYS]
        hint = f" ({', '.join(managed)} is set by hf_sentcl)" if managed else ""
        raise ValueError(
            f"peft: unknown key(s) {', '.join(unknown)}{hint}. LoRA keys: r, lora_alpha, lora_dropout, "
            "target_modules, bias, use_rslora, modules_to_save, init_lora_weights, ... (peft.LoraConfig)."
        )
    rank = settings.get("r", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"peft.r (the LoRA rank) must be a positive integer, got {rank!r}.")
    alpha = settings.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise ValueError(f"peft.lora_alpha must be a positive number, got {alpha!r}.")
    dropout = settings.get("lora_dropout", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ValueError(f"peft.lora_dropout must be in [0, 1), got {dropout!r}.")
    targets = settings.get("target_modules")
    if targets is not None and not (
        isinstance(targets, str) or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        raise ValueError(
            f"peft.target_modules must be a module name suffix, a list of them or a regex string, got {targets!r}."
        )
    bias = settings.get("bias", "none")
    if bias not in ("none", "all", "lora_only"):
        raise ValueError(f"peft.bias must be none, all or lora_only, got {bias!r}.")
    try:
        LoraConfig(**settings)
    except (TypeError, ValueError) as err:
        raise ValueError(f"peft: {err}") from None
    return settings
