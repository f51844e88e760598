"""Several training datasets in one run: every batch drawn from ONE dataset (in-batch negatives from another dataset
are trivially easy to tell apart), in the order of sentence-transformers' `MultiDatasetBatchSamplers`:

- `proportional`: every full batch of every dataset once per epoch, in a random order, so each dataset is drawn in
  proportion to its size (`ProportionalBatchSampler`);
- `round_robin`: one batch of each dataset in turn, stopping when the smallest runs out (`RoundRobinBatchSampler`).

Multi-process: the in-batch negatives are gathered over the processes, so every process must draw from the same
dataset at the same step. accelerate shards a batch sampler by giving process k the batches k, k+n, k+2n, ...
(`BatchSamplerShard`, split_batches false), so `MixedBatchSampler` yields its batches in groups of `group` (the
number of processes) consecutive batches from one dataset: one draw of group x batch examples per step.

The order depends only on the seed and the epoch (`set_epoch`), so a run resumed from a checkpoint (the Trainer skips
the epoch's consumed batches) replays the same order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from datasets import Dataset
from torch.utils.data import Dataset as TorchDataset

from hf_sentcl.configs.sources import MIXING_POLICIES

#: the key of a mixed batch that says which dataset it came from (an int, taken out by the trainer)
DATASET_INDEX = "dataset_index"


class MixedBatchSampler:
    """Batches of `batch_size` indices into the concatenation of datasets of `sizes`, each from one dataset, in
    groups of `group` consecutive batches from the same dataset (one per process), ordered by `policy` (module
    docstring) with a generator seeded by (`seed`, epoch)."""

    drop_last = True  # a dataset's last, partial draw is left out (as sentence-transformers' samplers do)

    def __init__(self, sizes: Sequence[int], batch_size: int, policy: str = "proportional", seed: int = 0,
                 group: int = 1, names: Sequence[str] | None = None):
        if policy not in MIXING_POLICIES:
            raise ValueError(f"mixing must be one of {', '.join(MIXING_POLICIES)}; got '{policy}'.")
        self.sizes, self.batch_size, self.policy = list(sizes), batch_size, policy
        self.seed, self.group, self.epoch = seed, max(group, 1), 0
        self.names = list(names) if names is not None else [str(i) for i in range(len(self.sizes))]
        self.offsets = np.cumsum([0] + self.sizes[:-1]).tolist()
        draw = self.batch_size * self.group
        if small := [f"'{n}' ({s} examples)" for n, s in zip(self.names, self.sizes) if s < draw]:
            raise ValueError(
                f"mixing '{policy}' draws whole batches of {draw} examples (per-device batch {batch_size} x "
                f"{self.group} process(es)) from each dataset; {', '.join(small)} cannot fill one. Add data to it, "
                "remove it from the list, or lower the batch size."
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @property
    def draws(self) -> list[int]:
        """Whole draws (steps) per dataset in one epoch."""
        return [size // (self.batch_size * self.group) for size in self.sizes]

    def order(self, rng: np.random.Generator | None = None) -> list[int]:
        """The dataset of each step of the epoch."""
        draws = self.draws
        if self.policy == "round_robin":
            return list(range(len(draws))) * min(draws)
        rng = rng or self.generator()
        steps = np.repeat(np.arange(len(draws)), draws)
        return rng.permutation(steps).tolist()

    def generator(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    def __iter__(self) -> Iterator[list[int]]:
        rng = self.generator()
        order = self.order(rng)
        permutations = [rng.permutation(size) + offset for size, offset in zip(self.sizes, self.offsets)]
        taken = [0] * len(self.sizes)
        for dataset in order:
            for _ in range(self.group):
                start = taken[dataset]
                taken[dataset] += self.batch_size
                yield permutations[dataset][start:start + self.batch_size].tolist()

    def __len__(self) -> int:
        return len(self.order()) * self.group


class MixedViews(TorchDataset):
    """The tokenised datasets of a mixed run, indexed as one concatenation (what `MixedBatchSampler` draws from);
    each example carries the index of its dataset (`DATASET_INDEX`)."""

    def __init__(self, datasets: Sequence[Dataset], names: Sequence[str], policy: str):
        self.datasets, self.names, self.policy = list(datasets), list(names), policy
        self.sizes = [len(d) for d in self.datasets]
        self.offsets = np.cumsum([0] + self.sizes[:-1]).tolist()

    def __len__(self) -> int:
        return sum(self.sizes)

    def sampler(self, batch_size: int, processes: int, seed: int = 0) -> MixedBatchSampler:
        """The batch sampler that draws from these datasets by their policy: ValueError naming a dataset that
        cannot fill one draw of `batch_size` x `processes` examples."""
        return MixedBatchSampler(self.sizes, batch_size, self.policy, seed=seed, group=max(processes, 1),
                                 names=self.names)

    def locate(self, index: int) -> tuple[int, int]:
        dataset = bisect.bisect_right(self.offsets, index) - 1
        return dataset, index - self.offsets[dataset]

    def __getitem__(self, index: int) -> dict:
        dataset, row = self.locate(index)
        return {**self.datasets[dataset][row], DATASET_INDEX: dataset}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        located = [self.locate(i) for i in indices]
        datasets = {d for d, _ in located}
        if len(datasets) != 1:
            return [self[i] for i in indices]
        dataset = datasets.pop()
        rows = self.datasets[dataset][[row for _, row in located]]
        return [{**{k: rows[k][i] for k in rows}, DATASET_INDEX: dataset} for i in range(len(indices))]


class MixedCollator:
    """Collates a batch of one dataset with that dataset's own collator (datasets may have different views, e.g.
    triplets beside pairs), and adds the dataset's index as `DATASET_INDEX`."""

    def __init__(self, collators: Sequence[Callable]):
        self.collators = list(collators)

    def __call__(self, features: list[dict]) -> dict:
        indices = {f[DATASET_INDEX] for f in features}
        if len(indices) != 1:
            raise ValueError(f"a mixed batch holds examples of datasets {sorted(indices)}; every batch must come from "
                             "one (use MixedBatchSampler).")
        index = indices.pop()
        batch = self.collators[index]([{k: v for k, v in f.items() if k != DATASET_INDEX} for f in features])
        batch[DATASET_INDEX] = index
        return batch
