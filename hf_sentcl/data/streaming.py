"""`streaming: true`: training text read as a stream (`datasets.load_dataset(..., streaming=True)`), never held whole.

The stream of one run is a sequence of *global batches*: the source's rows, repaired and filtered row by row as the
file scan would (`StreamAccount`), shuffled in a bounded buffer (`buffer_size` rows; the order is a function of the
seed and the epoch only), cut into groups of `per_device_batch x processes` rows. Epochs follow each other without
end (`max_steps` ends training); the rows of an epoch's last, incomplete group are dropped and counted, so every
process gets the same number of batches and none waits for another at the end of the data.

Process `rank` trains on the `rank`-th slice of every global batch: the processes' examples are disjoint and together
cover each epoch once (less the dropped tail). Every process reads the whole stream (reading a line is cheap) and
tokenises only its own slice, in one batched tokenizer call per batch, with the same tokenisation and collator as the
pre-tokenised path (`tokenize_views`' settings, `ViewCollator`). DataLoader workers (`dataloader_num_workers`) take
the global batches in turn (worker w: batches w, w + workers, ...), which the DataLoader yields in order.

Position: after `n` optimizer steps (gradient accumulation `a`) every process has trained on global batches
`0 .. n*a - 1`; a resumed stream (`start_batch`) reads past those without tokenising them. `datasets`' own
`IterableDataset.state_dict()` does not save the shuffle buffer (its `load_state_dict` refills the buffer from the
rows after the saved position, so a restored shuffled stream differs from the uninterrupted one); replaying the
deterministic stream does not, at the cost of reading (not tokenising) the rows before the position again.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Features, Value, load_dataset
from datasets import IterableDataset as RowStream

from hf_sentcl.data.checks import FILE_BUILDERS
from hf_sentcl.data.corpus import _clean_text, locate_train_file, method_columns, view_ids

#: rows held by the shuffle buffer when `buffer_size` is not set (datasets' own default)
DEFAULT_BUFFER_SIZE = 10_000
#: rows read from the `datasets` stream at a time
READ_BATCH = 1_000
#: bytes a .txt/.jsonl file is read in (datasets' default, 10 MB, held ~150 MiB more at the peak than a 1 MB file)
READ_CHUNK_BYTES = 1 << 20


@dataclass
class StreamAccount:
    """What the stream repaired and dropped while it was read, counted row by row on the process's stream (the
    counts of the map-style path's `DataCleaning`, under the same names); `as_dict()` is results.json's
    `train.data_cleaning`. Counted where the rows are read: exact with `dataloader_num_workers: 0`, the default; with
    worker processes the rows are read there and `counted` is false."""

    source: str
    format: str
    max_chars_per_text: int
    rows_read: int = 0
    rows_kept: int = 0
    epochs_started: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {
        "blank_lines_dropped": 0, "missing_value_rows_dropped": 0, "invalid_utf8_lines_repaired": 0,
        "nul_lines_repaired": 0, "lines_truncated": 0, "epoch_tail_rows_dropped": 0})
    counted: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "streaming": True, "counted": self.counted,
                "rows_read": self.rows_read, "rows_kept": self.rows_kept, "epochs_started": self.epochs_started,
                **self.counts, "max_chars_per_text": self.max_chars_per_text}

    def clean(self, row: dict, columns: tuple[str, ...]) -> dict | None:
        """The row's `columns` repaired (NULs removed, overlong texts cut, as the file scan's loader does), or None
        (counted) when one of them is missing or blank."""
        self.rows_read += 1
        values = {}
        for column in columns:
            value = row.get(column)
            if value is None:
                self.counts["missing_value_rows_dropped"] += 1
                return None
            value = str(value)
            if "\ufffd" in value:
                self.counts["invalid_utf8_lines_repaired"] += 1
            if "\x00" in value:
                self.counts["nul_lines_repaired"] += 1
            if len(value.replace("\x00", "")) > self.max_chars_per_text:
                self.counts["lines_truncated"] += 1
            cleaned = _clean_text(value, self.max_chars_per_text)
            if not cleaned.strip():
                self.counts["blank_lines_dropped"] += 1
                return None
            values[column] = cleaned
        self.rows_kept += 1
        return values


def resolve_stream_file(path: str | None) -> str | None:
    """The local path a streamed `train_file` is read from, without reading it (the map-style check scans the whole
    file): `~` and `$VARS` expanded, an `hf://datasets/...` file from the Hugging Face cache (downloaded first when
    missing and online). FileNotFoundError naming the key when there is none."""
    if path is None:
        return None
    resolved = locate_train_file(path)
    if resolved.suffix.lower().lstrip(".") not in FILE_BUILDERS:
        raise FileNotFoundError(f"train_file '{resolved}': streaming reads {', '.join(sorted(FILE_BUILDERS))} files.")
    return str(resolved)


def stream_columns(stream: RowStream) -> list[str]:
    """A stream's columns: as its features declare them, else those of its first row (a text or JSON stream)."""
    return stream.column_names or list(next(iter(stream.take(1)), {}).keys())


def open_row_stream(train_file: str | None, dataset_name: str | None, config: str | None = None,
                    split: str = "train") -> tuple[RowStream, str, str]:
    """The source's rows as a `datasets` stream (`load_dataset(..., streaming=True)`), a description and its format:
    a local .txt/.csv/.tsv/.json(l) file (bad UTF-8 replaced by U+FFFD, CRLF read as LF, cells as text) or a Hub
    dataset id (its own format)."""
    if dataset_name is not None:
        return (load_dataset(dataset_name, config, split=split, streaming=True), f"dataset '{dataset_name}'",
                "dataset")
    suffix = train_file.rsplit(".", 1)[-1].lower()
    builder = FILE_BUILDERS[suffix]
    extra: dict[str, Any] = {}
    if builder in ("text", "csv"):
        extra["encoding_errors"] = "replace"
    if builder in ("text", "json"):
        extra["chunksize"] = READ_CHUNK_BYTES
    if builder == "csv":
        delimiter = "\t" if suffix == "tsv" else ","
        with open(train_file, encoding="utf-8", errors="replace", newline="") as file:  # the header line only
            header = next(csv.reader(file, delimiter=delimiter), [])
        extra.update(keep_default_na=False, na_filter=False, delimiter=delimiter,
                     features=Features({name: Value("string") for name in header}))
    stream = load_dataset(builder, data_files=train_file, split="train", streaming=True, **extra)
    return stream, f"train_file '{train_file}'", builder


@dataclass(frozen=True)
class StreamSplit:
    """How the stream is cut and shared: rows per process per batch, processes, this process, and the shuffle."""

    batch_size: int
    processes: int
    rank: int
    seed: int
    buffer_size: int

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.processes

    def mine(self, rows: list) -> list:
        """This process's slice of a global batch."""
        return rows[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def as_dict(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "processes": self.processes, "seed": self.seed,
                "buffer_size": self.buffer_size}


class StreamedViews(torch.utils.data.IterableDataset):
    """A process's tokenised examples of the stream (module docstring): dicts of `view0`, `view1`, ... token ids,
    the format of `tokenize_views`, for `ViewCollator`. No length: training needs `max_steps`."""

    def __init__(self, open_rows: Callable[[], RowStream], account: StreamAccount, columns: tuple[str, ...],
                 split: StreamSplit, tokenizer, max_seq_length: int, max_samples: int | None = None):
        super().__init__()
        self.open_rows, self.account, self.columns, self.split = open_rows, account, columns, split
        self.tokenizer, self.max_seq_length, self.max_samples = tokenizer, max_seq_length, max_samples
        #: global batches already trained on: read past, not tokenised (set on resume)
        self.start_batch = 0

    def epoch_rows(self, epoch: int) -> Iterator[dict]:
        """Epoch `epoch`'s repaired rows, in the buffer-shuffled order of (seed, epoch)."""
        stream = self.open_rows()
        if self.max_samples is not None:
            stream = stream.take(self.max_samples)
        stream = stream.shuffle(seed=self.split.seed, buffer_size=self.split.buffer_size)
        stream.set_epoch(epoch)
        self.account.epochs_started += 1
        # `iter(batch_size=...)`, not `iter(stream)`: in a DataLoader worker the latter reads only the shards that
        # datasets assigns to that worker (none but worker 0's for a one-file source); every worker reads it all here
        for batch in stream.iter(batch_size=READ_BATCH):
            for values in zip(*batch.values()):
                if (cleaned := self.account.clean(dict(zip(batch, values)), self.columns)) is not None:
                    yield cleaned

    def global_batches(self) -> Iterator[list[dict]]:
        """The endless sequence of global batches, epoch after epoch (an epoch's incomplete last one dropped)."""
        size, epoch = self.split.global_batch, 0
        while True:
            rows, batches = [], 0
            for row in self.epoch_rows(epoch):
                rows.append(row)
                if len(rows) == size:
                    yield rows
                    rows, batches = [], batches + 1
            self.account.counts["epoch_tail_rows_dropped"] += len(rows)
            if batches == 0:
                raise ValueError(f"{self.account.source}: fewer usable rows than one global batch of {size} "
                                 "(per-device batch x processes); add training text or lower the batch size.")
            epoch += 1

    def tokenised(self, rows: list[dict]) -> list[dict]:
        """`rows` tokenised into views (one batched tokenizer call per column), as `tokenize_views` does."""
        batch = {column: [row[column] for row in rows] for column in self.columns}
        views = view_ids(self.tokenizer, batch, self.columns, self.max_seq_length)
        return [{name: ids[k] for name, ids in views.items()} for k in range(len(rows))]

    def __iter__(self) -> Iterator[dict]:
        worker = torch.utils.data.get_worker_info()
        workers, me = (1, 0) if worker is None else (worker.num_workers, worker.id)
        for index, rows in enumerate(self.global_batches()):
            if index >= self.start_batch and (index - self.start_batch) % workers == me:
                yield from self.tokenised(self.split.mine(rows))


def stream_views(data_args, columns: tuple[str, ...], optional: tuple[str, ...], tokenizer, split: StreamSplit,
                 max_chars: int) -> tuple[StreamedViews, tuple[str, ...]]:
    """The recipe's text source as this process's `StreamedViews` of the method's `columns` (plus those of `optional`
    the source has), read through `method_columns`' rule; returns it with the columns it yields as views."""

    path = resolve_stream_file(data_args.train_file)

    def open_rows() -> RowStream:
        stream = open_row_stream(path, data_args.dataset_name, data_args.dataset_config_name,
                                 data_args.dataset_split)[0]
        return stream.rename_columns(renamed) if renamed else stream

    stream, source, kind = open_row_stream(path, data_args.dataset_name,
                                           data_args.dataset_config_name, data_args.dataset_split)
    available = stream_columns(stream)
    read_from = method_columns(source, available, columns, optional, data_args.text_column)
    renamed = {name: column for column, name in read_from.items() if column != name}
    views = columns + tuple(c for c in optional if c in available and c not in columns)
    account = StreamAccount(source, kind, max_chars)
    return StreamedViews(open_rows, account, views, split, tokenizer, data_args.max_seq_length,
                         data_args.max_train_samples), views
