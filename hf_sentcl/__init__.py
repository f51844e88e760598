"""hf_sentcl: contrastive sentence-embedding training on the Hugging Face stack."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_sentcl.modeling import SentenceEncoder, SentenceEncoderConfig
    from hf_sentcl.recipe.plan import RunPlan

__version__ = "0.1.0"

__all__ = ["SentenceEncoder", "SentenceEncoderConfig", "__version__", "plan", "train"]


def plan(recipe: str | os.PathLike | None = None, **settings: Any) -> RunPlan:
    """The checked plan of a run, to read before training it (`train(plan)`): `recipe` and `settings` as `train`
    takes them. It has passed every check the command line makes before a model loads (`RecipeError` naming the key
    at fault) and holds what the run will do: its stages, their training data and evaluation precision, the global
    batch of in-batch negatives, the data directory, the checkpoint it resumes from (`hf_sentcl.recipe.plan`). Its
    output_dir is reserved for it (no other run may write there) until it has trained or this process ends."""
    from hf_sentcl.recipe.checks import checked
    from hf_sentcl.recipe.parser import parse_recipe

    return checked(parse_recipe(recipe, **settings))


def train(recipe: str | os.PathLike | RunPlan | None = None, **settings: Any) -> dict[str, Any]:
    """Train, evaluate and export as a recipe says, from Python (a notebook): `recipe` is a YAML file (None: the
    `settings` alone, which must then name the `method`), `settings` its keys as keyword arguments over it, e.g.
    `train("recipes/quickstart.yaml", max_steps=16, output_dir="outputs/nb")`; or a plan from `plan(...)`, trained as
    it is. The same checks as the command line run first (`RecipeError` naming the key at fault); returns what
    results.json holds."""
    from hf_sentcl.pipeline.train import run
    from hf_sentcl.recipe.parser import parse_recipe
    from hf_sentcl.recipe.plan import RunPlan
    from hf_sentcl.recipe.run_lock import release_output_dirs

    if isinstance(recipe, RunPlan) and settings:
        raise TypeError("train(plan) takes no settings: the plan is checked already; pass them to plan(...) instead.")
    try:
        return run(recipe if isinstance(recipe, RunPlan) else parse_recipe(recipe, **settings))
    finally:
        release_output_dirs()  # another process may train into the folder once this run is over


def __getattr__(name: str):
    """`SentenceEncoder` and `SentenceEncoderConfig` load torch and transformers on first use, not with the package:
    `hf-sentcl --help` and `hf-sentcl data` answer without them (10 s of imports on a 2-core CPU)."""
    if name in ("SentenceEncoder", "SentenceEncoderConfig"):
        from hf_sentcl import modeling

        return getattr(modeling, name)
    raise AttributeError(f"module 'hf_sentcl' has no attribute '{name}'")
