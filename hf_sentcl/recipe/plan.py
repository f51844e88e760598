"""A run's plan: the recipe resolved once into what the pipeline and the trainers read, so nothing downstream derives
a value again (and no two places can derive it differently).

`plan_run` is the one place these values are derived: the training stages (one, or a chained method's), each stage's
own training data or its text source, the SentEval data directory, the training precision and whether evaluation
runs mixed, the evaluation suites with their whitening and GLUE settings, the global batch of in-batch negatives
and the checkpoint a run resumes from. `hf_sentcl.recipe.checks` builds the plan while it checks the recipe and
checks every rule against the plan's values; `checked` returns the plan of the recipe as every process agreed on it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_sentcl.configs.precision import eval_mixed_precision
from hf_sentcl.configs.sources import TrainingSource, the_training_sources
from hf_sentcl.data.corpus import text_sources
from hf_sentcl.evaluation.glue import GlueSettings
from hf_sentcl.evaluation.suites import suite_settings
from hf_sentcl.evaluation.whitening import WhiteningSpec
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.registry import MethodSpec, get_method


@dataclass(frozen=True)
class StagePlan:
    """One training run of the plan: its settings, its training data and its evaluation precision."""

    recipe: Recipe  #: the stage's settings (the recipe itself for a one-stage method)
    number: int  #: 1-based, of `of`
    of: int
    #: the method's own training data for this stage (a hook with check() and build(tokenizer)), or None: the text
    #: source's columns
    train_data: Any | None
    eval_mixed: bool  #: whether evaluation (dev and final) encodes under mixed precision (`eval_mixed_precision`)
    #: the datasets the stage's text is read from, one per dataset, each named (`hf_sentcl.configs.sources`); () when
    #: the stage trains on the method's own data
    training_sources: tuple[TrainingSource, ...] = ()

    @property
    def args(self):
        return self.recipe.training


@dataclass(frozen=True)
class RunPlan:
    """A recipe resolved for its run (module docstring); frozen: read it, derive nothing from its recipe again."""

    recipe: Recipe
    stages: tuple[StagePlan, ...]
    #: the training text keys the recipe sets (train_file, dataset_name, unlabeled_sts), whether or not it needs one
    text_sources: tuple[str, ...]
    #: the in-batch negatives: sentences per step over every process
    negatives_batch: int
    whitening: tuple[WhiteningSpec, ...]
    glue: GlueSettings | None

    @property
    def method(self) -> MethodSpec:
        return get_method(self.recipe.method)

    @functools.cached_property
    def data_dir(self) -> Path:
        """The SentEval data directory (STS, transfer, GLUE from SentEval), resolved on first use: it may mean
        downloading the Hub's archive, which the checks do only once every cheaper check has passed."""
        return resolve_data_dir(self.recipe.data.sts_data_dir)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint folder the run resumes from (resolved by `hf_sentcl.recipe.run_folder`), or None."""
        return self.recipe.training.resume_from_checkpoint

    @property
    def train_precision(self) -> str:
        """fp32, bf16 or fp16, as the `precision` key (or the bf16/fp16 keys, or the launcher) resolved it."""
        return self.recipe.training.resolved_precision

    @property
    def training_sources(self) -> tuple[TrainingSource, ...]:
        """The datasets the stages read text from, one per dataset (a chained method's stages may share them)."""
        return tuple(dict.fromkeys(source for stage in self.stages for source in stage.training_sources))

    @property
    def own_data_only(self) -> bool:
        """Whether every stage trains on the method's own data (no text source is read)."""
        return all(stage.train_data is not None for stage in self.stages)

    def resuming_from(self, checkpoint: str | None) -> RunPlan:
        """This plan resuming from `checkpoint` instead (a chained method decides again which stage resumes)."""
        if checkpoint == self.resume_from:
            return self
        training = dataclasses.replace(self.recipe.training, resume_from_checkpoint=checkpoint)
        return plan_run(dataclasses.replace(self.recipe, training=training))


def plan_run(recipe: Recipe) -> RunPlan:
    """Resolve `recipe` into its plan; RecipeError naming the key when a value cannot be derived (a stage's settings
    or data, the whitening or GLUE keys, a global batch too small for in-batch negatives)."""
    spec = get_method(recipe.method)
    try:
        negatives_batch = spec.trainer_class.check_global_batch(recipe.training)
        whitening, glue = suite_settings(recipe.data)
        stage_recipes = spec.stages(recipe)
        stages = tuple(stage_plan(spec, stage, number, len(stage_recipes))
                       for number, stage in enumerate(stage_recipes, start=1))
    except ValueError as err:
        raise RecipeError(f"{recipe.source}: {err}") from None
    return RunPlan(recipe, stages, tuple(text_sources(recipe.data)), negatives_batch, tuple(whitening), glue)


def stage_plan(spec: MethodSpec, stage: Recipe, number: int, of: int) -> StagePlan:
    """One stage's plan: its own data, or the training sources its text is read from (ValueError when it sets none
    or several single ones, `the_training_sources`)."""
    own = spec.train_data(stage)
    return StagePlan(recipe=stage, number=number, of=of, train_data=own,
                     eval_mixed=eval_mixed_precision(stage.data, stage.training),
                     training_sources=() if own is not None else the_training_sources(stage.data))
