"""LoRA adapters on the encoder's backbone, through `peft`: recipe settings, wrapping, merging, adapter export, and
the distance between a LoRA-tuned backbone and a frozen copy (SG/SG-OPT's regularizer).

A recipe's `peft:` mapping holds `peft.LoraConfig` keys. The settings are stored in the encoder's config
(`SentenceEncoderConfig.peft`), so a checkpoint saved mid-training (adapter weights beside the frozen base)
reloads with `SentenceEncoder.from_pretrained`; at the end of a run the adapters are merged into the base weights
(`merge_adapters`) and the saved encoder, like its export, is a plain backbone that `AutoModel` loads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer
from torch import nn

#: attention query/value projections of sentence-encoder backbones for which peft has no default target modules
#: (peft covers BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa, ...)
EXTRA_TARGET_MODULES = {"mpnet": ["q", "v"], "distilbert": ["q_lin", "v_lin"], "albert": ["query", "value"]}


def is_peft_model(module: nn.Module) -> bool:
    return isinstance(module, PeftModel)


def wrap_backbone(backbone: nn.Module, settings: Mapping[str, Any]) -> PeftModel:
    """`backbone` with LoRA adapters: only the adapters (and `modules_to_save`) train, the base weights are frozen.
    Without `target_modules`, peft's default for the architecture is used (or `EXTRA_TARGET_MODULES`)."""
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    if settings.get("target_modules") is None and model_type in EXTRA_TARGET_MODULES:
        settings = {**settings, "target_modules": EXTRA_TARGET_MODULES[model_type]}
    try:
        return get_peft_model(backbone, LoraConfig(**settings))
    except ValueError as err:
        if settings.get("target_modules") is None:
            raise ValueError(
                f"peft: no default LoRA target modules for model type '{model_type}' ({err}); set "
                "peft.target_modules, e.g. [query, value]."
            ) from None
        raise ValueError(f"peft: {err}") from None


def merge_adapters(encoder: nn.Module) -> bool:
    """Fold the LoRA adapters into the backbone's weights (W + scaling * B A) and drop them, in place; the encoder
    then saves and loads as a plain one. Returns whether there was anything to merge."""
    if not is_peft_model(encoder.backbone):
        return False
    encoder.backbone = encoder.backbone.merge_and_unload()
    encoder.config.peft = None
    return True


def save_adapter(encoder: nn.Module, directory: str | Path) -> Path:
    """Save the backbone's LoRA adapter alone (adapter_config.json + adapter_model.safetensors); load it back with
    `PeftModel.from_pretrained(AutoModel.from_pretrained(base), directory)`."""
    if not is_peft_model(encoder.backbone):
        raise ValueError("There is no LoRA adapter to save: the encoder was trained without a 'peft' section.")
    directory = Path(directory)
    encoder.backbone.save_pretrained(directory)
    return directory


def parameter_counts(model: nn.Module) -> dict[str, float]:
    """Trainable and total parameters of `model` (shared tensors counted once), and the trainable share in %."""
    unique = {id(p): p for p in model.parameters()}.values()
    numel = {id(p): getattr(p, "ds_numel", None) or p.numel() for p in unique}  # ZeRO-3 partitions hold 0 locally
    total = sum(numel[id(p)] for p in unique)
    trainable = sum(numel[id(p)] for p in unique if p.requires_grad)
    return {"trainable_parameters": trainable, "total_parameters": total, "trainable_percent": 100 * trainable / total}


def frozen_base_copy(backbone: nn.Module) -> nn.Module:
    """A copy of the backbone as it computes now, without adapters (LoRA merged), for a frozen reference model."""
    clone = copy.deepcopy(backbone)
    return clone.merge_and_unload() if is_peft_model(clone) else clone


# ------------------------------------------------------------------------------------ distance to a frozen copy
def lora_delta_squared_norm(lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """||scaling * B A||_F^2 for A (r, in) and B (out, r), without forming the (out, in) product:
    ||B A||^2 = trace(A^T B^T B A) = sum((B^T B) * (A A^T)), two r x r matrices. Computed in fp32 (or fp64)."""
    dtype = torch.promote_types(lora_a.dtype, torch.float32)
    a, b = lora_a.to(dtype), lora_b.to(dtype)
    return scaling**2 * ((b.T @ b) * (a @ a.T)).sum()


def _plain_name(name: str) -> str:
    """The name a parameter of a LoRA-wrapped model has in the unwrapped model."""
    for prefix in ("base_model.model.",):
        name = name.removeprefix(prefix)
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def weight_distance(tuned: nn.Module, frozen: nn.Module) -> torch.Tensor:
    """sum over the weights of ||theta_tuned - theta_frozen||^2, where theta_tuned are the weights `tuned` computes
    with: for LoRA layers W + scaling * B A. Gradient flows into the trainable parameters of `tuned` only.

    `frozen` is a plain module (see `frozen_base_copy`). For a LoRA-wrapped `tuned` whose base weights are frozen
    and equal `frozen`'s, a LoRA layer contributes ||scaling * B A||^2 (`lora_delta_squared_norm`); any other
    trainable parameter (`modules_to_save`, trainable biases) is compared with `frozen`'s by name. Every trainable
    parameter must find its counterpart: a name or shape mismatch raises instead of silently adding nothing.
    For a plain `tuned` this is `hf_sentcl.losses.parameter_distance` over its trainable parameters.
    """
    if not is_peft_model(tuned):
        from hf_sentcl.losses import parameter_distance

        check_counterparts(tuned, frozen)
        return parameter_distance(tuned, frozen)
    reference = dict(frozen.named_parameters())
    device = next(tuned.parameters()).device
    total = torch.zeros((), device=device)
    covered: set[str] = set()
    for module_name, module in tuned.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if not isinstance(module, LoraLinear) or module.use_dora.get(adapter, False):
                raise ValueError(
                    f"peft: the regularizer supports plain LoRA on Linear layers; '{module_name}' is a "
                    f"{type(module).__name__}{' with DoRA' if module.use_dora.get(adapter) else ''}."
                )
            a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
            covered.update(f"{module_name}.lora_{x}.{adapter}.weight" for x in "AB")
            if a.requires_grad or b.requires_grad:
                total = total + lora_delta_squared_norm(a, b, module.scaling[adapter]).to(total.dtype)
    missing = []
    for name, param in tuned.named_parameters():
        if not param.requires_grad or name in covered:
            continue
        counterpart = reference.get(_plain_name(name))
        if counterpart is None or counterpart.shape != param.shape:
            missing.append(name)
            continue
        total = total + (param.float() - counterpart.detach().float()).pow(2).sum()
    if missing:
        raise ValueError(
            f"The frozen copy has no weight matching the trained parameter(s) {missing[:5]}: the parameter distance "
            "would silently leave them out."
        )
    return total


def check_counterparts(tuned: nn.Module, frozen: nn.Module) -> None:
    """Every trainable parameter of `tuned` has a parameter of the same name and shape in `frozen` (else raises:
    `parameter_distance` would skip it). Catches e.g. parameters sharded away (DeepSpeed ZeRO-3, FSDP)."""
    reference = dict(frozen.named_parameters())
    missing = [
        name for name, param in tuned.named_parameters()
        if param.requires_grad and (name not in reference or reference[name].shape != param.shape)
    ]
    if missing:
        raise ValueError(
            f"The frozen copy has no weight matching the trained parameter(s) {missing[:5]} (by name and shape): the "
            "parameter distance would silently leave them out. Sharded parameters (DeepSpeed ZeRO-3, FSDP) cause "
            "this; use DDP or ZeRO-2."
        )
