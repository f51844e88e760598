"""Run a recipe end to end: parse -> seed -> build -> evaluate before -> train -> evaluate after -> save.

    python -m hf_sentcl.run recipes/quickstart.yaml [--key value ...]
    accelerate launch -m hf_sentcl.run recipes/quickstart.yaml
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import transformers
from accelerate import PartialState
from datasets import Dataset
from transformers import AutoConfig, set_seed
from transformers.integrations import is_deepspeed_zero3_enabled

from hf_sentcl.data import ViewCollator, add_length_column, load_training_dataset, tokenize_views
from hf_sentcl.data.checks import count_train_examples
from hf_sentcl.data.corpus import check_train_file, text_sources
from hf_sentcl.defaults import resolve_data_dir, resolve_model_name
from hf_sentcl.evaluate import (
    EvaluationSuites, SuiteResults, check_suites, markdown_report, run_results, suite_settings,
)
from hf_sentcl.evaluation.mteb import mteb_sts_scores
from hf_sentcl.evaluation.plots import write_run_plots
from hf_sentcl.evaluation.report import RUN_LABELS, embedding_note, write_results
from hf_sentcl.evaluation.transfer import check_transfer_files
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.hub import HubError, check_hub_settings
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.peft import ADAPTER_DIRNAME, merge_adapters, parameter_counts, save_adapter
from hf_sentcl.parser import USAGE as RECIPE_USAGE
from hf_sentcl.parser import Recipe, RecipeError, merged_values, method_help, parse_recipe
from hf_sentcl.preflight import BackboneError, backbone_config, max_sequence_length
from hf_sentcl.progress import quiet_library_bars, watched
from hf_sentcl.push import publish_run
from hf_sentcl.run_folder import check_run_folder
from hf_sentcl.run_metadata import run_metadata
from hf_sentcl.health import TrainingFailure, check_final_model
from hf_sentcl.trainers.registry import METHODS, get_method

logger = logging.getLogger("hf_sentcl")

USAGE = f"usage: {RECIPE_USAGE}"
#: transformers' samplers that batch examples by length (they need a length column)
LENGTH_SAMPLERS = ("group_by_length", "batch_rebalance")


def validate_recipe(recipe: Recipe) -> None:
    """Check everything that can be checked without loading a model, so bad input fails in seconds."""
    # TrainingArguments would quietly fall back to ./trainer_output; a run's results belong somewhere named.
    if "output_dir" not in recipe.explicit_keys or not recipe.training.output_dir:
        raise RecipeError(f"{recipe.source}: key 'output_dir' is missing (where results and the encoder go).")
    negatives_batch = recipe.training.per_device_train_batch_size * max(recipe.training.world_size, 1)
    if negatives_batch < 2:
        raise RecipeError(
            f"{recipe.source}: key 'per_device_train_batch_size' is {recipe.training.per_device_train_batch_size} "
            f"on {recipe.training.world_size} process(es); in-batch negatives need a global batch of at least 2."
        )
    check_backbone(recipe)
    if recipe.training.global_train_batch_size is not None and "per_device_train_batch_size" in recipe.explicit_keys:
        raise RecipeError(
            f"{recipe.source}: keys 'global_train_batch_size' and 'per_device_train_batch_size' are both set; keep "
            "one (global_train_batch_size derives the per-device batch from the number of processes)."
        )
    if recipe.training.export_adapter and not recipe.model.peft:
        raise RecipeError(f"{recipe.source}: key 'export_adapter' needs a 'peft' section (LoRA settings) to train one.")
    spec = get_method(recipe.method)
    try:
        spec.trainer_class.check_cached_step(recipe.training)
        spec.trainer_class.check_length_buckets(recipe.training)
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    try:  # a method's own training data (e.g. NLI pairs) checks itself, stage by stage
        stage_data = [spec.train_data(stage) for stage in spec.stages(recipe)]
        for data in stage_data:
            if data is not None:
                data.check()
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    sources = text_sources(recipe.data)
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
    try:
        check_hub_settings(recipe.training)
    except HubError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    check_train_text(recipe, negatives_batch)  # last: it reads the whole file


def check_backbone(recipe: Recipe) -> None:
    """The backbone exists (local folder with config.json and weights, or a Hub id), read from its config.json
    only; max_seq_length fits its position embeddings; a tokenizer_name that is a path exists."""
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


def check_train_text(recipe: Recipe, global_batch: int) -> None:
    """A local train_file exists, is UTF-8 with usable examples, and fills at least one global batch (a smaller
    one trains on fewer in-batch negatives than the recipe says, and one example on none at all: loss 0)."""
    try:
        path = check_train_file(recipe.data.train_file)
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


def dropout_overrides(name_or_path: str, probability: float) -> dict[str, float]:
    """`from_pretrained` keyword arguments that set every dropout probability of the backbone's config."""
    config = AutoConfig.from_pretrained(resolve_model_name(name_or_path))
    return {key: probability for key, value in config.to_dict().items() if "dropout" in key and isinstance(value, float)}


def build_encoder(recipe: Recipe) -> SentenceEncoder:
    args = recipe.model
    load_kwargs = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    if args.dropout is not None:
        load_kwargs.update(dropout_overrides(args.model_name_or_path, args.dropout))
    return SentenceEncoder.from_backbone(
        args.model_name_or_path,
        pooling=args.pooling,
        pooling_layer=args.pooling_layer,
        head=args.head,
        head_at_inference=args.head_at_inference,
        inference_pooling=args.inference_pooling,
        tokenizer_name=args.tokenizer_name,
        peft=args.peft,
        **load_kwargs,
    )


def build_train_dataset(recipe: Recipe, tokenizer) -> tuple[Dataset, int, Callable]:
    """Load and tokenise the training data; returns the dataset, its number of text views and the collator."""
    spec = get_method(recipe.method)
    custom = spec.train_data(recipe)
    if custom is not None:
        dataset, num_views, collator = custom.build(tokenizer)
    else:
        raw = load_training_dataset(recipe.data, spec.text_columns)
        columns = spec.text_columns + tuple(c for c in spec.optional_text_columns if c in raw.column_names)
        raw = raw.select_columns(list(columns))
        dataset = tokenize_views(
            raw, tokenizer, columns, recipe.data.max_seq_length, recipe.data.preprocessing_num_workers
        )
        num_views = len(columns)
        collator = ViewCollator(tokenizer, num_views=num_views, pad_to_multiple_of=recipe.data.pad_to_multiple_of)
    if recipe.training.train_sampling_strategy in LENGTH_SAMPLERS:
        dataset = add_length_column(dataset, num_views, recipe.training.length_column_name)
    return dataset, num_views, collator


def evaluate_suites(encoder: SentenceEncoder, suites: EvaluationSuites, recipe: Recipe) -> SuiteResults:
    return suites(encoder, batch_size=recipe.training.per_device_eval_batch_size, bf16=recipe.data.eval_bf16)


def checked(recipe: Recipe) -> Recipe:
    """The recipe after every check that needs no model (RecipeError otherwise), with resume_from_checkpoint
    resolved to a checkpoint folder."""
    validate_recipe(recipe)
    return check_run_folder(recipe)  # after the recipe's own checks: it creates output_dir to probe it


def run(recipe: Recipe, *, already_checked: bool = False) -> dict[str, Any]:
    """Train and evaluate as the recipe says, every stage of a chained method in turn; returns the (last stage's)
    results dict that is also written to disk. The recipe is checked first unless `already_checked` (by `checked`)."""
    if not already_checked:
        recipe = checked(recipe)
    quiet_progress_bars(recipe)
    stages = get_method(recipe.method).stages(recipe)
    for stage in stages[:-1]:
        run_stage(stage)
        PartialState().wait_for_everyone()  # the next stage loads this stage's export, written by process 0
    return run_stage(stages[-1])


def quiet_progress_bars(recipe: Recipe) -> None:
    """Without a terminal on stderr (a log file, CI output): no progress bars, and Trainer's logs as printed lines.

    Bars redrawn into a file leave carriage returns and cursor-up (`[A`) fragments; `disable_tqdm` set in the recipe
    is kept.
    """
    if watched():
        return
    if "disable_tqdm" not in recipe.explicit_keys:
        recipe.training.disable_tqdm = True
    quiet_library_bars()


def run_stage(recipe: Recipe) -> dict[str, Any]:
    """One training run of an already validated recipe (or stage): build, evaluate before, train, evaluate after,
    save and export."""
    args = recipe.training
    set_seed(args.seed)
    state = PartialState()
    spec = get_method(recipe.method)
    data_dir = resolve_data_dir(recipe.data.sts_data_dir)

    encoder = build_encoder(recipe)
    with args.main_process_first(desc="tokenising training data"):
        train_dataset, num_views, collator = build_train_dataset(recipe, encoder.tokenizer)
    logger.info("Training on %d examples with %d text view(s) each.", len(train_dataset), num_views)

    dev_evaluator = STSEvaluator(data_dir, tasks=("STSBenchmark",), split="dev")
    whitening, glue = suite_settings(recipe.data)
    suites = EvaluationSuites(
        data_dir, recipe.data.eval_tasks, sts_mode=recipe.data.sts_mode, whitening=whitening, glue=glue
    )
    dev_pairs = dev_evaluator.data["STSBenchmark"]["dev"]
    trainer = spec.trainer_class(
        model=encoder,
        # The Trainer's own push would upload output_dir with its checkpoints; publish_run pushes the export only.
        args=dataclasses.replace(args, push_to_hub=False) if args.push_to_hub else args,
        train_dataset=train_dataset,
        eval_dataset=Dataset.from_dict(
            {"sentence1": dev_pairs.sentences1, "sentence2": dev_pairs.sentences2, "score": dev_pairs.scores}
        ),
        data_collator=collator,
        processing_class=encoder.tokenizer,
        dev_evaluator=dev_evaluator,
    )
    parameters = parameter_counts(trainer.model)
    final: dict[str, SuiteResults] = {}  # "before"/"after" training
    # After the trainer is built, so "before" scores the encoder that trains (CLEAR's from_scratch replaces it).
    if suites.suites and recipe.data.eval_before_training and state.is_main_process:
        final["before"] = evaluate_suites(encoder, suites, recipe)
        before = markdown_report({RUN_LABELS["before"]: final["before"]}, recipe.data.sts_mode)
        print(f"{before}\n{embedding_note(encoder)}", flush=True)
    train_output = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if args.export_adapter and trainer.is_world_process_zero():
        print(f"LoRA adapter saved to {save_adapter(trained, Path(args.output_dir) / ADAPTER_DIRNAME)}", flush=True)
    merge_adapters(trained)  # the saved encoder and its export are plain models (no-op without peft)
    sharded = trainer.is_fsdp_enabled or is_deepspeed_zero3_enabled()
    if not sharded:  # every process holds the whole model: refuse a poisoned one before it is saved
        _check_trained(trained, dev_evaluator, args)
    trainer.save_model(args.output_dir)

    results: dict[str, Any] = {
        "method": recipe.method,
        "model_name_or_path": recipe.model.model_name_or_path,
        "recipe": recipe.source,
        "sts_mode": recipe.data.sts_mode,
        "train": {
            **train_output.metrics,
            "global_step": trainer.state.global_step,
            "best_step": _best_step(trainer),
            "best_dev_stsb_spearman": trainer.state.best_metric,
            **trainer.training_cost(),
            **parameters,
            # every logged training loss and gradient norm, unrounded (e.g. to compare runs on 1 and N processes)
            "loss_curve": [
                {key: e[key] for key in ("step", "loss", "grad_norm") if key in e}
                for e in trainer.state.log_history if "loss" in e
            ],
            # every STS-B dev evaluation: step, eval_stsb_spearman, eval_alignment, eval_uniformity, ...
            "dev_curve": [entry for entry in trainer.state.log_history if "eval_stsb_spearman" in entry],
        },
    }
    if trainer.is_world_process_zero():
        # Without accelerate's mixed-precision forward wrapper, so evaluation precision follows eval_bf16.
        final_encoder = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        if sharded:  # sharded weights: use the saved (whole) ones
            final_encoder = SentenceEncoder.from_pretrained(args.output_dir)
            _check_trained(final_encoder, dev_evaluator, args)
        if suites.suites:
            final["after"] = evaluate_suites(final_encoder, suites, recipe)
        results.update(run_results(final))
        rows = results["sts"]
        if "after" in rows:  # MTEB's protocol (SICK-R on all pairs) for the model card's model-index
            results.update(mteb_sts_scores(
                final_encoder, data_dir, recipe.training.per_device_eval_batch_size, recipe.data.eval_bf16,
                reuse=rows["after"] if recipe.data.sts_mode == "all" else None,
            ).to_results())
        results.update(run_metadata(recipe, final_encoder, len(train_dataset), num_views))
        results["plots"] = write_run_plots(
            args.output_dir, trainer.state.log_history,
            {RUN_LABELS[k]: r.stsb_predictions for k, r in final.items() if r.stsb_predictions},
        )
        table = markdown_report({RUN_LABELS[k]: r for k, r in final.items()}, recipe.data.sts_mode)
        table += "\n" + embedding_note(final_encoder)
        json_path, md_path = write_results(args.output_dir, results, table)
        print("\n" + table, flush=True)
        print(f"\nResults: {json_path} and {md_path}; encoder saved to {args.output_dir}", flush=True)
        results["export"] = publish_run(final_encoder, results, args)
    return results


def _check_trained(encoder: SentenceEncoder, dev_evaluator: STSEvaluator, args) -> None:
    """TrainingFailure if the trained encoder's weights or STS-B dev embeddings are non-finite or collapsed."""
    embeddings = dev_evaluator.embed(encoder, batch_size=args.per_device_eval_batch_size, bf16=args.bf16 or args.fp16)
    check_final_model(encoder, embeddings)


def _best_step(trainer) -> int | None:
    checkpoint = trainer.state.best_model_checkpoint
    return int(checkpoint.rsplit("-", 1)[-1]) if checkpoint else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(f"{USAGE}\n\n{method_list()}")
        return 2
    if "-h" in argv or "--help" in argv:
        return print_help([a for a in argv if a not in ("-h", "--help")])
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    try:
        recipe = checked(parse_recipe(argv[0], argv[1:]))
    except (RecipeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        results = run(recipe, already_checked=True)
    except TrainingFailure as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 1 if {"push_error", "export_error"} & set(results.get("export", {})) else 0


def method_list() -> str:
    return "Methods (key 'method'; `--method NAME --help` lists its keys):\n" + "\n".join(
        f"  {name:12} {spec.summary}" for name, spec in METHODS.items()
    )


def print_help(argv: list[str]) -> int:
    """`RECIPE --help` or `--method NAME --help`: every key of the method with type, default and help (keys the
    recipe sets also show its value); without a method, the usage and the methods."""
    recipe = argv[0] if argv and not argv[0].startswith("--") else None
    try:
        values, _, _ = merged_values(recipe, argv[1:] if recipe else argv)
        if "method" not in values:
            print(f"{USAGE}\n\n{method_list()}")
            return 0
        method = str(values.pop("method"))
        print(method_help(method, values))
    except (RecipeError, KeyError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
