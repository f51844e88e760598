"""Loading and pre-tokenising training text with `datasets` (tokenised once, cached between runs)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from datasets import Dataset, load_dataset
from transformers import PreTrainedTokenizerBase

from hf_sentcl.configs import DataArguments
from hf_sentcl.data.checks import FILE_BUILDERS, count_train_examples
from hf_sentcl.evaluation.sts import unlabeled_sts_sentences
from hf_sentcl.hub.download import HubFile, hub_file_path, is_hub_uri

VIEW_PREFIX = "view"


def check_train_file(path: str | None) -> Path | None:
    """Return the local path of the training file, or raise naming it when it cannot be had or holds no usable text.

    A local path has `~` and `$VARS` expanded and must exist; an `hf://datasets/ORG/NAME[@REVISION]/PATH` file is
    read from the Hugging Face cache, downloaded first when missing and not offline.
    """
    if path is None:
        return None
    if is_hub_uri(path):
        try:
            file = HubFile.parse(path)
        except ValueError as err:
            raise FileNotFoundError(f"train_file {err}") from None
        resolved = hub_file_path(file, "train_file")
    else:
        resolved = Path(os.path.expandvars(path)).expanduser()
        if not resolved.is_file():
            raise FileNotFoundError(f"train_file '{resolved}' does not exist (recipe key 'train_file').")
    count_train_examples(resolved)
    return resolved


#: the recipe keys that name training text; a recipe sets one of them
TEXT_SOURCES = ("train_file", "dataset_name", "unlabeled_sts")


def text_sources(data_args: DataArguments) -> list[str]:
    """The keys of `TEXT_SOURCES` that `data_args` sets."""
    return [k for k in TEXT_SOURCES if getattr(data_args, k) is not None]


def load_data_file(path: Path) -> Dataset:
    """A local .txt (one example per line), .csv, .tsv or .json(l) file as a Dataset (extension in FILE_BUILDERS)."""
    suffix = path.suffix.lower().lstrip(".")
    extra = {"delimiter": "\t"} if suffix == "tsv" else {}
    return load_dataset(FILE_BUILDERS[suffix], data_files=str(path), split="train", **extra)


def load_training_dataset(data_args: DataArguments, text_columns: tuple[str, ...]) -> Dataset:
    """Load the raw training examples with the given text columns (one column per view).

    `.txt` files give one sentence per line (blank lines dropped); `.csv`/`.json(l)` files and `datasets` ids
    must contain the requested columns.
    """
    sources = text_sources(data_args)
    if len(sources) != 1:
        raise ValueError(
            "Set exactly one source of training text: 'train_file', 'dataset_name' or 'unlabeled_sts' "
            f"(got {sources or 'none'})."
        )
    if data_args.unlabeled_sts is not None:
        if text_columns != ("text",):
            raise ValueError(f"unlabeled_sts gives single sentences; this method needs columns {text_columns}.")
        sentences = unlabeled_sts_sentences(data_args.sts_data_dir, data_args.unlabeled_sts)
        dataset = Dataset.from_dict({"text": sentences})
        source = f"unlabeled_sts '{data_args.unlabeled_sts}'"
    elif data_args.train_file is not None:
        path = check_train_file(data_args.train_file)
        dataset = load_data_file(path)
        source = f"train_file '{data_args.train_file if is_hub_uri(data_args.train_file) else path}'"
    else:
        dataset = load_dataset(data_args.dataset_name, data_args.dataset_config_name, split=data_args.dataset_split)
        source = f"dataset '{data_args.dataset_name}'"
    if text_columns == ("text",) and data_args.text_column != "text" and data_args.text_column in dataset.column_names:
        dataset = dataset.rename_column(data_args.text_column, "text")
    missing = [c for c in text_columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{source} has no column(s) {missing}; it has {dataset.column_names}.")
    dataset = dataset.filter(lambda row: all(row[c] and str(row[c]).strip() for c in text_columns))
    if data_args.max_train_samples is not None:
        dataset = dataset.select(range(min(data_args.max_train_samples, len(dataset))))
    dataset = random_subset(dataset, data_args.train_subset_size, data_args.train_subset_seed)
    if len(dataset) == 0:
        raise ValueError(f"{source} contains no usable (non-empty) training examples.")
    return dataset


def random_subset(dataset: Dataset, size: int | None, seed: int) -> Dataset:
    """`size` examples drawn uniformly without replacement by `seed` (the few-shot settings of ConSERT's section 5.3),
    in their original order; the dataset itself when `size` is None. The draw depends on the seed and the dataset's
    length only, so a method's own training data (NLI pairs) subsamples the same way; a size larger than the
    dataset is an error, not a silent full run."""
    if size is None:
        return dataset
    if size > len(dataset):
        raise ValueError(
            f"train_subset_size {size} is larger than the training data ({len(dataset)} examples); lower or unset it."
        )
    rows = np.random.default_rng(seed).choice(len(dataset), size=size, replace=False)
    return dataset.select(np.sort(rows))


def tokenize_views(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    text_columns: tuple[str, ...],
    max_seq_length: int,
    num_proc: int | None = None,
) -> Dataset:
    """Tokenise each text column into `view0`, `view1`, ... (token-id lists, unpadded, truncated)."""

    def tokenize(batch):
        return {
            f"{VIEW_PREFIX}{i}": tokenizer(batch[column], truncation=True, max_length=max_seq_length)["input_ids"]
            for i, column in enumerate(text_columns)
        }

    return dataset.map(
        tokenize,
        batched=True,
        num_proc=num_proc,
        remove_columns=dataset.column_names,
        desc="Tokenising training text",
    )


def add_length_column(dataset: Dataset, num_views: int, column: str = "length") -> Dataset:
    """Add each example's longest view (in tokens) as `column`.

    transformers' length-grouped samplers (`train_sampling_strategy: group_by_length` / `batch_rebalance`) read
    lengths from `length_column_name`; without it they look for an `input_ids` column, which view datasets do not
    have.
    """
    names = [f"{VIEW_PREFIX}{v}" for v in range(num_views)]
    missing = [n for n in names if n not in dataset.column_names]
    if missing:
        raise ValueError(
            f"add_length_column: the dataset has no view column(s) {missing}; it has {dataset.column_names}."
        )

    def lengths(batch):
        return {column: [max(map(len, views)) for views in zip(*(batch[n] for n in names))]}

    return dataset.map(lengths, batched=True, desc="Measuring view lengths")
