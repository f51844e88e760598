"""The launch topology of a run: checked before any work, and stated in the log and results.json once training runs.

`check_topology(recipe)` refuses, before a model loads, the launches that would train differently from what the
user asked for or hang:

- FSDP on a machine without accelerators: accelerate enables FSDP only for accelerator devices, so `fsdp.yaml` on
  CPUs silently trains plain gloo DDP with whole weights on every process. DeepSpeed configs run there: DeepSpeed
  falls back to its CPU accelerator (gloo without oneCCL) and shards as asked;
- ZeRO-3 with `zero3_init_flag: true`: the encoder would be built already partitioned, which the "before"
  evaluation, the parameter counts and the training heads (built whole, in fp32) cannot work with;
- methods that use weights outside the encoder's forward under FSDP or ZeRO-3 (SG/SG-OPT, CLEAR: the registry's
  `sharded_weights_problem`; ConSERT's supervised modes: its NLI classifier), where those configs leave them
  sharded (ZeRO-3 hands out an empty tensor);
- LoRA under FSDP or ZeRO-3: adapters would be merged into sharded weights and saved from process 0's shard;
- `compile_layers` under FSDP or ZeRO-3: their hooks gather each layer's weights around its forward, which a
  compiled layer graph does not run through (untested, so refused);
- plain `python -m hf_sentcl.run` on a host with several GPUs: Trainer would wrap the encoder in `DataParallel`,
  whose replicas see row chunks (ConSERT's hooks raise, gathered negatives shrink);
- `eval_tasks: [glue]` with more than one process: GLUE fine-tunes a nested Trainer on process 0 alone, whose
  collectives wait for processes that never join;
- `even_batches: false` with more than one process: the embedding gather needs the same batch size on every process.

`effective_parallelism(trainer)` says what the prepared trainer actually runs: process count, strategy (single
process, DDP, FSDP1/2, DeepSpeed ZeRO stage), backend, device and mixed precision.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from hf_sentcl.registry import get_method

if TYPE_CHECKING:
    from hf_sentcl.recipe.parser import Recipe

CONFIGS = "recipes/accelerate_configs"
CPU_CONFIG = f"{CONFIGS}/multi_cpu.yaml"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def requests_deepspeed(args) -> bool:
    """Whether the launcher (`ACCELERATE_USE_DEEPSPEED`) or the recipe (`deepspeed`) asks for DeepSpeed."""
    return _env_true("ACCELERATE_USE_DEEPSPEED") or bool(getattr(args, "deepspeed", None))


def requested_sharding(args) -> str | None:
    """The sharding the launcher or the recipe asks for ('FSDP', 'DeepSpeed ZeRO-N'), or None (plain DDP / one
    process)."""
    if _env_true("ACCELERATE_USE_FSDP") or getattr(args, "fsdp", None):
        return "FSDP"
    if requests_deepspeed(args):
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        if stage is None and isinstance(getattr(args, "deepspeed", None), dict):
            stage = args.deepspeed.get("zero_optimization", {}).get("stage")
        return f"DeepSpeed ZeRO-{stage}" if stage is not None else "DeepSpeed"
    return None


def has_accelerator() -> bool:
    """Whether this machine has a device accelerate shards on (CUDA, XPU, NPU...)."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def sharding_problem(args, accelerator: bool) -> str | None:
    """Why the requested sharding cannot be honoured on this machine (None when it can, or none is requested): FSDP
    without an accelerator. DeepSpeed's ZeRO stages run on CPU processes too (DeepSpeed's CPU accelerator)."""
    sharding = requested_sharding(args)
    if sharding != "FSDP" or accelerator:
        return None
    return (
        f"the accelerate config asks for {sharding}, but this machine has no GPU (or other accelerator): accelerate "
        "would silently train plain data parallel across CPU processes with the whole model on each, not sharded. "
        f"On CPUs use --config_file {CPU_CONFIG}; run the sharded config on GPUs."
    )


def zero3_init_problem(args) -> str | None:
    """Why the DeepSpeed config's `zero3_init_flag` cannot be honoured (None when it is off, or without DeepSpeed)."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is None or not getattr(plugin, "zero3_init_flag", False):
        return None
    return (
        "the DeepSpeed config sets zero3_init_flag: true (or leaves it unset in a `deepspeed` JSON file, where it "
        "defaults to true for ZeRO-3), which builds the encoder already partitioned across the processes; hf_sentcl "
        "builds it whole on every process (the untouched encoder is evaluated before training, its training heads "
        "are built beside it) and DeepSpeed partitions it when training starts. Set zero3_init_flag: false, as "
        f"{CONFIGS}/deepspeed_zero3.yaml does (or export ACCELERATE_DEEPSPEED_ZERO3_INIT=false)."
    )


def method_sharding_problem(recipe: Recipe) -> str | None:
    """Why the method cannot train under the requested sharding (weights read outside the forward), or None."""
    sharding = requested_sharding(recipe.training)
    if sharding is None or not (sharding == "FSDP" or sharding.endswith("-3")):
        return None
    if getattr(recipe.training, "compile_layers", False):
        return (
            f"compile_layers cannot run under {sharding}: that config gathers each layer's sharded weights in hooks "
            "around its forward, which the compiled layer graph does not go through. Set compile_layers: false, or "
            f"use a DDP ({CONFIGS}/ddp*.yaml) or ZeRO-2 ({CONFIGS}/deepspeed_zero2.yaml) config."
        )
    if recipe.model.peft:
        return (
            f"LoRA ('peft') cannot run under {sharding} here: the adapters would be merged into sharded weights and "
            f"saved by process 0 from its shard. Use a DDP ({CONFIGS}/ddp*.yaml) or ZeRO-2 "
            f"({CONFIGS}/deepspeed_zero2.yaml) config: LoRA's small optimizer state rarely needs sharding."
        )
    if reason := get_method(recipe.method).sharded_weights_problem:
        return (
            f"method {recipe.method} cannot run under {sharding}: {reason}, where that config leaves them sharded. "
            f"Use a DDP ({CONFIGS}/ddp*.yaml) or ZeRO-2 ({CONFIGS}/deepspeed_zero2.yaml) config."
        )
    mode = getattr(recipe.training, "supervised_mode", "unsup")
    if recipe.method == "consert" and mode != "unsup":
        return (
            f"method consert with supervised_mode '{mode}' cannot run under {sharding}: its NLI classifier's weight "
            "is read outside the encoder's forward, where that config leaves it sharded. Use a DDP "
            f"({CONFIGS}/ddp*.yaml) or ZeRO-2 ({CONFIGS}/deepspeed_zero2.yaml) config."
        )
    return None


def data_parallel_problem(args, device_count: int) -> str | None:
    """Why one process on this host would train under torch DataParallel (several visible GPUs), or None."""
    if max(getattr(args, "world_size", 1), 1) > 1 or getattr(args, "use_cpu", False) or device_count <= 1:
        return None
    return (
        f"one process sees {device_count} GPUs, so Trainer would wrap the encoder in torch DataParallel (replicas "
        "see slices of the batch: ConSERT's hooks fail, in-batch negatives shrink). Launch one process per GPU "
        f"with `accelerate launch --config_file {CONFIGS}/ddp.yaml -m hf_sentcl.run RECIPE`, or train on one "
        "GPU with CUDA_VISIBLE_DEVICES=0."
    )


def process_group_problems(recipe: Recipe) -> list[str]:
    """Settings that cannot work with more than one process (an empty list with one)."""
    args = recipe.training
    if max(args.world_size, 1) <= 1:
        return []
    problems = []
    if "glue" in (recipe.data.eval_tasks or ()):
        problems.append(
            f"key 'eval_tasks': glue fine-tunes a nested Trainer on process 0 alone, which hangs inside the "
            f"{args.world_size}-process group; remove glue from eval_tasks and run `hf-sentcl glue --model "
            "OUTPUT_DIR` (one process) after training."
        )
    accelerator_config = getattr(args, "accelerator_config", None)
    if accelerator_config is not None and getattr(accelerator_config, "even_batches", True) is False:
        problems.append(
            "key 'accelerator_config': even_batches false lets processes hold batches of different sizes, but the "
            "embedding gather across processes needs equal ones; leave even_batches on (the default)."
        )
    return problems


def check_topology(recipe: Recipe) -> None:
    """RecipeError, before any work, for a launch this run cannot honour (see the module docstring)."""
    from hf_sentcl.recipe.parser import RecipeError

    args = recipe.training
    problems = [p for p in (method_sharding_problem(recipe), sharding_problem(args, has_accelerator()),
                            zero3_init_problem(args)) if p]
    problems += process_group_problems(recipe)
    if problem := data_parallel_problem(args, torch.cuda.device_count()):
        problems.append(problem)
    if problems:
        raise RecipeError(f"{recipe.source}: " + problems[0])


def effective_parallelism(trainer) -> dict[str, Any]:
    """What the prepared trainer runs: processes, strategy, backend, device and precision (stored in results.json)."""
    accelerator = trainer.accelerator
    state = accelerator.state
    processes = state.num_processes
    deepspeed = getattr(state, "deepspeed_plugin", None)
    if getattr(trainer, "is_fsdp_enabled", False):
        strategy = f"FSDP{getattr(state.fsdp_plugin, 'fsdp_version', 1)}"
    elif deepspeed is not None:
        strategy = f"DeepSpeed ZeRO-{deepspeed.zero_stage}"
    else:
        strategy = "DDP" if processes > 1 else "single process"
    args = trainer.args
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    return {
        "processes": processes,
        "strategy": strategy,
        "distributed_type": str(getattr(state.distributed_type, "value", state.distributed_type)),
        "backend": state.backend,
        "device": state.device.type,
        "precision": precision,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "global_train_batch_size": args.per_device_train_batch_size * processes,
    }


def parallelism_summary(parallelism: dict[str, Any]) -> str:
    """What a run trained on, in words (the log line and the model card): '2 processes, DDP (gloo on cpu), fp32,
    global batch 8 (4 per process)', or '1 process (cpu), fp32, batch 8' for a single process."""
    p = parallelism
    if p["strategy"] == "single process":
        return f"1 process ({p['device']}), {p['precision']}, batch {p['global_train_batch_size']}"
    backend = f"{p['backend']} on {p['device']}" if p.get("backend") else p["device"]
    processes = "1 process" if p["processes"] == 1 else f"{p['processes']} processes"
    return (
        f"{processes}, {p['strategy']} ({backend}), {p['precision']}, global batch "
        f"{p['global_train_batch_size']} ({p['per_device_train_batch_size']} per process)"
    )


def describe_parallelism(parallelism: dict[str, Any]) -> str:
    """One log line: 'Parallelism: ' and `parallelism_summary`."""
    return f"Parallelism: {parallelism_summary(parallelism)}"
