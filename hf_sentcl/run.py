"""Run a recipe end to end: parse -> seed -> build -> evaluate before -> train -> evaluate after -> save.

    python -m hf_sentcl.run recipes/quickstart.yaml [--key value ...]
    accelerate launch -m hf_sentcl.run recipes/quickstart.yaml
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import transformers
from accelerate import PartialState
from datasets import Dataset
from transformers import set_seed

from hf_sentcl.data import ViewCollator, load_training_dataset, tokenize_views
from hf_sentcl.data.corpus import check_train_file
from hf_sentcl.defaults import resolve_data_dir
from hf_sentcl.evaluation.report import sts_markdown_table, write_results
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.hub import HubError, check_hub_settings
from hf_sentcl.model_card import mteb_sts_scores, run_metadata
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.parser import Recipe, RecipeError, parse_recipe
from hf_sentcl.push import publish_run
from hf_sentcl.trainers.registry import get_method

logger = logging.getLogger("hf_sentcl")

USAGE = "usage: python -m hf_sentcl.run RECIPE.yaml [--key value ...]"


def validate_recipe(recipe: Recipe) -> None:
    """Check everything that can be checked without loading a model, so bad input fails in seconds."""
    # TrainingArguments would quietly fall back to ./trainer_output; a run's results belong somewhere named.
    if "output_dir" not in recipe.explicit_keys or not recipe.training.output_dir:
        raise RecipeError(f"{recipe.source}: key 'output_dir' is missing (where results and the encoder go).")
    check_train_file(recipe.data.train_file)
    negatives_batch = recipe.training.per_device_train_batch_size * max(recipe.training.world_size, 1)
    if negatives_batch < 2:
        raise RecipeError(
            f"{recipe.source}: key 'per_device_train_batch_size' is {recipe.training.per_device_train_batch_size} "
            f"on {recipe.training.world_size} process(es); in-batch negatives need a global batch of at least 2."
        )
    sources = [k for k in ("train_file", "dataset_name", "unlabeled_sts") if getattr(recipe.data, k) is not None]
    if len(sources) != 1:
        raise RecipeError(
            f"{recipe.source}: set exactly one of 'train_file', 'dataset_name', 'unlabeled_sts' "
            f"(the training text); got {sources or 'none'}."
        )
    unknown_tasks = [t for t in recipe.data.eval_tasks if t not in ("sts",)]
    if unknown_tasks:
        raise RecipeError(f"{recipe.source}: key 'eval_tasks' has unknown task(s) {unknown_tasks}; known: sts.")
    resolve_data_dir(recipe.data.sts_data_dir)
    path = recipe.model.model_name_or_path
    if path.startswith((".", "/", "~")) and not Path(path).expanduser().exists():
        raise RecipeError(f"{recipe.source}: model_name_or_path '{path}' does not exist.")
    try:
        check_hub_settings(recipe.training)
    except HubError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None


def build_encoder(recipe: Recipe) -> SentenceEncoder:
    args = recipe.model
    load_kwargs = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    return SentenceEncoder.from_backbone(
        args.model_name_or_path,
        pooling=args.pooling,
        pooling_layer=args.pooling_layer,
        head=args.head,
        head_at_inference=args.head_at_inference,
        inference_pooling=args.inference_pooling,
        tokenizer_name=args.tokenizer_name,
        **load_kwargs,
    )


def build_train_dataset(recipe: Recipe, tokenizer) -> tuple[Dataset, int]:
    """Load and tokenise the training data; returns the dataset and its number of text views."""
    spec = get_method(recipe.method)
    raw = load_training_dataset(recipe.data, spec.text_columns)
    columns = spec.text_columns + tuple(c for c in spec.optional_text_columns if c in raw.column_names)
    raw = raw.select_columns(list(columns))
    tokenized = tokenize_views(
        raw, tokenizer, columns, recipe.data.max_seq_length, recipe.data.preprocessing_num_workers
    )
    return tokenized, len(columns)


def evaluate_sts(encoder: SentenceEncoder, evaluator: STSEvaluator, recipe: Recipe) -> dict[str, float]:
    return evaluator(encoder, batch_size=recipe.training.per_device_eval_batch_size, bf16=recipe.data.eval_bf16)


def run(recipe: Recipe) -> dict[str, Any]:
    """Train and evaluate as the recipe says; returns the results dict that is also written to disk."""
    validate_recipe(recipe)
    args = recipe.training
    set_seed(args.seed)
    state = PartialState()
    spec = get_method(recipe.method)
    data_dir = resolve_data_dir(recipe.data.sts_data_dir)

    encoder = build_encoder(recipe)
    with args.main_process_first(desc="tokenising training data"):
        train_dataset, num_views = build_train_dataset(recipe, encoder.tokenizer)
    logger.info("Training on %d examples with %d text view(s) each.", len(train_dataset), num_views)

    dev_evaluator = STSEvaluator(data_dir, tasks=("STSBenchmark",), split="dev")
    test_evaluator = STSEvaluator(data_dir, mode=recipe.data.sts_mode) if "sts" in recipe.data.eval_tasks else None
    rows: dict[str, dict[str, float]] = {}
    if test_evaluator is not None and recipe.data.eval_before_training and state.is_main_process:
        rows["before"] = evaluate_sts(encoder, test_evaluator, recipe)
        print(sts_markdown_table({"before training": rows["before"]}, recipe.data.sts_mode), flush=True)

    dev_pairs = dev_evaluator.data["STSBenchmark"]["dev"]
    trainer = spec.trainer_class(
        model=encoder,
        # The Trainer's own push would upload output_dir with its checkpoints; publish_run pushes the export only.
        args=dataclasses.replace(args, push_to_hub=False) if args.push_to_hub else args,
        train_dataset=train_dataset,
        eval_dataset=Dataset.from_dict(
            {"sentence1": dev_pairs.sentences1, "sentence2": dev_pairs.sentences2, "score": dev_pairs.scores}
        ),
        data_collator=ViewCollator(encoder.tokenizer, num_views=num_views),
        processing_class=encoder.tokenizer,
        dev_evaluator=dev_evaluator,
    )
    train_output = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
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
            # every STS-B dev evaluation: step, eval_stsb_spearman, eval_alignment, eval_uniformity, ...
            "dev_curve": [entry for entry in trainer.state.log_history if "eval_stsb_spearman" in entry],
        },
    }
    if trainer.is_world_process_zero():
        # Without accelerate's mixed-precision forward wrapper, so evaluation precision follows eval_bf16.
        final_encoder = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        if test_evaluator is not None:
            rows["after"] = evaluate_sts(final_encoder, test_evaluator, recipe)
        results["sts"] = rows
        if "after" in rows:  # MTEB's protocol (SICK-R on all pairs) for the model card's model-index
            results["mteb_sts"] = mteb_sts_scores(
                final_encoder, data_dir, rows["after"], recipe.data.sts_mode,
                recipe.training.per_device_eval_batch_size, recipe.data.eval_bf16,
            )
        results.update(run_metadata(recipe, final_encoder, len(train_dataset), num_views))
        table = sts_markdown_table(
            {{"before": "before training", "after": "after training"}[k]: v for k, v in rows.items()},
            recipe.data.sts_mode,
        )
        json_path, md_path = write_results(args.output_dir, results, table)
        print("\n" + table, flush=True)
        print(f"\nResults: {json_path} and {md_path}; encoder saved to {args.output_dir}", flush=True)
        results["export"] = publish_run(final_encoder, results, args)
    return results


def _best_step(trainer) -> int | None:
    checkpoint = trainer.state.best_model_checkpoint
    return int(checkpoint.rsplit("-", 1)[-1]) if checkpoint else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    try:
        recipe = parse_recipe(argv[0], argv[1:])
        validate_recipe(recipe)
    except (RecipeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = run(recipe)
    return 1 if "push_error" in results.get("export", {}) else 0


if __name__ == "__main__":
    sys.exit(main())
