"""Training-only heads of a trainer (projection heads, classifiers, an MLM head) that never belong to the saved
encoder, and the checks shared by the methods that use them.

A head is registered as a submodule of the encoder, so the optimizer, gradient clipping, device placement, mixed
precision and DDP gradient averaging treat it like any trained weight without an override of optimizer creation.
Its keys are added to the encoder's `_keys_to_ignore_on_save`, so `save_pretrained` (checkpoints and the final
encoder) leaves it out and loading the best checkpoint does not warn about it; `TrainingHeadsMixin` writes each
head to its own safetensors file beside every checkpoint and loads it back on `resume_from_checkpoint`.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hf_sentcl.registry import get_method


def attach_training_head(encoder: nn.Module, name: str, head: nn.Module) -> nn.Module:
    """Register `head` as submodule `name` of `encoder` (on its device and dtype) and keep it out of
    `save_pretrained`."""
    head.to(device=encoder.device, dtype=encoder.dtype)
    encoder.add_module(name, head)
    ignored = {f"{name}.{key}" for key in head.state_dict()}
    encoder._keys_to_ignore_on_save = set(encoder._keys_to_ignore_on_save or ()) | ignored
    return head


def own_head_state(head: nn.Module, backbone: nn.Module) -> dict[str, torch.Tensor]:
    """The head's own tensors, each once: without those tied to the backbone (e.g. an MLM decoder's weight, which
    is the word-embedding matrix and is saved with the encoder)."""
    seen = {p.data_ptr() for p in backbone.parameters()}
    state = {}
    for key, value in head.state_dict().items():
        if value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            state[key] = value.detach().cpu().contiguous()
    return state


def check_raw_cls_encoder(config, method: str, head_keys: str) -> None:
    """For methods whose sentence vector is the encoder's raw [CLS] and whose projection head is the trainer's own
    (SG, CLEAR): refuse an encoder head and a non-[CLS] pooling. `head_keys` names the recipe keys of the trainer's
    head, for the message."""
    if config.head != "none":
        raise ValueError(
            f"method {method}: set 'head: none' in the recipe (got head: {config.head}). The sentence vector is the "
            f"raw [CLS]; the training-only projection head is set by {head_keys}."
        )
    if config.pooling not in ("cls", "cls_before_pooler"):
        raise ValueError(f"method {method}: 'pooling' must be cls or cls_before_pooler, got '{config.pooling}'.")


def refuse_sharded_weights(trainer, method: str) -> None:
    """Refuse FSDP and DeepSpeed ZeRO-3 for a method that uses weights outside the encoder's forward (its registry
    entry's `sharded_weights_problem`), where those configs leave them sharded. A recipe run is refused earlier,
    before any work (`hf_sentcl.recipe.parallelism`); this covers trainers built in Python."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if trainer.is_fsdp_enabled or (plugin is not None and plugin.zero_stage == 3):
        raise ValueError(
            f"method {method} cannot run under FSDP or DeepSpeed ZeRO-3: "
            f"{get_method(method).sharded_weights_problem}, where weights are sharded. Use a DDP (ddp*.yaml) or "
            "ZeRO-2 accelerate config."
        )


class TrainingHeadsMixin:
    """`Trainer` mixin (put it before the Trainer class): `add_training_head(name, head, filename)` attaches a head
    to `self.model` (or `keep_training_head` records one already attached); checkpoints then carry it in
    `filename`, and resuming restores it."""

    def add_training_head(self, name: str, head: nn.Module, filename: str) -> nn.Module:
        return self.keep_training_head(attach_training_head(self.model, name, head), filename)

    def keep_training_head(self, head: nn.Module, filename: str) -> nn.Module:
        if not hasattr(self, "_training_heads"):
            self._training_heads: dict[str, nn.Module] = {}
        self._training_heads[filename] = head
        return head

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        if not self.args.should_save:
            return
        backbone = self.accelerator.unwrap_model(self.model).backbone
        for filename, head in getattr(self, "_training_heads", {}).items():
            save_file(own_head_state(head, backbone), os.path.join(output_dir or self.args.output_dir, filename))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        for filename, head in getattr(self, "_training_heads", {}).items():
            path = os.path.join(resume_from_checkpoint, filename)
            if os.path.isfile(path):
                device = str(next(head.parameters()).device)
                state = load_file(path, device=device)
                expected = own_head_state(head, self.accelerator.unwrap_model(self.model).backbone)
                if set(state) != set(expected):  # tied tensors come back with the encoder, not from this file
                    raise ValueError(
                        f"{path} does not match this training head: missing {sorted(set(expected) - set(state))}, "
                        f"unexpected {sorted(set(state) - set(expected))}."
                    )
                head.load_state_dict(state, strict=False)
