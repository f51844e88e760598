"""AnglE's training pairs from a SentEval STS train split with its gold scores (`sts_train`): the paper's in-domain
STS setting, available offline wherever the evaluation data is. Pairs from a file or a `datasets` id need no hook:
the registry's `score_column` makes the plain loader keep their `score`."""

from __future__ import annotations

from dataclasses import dataclass

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from hf_sentcl.data.collators import LabelledViewCollator, tokenized_views
from hf_sentcl.data.corpus import OwnDataSettings, random_subset
from hf_sentcl.evaluation.sts import load_sts_task
from hf_sentcl.hub.download import resolve_data_dir

#: `sts_train` value -> (SentEval task, the split read)
STS_TRAIN_SPLITS = {"stsb": ("STSBenchmark", "train"), "sickr": ("SICKRelatedness", "train")}
PAIR_COLUMNS = ("sent0", "sent1")


@dataclass
class STSTrainPairs(OwnDataSettings):
    """A SentEval STS train split as (sent0, sent1) views with float `labels` (the gold scores). `check()` runs before
    any model loads; `build(tokenizer)` returns (dataset, number of text views, collator)."""

    #: the recipe key that names this data (for results.json and the model card)
    source_key = "sts_train"

    which: str
    data_dir: str | None
    cleaning = None  # SentEval's files are read by the evaluation's strict reader: nothing is repaired

    @property
    def description(self) -> str:
        task, split = STS_TRAIN_SPLITS[self.which]
        return f"SentEval {task} {split}"

    def pairs(self) -> Dataset:
        task, split = STS_TRAIN_SPLITS[self.which]
        pairs = load_sts_task(resolve_data_dir(self.data_dir), task, split)[split]
        rows = Dataset.from_dict({"sent0": pairs.sentences1, "sent1": pairs.sentences2, "labels": pairs.scores})
        if self.max_samples is not None:
            rows = rows.select(range(min(self.max_samples, len(rows))))
        return random_subset(rows, self.subset_size, self.subset_seed)

    def check(self) -> None:
        self.pairs()  # the data folder resolves and the split reads, or the error names the file

    def build(self, tokenizer: PreTrainedTokenizerBase) -> tuple[Dataset, int, LabelledViewCollator]:
        dataset, collator = tokenized_views(self.pairs(), tokenizer, PAIR_COLUMNS, self.max_seq_length, "labels",
                                            self.description, self.num_proc, self.pad_to_multiple_of)
        return dataset, len(PAIR_COLUMNS), collator


def angle_train_data(recipe) -> STSTrainPairs | None:
    """The STS train split named by `sts_train`; None for a `train_file` / `dataset_name` of scored pairs."""
    which = recipe.training.sts_train
    if which is None:
        return None
    return STSTrainPairs(which, recipe.data.sts_data_dir, **STSTrainPairs.of(recipe.data))
