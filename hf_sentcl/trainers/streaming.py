"""The trainer's side of `streaming: true` (`hf_sentcl.data.streaming.StreamedViews`): its DataLoader, and the
stream position each checkpoint records and a resume restores.

DataLoader: the stream already gives each process its own slice of every global batch, so accelerate must not split
it again. `accelerator.prepare` would either dispatch (process 0 reads and broadcasts every batch: its default for an
iterable dataset) or wrap it in `IterableDatasetShard` (every process keeps 1/N of what it is given); the DataLoader
is therefore prepared as a one-process loader (device placement and accelerate's end-of-data tracking, no split).

Position: every checkpoint holds `stream_state_<rank>.json` per process (written with its RNG state, before the
completion mark): the global batches read, this process's slice of each, the split and the shuffle (seed, buffer).
A resume checks that the split and shuffle are the recipe's (another batch size, process count, seed or buffer would
point the position at other examples) and starts the stream after the recorded batches, reading past them without
tokenising them; Trainer's own fast-forward, which draws and collates every skipped batch, is bypassed.
"""

from __future__ import annotations

import json
from pathlib import Path

from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from hf_sentcl.data.streaming import StreamedViews

STREAM_STATE = "stream_state_{rank}.json"


class StreamPositionError(ValueError):
    """A checkpoint's stream position cannot be honoured by this run's stream."""


def stream_state(dataset: StreamedViews, steps: int, accumulation: int) -> dict:
    """What a checkpoint after `steps` optimizer steps records of this process's stream."""
    split = dataset.split
    read = steps * accumulation
    return {"global_batches_read": read, "rank": split.rank, "examples_trained": read * split.batch_size,
            "slice_of_each_global_batch": [split.rank * split.batch_size, (split.rank + 1) * split.batch_size],
            "split": split.as_dict(), "source": dataset.account.source}


def resume_position(checkpoint: str, dataset: StreamedViews, steps: int, accumulation: int) -> int:
    """The global batches to read past, from `checkpoint`'s record of this process's stream; StreamPositionError when
    it is missing or was written for another split or shuffle."""
    path = Path(checkpoint) / STREAM_STATE.format(rank=dataset.split.rank)
    if not path.is_file():
        raise StreamPositionError(f"resume_from_checkpoint '{checkpoint}' has no {path.name}: it was not written by "
                                  "a streamed run, so the stream position is unknown; resume with 'streaming: false' "
                                  "or start a new output_dir.")
    saved = json.loads(path.read_text())
    if saved["split"] != dataset.split.as_dict():
        raise StreamPositionError(
            f"resume_from_checkpoint '{checkpoint}': the stream was split and shuffled as {saved['split']}, this run "
            f"as {dataset.split.as_dict()}; the position would name other examples. Resume with the same "
            "per-device batch, processes, seed and buffer_size.")
    if saved["global_batches_read"] != steps * accumulation:
        raise StreamPositionError(f"{path}: {saved['global_batches_read']} global batches read at step {steps} "
                                  f"(expected {steps * accumulation}).")
    return saved["global_batches_read"]


class StreamingData:
    """Trainer mixin: the DataLoader of a `StreamedViews` train dataset and its position in checkpoints."""

    def get_train_dataloader(self):
        dataset = self.train_dataset
        if not isinstance(dataset, StreamedViews):
            return super().get_train_dataloader()
        args = self.args
        if args.dataloader_num_workers:
            dataset.account.counted = False  # the rows are read (and counted) in the worker processes
        loader = DataLoader(dataset, batch_size=self._train_batch_size, collate_fn=self.data_collator,
                            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
                            prefetch_factor=args.dataloader_prefetch_factor if args.dataloader_num_workers else None)
        return prepare_data_loader(loader, device=args.device, num_processes=1, process_index=0, put_on_device=True,
                                   dispatch_batches=False)

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if isinstance(self.train_dataset, StreamedViews):
            state = stream_state(self.train_dataset, self.state.global_step, self.args.gradient_accumulation_steps)
            path = Path(output_dir) / STREAM_STATE.format(rank=self.train_dataset.split.rank)
            path.write_text(json.dumps(state, indent=1) + "\n")

    def _run_epoch(self, *args, **kwargs):
        """A resumed stream starts after the batches its checkpoint records (Trainer's epoch of a length-less
        dataloader is the whole run, so there is one resumed epoch), read past without tokenising."""
        dataset, checkpoint = self.train_dataset, kwargs.get("resume_from_checkpoint")
        first = kwargs["epoch"] == kwargs["epochs_trained"]
        if isinstance(dataset, StreamedViews) and checkpoint is not None and first:
            accumulation = self.args.gradient_accumulation_steps
            dataset.start_batch = resume_position(checkpoint, dataset, self.state.global_step, accumulation)
            kwargs["steps_trained_in_current_epoch"] = 0
            self._stream_rng_from = checkpoint  # restored once the first batches are drawn (`get_batch_samples`)
        return super()._run_epoch(*args, **kwargs)

    def _load_rng_state(self, checkpoint):
        """Deferred for a resumed stream: `iter(dataloader)` draws a seed from torch's generator, which the
        uninterrupted run drew before its first step; the checkpoint's states must follow that draw, as they do
        after Trainer's own fast-forward."""
        if getattr(self, "_stream_rng_from", None) is None:
            super()._load_rng_state(checkpoint)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        if (checkpoint := getattr(self, "_stream_rng_from", None)) is not None:
            self._stream_rng_from = None
            self._load_rng_state(checkpoint)
        return batches
