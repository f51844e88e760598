"""What the model card says beyond the scores, in a form that can be published: no local path anywhere (a card is
uploaded with the folder), the usage id a placeholder until the repository is known, the training data described
as what it is, and every hyperparameter that shaped the run (`card_settings`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_sentcl.export.results import training_datasets
from hf_sentcl.export.snippets import EXAMPLE_SENTENCES
from hf_sentcl.recipe.metadata import HIDDEN_SETTINGS

logger = logging.getLogger("hf_sentcl")

#: what the usage snippets load when the export has no repository id yet (the card says to replace it)
PLACEHOLDER_ID = "your-username/your-model-name"

#: settings of every recipe that shape the trained model, shown defaults included (the method's own keys follow)
SHAPING_SETTINGS = (
    "pooling", "pooling_layer", "inference_pooling", "head", "head_at_inference", "dropout", "peft",
    "max_seq_length", "max_train_samples", "train_subset_size", "train_subset_seed",
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "optim", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps", "per_device_train_batch_size",
    "global_train_batch_size", "gradient_accumulation_steps", "seed", "false_negatives", "guide_model",
    "guide_margin", "guide_margin_strategy", "matryoshka_dims", "matryoshka_weights", "load_best_model_at_end",
    "metric_for_best_model",
)

#: a setting that matters only when another one is set (e.g. the margin of a logit perturbation)
ONLY_WITH = {
    "train_subset_seed": "train_subset_size", "guide_margin": "guide_model", "guide_margin_strategy": "guide_model",
    "matryoshka_weights": "matryoshka_dims", "margin": "perturbation", "margin_type": "perturbation",
    "detach_margin": "perturbation", "multi_task": "perturbation", "metric_for_best_model": "load_best_model_at_end",
}

#: an absolute or home-relative path inside a text (not the path part of a URL, nor an `org/name` id)
_PATH_IN_TEXT = re.compile(r"(?<![\w:/.~-])(?:~|\.{1,2})?/[^\s'\"`,;()\[\]]+")


# ------------------------------------------------------------------------------------------------ no local paths
def is_local_path(value: object) -> bool:
    """Whether `value` names a local file or folder (absolute, `~`, `./`, `../`, or an existing relative path with a
    separator) rather than a Hub id, an `hf://` address or a URL."""
    if not isinstance(value, str) or not value or "://" in value:
        return False
    if value.startswith(("/", "~", "./", "../")) or re.match(r"^[A-Za-z]:[\\/]", value):
        return True
    return ("/" in value or "\\" in value) and Path(value).exists()


def public_name(value: str) -> str:
    """`value` as a card may show it: a local path reduced to its last part, anything else unchanged."""
    return (Path(value.rstrip("/\\")).name or value) if is_local_path(value) else value


def scrub_paths(text: str) -> str:
    """`text` with every absolute or home-relative path in it reduced to its last part (e.g. an NLI source
    `file '/data/nli.csv'` -> `file 'nli.csv'`)."""
    return _PATH_IN_TEXT.sub(lambda match: Path(match.group(0).rstrip("/")).name or match.group(0), text)


def public_value(value: Any) -> Any:
    """A setting's value for the card: enums by value, containers element-wise, local paths by their last part."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, (list, tuple)):
        return [public_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): public_value(v) for k, v in value.items()}
    return scrub_paths(public_name(value)) if isinstance(value, str) else value


# ------------------------------------------------------------------------------------------------ metadata
def widget() -> list[dict[str, Any]]:
    """The Hub's sentence-similarity widget example: the first usage sentence against the others."""
    return [{"source_sentence": EXAMPLE_SENTENCES[0], "sentences": list(EXAMPLE_SENTENCES[1:])}]


def data_line(data: Mapping[str, Any]) -> str | None:
    """The card's sentence on the training data: a Hub dataset linked, a local file named as one (never credited to
    a published dataset by its name), then the example count, columns and training length."""
    if not data:
        return None
    source, name = data.get("source"), scrub_paths(public_name(str(data.get("name"))))
    hub = training_datasets({"training_data": data}) or []
    links = ", ".join(f"[{d}](https://huggingface.co/datasets/{d})" for d in hub)
    if source == "train_file" and not hub:
        line = f"the local file `{name}` (`train_file`; not published with this model)"
    elif source == "dataset_name" and hub:
        line = f"the Hub dataset {links}"
    else:
        line = f"{name} (`{source}`" + (f"; Hub dataset {links})" if hub else ")")
    if data.get("examples"):
        line += f", {data['examples']} training examples"
    if data.get("columns"):
        line += f", text column(s) {', '.join(map(str, data['columns']))}"
    if data.get("max_seq_length"):
        line += f", truncated to {data['max_seq_length']} tokens"
    return line + "."


# ------------------------------------------------------------------------------------------------ hyperparameters
def full_settings(recorded: Mapping[str, Any]) -> dict[str, Any] | None:
    """Every setting of the run: the recorded (non-default) ones over the method's defaults, rebuilt with the recipe
    parser; None when they no longer parse (a method or key this version lacks), which the card then shows as
    recorded."""
    from hf_sentcl.recipe.parser import RecipeError, parse_recipe

    try:
        recipe = parse_recipe(None, **recorded)
    except (RecipeError, ValueError, TypeError) as err:
        logger.warning("The card lists only the recorded recipe settings: they do not parse any more (%s).", err)
        return None
    values: dict[str, Any] = {}
    for group in (recipe.model, recipe.data, recipe.training):
        values.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group) if f.init})
    return values


def method_keys(method: str) -> list[str]:
    """The settings the method's own config adds (e.g. `temperature`, `perturbation`, `hard_negative_weight`), not
    the training arguments every method shares."""
    from hf_sentcl.configs.arguments import SentCLTrainingArguments
    from hf_sentcl.registry import get_method

    shared = {f.name for f in dataclasses.fields(SentCLTrainingArguments)}
    keys: list[str] = []
    for owner in get_method(method).config_class.__mro__:
        if owner is SentCLTrainingArguments:
            break
        keys += [k for k in vars(owner).get("__annotations__", {}) if k not in shared and k not in keys]
    return keys


def _applies(key: str, values: Mapping[str, Any]) -> bool:
    """Whether `key` is worth a row: set, not hidden, and what it depends on is set (`ONLY_WITH`)."""
    value = values.get(key)
    if value is None or key in HIDDEN_SETTINGS or "token" in key or (key == "max_steps" and value <= 0):
        return False
    needed = ONLY_WITH.get(key)
    return needed is None or bool(values.get(needed))


def card_settings(recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """The card's settings table: the method, every hyperparameter that shaped the run (`SHAPING_SETTINGS` and the
    method's own keys, defaults included: learning rate, temperature, max length, seed, ...), then the other recorded
    settings that differ from their defaults; values with local paths reduced to names."""
    if not recorded:
        return {}
    method = recorded.get("method")
    full = full_settings(recorded) if method else None
    shown: dict[str, Any] = {"method": method} if method else {}
    if full is not None:
        shown.update({key: full[key] for key in (*SHAPING_SETTINGS, *method_keys(method)) if _applies(key, full)})
    for key, value in recorded.items():
        if key not in HIDDEN_SETTINGS and "token" not in key:
            shown.setdefault(key, value)
    return {key: public_value(value) for key, value in shown.items()}
