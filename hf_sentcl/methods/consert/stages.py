"""ConSERT's chained settings (sup-unsup, joint-unsup: two runs, the second from the first's export) and the NLI data
of its supervised stages: what the registry's `stages_path` and `train_data_path` name. The pipeline runs the stages
in turn (`hf_sentcl.pipeline.train.run`); the trainer trains one of them and knows nothing of the chain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hf_sentcl.common.layout import RUN_COMPLETE_JSON, export_dir
from hf_sentcl.data.corpus import text_sources
from hf_sentcl.data.nli import NLITrainData, resolve_nli_source
from hf_sentcl.methods.consert.config import CHAINED_MODES, STAGE_KEYS
from hf_sentcl.registry import get_method

#: the recipe keys of the plug-ins that act on an in-batch contrastive loss (`matryoshka_dims`, `false_negatives`,
#: the IFM/BYOP margin), switched off (their defaults) in a chained mode's `sup` stage: see `plugins_for_stage`
IN_BATCH_PLUGIN_KEYS = (
    "matryoshka_dims", "matryoshka_weights", "false_negatives", "guide_model", "guide_margin", "guide_margin_strategy",
    "perturbation", "margin", "margin_type", "detach_margin", "multi_task",
)


def plugins_for_stage(args, mode: str) -> dict:
    """The plug-in keys to override in a chained mode's stage that runs `mode`: {} (the recipe's values) unless the
    stage is `sup`, which gets every plug-in off.

    Why: ConSERT's `sup` stage is a sentence-pair classifier (section 3.3, Eq. 2: cross-entropy of W(r1, r2,
    |r1 - r2|) + b on the NLI labels, as SBERT-NLI), with no in-batch loss. Matryoshka prefixes, the masking of
    duplicate in-batch negatives and the IFM/BYOP logit margin all act on the in-batch NT-Xent, so in that stage
    they would have nothing to act on (a recipe in plain `sup` mode with one of them is refused for that reason).
    In sup-unsup they belong to stage 2, the unsupervised NT-Xent on the target text, which also writes the final
    encoder: so the Matryoshka prefixes the recipe asks for are those of the encoder it exports. In joint-unsup
    both stages have the NT-Xent (joint: L_ce + alpha * L_con), and both keep the recipe's plug-ins: duplicate
    premises are common in NLI (one premise, three hypotheses), which is what `false_negatives: mask` is for."""
    if mode != "sup":
        return {}
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.name in IN_BATCH_PLUGIN_KEYS}
    return {key: defaults[key] for key in IN_BATCH_PLUGIN_KEYS if key in defaults}


def first_stage_batch(args) -> dict:
    """The first stage's batch override: supervised_batch_size is global, like global_train_batch_size, and split
    over the processes (ValueError when it cannot be split evenly)."""
    if not args.supervised_batch_size:
        return {}
    processes = max(args.world_size, 1)
    if args.supervised_batch_size % processes:
        raise ValueError(
            f"supervised_batch_size={args.supervised_batch_size} (the first stage's global batch) cannot be split "
            f"evenly over {processes} processes; use a multiple of {processes}."
        )
    return {"global_train_batch_size": args.supervised_batch_size}


def consert_stages(recipe) -> list:
    """The recipe's training stages. sup-unsup / joint-unsup: stage 1 (sup / joint on the NLI pairs) writes to
    <output_dir>/stage-1; stage 2 (unsup on the unlabeled text) starts from stage 1's exported encoder and writes
    the final results to output_dir. Other modes: the recipe itself. The in-batch plug-ins (`matryoshka_dims`,
    `false_negatives`, the IFM/BYOP margin) go to the stages with an in-batch loss (`plugins_for_stage`): both stages
    of joint-unsup, stage 2 only of sup-unsup.

    `resume_from_checkpoint` resumes the stage whose output folder holds the checkpoint: one under
    <output_dir>/stage-1 resumes stage 1 (then stage 2 runs), any other resumes stage 2 alone from stage 1's export;
    so does one of a finished stage 1 (`run_complete.json`: `auto` when stage 2 stopped before its first checkpoint).
    """
    args = recipe.training
    sources = text_sources(recipe.data)
    if args.supervised_mode in ("sup", "joint") and sources:
        raise ValueError(
            f"supervised_mode '{args.supervised_mode}' trains on nli_source only; {sources} would be unused "
            "(use sup-unsup / joint-unsup to continue on unlabeled text, or remove it)."
        )
    if args.supervised_mode not in CHAINED_MODES:
        return [recipe]
    first_mode, second_mode = CHAINED_MODES[args.supervised_mode]
    stage_dir = Path(args.output_dir) / get_method("consert").stage_dirname
    no_stage_keys = dict.fromkeys(STAGE_KEYS)
    resume = args.resume_from_checkpoint
    resume_first = bool(resume) and Path(resume).resolve().is_relative_to(stage_dir.resolve())
    first = dataclasses.replace(
        args, supervised_mode=first_mode, output_dir=str(stage_dir), push_to_hub=False,
        resume_from_checkpoint=resume if resume_first else None,
        learning_rate=args.supervised_learning_rate or args.learning_rate,
        num_train_epochs=args.supervised_num_train_epochs or args.num_train_epochs, **first_stage_batch(args),
        **no_stage_keys, **plugins_for_stage(args, first_mode),
    )
    second = dataclasses.replace(
        args, supervised_mode=second_mode, nli_source=None, nli_splits=None, nli_config=None, adversarial=False,
        resume_from_checkpoint=None if resume_first else resume, **no_stage_keys,
    )
    stage_one_export = export_dir(stage_dir)
    second_model = dataclasses.replace(recipe.model, model_name_or_path=str(stage_one_export), tokenizer_name=None)
    # the few-shot subset (train_subset_size) limits the unlabeled text of stage 2, not the NLI pairs (Figure 6)
    first_data = dataclasses.replace(recipe.data, train_subset_size=None)
    stages = [
        dataclasses.replace(recipe, data=first_data, training=first),
        dataclasses.replace(recipe, model=second_model, training=second),
    ]
    if resume and not resume_first:  # stage 2 is resumed: stage 1 is done
        if not stage_one_export.is_dir():
            raise ValueError(
                f"resume_from_checkpoint '{resume}' resumes stage 2, which starts from stage 1's export "
                f"'{stage_one_export}', but that folder does not exist (point it at a stage-1 checkpoint instead)."
            )
        return stages[1:]
    # `auto`: stage 1 finished, stage 2 had no checkpoint
    if resume_first and (stage_dir / RUN_COMPLETE_JSON).is_file():
        return stages[1:]
    return stages


def consert_train_data(recipe) -> NLITrainData | None:
    """The NLI pairs of a sup / joint stage; None for unsup (the plain-text loader reads the unlabeled text)."""
    args, data = recipe.training, recipe.data
    if args.supervised_mode == "unsup":
        return None
    source = resolve_nli_source(args.nli_source, args.nli_splits, data.sts_data_dir, args.nli_config)
    return NLITrainData(source, **NLITrainData.of(data))
