"""What a model card needs to know about a training run beyond its scores, collected at the end of the run.

`run_metadata` returns the `recipe_settings`, `training_data`, `precision` and `versions` entries of a run's
results.json; `hf_sentcl.export.card` renders them.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_sentcl.data.provenance import MTEB_DATASETS_KEY, read_provenance
from hf_sentcl.registry import get_method

if TYPE_CHECKING:
    from hf_sentcl.recipe.parser import Recipe
    from hf_sentcl.recipe.plan import StagePlan


# Settings never shown in the card: local paths, Hub plumbing, log display and anything that could hold a secret.
HIDDEN_SETTINGS = {
    "output_dir", "logging_dir", "run_name", "sts_data_dir", "overwrite_output_dir", "resume_from_checkpoint",
    "push_to_hub", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_always_push",
    "disable_tqdm",  # how the log looked (set for runs without a terminal), not how the model was trained
}


VERSIONED_PACKAGES = (
    "hf-sentcl", "torch", "transformers", "sentence-transformers", "accelerate", "datasets", "huggingface-hub",
    "peft",
)


def _plain(value: Any) -> Any:
    """A JSON/YAML-friendly version of a setting value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _default_values(group: Any) -> dict[str, Any]:
    """The values a dataclass instance would have with no recipe: for TrainingArguments, after its __post_init__."""
    cls = type(group)
    if hasattr(group, "output_dir") and hasattr(group, "to_dict"):  # a TrainingArguments subclass
        try:
            reference = cls(output_dir=group.output_dir)
            return {f.name: getattr(reference, f.name) for f in dataclasses.fields(cls) if f.init}
        except (ValueError, TypeError):
            pass
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def non_default_settings(recipe: Recipe) -> dict[str, Any]:
    """Recipe settings that differ from the dataclass defaults (the method name first), for the model card.

    Local paths, Hub settings and token fields are left out; a local `train_file` is reduced to its file name.
    """
    settings: dict[str, Any] = {"method": recipe.method}
    for group in (recipe.model, recipe.data, recipe.training):
        defaults = _default_values(group)
        for f in dataclasses.fields(group):
            if not f.init or f.name in HIDDEN_SETTINGS or "token" in f.name:
                continue
            value = getattr(group, f.name)
            if f.name in defaults and _plain(defaults[f.name]) == _plain(value):
                continue
            settings[f.name] = public_file_name(value) if f.name == "train_file" and value else _plain(value)
    return settings


def public_file_name(path: Any) -> Any:
    """A training file as a card may name it: an `hf://` address whole (public, and the card's `datasets:` reads
    the dataset id from it), a local file by its name alone (its folders are nobody else's business); a list of
    them (several datasets) entry by entry, a mapping entry with its `path` so reduced."""
    if isinstance(path, list):
        return [public_file_name(entry) for entry in path]
    if isinstance(path, dict):
        return {**path, "path": public_file_name(path["path"])} if "path" in path else path
    return path if str(path).startswith("hf://") else Path(os.path.expandvars(path)).name


def training_data_summary(stage: StagePlan, num_examples: int | None, text_columns: Sequence[str]) -> dict[str, Any]:
    """Where a stage's training text came from and how much of it was used; for a `train_file` with a provenance
    sidecar (`hf_sentcl.data.provenance`, e.g. written by `hf-sentcl mine`), the MTEB datasets it declares."""
    data = stage.recipe.data
    own_data = stage.train_data  # e.g. the NLI pairs of a ConSERT sup/joint stage
    declared = {}
    if own_data is not None:
        source, name = own_data.source_key, own_data.description
    elif len(stage.training_sources) > 1:  # several datasets: each named, files as a card may name them
        listed = [{"key": s.key, "name": public_file_name(s.location) if s.key == "train_file" else s.location}
                  for s in stage.training_sources]
        source, name = "mixed", ", ".join(entry["name"] for entry in listed)
        declared["datasets"] = listed
    elif data.train_file is not None:
        location = stage.training_sources[0].location if stage.training_sources else data.train_file
        source, name = "train_file", public_file_name(location)
        provenance = read_provenance(location)
        if MTEB_DATASETS_KEY in provenance:
            declared[MTEB_DATASETS_KEY] = provenance[MTEB_DATASETS_KEY]
    elif data.dataset_name is not None:
        source, name = "dataset_name", stage.training_sources[0].location if stage.training_sources else None
    else:
        source, name = "unlabeled_sts", data.unlabeled_sts
    return {
        "source": source,
        "name": name,
        "examples": num_examples,
        "max_train_samples": data.max_train_samples,
        "train_subset_size": data.train_subset_size,
        "train_subset_seed": data.train_subset_seed if data.train_subset_size is not None else None,
        "max_seq_length": data.max_seq_length,
        "columns": list(text_columns),
        **declared,
    }


def precision_summary(recipe: Recipe, weights_dtype: str, eval_mixed: bool) -> dict[str, str]:
    """Numeric precision of training, evaluation (`StagePlan.eval_mixed`) and the exported weights."""
    args = recipe.training
    training = "bf16 mixed precision (autocast)" if args.bf16 else "fp16 mixed precision" if args.fp16 else "fp32"
    if args.precision == "auto":  # the card says the precision was picked for the hardware it ran on
        training += " (precision: auto)"
    evaluation = "fp32"
    if eval_mixed:
        evaluation = "bf16 autocast (fp16 on GPUs without native bf16)"
    return {
        "training": training,
        "requested": args.precision or ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"),
        "resolved": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "tf32": bool(args.tf32),
        "evaluation": evaluation,
        "weights": weights_dtype.replace("torch.", ""),
    }


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that produced the model."""
    return {name: v for name in VERSIONED_PACKAGES if (v := package_version(name))}


def run_metadata(
    stage: StagePlan, encoder, num_examples: int, num_views: int, parallelism: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the card needs beyond the scores, collected at the end of a run (stored in results.json); `parallelism`
    is `hf_sentcl.recipe.parallelism.effective_parallelism` of the run's trainer."""
    recipe = stage.recipe
    spec = get_method(recipe.method)
    columns = (spec.text_columns + spec.optional_text_columns)[:num_views]
    return {
        "recipe_settings": non_default_settings(recipe),
        "training_data": training_data_summary(stage, num_examples, columns),
        "precision": precision_summary(recipe, str(next(encoder.parameters()).dtype), stage.eval_mixed),
        "versions": library_versions(),
        **({"parallelism": parallelism} if parallelism is not None else {}),
    }
