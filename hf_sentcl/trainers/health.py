"""Checks that keep a poisoned model from being saved, exported or published.

- `check_finite_loss`: a NaN/inf training loss stops training at the step it appears (the optimizer step that
  follows would write NaN into every weight).
- `CHECKPOINT_COMPLETE`: the mark that a checkpoint was written whole.
- `check_final_model`: the trained weights must be finite, and the encoder's embeddings of the STS-B dev
  sentences finite and not collapsed. Collapsed means the mean pairwise cosine similarity of the embeddings is at
  least `COLLAPSE_COSINE`: every sentence maps to (nearly) the same direction, so no similarity is ranked.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: written into checkpoint-N by the trainer once every file of the checkpoint is on disk (see hf_sentcl.run_folder)
CHECKPOINT_COMPLETE = "checkpoint_complete.json"
#: mean pairwise cosine similarity of the dev embeddings at or above which a model counts as collapsed
COLLAPSE_COSINE = 0.999


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


def mean_pairwise_cosine(embeddings: np.ndarray) -> float:
    """Mean cosine similarity over all pairs of distinct rows: (|sum of unit rows|^2 - n) / (n (n - 1))."""
    x = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    units = x / np.where(norms > 0, norms, 1.0)
    n = len(units)
    total = units.sum(axis=0)
    return float((total @ total - (norms > 0).sum()) / (n * (n - 1)))


def check_final_model(model: nn.Module, embeddings: np.ndarray) -> None:
    """Raise TrainingFailure if `model` has non-finite weights or `embeddings` (of distinct dev sentences) are
    non-finite or collapsed (see the module docstring)."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]
    if bad:
        raise TrainingFailure(
            f"the trained model has non-finite weights in {len(bad)} tensor(s) (first: {bad[0]}); nothing was "
            "exported. Lower learning_rate or check the loss settings (temperature, margins)."
        )
    if not np.isfinite(embeddings).all():
        raise TrainingFailure("the trained model's STS-B dev embeddings are not finite; nothing was exported.")
    cosine = mean_pairwise_cosine(embeddings)
    if cosine >= COLLAPSE_COSINE:
        raise TrainingFailure(
            f"the trained model collapsed: its STS-B dev embeddings have a mean pairwise cosine similarity of "
            f"{cosine:.5f} (>= {COLLAPSE_COSINE}), every sentence maps to nearly one vector; nothing was exported. "
            "Lower learning_rate or raise temperature."
        )
