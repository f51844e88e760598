"""What a run builds from its recipe: the encoder and the tokenised training data with its collator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datasets import Dataset
from transformers import AutoConfig

from hf_sentcl.configs.sources import TrainingSource
from hf_sentcl.data import add_length_column
from hf_sentcl.data.cleaning import DataCleaning, max_text_chars
from hf_sentcl.data.collators import ViewCollator, tokenized_views
from hf_sentcl.data.corpus import LENGTH_SAMPLERS, load_training_data
from hf_sentcl.data.mixing import MixedCollator, MixedViews
from hf_sentcl.data.streaming import DEFAULT_BUFFER_SIZE, StreamSplit, stream_views
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.recipe.parser import Recipe
from hf_sentcl.recipe.plan import StagePlan, plan_run
from hf_sentcl.registry import get_method


def dropout_overrides(name_or_path: str, probability: float) -> dict[str, float]:
    """`from_pretrained` keyword arguments that set every dropout probability of the backbone's config."""
    config = AutoConfig.from_pretrained(resolve_model_name(name_or_path))
    return {key: probability for key, value in config.to_dict().items()
            if "dropout" in key and isinstance(value, float)}


def build_encoder(recipe: Recipe) -> SentenceEncoder:
    args = recipe.model
    load_kwargs = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    if args.dropout is not None:
        load_kwargs.update(dropout_overrides(args.model_name_or_path, args.dropout))
    encoder = SentenceEncoder.from_backbone(
        args.model_name_or_path,
        pooling=args.pooling,
        pooling_layer=args.pooling_layer,
        head=args.head,
        head_at_inference=args.head_at_inference,
        inference_pooling=args.inference_pooling,
        tokenizer_name=args.tokenizer_name,
        peft=args.peft,
        unpadded=args.unpadded,
        **load_kwargs,
    )
    dims = recipe.training.matryoshka_dims
    encoder.config.matryoshka_dims = sorted(dims, reverse=True) if dims else None  # scored before and after training
    return encoder


@dataclass
class TrainData:
    """A run's tokenised training data: the dataset, its number of text views, the collator, and the account of
    what loading repaired and dropped (results.json's `train.data_cleaning`; None for data that gives none)."""

    dataset: Dataset
    num_views: int
    collator: Callable
    data_cleaning: dict[str, Any] | None = None


def build_train_dataset(recipe: Recipe, tokenizer) -> tuple[Dataset, int, Callable]:
    """A one-stage recipe's training data, tokenised, without its checks (tests, benchmarks); returns the dataset, its
    number of text views and the collator."""
    data = build_train_data(plan_run(recipe).stages[-1], tokenizer)
    return data.dataset, data.num_views, data.collator


def build_train_data(stage: StagePlan, tokenizer) -> TrainData:
    """Load and tokenise a stage's training data (the method's own, or its text source's columns), with the account
    of the rows repaired and dropped on the way."""
    recipe, custom = stage.recipe, stage.train_data
    if custom is None and recipe.data.streaming:
        return streamed_train_data(stage, tokenizer)
    if custom is not None:
        dataset, num_views, collator = custom.build(tokenizer)
        cleaning = getattr(custom, "cleaning", None)  # a method's own data may account for itself (NLITrainData)
    elif len(stage.training_sources) > 1:
        return mixed_train_data(stage, tokenizer)
    else:
        dataset, num_views, collator, cleaning = source_views(recipe, stage.training_sources[0], tokenizer)
    if recipe.training.train_sampling_strategy in LENGTH_SAMPLERS:
        dataset = add_length_column(dataset, num_views, recipe.training.length_column_name)
    return TrainData(dataset, num_views, collator, cleaning.as_dict() if cleaning is not None else None)


def source_views(recipe: Recipe, source: TrainingSource, tokenizer) -> tuple[Dataset, int, Callable, DataCleaning]:
    """One training source's rows tokenised into the method's views: the dataset, its number of views, its collator
    and the account of the rows repaired and dropped."""
    spec = get_method(recipe.method)
    # optional columns the file has (hard_neg) are required in every row: a triplet without its hard negative
    # is dropped and counted rather than tokenised as None
    raw, cleaning = load_training_data(recipe.data, spec.required_columns, spec.optional_text_columns, source)
    columns = spec.text_columns + tuple(c for c in spec.optional_text_columns if c in raw.column_names)
    dataset, collator = tokenized_views(
        raw, tokenizer, columns, recipe.data.max_seq_length, spec.score_column, cleaning.source,
        recipe.data.preprocessing_num_workers, recipe.data.pad_to_multiple_of,
    )
    return dataset, len(columns), collator, cleaning


def mixed_train_data(stage: StagePlan, tokenizer) -> TrainData:
    """Several training sources, each tokenised on its own, drawn batch by batch (`hf_sentcl.data.mixing`); the
    account of what loading repaired and dropped is kept per dataset (`sources`, by name)."""
    built = [source_views(stage.recipe, source, tokenizer) for source in stage.training_sources]
    names = [source.name for source in stage.training_sources]
    dataset = MixedViews([b[0] for b in built], names, stage.recipe.data.mixing or "proportional")
    args = stage.args  # each dataset fills one draw (a Hub dataset's size is known only now): ValueError naming it
    dataset.sampler(args.per_device_train_batch_size, args.world_size)
    collator = MixedCollator([b[2] for b in built])
    cleaning = {"sources": {name: b[3].as_dict() for name, b in zip(names, built)}}
    return TrainData(dataset, max(b[1] for b in built), collator, cleaning)


def streamed_train_data(stage: StagePlan, tokenizer) -> TrainData:
    """`streaming: true`: this process's share of the text source as a stream (`hf_sentcl.data.streaming`), tokenised
    as it is read, with the collator of the pre-tokenised path; its data account fills as the stream is read."""
    recipe, spec = stage.recipe, get_method(stage.recipe.method)
    args = recipe.training
    split = StreamSplit(args.per_device_train_batch_size, max(args.world_size, 1), args.process_index,
                        args.data_seed if args.data_seed is not None else args.seed,
                        recipe.data.buffer_size or DEFAULT_BUFFER_SIZE)
    dataset, columns = stream_views(recipe.data, spec.required_columns, spec.optional_text_columns, tokenizer, split,
                                    max_text_chars(recipe.data.max_seq_length))
    collator = ViewCollator(tokenizer, num_views=len(columns), pad_to_multiple_of=recipe.data.pad_to_multiple_of)
    return TrainData(dataset, len(columns), collator, dataset.account)
