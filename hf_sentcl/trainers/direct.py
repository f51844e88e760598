"""A method's trainer used directly, the way TRL's trainers are: a model id and a raw `datasets.Dataset` of text
columns, without a recipe, e.g. `SimCSETrainer(model="bert-base-uncased", args=SimCSEConfig(...),
train_dataset=Dataset.from_dict({"text": sentences}))`. The trainer builds the encoder and tokenises the columns
its method reads (`MethodSpec.text_columns`, and the `score_column` as labels) with the recipe's collators."""

from __future__ import annotations

from collections.abc import Callable

from datasets import Dataset

from hf_sentcl.data.collators import tokenized_views
from hf_sentcl.data.corpus import VIEW_PREFIX, method_columns, take_columns
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.registry import METHODS, MethodSpec

#: the token length of the raw texts a directly used trainer tokenises, unless it is given `max_seq_length`
DEFAULT_MAX_SEQ_LENGTH = 32


def method_of(trainer_class: type) -> MethodSpec:
    """The registered method whose trainer is `trainer_class` (or, for a subclass, its nearest registered base)."""
    for cls in trainer_class.__mro__:
        for spec in METHODS.values():
            if spec.trainer_path == f"{cls.__module__}.{cls.__qualname__}":
                return spec
    raise ValueError(f"{trainer_class.__name__} is the trainer of no registered method; register one "
                     "(docs/extending.md) or pass a tokenised train_dataset with its data_collator.")


def is_raw(dataset) -> bool:
    """Whether `dataset` holds texts rather than the tokenised views (`view0`, ...) a recipe run builds."""
    return isinstance(dataset, Dataset) and f"{VIEW_PREFIX}0" not in dataset.column_names


def prepare_raw_dataset(trainer_class: type, model, dataset: Dataset,
                        max_seq_length: int) -> tuple[Dataset, Callable]:
    """`dataset`'s text columns tokenised for `trainer_class`'s method, and their collator; ValueError naming the
    columns the method reads when the dataset lacks one."""
    spec = method_of(trainer_class)
    read = method_columns("train_dataset", dataset.column_names, spec.required_columns, spec.optional_text_columns,
                          reader=f"method '{spec.name}'")
    dataset = take_columns(dataset, read)  # sentence-transformers' names (anchor, positive, ...) read as the method's
    columns = spec.text_columns + tuple(c for c in spec.optional_text_columns if c in read)
    return tokenized_views(dataset, model.tokenizer, columns, max_seq_length, spec.score_column)


def direct_use(trainer_class: type, model, kwargs: dict, max_seq_length: int | None) -> SentenceEncoder:
    """A model id becomes a `SentenceEncoder` (its default pooling); a raw `train_dataset` without a
    `data_collator` is tokenised in `kwargs` (`prepare_raw_dataset`). Returns the model."""
    if isinstance(model, str):
        model = SentenceEncoder.from_backbone(model)
    dataset = kwargs.get("train_dataset")
    if dataset is not None and kwargs.get("data_collator") is None and is_raw(dataset):
        kwargs["train_dataset"], kwargs["data_collator"] = prepare_raw_dataset(
            trainer_class, model, dataset, max_seq_length or DEFAULT_MAX_SEQ_LENGTH)
    return model
