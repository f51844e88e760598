"""One run of a checked recipe: build, evaluate before, train, save, evaluate after, report and export."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import set_seed
from transformers.integrations import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

from hf_sentcl.common.distributed import others_wait_for_main_process, world_size
from hf_sentcl.common.layout import (
    ADAPTER_DIRNAME,
    EXPORT_DIRNAME,
    PREEMPTED_JSON,
    RUN_COMPLETE_JSON,
    results_json,
)
from hf_sentcl.common.logs import quiet_library_bars, watched
from hf_sentcl.common.preemption import Preempted, current_watch, set_phase
from hf_sentcl.common.progress import phase
from hf_sentcl.evaluation.mteb import mteb_data_problem, mteb_sts_scores
from hf_sentcl.evaluation.plots import write_run_plots
from hf_sentcl.evaluation.report import RUN_LABELS, embedding_note, write_json, write_results
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.evaluation.suites import EvaluationSuites, SuiteResults, markdown_report, run_results
from hf_sentcl.export.publish import publish_run
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.health import check_final_model
from hf_sentcl.modeling.peft import merge_adapters, parameter_counts, save_adapter
from hf_sentcl.pipeline.build import build_encoder, build_train_data
from hf_sentcl.pipeline.stops import (
    before_evaluation_key,
    keep_before_scores,
    mark_run_complete,
    read_before_scores,
    stop_if_signalled,
    write_preemption_note,
)
from hf_sentcl.recipe.checks import checked
from hf_sentcl.recipe.metadata import run_metadata
from hf_sentcl.recipe.parallelism import describe_parallelism, effective_parallelism
from hf_sentcl.recipe.parser import Recipe
from hf_sentcl.recipe.plan import RunPlan, StagePlan
from hf_sentcl.trainers.callbacks import print_logs_as_numbers
from hf_sentcl.trainers.guide import Guide

logger = logging.getLogger("hf_sentcl")


def evaluate_suites(encoder: SentenceEncoder, stage: Stage) -> SuiteResults:
    return stage.suites(encoder, batch_size=stage.args.per_device_eval_batch_size, bf16=stage.eval_mixed)


def run(recipe: Recipe | RunPlan) -> dict[str, Any]:
    """Train and evaluate as the recipe says, every stage of a chained method in turn; returns the (last stage's)
    results dict that is also written to disk. A recipe is checked first (`checked`); a plan already is."""
    plan = recipe if isinstance(recipe, RunPlan) else checked(recipe)
    quiet_progress_bars(plan.recipe)
    for stage in plan.stages[:-1]:
        run_stage(plan, stage)
        with others_wait_for_main_process():  # the next stage loads this stage's export, written by process 0
            pass
        forget_accelerator_state()
    return run_stage(plan, plan.stages[-1])


def forget_accelerator_state() -> None:
    """Let the next stage's Trainer build its own Accelerator: accelerate keeps one state per process, and a second
    Accelerator given a DeepSpeed plugin is refused ('You cannot pass in a `deepspeed_plugin` when creating a second
    `Accelerator`'). The process group stays (PartialState is kept)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def quiet_progress_bars(recipe: Recipe) -> None:
    """Without a terminal on stderr (a log file, CI output): no progress bars, and Trainer's logs as printed lines.

    Bars redrawn into a file leave carriage returns and cursor-up (`[A`) fragments; `disable_tqdm` set in the recipe
    is kept.
    """
    if watched():
        return
    if "disable_tqdm" not in recipe.explicit_keys:
        recipe.training.disable_tqdm = True  # the stages' settings share this TrainingArguments' fields
    quiet_library_bars()


@dataclass
class Stage:
    """What one run builds from its plan, handed from step to step."""

    plan: RunPlan
    stage: StagePlan
    encoder: SentenceEncoder
    trainer: Any  # the method's ContrastiveTrainer
    suites: EvaluationSuites
    dev_evaluator: STSEvaluator
    num_examples: int | None
    num_views: int
    #: what loading the training data repaired and dropped (results.json's `train.data_cleaning`), when accounted
    data_cleaning: dict[str, Any] | None = None

    @property
    def recipe(self) -> Recipe:
        return self.stage.recipe

    @property
    def args(self):
        return self.stage.recipe.training

    @property
    def eval_mixed(self) -> bool:
        return self.stage.eval_mixed

    @property
    def data_dir(self) -> Path:
        return self.plan.data_dir

    @property
    def reloads_saved_encoder(self) -> bool:
        """Whether the final encoder is the saved one reloaded rather than the trained module: under FSDP and ZeRO-3 no
        process holds the whole model, and under every DeepSpeed engine the save carries the fp32 master weights
        while the module may be a 16-bit copy (`hf_sentcl.trainers.master_weights`)."""
        return self.trainer.is_fsdp_enabled or self.trainer.is_deepspeed_enabled


def run_stage(plan: RunPlan, stage_plan: StagePlan) -> dict[str, Any]:
    """One training run (stage) of a checked plan; returns its results dict (written to disk)."""
    set_seed(stage_plan.args.seed)
    set_phase("setup")
    stage = build_stage(plan, stage_plan)
    state_parallelism(stage)
    parameters = parameter_counts(stage.trainer.model)
    scores = evaluate_before(stage)
    stop_if_signalled(stage.recipe, "before training, during the model load or the evaluation before training")
    train_output = stage.trainer.train(resume_from_checkpoint=stage.args.resume_from_checkpoint)
    end_if_preempted(stage)
    set_phase("finishing")  # a signal from here on stops process 0 at once: training's last checkpoint is complete
    try:
        return finish_stage(stage, train_output, parameters, scores)
    except Preempted as stop:
        if stage.trainer.is_world_process_zero():
            note_preemption(stage, stop.signal_name, stage.trainer.state.global_step, "after training")
        raise


def finish_stage(stage: Stage, train_output, parameters: dict[str, Any], scores: dict[str, SuiteResults]
                 ) -> dict[str, Any]:
    """After training: save the encoder, evaluate it, report, export (process 0), and mark the run complete."""
    save_trained(stage)
    results = training_results(stage, train_output, parameters)
    record = None
    try:
        if stage.trainer.is_world_process_zero():
            encoder = final_encoder(stage)
            scores.update(evaluate_after(stage, encoder))
            results.update(score_results(stage, encoder, scores))
            report(stage, encoder, scores, results)
            results["export"] = export_and_push(stage, encoder, results)
            write_json(results_json(stage.args.output_dir), results)  # with where it went and the push, or why not
            record = mark_run_complete(stage.args.output_dir, results)
            stage.trainer.prune_after_run()
    finally:  # also when process 0 failed: the other nodes wait for its word
        mark_complete_on_every_node(stage, record)
    return results


def mark_complete_on_every_node(stage: Stage, record: dict[str, Any] | None) -> None:
    """With `save_on_each_node` (disks local to each node): process 0 hands its run_complete.json to the other nodes,
    whose first process writes it to its own disk, so a requeued launch finds the run finished on every node
    (`hf_sentcl.recipe.agreement`). `record` is None where process 0 did not complete the run."""
    if not stage.args.save_on_each_node or world_size() == 1:
        return
    import torch.distributed as dist

    from hf_sentcl.common.distributed import _long_wait_group

    shared = [record]
    dist.broadcast_object_list(shared, src=0, group=_long_wait_group())
    if shared[0] is not None and stage.args.should_save and not stage.trainer.is_world_process_zero():
        write_json(Path(stage.args.output_dir) / RUN_COMPLETE_JSON, shared[0])
        (Path(stage.args.output_dir) / PREEMPTED_JSON).unlink(missing_ok=True)


def end_if_preempted(stage: Stage) -> None:
    """Raise `Preempted` when a preemption signal stopped training (`PreemptionCallback`), after process 0 has
    noted it in output_dir/preempted.json."""
    step = stage.trainer.preemption.stop_step
    if step is None:
        return
    watch = current_watch()
    name = watch.received.name if watch.received is not None else "a preemption signal to another process"
    if stage.args.should_save:  # process 0, and each node's first process with save_on_each_node
        note_preemption(stage, name, step, "in training")
    raise Preempted(
        f"preempted by {name}: training stopped at step {step} of {stage.trainer.state.max_steps} and "
        f"checkpoint {Path(stage.args.output_dir) / f'checkpoint-{step}'} is complete. Resume: rerun the same "
        "command with 'resume_from_checkpoint: auto' (or --resume_from_checkpoint latest).", name, step,
    )


def note_preemption(stage: Stage, signal_name: str, step: int, when: str) -> None:
    """output_dir/preempted.json: which signal stopped the run, when, and the checkpoint a requeued run resumes
    from (a job script can test for the file: `accelerate launch` turns every worker's status into 1)."""
    write_preemption_note(stage.args.output_dir, signal_name, when, step, stage.trainer.state.max_steps,
                          Path(stage.args.output_dir) / f"checkpoint-{step}", stage.trainer.steps_run.summary())


def state_parallelism(stage: Stage) -> None:
    """Say in the log (process 0) what the run trains on: processes, DDP/FSDP/ZeRO stage, precision."""
    if stage.trainer.is_world_process_zero():
        print(describe_parallelism(effective_parallelism(stage.trainer)), flush=True)


def build_stage(plan: RunPlan, stage_plan: StagePlan | None = None) -> Stage:
    """The encoder, its training data, the evaluators and the method's trainer, for one stage of the plan (by
    default its last, the only one of most methods)."""
    stage_plan = stage_plan or plan.stages[-1]
    recipe, args, data_dir = stage_plan.recipe, stage_plan.args, plan.data_dir
    plugin = getattr(args, "deepspeed_plugin", None)
    with without_zero3_init(None if plugin is None or plugin.zero3_init_flag else plugin):
        encoder = build_encoder(recipe)
    with without_zero3_init(plugin):  # a frozen helper: whole on every process, never partitioned
        guide = Guide.load(args.guide_model, encoder.tokenizer, args.device) if args.guide_model else None
    with args.main_process_first(desc="tokenising training data"):
        train_data = build_train_data(stage_plan, encoder.tokenizer)
    train_dataset, num_views, collator = train_data.dataset, train_data.num_views, train_data.collator
    # a stream (`streaming: true`) has no length: its rows are counted as they are read (data_cleaning)
    num_examples = len(train_dataset) if hasattr(train_dataset, "__len__") else None
    logger.info("Training on %s examples with %d text view(s) each.", num_examples or "a stream of", num_views)
    eval_mixed = stage_plan.eval_mixed
    logger.info("Precision: training %s (precision: %s), evaluation %s.", args.resolved_precision,
                args.precision or "from bf16/fp16", "mixed" if eval_mixed else "fp32")
    dev_evaluator = STSEvaluator(data_dir, tasks=("STSBenchmark",), split="dev")
    suites = EvaluationSuites(
        data_dir, recipe.data.eval_tasks, sts_mode=recipe.data.sts_mode, whitening=plan.whitening, glue=plan.glue
    )
    trainer = plan.method.trainer_class(
        model=encoder,
        # The Trainer's own push would upload output_dir with its checkpoints; publish_run pushes the export only.
        args=dataclasses.replace(args, push_to_hub=False) if args.push_to_hub else args,
        train_dataset=train_dataset,
        eval_dataset=dev_dataset(dev_evaluator),
        data_collator=collator,
        processing_class=encoder.tokenizer,
        dev_evaluator=dev_evaluator,
        eval_bf16=eval_mixed,
        guide=guide,
    )
    print_logs_as_numbers(trainer)
    return Stage(plan, stage_plan, encoder, trainer, suites, dev_evaluator, num_examples, num_views,
                 data_cleaning=train_data.data_cleaning)


def dev_dataset(dev_evaluator: STSEvaluator) -> Dataset:
    """STS-B dev as the trainer's eval_dataset (its evaluation loop scores it with `dev_evaluator`)."""
    pairs = dev_evaluator.data["STSBenchmark"]["dev"]
    return Dataset.from_dict({"sentence1": pairs.sentences1, "sentence2": pairs.sentences2, "score": pairs.scores})


def evaluate_before(stage: Stage) -> dict[str, SuiteResults]:
    """The untouched encoder's scores, printed (process 0; `{}` when the recipe asks for none). Called after the
    trainer is built, so "before" scores the encoder that trains (CLEAR's from_scratch replaces it).

    A signal stops it at once (phase `evaluating`; `stop_if_signalled` then ends the run), and the scores are kept in
    output_dir (`EVAL_BEFORE_JSON`), so a requeued run reuses them rather than evaluating again."""
    recipe = stage.recipe
    if not (stage.suites.suites and recipe.data.eval_before_training):
        return {}
    before = None
    with others_wait_for_main_process() as main:  # the others wait longer than ddp_timeout if need be
        if not main:
            return {}
        key = before_evaluation_key(recipe, stage.eval_mixed)
        before = read_before_scores(stage.args.output_dir, key)
        if before is None:
            before = evaluate_untouched(stage)
            if before is not None:
                keep_before_scores(stage.args.output_dir, key, before)
    if before is None:
        return {}
    table = markdown_report({RUN_LABELS["before"]: before}, recipe.data.sts_mode)
    print(f"{table}\n{embedding_note(stage.encoder)}", flush=True)
    return {"before": before}


def evaluate_untouched(stage: Stage) -> SuiteResults | None:
    """Process 0's evaluation of the encoder before training, or None when a preemption signal stopped it."""
    set_phase("evaluating")
    try:
        with on_device(stage.encoder, stage.args.device), phase("Evaluation before training"):
            return evaluate_suites(stage.encoder, stage)
    except Preempted:
        return None
    finally:
        set_phase("setup")


@contextmanager
def on_device(encoder: SentenceEncoder, device: torch.device) -> Iterator[None]:
    """`encoder` on `device` inside the block, back on its own device after.

    Under FSDP and DeepSpeed the Trainer leaves the model on the CPU until `train()` prepares it, so the "before"
    evaluation would encode on the CPU (one thread per process under `accelerate launch`) while a GPU waits; it
    goes back because FSDP and DeepSpeed expect to place (and shard) it themselves."""
    original = encoder.device
    if original == torch.device(device):
        yield
        return
    encoder.to(device)
    try:
        yield
    finally:
        encoder.to(original)


def save_trained(stage: Stage) -> None:
    """Save the encoder to output_dir: with its LoRA adapter saved alone when asked and then merged, after refusing a
    poisoned model. A reloaded encoder (`Stage.reloads_saved_encoder`) is saved as trained (every process takes
    part) and adapter, merge and check follow in `final_encoder`."""
    args, trainer = stage.args, stage.trainer
    if stage.reloads_saved_encoder:
        trainer.save_model(args.output_dir)
        return
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.is_world_process_zero():
        save_lora_adapter(trained, args)
    merge_adapters(trained)  # the saved encoder and its export are plain models (no-op without peft)
    _check_trained(trained, stage)  # refuse a poisoned model before it is saved
    trainer.save_model(args.output_dir)


def save_lora_adapter(encoder: SentenceEncoder, args) -> None:
    """With `export_adapter`, save the encoder's LoRA adapter alone to <output_dir>/adapter."""
    if args.export_adapter:
        print(f"LoRA adapter saved to {save_adapter(encoder, Path(args.output_dir) / ADAPTER_DIRNAME)}", flush=True)


def training_results(stage: Stage, train_output, parameters: dict[str, Any]) -> dict[str, Any]:
    """The results dict's description of the run and its training (every process computes it)."""
    recipe, trainer = stage.recipe, stage.trainer
    return {
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
            # every logged training loss and gradient norm, unrounded (e.g. to compare runs on 1 and N processes),
            # and with several datasets each one's loss (loss_<name>)
            "loss_curve": [
                {key: e[key] for key in e if key in ("step", "loss", "grad_norm") or key.startswith("loss_")}
                for e in trainer.state.log_history if "loss" in e
            ],
            # every STS-B dev evaluation: step, eval_stsb_spearman, eval_alignment, eval_uniformity, ...
            "dev_curve": [entry for entry in trainer.state.log_history if "eval_stsb_spearman" in entry],
            # rows read, kept, repaired and dropped while loading the training data (hf_sentcl.data.cleaning)
            **({"data_cleaning": _as_dict(stage.data_cleaning)} if stage.data_cleaning is not None else {}),
        },
    }


def _as_dict(cleaning: Any) -> dict[str, Any]:
    """A data account as results.json holds it: a stream's (`StreamAccount`) is read at the end, when it is full."""
    return cleaning.as_dict() if hasattr(cleaning, "as_dict") else cleaning


def final_encoder(stage: Stage) -> SentenceEncoder:
    """The trained encoder as evaluated and exported (process 0): without accelerate's mixed-precision forward wrapper
    (so evaluation precision follows eval_bf16), on the device training ran on. Under FSDP and DeepSpeed it is the
    saved encoder reloaded whole in fp32, its LoRA adapter saved alone when asked and merged (output_dir then holds
    the merged encoder, as after other runs)."""
    trainer = stage.trainer
    if not stage.reloads_saved_encoder:
        return trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    with without_zero3_init(getattr(trainer.accelerator.state, "deepspeed_plugin", None)):
        encoder = load_saved_encoder(stage.args.output_dir)
    save_lora_adapter(encoder, stage.args)
    if merge_adapters(encoder):
        encoder.save_pretrained(stage.args.output_dir)
    # from_pretrained builds it on the CPU: left there, the final check, evaluation and export of a GPU run would
    # encode tens of thousands of sentences on the CPU, with the one thread `accelerate launch` gives a process
    # (OMP_NUM_THREADS=1), minutes for a MiniLM that the GPU encodes in seconds
    encoder.to(stage.args.device)
    logger.info("Final encoder reloaded whole from %s onto %s.", stage.args.output_dir, stage.args.device)
    _check_trained(encoder, stage)
    return encoder


@contextmanager
def without_zero3_init(plugin) -> Iterator[None]:
    """Models built inside load whole, not under `deepspeed.zero.Init` (`plugin`: the run's DeepSpeed plugin, or None
    to leave model building as it is).

    While a ZeRO-3 config is registered, transformers builds every model under `deepspeed.zero.Init`, which
    partitions each weight across the process group as it is created, whatever the accelerate config's
    `zero3_init_flag` says (accelerate registers the config either way). Used for the encoder when that flag is false
    (deepspeed_zero3.yaml: the untouched encoder is evaluated whole before training; DeepSpeed partitions it when the
    Trainer prepares it), and for process 0's reload of the final encoder, which alone would wait in zero.Init for
    processes that have finished (gloo: 'Connection closed by peer'). The plugin's config is registered again after.
    """
    if plugin is None or not is_deepspeed_zero3_enabled():
        yield
        return
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def load_saved_encoder(output_dir: str | Path) -> SentenceEncoder:
    """The saved encoder in fp32, whatever dtype the save wrote (FSDP's full state dict of a bf16 run may be bf16):
    the final evaluation and the export read fp32 weights, as after unsharded training."""
    return SentenceEncoder.from_pretrained(output_dir, dtype=torch.float32)


def evaluate_after(stage: Stage, encoder: SentenceEncoder) -> dict[str, SuiteResults]:
    if not stage.suites.suites:
        return {}
    with phase("Final evaluation"):
        return {"after": evaluate_suites(encoder, stage)}


def export_and_push(stage: Stage, encoder: SentenceEncoder, results: dict[str, Any]) -> dict[str, Any]:
    """The export (and push) of the trained encoder, or a note that the recipe skipped it (`export: false`)."""
    if not stage.args.export:
        out = Path(stage.args.output_dir)
        logger.info("Export skipped (export: false); `hf-sentcl export %s %s` exports this run later.", out,
                    out / EXPORT_DIRNAME)
        return {"skipped": "export: false"}
    with phase("Export", "the encoder as a Hugging Face and sentence-transformers model with its card"):
        return publish_run(encoder, results, stage.args)


def score_results(stage: Stage, encoder: SentenceEncoder, scores: dict[str, SuiteResults]) -> dict[str, Any]:
    """The results dict's scores: the suites before/after, and MTEB's STS protocol for the card's model-index."""
    recipe = stage.recipe
    results = run_results(scores)
    if "after" not in results["sts"]:
        return results
    problem = mteb_data_problem(stage.data_dir)
    if not recipe.training.export:  # the scores exist for the export's card and MTEB files
        return results
    if problem:
        logger.info("MTEB-protocol scores left out (the card's model-index and the MTEB result files name MTEB's "
                    "datasets, so they are computed on SentEval's own STS data only): %s.", problem)
    else:  # MTEB's protocol (SICK-R on all pairs)
        with phase("MTEB-protocol STS scores", "for the card's model-index and the MTEB result files"):
            results.update(mteb_sts_scores(
                encoder, stage.data_dir, recipe.training.per_device_eval_batch_size, stage.eval_mixed,
                reuse=results["sts"]["after"] if recipe.data.sts_mode == "all" else None,
            ).to_results())
    return results


def report(stage: Stage, encoder: SentenceEncoder, scores: dict[str, SuiteResults], results: dict[str, Any]) -> None:
    """Add the run's metadata and plots to `results`, write results.json/.md and print the table."""
    recipe, args = stage.recipe, stage.args
    results.update(run_metadata(
        stage.stage, encoder, stage.num_examples, stage.num_views, effective_parallelism(stage.trainer)
    ))
    results["plots"] = write_run_plots(
        args.output_dir, stage.trainer.state.log_history,
        {RUN_LABELS[k]: r.stsb_predictions for k, r in scores.items() if r.stsb_predictions},
    )
    table = markdown_report({RUN_LABELS[k]: r for k, r in scores.items()}, recipe.data.sts_mode)
    table += "\n" + embedding_note(encoder)
    json_path, md_path = write_results(args.output_dir, results, table)
    print("\n" + table, flush=True)
    print(f"\nResults: {json_path} and {md_path}; encoder saved to {args.output_dir}", flush=True)


def _check_trained(encoder: SentenceEncoder, stage: Stage) -> None:
    """TrainingFailure if the trained encoder's weights or STS-B dev embeddings are non-finite or collapsed (encoded
    as the evaluation encodes them)."""
    with phase("Health check of the trained encoder", "finite weights, STS-B dev embeddings not collapsed"):
        embeddings = stage.dev_evaluator.embed(encoder, batch_size=stage.args.per_device_eval_batch_size,
                                               bf16=stage.eval_mixed)
    check_final_model(encoder, embeddings)


def _best_step(trainer) -> int | None:
    checkpoint = trainer.state.best_model_checkpoint
    return int(checkpoint.rsplit("-", 1)[-1]) if checkpoint else None
