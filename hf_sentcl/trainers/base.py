"""`ContrastiveTrainer`: the shared machinery of every in-batch contrastive method.

A method subclass sets how many dropout copies of each text view go through the encoder and implements
`contrastive_loss(views)` on the (num_views, batch, dim) embeddings; everything else (one forward pass for all
views, cross-process gathering, metric logging, STS-B dev evaluation) lives here.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from transformers import Trainer

from hf_sentcl.distributed import gather_with_grad, world_size
from hf_sentcl.evaluation.alignment import sts_alignment_uniformity
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.trainers.callbacks import TrainingCostCallback


def scale_gradient(loss: torch.Tensor, factor: float) -> torch.Tensor:
    """Return a tensor equal to `loss` whose gradient is `factor` times larger (logged values stay unscaled)."""
    if factor == 1:
        return loss
    return loss * factor - loss.detach() * (factor - 1)


class ContrastiveTrainer(Trainer):
    """Base trainer: stack all views into one forward pass, gather across processes, call the method's loss.

    Args (beyond `Trainer`'s):
        dev_evaluator: an `STSEvaluator` on STS-B dev; `evaluate()` reports `eval_stsb_spearman` from it.
    """

    #: how many times each text view is repeated in the forward pass (2 for dropout-noise positives)
    dropout_copies: int = 1
    #: the smallest global batch the loss makes sense for
    min_global_batch_size: int = 2

    def __init__(self, *args, dev_evaluator: STSEvaluator | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dev_evaluator = dev_evaluator
        self.loss_is_scaled_for_ga = False
        self._metrics: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.cost = TrainingCostCallback()
        self.add_callback(self.cost)
        global_batch = self.args.per_device_train_batch_size * max(self.args.world_size, 1)
        if global_batch < self.min_global_batch_size:
            raise ValueError(
                f"per_device_train_batch_size={self.args.per_device_train_batch_size} x {self.args.world_size} "
                f"process(es) gives a global batch of {global_batch}; in-batch negatives need at least "
                f"{self.min_global_batch_size}. Raise per_device_train_batch_size."
            )

    @property
    def examples_per_step(self) -> int:
        """Training examples per optimizer step over all processes."""
        args = self.args
        return args.per_device_train_batch_size * max(args.world_size, 1) * args.gradient_accumulation_steps

    def training_cost(self) -> dict:
        """Throughput of the training steps alone (no evaluation or saving) and peak memory; see
        `TrainingCostCallback`. One example is one training sentence (SimCSE) or one pair/triplet (supervised)."""
        return self.cost.summary(self.examples_per_step)

    # ------------------------------------------------------------------ the training step
    def embed_views(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode every view of the batch in ONE forward pass; returns (copies * views, batch, dim)."""
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        batch, views, length = input_ids.shape
        copies = self.dropout_copies

        def stack(t: torch.Tensor) -> torch.Tensor:
            flat = t.transpose(0, 1).reshape(views * batch, length)
            return flat.repeat(copies, 1) if copies > 1 else flat

        embeddings = model(input_ids=stack(input_ids), attention_mask=stack(attention_mask)).embeddings
        return embeddings.view(copies * views, batch, -1)

    def contrastive_loss(self, views: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss from the gathered (num_views, global_batch, dim) embeddings, plus named components to log."""
        raise NotImplementedError(f"{type(self).__name__} must implement contrastive_loss(views).")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        views = gather_with_grad(self.embed_views(model, inputs), dim=1)
        loss, components = self.contrastive_loss(views)
        self.record_metrics(components)
        # Every process computes the full loss but back-propagates through its own slice only; DDP then
        # averages over processes, so the gradient is scaled back up by the world size.
        loss = scale_gradient(loss, world_size())
        return (loss, {"embeddings": views}) if return_outputs else loss

    # ------------------------------------------------------------------ logging of loss components
    def record_metrics(self, components: dict[str, torch.Tensor]) -> None:
        """Keep detached component values; they are averaged and logged with the next loss log (no host sync)."""
        mode = "train" if self.model.training else "eval"
        for name, value in components.items():
            self._metrics[f"{mode}/{name}"].append(value.detach())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metrics:
            for key, values in self._metrics.items():
                if key.startswith("train/"):
                    logs[key.removeprefix("train/")] = torch.stack(values).float().mean().item()
            self._metrics.clear()
        super().log(logs, start_time)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """STS-B dev Spearman x 100 of the current encoder as `{prefix}_stsb_spearman`, plus `extra_dev_metrics`
        (alignment and uniformity for every method) computed from the same single encode pass."""
        if self.dev_evaluator is None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        start = time.time()
        encoder = self.accelerator.unwrap_model(self.model)
        embeddings = self.dev_evaluator.embed(
            encoder, batch_size=self.args.per_device_eval_batch_size, bf16=self.args.bf16 or self.args.fp16
        )
        scores = self.dev_evaluator.score(embeddings)
        metrics = {f"{metric_key_prefix}_stsb_spearman": scores["STSBenchmark"]}
        metrics.update(self.extra_dev_metrics(encoder, metric_key_prefix, embeddings))
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def extra_dev_metrics(self, encoder, prefix: str, embeddings: np.ndarray) -> dict[str, float]:
        """More dev metrics from `embeddings` (`dev_evaluator.embed` output). The base reports STS-B dev alignment
        and uniformity (Wang & Isola 2020) as `{prefix}_alignment` / `{prefix}_uniformity`; a method adding
        its own metrics overrides this and merges `super().extra_dev_metrics(...)`."""
        values = sts_alignment_uniformity(self.dev_evaluator, embeddings)
        return {f"{prefix}_{name}": value for name, value in values.items()}
