"""The trainer's side of several training datasets (`hf_sentcl.data.mixing`): the data loader whose batches each come
from one dataset, the same dataset on every process at every step, and the loss of each dataset logged as
`loss_<name>` (averaged over that dataset's batches since the last log)."""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader
from transformers import TrainerCallback

from hf_sentcl.data.mixing import DATASET_INDEX, MixedBatchSampler, MixedViews


class SamplerEpoch(TrainerCallback):
    """Sets the mixed batch sampler's epoch at each epoch's start. The Trainer sets it itself on a fresh epoch, but
    not on the one it resumes in (the sampler then sits under accelerate's batch skipper), where the order must be
    that epoch's for the skipped batches to be the consumed ones."""

    def __init__(self, sampler: MixedBatchSampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(math.floor((state.epoch or 0) + 1e-6))


class MixedSources:
    """Mixin of `ContrastiveTrainer`: a `MixedViews` train_dataset trains through `MixedBatchSampler`."""

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        if not isinstance(dataset, MixedViews):
            return super().get_train_dataloader()
        args = self.args
        sampler = dataset.sampler(self._train_batch_size, args.world_size, args.seed)
        epochs = next((c for c in self.callback_handler.callbacks if isinstance(c, SamplerEpoch)), None)
        if epochs is None:
            self.add_callback(SamplerEpoch(sampler))
        else:
            epochs.sampler = sampler
        workers = args.dataloader_num_workers
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator, num_workers=workers,
                            pin_memory=args.dataloader_pin_memory,
                            persistent_workers=args.dataloader_persistent_workers and workers > 0)
        return self.accelerator.prepare(loader)

    def batch_source(self, inputs: dict) -> int | None:
        """Take the dataset index out of a mixed batch (None for a batch of one dataset's run)."""
        return inputs.pop(DATASET_INDEX, None)

    def record_source_loss(self, source: int | None, loss: torch.Tensor) -> None:
        """Log the batch's loss (unscaled for gradient accumulation) under its dataset's name."""
        if source is None:
            return
        name = self.train_dataset.names[source]
        self.record_metrics({f"loss_{name}": loss.detach() * getattr(self, "current_gradient_accumulation_steps", 1)})
