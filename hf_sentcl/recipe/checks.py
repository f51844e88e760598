"""Checks of a parsed recipe that need no model, so bad input fails in seconds with the key at fault named."""

from __future__ import annotations

import warnings
from pathlib import Path

from hf_sentcl.data.checks import count_train_examples
from hf_sentcl.data.corpus import check_train_columns, check_train_file, text_sources
from hf_sentcl.evaluation.mteb import license_problem
from hf_sentcl.evaluation.suites import check_suites, suite_settings
from hf_sentcl.evaluation.transfer import check_transfer_files
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.hub.upload import HubError, check_hub_settings
from hf_sentcl.modeling.backbone import BackboneError, backbone_config, max_sequence_length
from hf_sentcl.recipe.agreement import checked_by_every_process
from hf_sentcl.recipe.parallelism import check_topology
from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.recipe.run_folder import check_run_folder
from hf_sentcl.recipe.run_lock import hold_output_dir
from hf_sentcl.registry import get_method


def validate_recipe(recipe: Recipe) -> None:
    """Check everything that can be checked without loading a model, so bad input fails in seconds."""
    # TrainingArguments would quietly fall back to ./trainer_output; a run's results belong somewhere named.
    if "output_dir" not in recipe.explicit_keys or not recipe.training.output_dir:
        raise RecipeError(f"{recipe.source}: key 'output_dir' is missing (where results and the encoder go).")
    check_topology(recipe)  # a launch the hardware or the method cannot honour is refused first
    spec = get_method(recipe.method)
    try:
        negatives_batch = spec.trainer_class.check_global_batch(recipe.training)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    check_backbone(recipe)
    if recipe.training.global_train_batch_size is not None and "per_device_train_batch_size" in recipe.explicit_keys:
        raise RecipeError(
            f"{recipe.source}: keys 'global_train_batch_size' and 'per_device_train_batch_size' are both set; keep "
            "one (global_train_batch_size derives the per-device batch from the number of processes)."
        )
    if recipe.training.export_adapter and not recipe.model.peft:
        raise RecipeError(f"{recipe.source}: key 'export_adapter' needs a 'peft' section (LoRA settings) to train one.")
    try:
        spec.trainer_class.check_cached_step(recipe.training)
        spec.trainer_class.check_length_buckets(recipe.training)
        spec.trainer_class.check_plugins(recipe.training, recipe.model)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    try:  # a method's own training data (e.g. NLI pairs) checks itself, stage by stage
        stages = spec.stages(recipe)
        stage_data = [spec.train_data(stage) for stage in stages]
        for data in stage_data:
            if data is not None:
                data.check()
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    check_stage_plugins(recipe, stages)
    warn_unbounded_compilation(recipe)
    sources = text_sources(recipe.data)
    if None not in stage_data and sources:
        own = ", ".join(dict.fromkeys(data.source_key for data in stage_data))
        raise RecipeError(f"{recipe.source}: method '{recipe.method}' trains on its '{own}' here; {sources} would be "
                          "unused: remove it, or unset the method's own data key.")
    if None in stage_data and len(sources) != 1:
        raise RecipeError(
            f"{recipe.source}: set exactly one of 'train_file', 'dataset_name', 'unlabeled_sts' "
            f"(the training text); got {sources or 'none'}."
        )
    try:
        check_suites(recipe.data.eval_tasks)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: key 'eval_tasks': {err}") from None
    try:
        suite_settings(recipe.data)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    data_dir = resolve_data_dir(recipe.data.sts_data_dir)
    if "transfer" in recipe.data.eval_tasks:
        check_transfer_files(data_dir)
    check_publishing(recipe)
    check_train_text(recipe, negatives_batch)  # last: it reads the whole file


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


def check_stage_plugins(recipe: Recipe, stages: list[Recipe]) -> None:
    """Each stage of a chained method passes the plug-in check its trainer makes when it is built (`check_plugins`),
    so a plug-in that a stage cannot honour is refused now, naming the stage, and not after the stages before it
    have trained. (The method's `stages` decides which stages carry a plug-in: ConSERT's sup-unsup gives
    `matryoshka_dims` / `false_negatives` to stage 2 only.)"""
    if len(stages) < 2:
        return  # the recipe itself, checked above
    trainer = get_method(recipe.method).trainer_class
    for number, stage in enumerate(stages, start=1):
        try:
            trainer.check_plugins(stage.training, stage.model)
        except ValueError as err:
            mode = getattr(recipe.training, "supervised_mode", None)
            chain = f" that supervised_mode '{mode}' chains" if mode else f" of method '{recipe.method}'"
            raise RecipeError(f"{recipe.source}: stage {number} of the {len(stages)}{chain}: {err}") from None


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


def check_train_text(recipe: Recipe, global_batch: int) -> None:
    """A local train_file exists, is UTF-8 with usable examples, has the columns the method reads, and fills at
    least one global batch (a smaller one trains on fewer in-batch negatives than the recipe says, and one example
    on none at all: loss 0)."""
    try:
        path = check_train_file(recipe.data.train_file)
        if path is not None:  # the loader's rule (`method_columns`), before the model loads rather than after
            spec = get_method(recipe.method)
            check_train_columns(path, spec.required_columns, spec.optional_text_columns, recipe.data.text_column,
                                reader=f"method '{recipe.method}'", score_column=spec.score_column)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    if path is None:
        return
    examples = count_train_examples(path)
    kept = min(examples, recipe.data.max_train_samples or examples)
    if kept < global_batch:
        limit = f", max_train_samples keeps {kept}" if kept < examples else ""
        raise RecipeError(
            f"{recipe.source}: train_file '{path}' has {examples} usable example(s){limit}: fewer than one global "
            f"batch of {global_batch} (per_device_train_batch_size {recipe.training.per_device_train_batch_size} x "
            f"{max(recipe.training.world_size, 1)} process(es)). Add training text or lower the batch size."
        )


def checked(recipe: Recipe) -> Recipe:
    """The recipe after every check that needs no model (RecipeError otherwise), with resume_from_checkpoint
    resolved to a checkpoint folder; every process of a launch reaches the same verdict and checkpoint
    (`hf_sentcl.recipe.agreement`)."""
    return checked_by_every_process(recipe, check_on_this_process)


def check_on_this_process(recipe: Recipe) -> Recipe:
    """This process's checks: the recipe's own, then its output_dir (locked against another run still writing in
    it, before any checkpoint there is resolved or removed)."""
    validate_recipe(recipe)
    hold_output_dir(recipe)
    recipe = check_run_folder(recipe)  # after the recipe's own checks: it creates output_dir to probe it
    hold_output_dir(recipe, checked=True)  # also a folder the check has just created
    return recipe
