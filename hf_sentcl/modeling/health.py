"""Checks that keep a poisoned model from being saved, exported or published.

- `NonFiniteLossFlag`: a NaN/inf training loss stops training. The step only ORs `~isfinite(loss)` into a flag on
  the loss's device (no host read, which would stall a GPU every micro-step); the trainer reads the flag at
  logging, evaluation and save steps and before writing any checkpoint, so a non-finite update is never saved.
- `check_finite_loss`: the same check read at once (host read), for callers outside the training step.
- `CHECKPOINT_COMPLETE`: the mark that a checkpoint was written whole.
- `check_final_model`: the trained weights must be finite, and the encoder's embeddings of the STS-B dev
  sentences finite and not collapsed. Collapsed means their relative spread around their mean is below
  `COLLAPSE_SPREAD`: every sentence maps to (nearly) the same vector, so similarities rank nothing but noise.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: written into checkpoint-N by the trainer once every file of the checkpoint is on disk
#: (see hf_sentcl.recipe.run_folder)
CHECKPOINT_COMPLETE = "checkpoint_complete.json"


#: relative spread of the dev embeddings (see `relative_spread`) below which a model counts as collapsed
COLLAPSE_SPREAD = 1e-4


class TrainingFailure(RuntimeError):
    """Training produced a model that must not be published; the CLI prints it and exits 1."""


def check_finite_loss(loss: torch.Tensor, step: int) -> None:
    """Raise TrainingFailure if `loss` (a scalar) is NaN or infinite."""
    if not torch.isfinite(loss.detach()).all():
        raise TrainingFailure(
            f"training loss is {loss.detach().float().item()} at step {step + 1}: training stopped before the "
            "optimizer step, nothing was exported. Lower learning_rate, check temperature and the other loss "
            "settings, or turn off bf16/fp16; checkpoints written before this step are intact."
        )


class NonFiniteLossFlag:
    """A device-side record of the first NaN/inf training loss and its step (see the module docstring)."""

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None
        self.first: torch.Tensor | None = None  # (loss value, step) of the first non-finite loss

    def update(self, loss: torch.Tensor, step: int) -> None:
        """OR the loss's non-finiteness into the flag and keep the first bad (value, step); no host read."""
        value = loss.detach().float().sum()
        bad = ~torch.isfinite(value)
        record = torch.stack([value, torch.full_like(value, step)])
        if self.flag is None:
            self.flag, self.first = bad, record
            return
        self.first = torch.where(self.flag | ~bad, self.first, record)
        self.flag = self.flag | bad

    def check(self) -> None:
        """Raise TrainingFailure if a non-finite loss was seen (one host read: call it at logging/save steps)."""
        if self.flag is None or not bool(self.flag):
            return
        value, step = self.first.tolist()
        raise TrainingFailure(
            f"training loss is {value} at step {int(step) + 1}: training stopped before any checkpoint after that "
            "step was written, nothing was exported. Lower learning_rate, check temperature and the other loss "
            "settings, or change precision; checkpoints written before this step are intact."
        )


def relative_spread(embeddings: np.ndarray) -> float:
    """Root-mean-square distance of the rows from their mean, over the rows' root-mean-square norm: 0 when every
    sentence gets the same vector, ~1 for isotropic embeddings (a random encoder's anisotropic ones: ~1e-2)."""
    x = np.asarray(embeddings, dtype=np.float64)
    scale = np.sqrt((x**2).sum(axis=1).mean())
    if scale == 0:
        return 0.0
    return float(np.sqrt(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean()) / scale)


def nonfinite_tensors(model: nn.Module) -> list[str]:
    """Names of `model`'s floating-point weights and buffers that hold a NaN or an infinity."""
    return [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]


def is_collapsed(embeddings: np.ndarray) -> bool:
    """True when the rows of `embeddings` lie within `COLLAPSE_SPREAD` (relative spread) of their mean."""
    return len(embeddings) > 1 and relative_spread(embeddings) < COLLAPSE_SPREAD


def check_final_model(model: nn.Module, embeddings: np.ndarray) -> None:
    """Raise TrainingFailure if `model` has non-finite weights or `embeddings` (of distinct dev sentences) are
    non-finite or collapsed (see the module docstring)."""
    bad = nonfinite_tensors(model)
    if bad:
        raise TrainingFailure(
            f"the trained model has non-finite weights in {len(bad)} tensor(s) (first: {bad[0]}); nothing was "
            "exported. Lower learning_rate or check the loss settings (temperature, margins)."
        )
    if not np.isfinite(embeddings).all():
        raise TrainingFailure("the trained model's STS-B dev embeddings are not finite; nothing was exported.")
    if is_collapsed(embeddings):
        raise TrainingFailure(
            f"the trained model collapsed: its STS-B dev embeddings lie within {relative_spread(embeddings):.2e} "
            f"(relative spread, < {COLLAPSE_SPREAD}) of their mean, every sentence maps to nearly one vector; nothing "
            "was exported. Lower learning_rate or raise temperature."
        )
