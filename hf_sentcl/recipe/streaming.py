"""The recipe checks of `streaming: true`, before any model loads: what a stream can honour, and its source's columns.

A stream has no length, so nothing that needs the corpus size can be derived: a streamed run needs `max_steps`
(the learning-rate schedule, warm-up ratio and progress are over max_steps), and epoch-based strategies, a random
subset of the data and length-grouped samplers (which index the whole data) are refused naming the key. Reading a
stream's first rows is cheap, so the columns are checked here as the map-style path checks a file's header; the
per-line repairs and drops happen as the stream is read (`hf_sentcl.data.streaming.StreamAccount`).
"""

from __future__ import annotations

from hf_sentcl.data.corpus import LENGTH_SAMPLERS, method_columns
from hf_sentcl.data.streaming import open_row_stream, resolve_stream_file, stream_columns
from hf_sentcl.recipe.parser import RecipeError
from hf_sentcl.recipe.plan import RunPlan


def streaming_refusal(plan: RunPlan) -> str | None:
    """Why the recipe cannot stream, naming the key and the fix; None when it can (or does not stream)."""
    recipe = plan.recipe
    data, training = recipe.data, recipe.training
    if not data.streaming:
        return None
    if getattr(data, "mixing", None) or len(plan.training_sources) > 1 or isinstance(data.train_file, list | tuple):
        return ("key 'streaming' with several datasets ('mixing'): not yet supported; stream one train_file or "
                "dataset_name, or set 'streaming: false'.")
    if data.unlabeled_sts is not None or plan.own_data_only or any(s.train_data is not None for s in plan.stages):
        return ("key 'streaming' reads 'train_file' or 'dataset_name'; this recipe trains on other data "
                "(unlabeled_sts or the method's own data). Set 'streaming: false'.")
    if plan.method.score_column is not None:
        return (f"key 'streaming' with method '{recipe.method}', which reads scores ('{plan.method.score_column}'): "
                "not yet supported; set 'streaming: false'.")
    if training.max_steps is None or training.max_steps <= 0:
        return ("key 'streaming': a stream has no length, so epochs, the learning-rate schedule and progress "
                "cannot be derived from the data; set 'max_steps' (num_train_epochs is not used when streaming).")
    if data.train_subset_size is not None:
        return ("key 'train_subset_size' with 'streaming: true': not yet supported (a random subset draws from the "
                "whole data); use max_train_samples (the first N rows) or set 'streaming: false'.")
    if training.train_sampling_strategy in LENGTH_SAMPLERS:
        return (f"key 'train_sampling_strategy' is '{training.train_sampling_strategy}', which reads every "
                "example's length first; with 'streaming: true' use 'random' (the shuffle buffer).")
    for key in ("eval_strategy", "save_strategy", "logging_strategy"):
        if str(getattr(getattr(training, key, None), "value", getattr(training, key, ""))) == "epoch":
            return (f"key '{key}' is 'epoch', but a streamed run (streaming: true) does not know where an epoch "
                    "ends before reading it; use 'steps'.")
    return None


def check_streaming(plan: RunPlan) -> None:
    """RecipeError when the recipe streams what it cannot (`streaming_refusal`), or its source lacks the method's
    columns (read from the stream's first row)."""
    recipe = plan.recipe
    if not recipe.data.streaming:
        return
    if (reason := streaming_refusal(plan)) is not None:
        raise RecipeError(f"{recipe.source}: {reason}")
    data, spec = recipe.data, plan.method
    try:
        path = resolve_stream_file(data.train_file)
        stream, source, _ = open_row_stream(path, data.dataset_name, data.dataset_config_name, data.dataset_split)
        available = stream_columns(stream)
        method_columns(source, available, spec.required_columns, spec.optional_text_columns, data.text_column,
                       reader=f"method '{recipe.method}'")
    except (ValueError, FileNotFoundError) as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    except ConnectionError as err:  # a Hub id offline or unreachable: datasets' own message says which
        raise RecipeError(f"{recipe.source}: key 'dataset_name' with 'streaming: true': {err} A stream is read from "
                          "the Hub while training: run where the Hub is reachable, or download the data and set "
                          "'train_file'.") from None
