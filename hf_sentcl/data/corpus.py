"""Loading and pre-tokenising training text with `datasets` (tokenised once, cached between runs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, Features, Value, load_dataset
from transformers import PreTrainedTokenizerBase

from hf_sentcl.configs import DataArguments
from hf_sentcl.configs.sources import TrainingSource, the_training_sources
from hf_sentcl.data.checks import FILE_BUILDERS, check_data_file, scan_data_file
from hf_sentcl.data.cleaning import DataCleaning, FileScan, max_text_chars
from hf_sentcl.evaluation.sts import unlabeled_sts_sentences
from hf_sentcl.hub.download import HubFile, hub_file_path, is_hub_uri

VIEW_PREFIX = "view"

logger = logging.getLogger("hf_sentcl")


def check_train_file(path: str | None) -> Path | None:
    """Return the local path of the training file, or raise naming it when it cannot be had, holds no usable text
    or is refused for a defect that loading cannot safely repair (`hf_sentcl.data.checks`: the file and line named).

    A local path has `~` and `$VARS` expanded and must exist; an `hf://datasets/ORG/NAME[@REVISION]/PATH` file is
    read from the Hugging Face cache, downloaded first when missing and not offline.
    """
    if path is None:
        return None
    resolved = locate_train_file(path)
    check_data_file(resolved, "train_file")
    return resolved


def locate_train_file(path: str) -> Path:
    """The local path of a `train_file` value, without reading it: `~` and `$VARS` expanded for a local file (which
    must exist), an `hf://datasets/...` file from the Hugging Face cache (downloaded first when missing and online).
    FileNotFoundError naming the key when there is none."""
    if is_hub_uri(path):
        try:
            file = HubFile.parse(path)
        except ValueError as err:
            raise FileNotFoundError(f"train_file {err}") from None
        return hub_file_path(file, "train_file")
    resolved = Path(os.path.expandvars(path)).expanduser()
    if not resolved.is_file():
        raise FileNotFoundError(f"train_file '{resolved}' does not exist (recipe key 'train_file').")
    return resolved


#: sentence-transformers' column names, read where a method's own (sent0, sent1, hard_neg) are absent
ST_COLUMNS = {"sent0": "anchor", "sent1": "positive", "hard_neg": "negative"}


def mapped_columns(
    source: str,
    available: Sequence[str],
    text_columns: tuple[str, ...],
    optional_columns: tuple[str, ...],
    mapping: dict[str, str],
    reader: str,
) -> dict[str, str]:
    """The source column of each method column a source's `columns` mapping names, and of each text or optional column
    the source lacks under its own name but has under sentence-transformers' (`ST_COLUMNS`). ValueError naming the
    source when the mapping names a column the method does not read or one the source does not have."""
    readable = text_columns + optional_columns
    if unread := [c for c in mapping if c not in readable]:
        raise ValueError(f"{source}: 'columns' maps {', '.join(map(repr, unread))}, which {reader} does not read; it "
                         f"reads {', '.join(map(repr, readable))}.")
    if absent := [f"'{c}' -> '{s}'" for c, s in mapping.items() if s not in available]:
        has = ", ".join(f"'{c}'" for c in available) or "none"
        raise ValueError(f"{source}: 'columns' maps {', '.join(absent)}, but it has no such column: its columns "
                         f"are {has}. Fix the entry's 'columns'.")
    read = dict(mapping)
    for column in readable:
        alias = ST_COLUMNS.get(column)
        if column not in read and column not in available and alias in available:
            read[column] = alias
    return read


def method_columns(
    source: str,
    available: Sequence[str],
    text_columns: tuple[str, ...],
    optional_columns: tuple[str, ...] = (),
    text_column: str = "text",
    reader: str = "the method",
    mapping: dict[str, str] | None = None,
) -> dict[str, str]:
    """The source column each of a method's `text_columns` (and of the `optional_columns` it can have) is read from:
    the one the source's `mapping` names (a list entry's `columns`), else itself, else sentence-transformers' name for
    it (`anchor`, `positive`, `negative`), except that a one-sentence method (`("text",)`) reads `text_column` when
    the source has that column. ValueError naming the source, the columns it has, the ones `reader` needs and the
    fix when one is missing.

    The one rule for a training source's columns: checked before any model loads for a local .txt/.csv/.tsv file
    (`check_train_columns`, from its header) and when the data loads (`load_training_data`) for every source."""
    available = list(available)
    read = mapped_columns(source, available, text_columns, optional_columns, mapping or {}, reader)
    if text_columns == ("text",) and "text" not in read and text_column != "text" and text_column in available:
        return {"text": text_column}
    missing = [c for c in text_columns if c not in available and c not in read]
    if not missing:
        return {c: read.get(c, c) for c in text_columns + optional_columns if c in read or c in available}
    needs = ", ".join(f"'{c}'" for c in text_columns)
    if text_columns == ("text",):
        needs += f" (or '{text_column}', key 'text_column')" if text_column != "text" else " (or set key 'text_column')"
    if optional_columns:
        needs += " and, where present, " + ", ".join(f"'{c}'" for c in optional_columns)
    has = ", ".join(f"'{c}'" for c in available) or "none"
    named = ", ".join(f"'{c}'" for c in missing)
    raise ValueError(
        f"{source} has no column{'s' if len(missing) > 1 else ''} {named}: its columns are {has}, and {reader} "
        f"reads {needs}. Name the columns so in the file's header (line 1 of a .csv/.tsv, the keys of a .jsonl), "
        "map them with a list entry's 'columns' (e.g. {sent0: premise, sent1: hypothesis}), or use the method that "
        "fits the file."
    )


def check_train_columns(
    path: Path,
    text_columns: tuple[str, ...],
    optional_columns: tuple[str, ...] = (),
    text_column: str = "text",
    reader: str = "the method",
    score_column: str | None = None,
    mapping: dict[str, str] | None = None,
) -> None:
    """Before any model loads: the local training file `path` has the columns the method reads (`method_columns`,
    from the header its scan read: a .txt file's one column is `text`), and a number in its `score_column` on every
    row (`float_scores`). A .json(l) file's keys are read from its first record (`first_row_columns`)."""
    scan = scan_data_file(path)
    header = scan.header if scan.format in ("text", "csv") else first_row_columns("json", data_files=str(path))
    read = method_columns(f"train_file '{path}'", header, text_columns, optional_columns, text_column, reader, mapping)
    if scan.format == "csv" and score_column is not None:
        float_scores(load_data_file(path, scan), read[score_column], f"train_file '{path}'", first_line=2)


def first_row_columns(path: str, name: str | None = None, split: str = "train", **kwargs: Any) -> list[str]:
    """The columns of a dataset (a Hub id, a local folder, or a builder with its `data_files`) read from its first
    example, streamed: what `method_columns` checks before any model loads, without loading the data (a JSON file's
    keys and a Hub dataset's columns are otherwise known only once it has loaded). Empty when it has no example."""
    stream = load_dataset(path, name, split=split, streaming=True, **kwargs)
    return list(next(iter(stream), {}))


#: the recipe keys that name training text; a recipe sets one of them
TEXT_SOURCES = ("train_file", "dataset_name", "unlabeled_sts")


def text_sources(data_args: DataArguments) -> list[str]:
    """The keys of `TEXT_SOURCES` that `data_args` sets."""
    return [k for k in TEXT_SOURCES if getattr(data_args, k) is not None]


def load_data_file(path: Path, scan: FileScan | None = None) -> Dataset:
    """A local .txt (one example per line), .csv, .tsv or .json(l) file as a Dataset (extension in FILE_BUILDERS),
    read as `scan` (by default `scan_data_file(path)`) found it: bad UTF-8 sequences replaced by U+FFFD when it
    found some, and table cells read as strings, an empty cell as "" (pandas would read "NA", "null" or "None" as
    missing, and "1" as a number). Still cached by `datasets` per file version and these settings."""
    scan = scan or scan_data_file(path)
    builder = FILE_BUILDERS[path.suffix.lower().lstrip(".")]
    extra = {}
    if builder == "csv":
        extra = {"keep_default_na": False, "na_filter": False,
                 "features": Features({name: Value("string") for name in scan.header})}
        if path.suffix.lower() == ".tsv":
            extra["delimiter"] = "\t"
    if scan.invalid_utf8[0] and builder in ("text", "csv"):
        extra["encoding_errors"] = "replace"
    return load_dataset(builder, data_files=str(path), split="train", **extra)


def clean_texts(dataset: Dataset, columns: tuple[str, ...], report: DataCleaning) -> Dataset:
    """Remove NUL bytes from and cut overlong texts in `columns` (only when `report` counted some), then drop the
    rows with a blank or missing text in any of them (a batched, cached `datasets` pass each)."""
    if report.counts.get("nul_lines_repaired") or report.counts.get("lines_truncated"):
        dataset = dataset.map(_clean_batch, batched=True, fn_kwargs={"columns": columns,
                              "max_chars": report.max_chars_per_text}, desc="Repairing training text")
    if report.rows_kept != report.rows_read:
        dataset = drop_blank_rows(dataset, columns)
    return dataset


def drop_blank_rows(dataset: Dataset, columns: tuple[str, ...]) -> Dataset:
    """The rows whose `columns` all hold some non-blank text."""
    return dataset.filter(_keep_batch, batched=True, fn_kwargs={"columns": columns}, desc="Dropping blank rows")


def _clean_batch(batch: dict, columns: tuple[str, ...], max_chars: int) -> dict:
    return {c: [_clean_text(value, max_chars) for value in batch[c]] for c in columns}


def _clean_text(value: str | None, max_chars: int) -> str | None:
    """NULs removed; a text longer than `max_chars` stripped and cut to `max_chars` (as `FileScan` counts them)."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "")
    return value.strip()[:max_chars] if len(value) > max_chars else value


def _keep_batch(batch: dict, columns: tuple[str, ...]) -> list[bool]:
    return [all(v is not None and str(v).strip() for v in values) for values in zip(*(batch[c] for c in columns))]


def load_training_dataset(data_args: DataArguments, text_columns: tuple[str, ...]) -> Dataset:
    """Load the raw training examples with the given text columns (one column per view); see `load_training_data`,
    whose account of repaired and dropped rows this logs."""
    return load_training_data(data_args, text_columns)[0]


def load_training_data(
    data_args: DataArguments, text_columns: tuple[str, ...], optional_columns: tuple[str, ...] = (),
    source: TrainingSource | None = None,
) -> tuple[Dataset, DataCleaning]:
    """Load the raw training examples of `source` (by default the recipe's one training source): the columns
    `text_columns` plus those of `optional_columns` the source has (e.g. supervised SimCSE's `hard_neg`), every one of
    them required in each kept row, read under the names `method_columns` gives (a list entry's `columns`,
    sentence-transformers' names). Returns them with the account of what loading repaired and dropped (results.json's
    `train.data_cleaning`), which is logged once.

    `.txt` files give one sentence per line; `.csv`/`.json(l)` files and `datasets` ids must contain the requested
    columns. Defects of a local file are repaired, dropped or refused as `hf_sentcl.data.checks` says; rows without
    text are dropped (and counted) from every source. `max_train_samples` and `train_subset_size` apply per source.
    """
    source = source or the_one_source(data_args)
    dataset, described, scan = _raw_training_data(data_args, source, text_columns)
    read_from = method_columns(described, dataset.column_names, text_columns, optional_columns,
                               data_args.text_column, mapping=source.column_map)
    dataset = take_columns(dataset, read_from)
    columns = tuple(read_from)
    hub_file = source.key == "train_file" and is_hub_uri(source.location)
    if scan is not None and scan.format in ("text", "csv"):
        file_columns = None if scan.format == "text" else tuple(read_from[c] for c in columns)
        report = scan.cleaning(file_columns, max_text_chars(data_args.max_seq_length))
        report.source = described
        if hub_file:
            report.file = source.location
        dataset = clean_texts(dataset, columns, report)
        if len(dataset) != report.rows_kept:  # the check and the loader parsed the file differently: say so
            logger.warning("%s: loading kept %d rows where the check counted %d.", described, len(dataset),
                           report.rows_kept)
            report.rows_kept = len(dataset)
    else:
        rows_read = len(dataset)
        dataset = drop_blank_rows(dataset, columns)
        kind = "dataset" if source.key == "dataset_name" else "unlabeled_sts"
        report = DataCleaning.for_source(described, kind if scan is None else scan.format, rows_read, len(dataset))
        if scan is not None:
            report.file = source.location if hub_file else scan.path.name
    report.log()
    if data_args.max_train_samples is not None:
        dataset = dataset.select(range(min(data_args.max_train_samples, len(dataset))))
    dataset = random_subset(dataset, data_args.train_subset_size, data_args.train_subset_seed)
    if len(dataset) == 0:
        raise ValueError(f"{described} contains no usable (non-empty) training examples.")
    return dataset, report


def the_one_source(data_args: DataArguments) -> TrainingSource:
    """The recipe's training source where it has one (`the_training_sources`); ValueError for several (a mixed run
    loads each one by one)."""
    sources = the_training_sources(data_args)
    if len(sources) != 1:
        raise ValueError(f"the recipe names {len(sources)} datasets; load each of them (`source=`) and mix them "
                         "(`hf_sentcl.data.mixing`).")
    return sources[0]


def take_columns(dataset: Dataset, read_from: dict[str, str]) -> Dataset:
    """`dataset` with only the columns `read_from` names (method column -> the dataset's), under the method's names:
    renamed where each dataset column feeds one method column, copied where one feeds several ({sent0: text,
    sent1: text})."""
    if len(set(read_from.values())) == len(read_from):
        for column, name in read_from.items():
            if column != name:
                dataset = dataset.rename_column(name, column)
        return dataset.select_columns(list(read_from))
    return dataset.map(lambda batch: {c: batch[name] for c, name in read_from.items()}, batched=True,
                       remove_columns=dataset.column_names, desc="Mapping columns")


def _raw_training_data(
    data_args: DataArguments, source: TrainingSource, text_columns: tuple[str, ...]
) -> tuple[Dataset, str, FileScan | None]:
    """The source's rows as read, its description, and the file's scan (None for other sources)."""
    if source.key == "unlabeled_sts":
        if text_columns != ("text",):
            raise ValueError(f"unlabeled_sts gives single sentences; this method needs columns {text_columns}.")
        sentences = unlabeled_sts_sentences(data_args.sts_data_dir, source.location)
        return Dataset.from_dict({"text": sentences}), f"unlabeled_sts '{source.location}'", None
    if source.key == "train_file":
        path = check_train_file(source.location)
        scan = scan_data_file(path)
        described = f"train_file '{source.location if is_hub_uri(source.location) else path}'"
        return load_data_file(path, scan), described, scan
    dataset = load_dataset(source.location, source.config, split=source.split)
    return dataset, f"dataset '{source.location}'", None


def float_scores(dataset: Dataset, column: str, source: str, first_line: int | None = None) -> list[float]:
    """The values of a numeric `column` (a method's `score_column`, e.g. a gold similarity) as floats; ValueError
    naming the source, the column and the first value that is not a finite number (table cells are read as text).
    With `first_line` (a file's rows as read: the line of row 0) rows are named by line and blank cells pass (the
    loader drops such rows and counts them); otherwise by example number."""
    scores = []
    for row, value in enumerate(dataset[column]):
        if first_line is not None and (value is None or not str(value).strip()):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not np.isfinite(number):
            where = f"line {row + first_line}" if first_line is not None else f"example {row + 1}"
            raise ValueError(f"{source}: column '{column}' must hold a number in every row; {where} has {value!r}. "
                             "Fix or remove that row.")
        scores.append(number)
    return scores


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


@dataclass(kw_only=True)
class OwnDataSettings:
    """The data keys a method's own training data honours (a data hook of `MethodSpec.train_data_path`, e.g. NLI
    pairs or a SentEval split), as the plain loader does: length, a cap, a seeded subset, workers, padding."""

    max_seq_length: int
    max_samples: int | None = None
    num_proc: int | None = None
    pad_to_multiple_of: int | None = None
    #: `train_subset_size` / `train_subset_seed`: a seeded random subset of the pairs (see `random_subset`)
    subset_size: int | None = None
    subset_seed: int = 0

    @staticmethod
    def of(data_args: DataArguments) -> dict[str, Any]:
        """The keyword arguments these fields take from a recipe's data arguments."""
        return dict(max_seq_length=data_args.max_seq_length, max_samples=data_args.max_train_samples,
                    num_proc=data_args.preprocessing_num_workers, pad_to_multiple_of=data_args.pad_to_multiple_of,
                    subset_size=data_args.train_subset_size, subset_seed=data_args.train_subset_seed)


def view_ids(tokenizer: PreTrainedTokenizerBase, batch: dict[str, list[str]], text_columns: Sequence[str],
             max_seq_length: int) -> dict[str, list[list[int]]]:
    """A batch's text columns as views `view0`, `view1`, ...: token ids, truncated, unpadded. The one tokenisation
    of training text, pre-tokenised (`tokenize_views`) or streamed (`hf_sentcl.data.streaming`)."""
    # ids only: the attention mask and token types are rebuilt per batch by the collator (and skipping them here
    # takes about a sixth off tokenising a large corpus)
    return {
        f"{VIEW_PREFIX}{i}": tokenizer(batch[column], truncation=True, max_length=max_seq_length,
                                       return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        for i, column in enumerate(text_columns)
    }


def tokenize_views(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    text_columns: tuple[str, ...],
    max_seq_length: int,
    num_proc: int | None = None,
) -> Dataset:
    """Tokenise each text column into `view0`, `view1`, ... (token-id lists, unpadded, truncated)."""
    return dataset.map(
        lambda batch: view_ids(tokenizer, batch, text_columns, max_seq_length),
        batched=True,
        num_proc=num_proc,
        remove_columns=dataset.column_names,
        desc="Tokenising training text",
    )


#: transformers' samplers that batch examples by length (they need a length column; a mixed run draws each batch
#: from one dataset instead)
LENGTH_SAMPLERS = ("group_by_length", "batch_rebalance")


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
