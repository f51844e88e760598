"""Checks of a parsed recipe that need no model, so bad input fails in seconds with the key at fault named."""

from __future__ import annotations

import warnings
from pathlib import Path

from hf_sentcl.configs.sources import TrainingSource
from hf_sentcl.data.checks import count_train_examples
from hf_sentcl.data.corpus import (
    LENGTH_SAMPLERS,
    check_train_columns,
    check_train_file,
    first_row_columns,
    method_columns,
)
from hf_sentcl.evaluation.mteb import license_problem
from hf_sentcl.evaluation.suites import check_suites
from hf_sentcl.evaluation.transfer import check_transfer_files
from hf_sentcl.hub.upload import HubError, check_hub_settings
from hf_sentcl.modeling.backbone import BackboneError, backbone_config, max_sequence_length
from hf_sentcl.recipe.agreement import checked_by_every_process
from hf_sentcl.recipe.parallelism import check_topology
from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.recipe.plan import RunPlan, plan_run
from hf_sentcl.recipe.run_folder import check_run_folder
from hf_sentcl.recipe.run_lock import hold_output_dir
from hf_sentcl.recipe.streaming import check_streaming
from hf_sentcl.registry import get_method


def validate_recipe(recipe: Recipe) -> RunPlan:
    """Check everything that can be checked without loading a model, so bad input fails in seconds; returns the
    recipe's plan (`hf_sentcl.recipe.plan`), whose values the checks read."""
    # TrainingArguments would quietly fall back to ./trainer_output; a run's results belong somewhere named.
    if "output_dir" not in recipe.explicit_keys or not recipe.training.output_dir:
        raise RecipeError(f"{recipe.source}: key 'output_dir' is missing (where results and the encoder go).")
    check_topology(recipe)  # a launch the hardware or the method cannot honour is refused first
    plan = plan_run(recipe)
    check_backbone(recipe)
    check_training_keys(recipe)
    check_stages(plan)
    warn_unbounded_compilation(recipe)
    check_training_source(plan)
    try:
        check_suites(recipe.data.eval_tasks)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: key 'eval_tasks': {err}") from None
    data_dir = plan.data_dir  # resolved now (FileNotFoundError saying how to point at the data): every stage reads it
    if "transfer" in recipe.data.eval_tasks:
        check_transfer_files(data_dir)
    check_publishing(recipe)
    if recipe.data.streaming:  # a stream is checked from its first rows and repaired as it is read
        check_streaming(plan)
    else:
        check_train_text(plan)  # last: it reads the whole file
    return plan


def check_training_keys(recipe: Recipe) -> None:
    """Training keys that contradict each other, and the method's rules for the cached step, length buckets and
    plug-ins (each rule lives on the trainer class, which also applies it when it is built)."""
    if recipe.training.global_train_batch_size is not None and "per_device_train_batch_size" in recipe.explicit_keys:
        raise RecipeError(
            f"{recipe.source}: keys 'global_train_batch_size' and 'per_device_train_batch_size' are both set; keep "
            "one (global_train_batch_size derives the per-device batch from the number of processes)."
        )
    if recipe.training.export_adapter and not recipe.model.peft:
        raise RecipeError(f"{recipe.source}: key 'export_adapter' needs a 'peft' section (LoRA settings) to train one.")
    trainer = get_method(recipe.method).trainer_class
    try:
        trainer.check_cached_step(recipe.training)
        trainer.check_length_buckets(recipe.training)
        trainer.check_plugins(recipe.training, recipe.model)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None


def check_stages(plan: RunPlan) -> None:
    """A method's own training data (e.g. NLI pairs) checks itself, stage by stage, and each stage of a chained
    method passes the plug-in check its trainer makes when it is built."""
    try:
        for stage in plan.stages:
            if stage.train_data is not None:
                stage.train_data.check()
    except ValueError as err:
        raise RecipeError(f"{plan.recipe.source}: {err}") from None
    check_stage_plugins(plan)


def check_training_source(plan: RunPlan) -> None:
    """The training sources a stage reads (one, or several datasets listed: `plan.training_sources`, whose rule
    `plan_run` applied), none beside a method that trains on its own data only, and no length sampler beside mixing."""
    recipe, sources = plan.recipe, list(plan.text_sources)
    if plan.own_data_only and sources:
        own = ", ".join(dict.fromkeys(stage.train_data.source_key for stage in plan.stages))
        raise RecipeError(f"{recipe.source}: method '{recipe.method}' trains on its '{own}' here; {sources} would be "
                          "unused: remove it, or unset the method's own data key.")
    mixed = len(plan.training_sources) > 1
    if mixed and recipe.training.train_sampling_strategy in LENGTH_SAMPLERS:
        strategy = recipe.training.train_sampling_strategy
        raise RecipeError(f"{recipe.source}: key 'train_sampling_strategy' is '{strategy}'"
                          ", which batches one dataset by length; with several datasets each batch is drawn from one "
                          "dataset by 'mixing'. Remove the key (or train on one dataset).")


def warn_unbounded_compilation(recipe: Recipe) -> None:
    """Warn when `torch_compile` meets batches padded to their longest sentence: every new padded length compiles
    the model again, for seconds each, and a short run ends slower than without compilation (on an H200, 40 steps of
    BERT-base compiled with CUDA graphs and no such padding trained 65 examples/s, against 718 eager in the same run;
    docs/benchmarks.md)."""
    if recipe.training.torch_compile and recipe.data.pad_to_multiple_of is None:
        warnings.warn(
            f"{recipe.source}: torch_compile is on but 'pad_to_multiple_of' is unset, so each new padded batch "
            "length compiles the model again (seconds each; slower than no compilation on short runs). Set "
            f"'pad_to_multiple_of: 8' to bound the lengths (to {-(-recipe.data.max_seq_length // 8)} at "
            f"max_seq_length {recipe.data.max_seq_length}).",
            stacklevel=2,
        )


def check_stage_plugins(plan: RunPlan) -> None:
    """Each stage of a chained method passes the plug-in check its trainer makes when it is built (`check_plugins`),
    so a plug-in that a stage cannot honour is refused now, naming the stage, and not after the stages before it
    have trained. (The method's `stages` decides which stages carry a plug-in: ConSERT's sup-unsup gives
    `matryoshka_dims` / `false_negatives` to stage 2 only.)"""
    if len(plan.stages) < 2:
        return  # the recipe itself, checked by check_training_keys
    recipe = plan.recipe
    trainer = plan.method.trainer_class
    for stage in plan.stages:
        try:
            trainer.check_plugins(stage.args, stage.recipe.model)
        except ValueError as err:
            mode = getattr(recipe.training, "supervised_mode", None)
            chain = f" that supervised_mode '{mode}' chains" if mode else f" of method '{recipe.method}'"
            raise RecipeError(f"{recipe.source}: stage {stage.number} of the {stage.of}{chain}: {err}") from None


def check_publishing(recipe: Recipe) -> None:
    """What the export's card and the push need: a license the Hub and mteb know, the Hub settings and a token."""
    if recipe.training.license and (problem := license_problem(recipe.training.license)):
        raise RecipeError(f"{recipe.source}: key 'license': {problem}")
    try:
        check_hub_settings(recipe.training)
    except HubError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None


def check_backbone(recipe: Recipe) -> None:
    """The backbone (and the guide model of `false_negatives: guide`) exists (local folder with config.json and
    weights, or a Hub id), read from its config.json only; max_seq_length fits its position embeddings; a
    tokenizer_name that is a path exists."""
    try:
        config = backbone_config(recipe.model.model_name_or_path)
    except BackboneError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    limit = max_sequence_length(config)
    if limit is not None and recipe.data.max_seq_length > limit:
        raise RecipeError(
            f"{recipe.source}: key 'max_seq_length' is {recipe.data.max_seq_length}, but "
            f"'{recipe.model.model_name_or_path}' has position embeddings for {limit} tokens; use {limit} or fewer."
        )
    tokenizer = recipe.model.tokenizer_name
    if tokenizer and tokenizer.startswith((".", "/", "~")) and not Path(tokenizer).expanduser().is_dir():
        raise RecipeError(f"{recipe.source}: key 'tokenizer_name': no folder '{Path(tokenizer).expanduser()}'.")
    if recipe.training.guide_model:  # false_negatives: guide's model, looked for as the backbone is
        try:
            backbone_config(recipe.training.guide_model, "guide_model")
        except BackboneError as err:
            raise RecipeError(f"{recipe.source}: {err}") from None


def check_train_text(plan: RunPlan) -> None:
    """Each local training file exists, is UTF-8 with usable examples, has the columns the method reads (under its
    own names, sentence-transformers' or the entry's `columns` mapping), and fills at least one global batch (a
    smaller one trains on fewer in-batch negatives than the recipe says, and one example on none at all: loss 0).
    With several datasets, each must fill one global batch: every batch is drawn from one dataset."""
    recipe = plan.recipe
    for source in plan.training_sources:
        if source.key == "train_file":
            check_source_file(recipe, source, plan.negatives_batch, mixed=len(plan.training_sources) > 1)
        elif source.key == "dataset_name":
            check_dataset_columns(recipe, source)


def check_dataset_columns(recipe: Recipe, source: TrainingSource) -> None:
    """A `dataset_name` source has the columns the method reads, from its first example streamed (a Hub id is read
    over the network, or from the cache offline); its size is known once it has loaded (`build_train_data`)."""
    spec = get_method(recipe.method)
    label = f"dataset '{source.location}'" + (f" ({source.entry})" if source.index is not None else "")
    try:
        columns = first_row_columns(source.location, source.config, split=source.split)
    except Exception as err:  # noqa: BLE001 - no such dataset, config or split, a Hub that cannot be reached
        raise RecipeError(f"{recipe.source}: {label} cannot be read: {type(err).__name__}: {err}") from None
    try:
        method_columns(label, columns, spec.required_columns, spec.optional_text_columns, recipe.data.text_column,
                       f"method '{recipe.method}'", source.column_map)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None


def check_source_file(recipe: Recipe, source: TrainingSource, global_batch: int, mixed: bool) -> None:
    """One training file of `check_train_text`, named by its entry in the recipe's list when there are several."""
    spec = get_method(recipe.method)
    try:
        path = check_train_file(source.location)
        # the loader's rule (`method_columns`), before the model loads rather than after
        check_train_columns(path, spec.required_columns, spec.optional_text_columns, recipe.data.text_column,
                            reader=f"method '{recipe.method}'", score_column=spec.score_column,
                            mapping=source.column_map)
    except ValueError as err:
        where = f"{source.entry}: " if source.index is not None else ""
        raise RecipeError(f"{recipe.source}: {where}{err}") from None
    examples = count_train_examples(path)
    kept = min(examples, recipe.data.max_train_samples or examples)
    if kept < global_batch:
        limit = f", max_train_samples keeps {kept}" if kept < examples else ""
        batch = (f"one global batch of {global_batch} (per_device_train_batch_size "
                 f"{recipe.training.per_device_train_batch_size} x {max(recipe.training.world_size, 1)} process(es))")
        if mixed:
            raise RecipeError(
                f"{recipe.source}: {source.entry} (dataset '{source.name}') has {examples} usable example(s){limit}: "
                f"fewer than {batch}. With several datasets every batch is drawn from one of them (mixing "
                f"'{recipe.data.mixing or 'proportional'}'), so each must fill a batch. Add text to it, remove it "
                "from the list, or lower the batch size."
            )
        raise RecipeError(
            f"{recipe.source}: train_file '{path}' has {examples} usable example(s){limit}: fewer than {batch}. Add "
            "training text or lower the batch size."
        )


def checked(recipe: Recipe) -> RunPlan:
    """The recipe's plan after every check that needs no model (RecipeError otherwise), resuming from the checkpoint
    folder resume_from_checkpoint resolves to; every process of a launch reaches the same verdict and checkpoint
    (`hf_sentcl.recipe.agreement`)."""
    return checked_by_every_process(recipe, check_on_this_process)


def check_on_this_process(recipe: Recipe) -> RunPlan:
    """This process's checks: the recipe's own, then its output_dir (locked against another run still writing in
    it, before any checkpoint there is resolved or removed)."""
    plan = validate_recipe(recipe)
    hold_output_dir(recipe)
    resolved = check_run_folder(recipe)  # after the recipe's own checks: it creates output_dir to probe it
    hold_output_dir(resolved, checked=True)  # also a folder the check has just created
    return plan.resuming_from(resolved.training.resume_from_checkpoint)
