"""Labelled NLI sentence pairs (premise, hypothesis, label) for ConSERT's supervised settings, via `datasets`.

Three sources, named by one string:

- `senteval` (the SNLI folder of the SentEval data directory) or any folder in SentEval's SNLI layout:
  `s1.<split>`, `s2.<split>` and `labels.<split>`, one sentence / label per line;
- a `.csv`, `.tsv`, `.json` or `.jsonl` file with `premise`, `hypothesis` and `label` columns, local or on the Hub
  as `hf://datasets/ORG/NAME[@REVISION]/PATH` (read through the Hugging Face cache);
- anything else is a `datasets` id (e.g. `stanfordnlp/snli`, `nyu-mll/multi_nli`), with a config and splits.

Labels become 0 = entailment, 1 = neutral, 2 = contradiction (the SNLI/MNLI order on the Hub). String labels are
matched by name; integer labels are read through the dataset's `ClassLabel` names when it has them, else taken
as already in that order. Pairs without a gold label (SNLI's `-` / -1) are dropped.

A local or Hub file is checked like a `train_file` (`hf_sentcl.data.checks`): an unbalanced quote or a row with
more fields than the header is refused before any model loads, naming the file and line; invalid UTF-8, NUL bytes,
overlong texts, blank lines and rows with a missing premise, hypothesis or label are repaired or dropped and counted.
Every dropped pair, from any source, is counted in the stage's `train.data_cleaning` (results.json).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from datasets import ClassLabel, Dataset, concatenate_datasets, load_dataset
from transformers import PreTrainedTokenizerBase

from hf_sentcl.data.checks import check_data_file, scan_data_file
from hf_sentcl.data.cleaning import DataCleaning, max_text_chars
from hf_sentcl.data.collators import LabelledViewCollator
from hf_sentcl.data.corpus import (
    OwnDataSettings,
    clean_texts,
    drop_blank_rows,
    load_data_file,
    random_subset,
    tokenize_views,
)
from hf_sentcl.hub.download import HubFile, hub_file_path, is_hub_uri, resolve_data_dir

NLI_LABELS = ("entailment", "neutral", "contradiction")
NLI_TEXT_COLUMNS = ("premise", "hypothesis")
NO_GOLD_LABELS = ("-", "-1", -1)
SENTEVAL_SOURCE = "senteval"
TABLE_SUFFIXES = ("csv", "tsv", "json", "jsonl")  # NLI files are tables (premise, hypothesis, label)
SENTEVAL_FILES = ("s1", "s2", "labels")


@dataclass(frozen=True)
class NLISource:
    """A resolved NLI source: `kind` is 'senteval' (a folder), 'file' or 'dataset' (a `datasets` id)."""

    kind: str
    location: str
    splits: tuple[str, ...] = ("train",)
    config_name: str | None = None

    @property
    def description(self) -> str:
        splits = "" if self.kind == "file" else f" ({'+'.join(self.splits)})"
        return f"{self.kind} '{self.location}'{splits}"


def resolve_nli_source(
    source: str,
    splits: list[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    config_name: str | None = None,
) -> NLISource:
    """Decide what `source` (recipe key 'nli_source') names; `senteval` needs the SentEval data directory."""
    if not source:
        raise ValueError("key 'nli_source' is empty: give 'senteval', an SNLI-layout folder, a csv/jsonl file or a "
                         "`datasets` id.")
    if source == SENTEVAL_SOURCE:
        folder = resolve_data_dir(data_dir) / "SNLI"
        return NLISource("senteval", str(folder), tuple(splits or ("train",)))
    if is_hub_uri(source):
        HubFile.parse(source)  # a malformed address fails here, naming it
        if splits:
            raise ValueError(f"key 'nli_splits' does not apply to the file '{source}'; remove it.")
        return NLISource("file", source)
    path = Path(os.path.expandvars(source)).expanduser()
    suffix = path.suffix.lower().lstrip(".")
    if path.is_dir():
        return NLISource("senteval", str(path), tuple(splits or ("train",)))
    if suffix in TABLE_SUFFIXES or path.is_file() or source.startswith((".", "/", "~")):
        if splits:
            raise ValueError(f"key 'nli_splits' does not apply to the file '{path}'; remove it.")
        return NLISource("file", str(path))
    return NLISource("dataset", source, tuple(splits or ("train",)), config_name)


def check_nli_source(source: NLISource) -> Path | None:
    """Fail before any model loads when an NLI file is missing (a Hub file: not cached and not downloadable),
    naming it; returns the local path of a file source. `datasets` ids are not checked here: they resolve when
    loaded."""
    if source.kind == "file":
        if is_hub_uri(source.location):
            path = hub_file_path(HubFile.parse(source.location), "nli_source")
        else:
            path = Path(source.location)
            if not path.is_file():
                raise FileNotFoundError(f"NLI file '{path}' does not exist (recipe key 'nli_source').")
        if path.suffix.lower().lstrip(".") not in TABLE_SUFFIXES:
            raise ValueError(f"NLI file '{source.location}': unsupported extension (use .csv, .tsv, .json or .jsonl).")
        check_data_file(path, "NLI file")  # refused for an unbalanced quote, extra fields, not UTF-8 (line named)
        return path
    if source.kind == "senteval":
        for split in source.splits:
            for name in SENTEVAL_FILES:
                path = Path(source.location) / f"{name}.{split}"
                if not path.is_file():
                    raise FileNotFoundError(
                        f"NLI file '{path}' does not exist (recipe keys 'nli_source' / 'nli_splits'; SentEval's SNLI "
                        f"layout needs s1.<split>, s2.<split> and labels.<split>)."
                    )
    return None


def read_senteval_nli(folder: str | os.PathLike, split: str) -> Dataset:
    """One split of a SentEval SNLI folder as a Dataset with premise, hypothesis and (string) label columns."""
    folder = Path(folder)
    columns = {}
    for name, column in zip(SENTEVAL_FILES, (*NLI_TEXT_COLUMNS, "label")):
        lines = (folder / f"{name}.{split}").read_text(encoding="utf-8").splitlines()
        columns[column] = [line.strip() for line in lines]
    sizes = {column: len(values) for column, values in columns.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"{folder}: split '{split}' has files of different lengths {sizes} (s1, s2, labels).")
    return Dataset.from_dict(columns)


def label_ids(dataset: Dataset, where: str) -> Dataset:
    """Map the `label` column to 0/1/2 (entailment, neutral, contradiction), dropping pairs without a gold label."""
    names = {name: i for i, name in enumerate(NLI_LABELS)}
    values = list(dataset["label"])
    feature = dataset.features["label"]
    if isinstance(feature, ClassLabel):  # integer ids in the dataset's own order: go through its names
        values = [feature.names[v] if v >= 0 else "-" for v in values]

    def normalise(value):
        if isinstance(value, str):
            value = value.strip().lower()
            return names.get(value, int(value) if value.lstrip("-").isdigit() else value)
        return value

    values = [normalise(v) for v in values]
    keep = [i for i, v in enumerate(values) if v not in NO_GOLD_LABELS]
    bad = sorted({str(values[i]) for i in keep if values[i] not in (0, 1, 2)})
    if bad:
        raise ValueError(
            f"{where}: unknown NLI label(s) {bad[:5]}; use {', '.join(NLI_LABELS)} or 0/1/2 in that order "
            "('-' or -1 marks a pair without a gold label)."
        )
    dataset = dataset.select(keep).remove_columns("label")
    return dataset.add_column("label", [values[i] for i in keep])


def load_nli_pairs(source: NLISource, max_samples: int | None = None) -> Dataset:
    """premise / hypothesis / label (0, 1, 2) rows from `source`, splits concatenated in order, empty text dropped
    (`read_nli_pairs` without its account)."""
    return read_nli_pairs(source, max_samples)[0]


def read_nli_pairs(
    source: NLISource, max_samples: int | None = None, max_seq_length: int = 0
) -> tuple[Dataset, DataCleaning]:
    """premise / hypothesis / label (0, 1, 2) rows from `source`, splits concatenated in order, with the account of
    the rows dropped (blank, missing a value, without a gold label) and texts repaired (a file's defects; texts cut
    to `max_text_chars(max_seq_length)`), which is logged once."""
    local_file = check_nli_source(source)
    where = f"NLI {source.description}"
    scan = None
    if source.kind == "senteval":
        parts = [read_senteval_nli(source.location, split) for split in source.splits]
    elif source.kind == "file":
        scan = scan_data_file(local_file, "NLI file")
        parts = [load_data_file(local_file, scan)]
    else:
        parts = [load_dataset(source.location, source.config_name, split=split) for split in source.splits]
    dataset = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    missing = [c for c in (*NLI_TEXT_COLUMNS, "label") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{where} has no column(s) {missing}; it has {dataset.column_names} (needs premise, "
                         "hypothesis, label).")
    columns = (*NLI_TEXT_COLUMNS, "label")
    dataset = dataset.select_columns(list(columns))
    if scan is not None and scan.format == "csv":  # an empty label cell is a missing value too
        report = scan.cleaning(columns, max_text_chars(max_seq_length))
        report.source = where
        if is_hub_uri(source.location):
            report.file = source.location
        dataset = clean_texts(dataset, columns, report)
    else:
        rows_read = len(dataset)
        dataset = drop_blank_rows(dataset, NLI_TEXT_COLUMNS)
        report = DataCleaning.for_source(where, source.kind if scan is None else scan.format, rows_read, len(dataset))
        if scan is not None:
            report.file = source.location if is_hub_uri(source.location) else scan.path.name
    labelled = label_ids(dataset, where)
    report.drop("no_gold_label_rows_dropped", len(dataset) - len(labelled))
    dataset = labelled
    report.log()
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"{where} contains no labelled sentence pairs.")
    return dataset, report


@dataclass
class NLITrainData(OwnDataSettings):
    """Training data of a supervised stage: tokenised (premise, hypothesis) views plus labels.

    `check()` runs before any model loads; `build(tokenizer)` returns (dataset, number of text views, collator).
    """

    #: the recipe key that names this data (for results.json and the model card)
    source_key = "nli_source"

    source: NLISource
    #: set by `build`: what loading repaired and dropped (results.json's `train.data_cleaning`)
    cleaning: DataCleaning | None = field(default=None, init=False, compare=False)

    @property
    def description(self) -> str:
        """How results.json and the model card name the data."""
        return self.source.description

    def check(self) -> None:
        check_nli_source(self.source)

    def build(self, tokenizer: PreTrainedTokenizerBase) -> tuple[Dataset, int, LabelledViewCollator]:
        pairs, self.cleaning = read_nli_pairs(self.source, self.max_samples, self.max_seq_length)
        pairs = random_subset(pairs, self.subset_size, self.subset_seed)
        tokenized = tokenize_views(pairs, tokenizer, NLI_TEXT_COLUMNS, self.max_seq_length, self.num_proc)
        tokenized = tokenized.add_column("labels", pairs["label"])
        views = len(NLI_TEXT_COLUMNS)
        return tokenized, views, LabelledViewCollator(tokenizer, views, self.pad_to_multiple_of)
