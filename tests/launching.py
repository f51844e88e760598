"""The users' launch lines, run as subprocesses by the multi-process tests, and what the tests read back.

    python -m hf_sentcl.run RECIPE ...                                                      (config None: 1 process)
    accelerate launch --config_file recipes/accelerate_configs/CONFIG -m hf_sentcl.run RECIPE ...
    accelerate launch --config_file recipes/accelerate_configs/fsdp.yaml tests/pipeline/trainer_fsdp_cpu.py RECIPE ...

The last is fsdp.yaml the way a CPU allows it (`tests/pipeline/trainer_fsdp_cpu.py` makes accelerate take the gloo
group for a GPU group). Only the process count is set on the command line (`--num_processes`: the configs ask for 8
GPUs); DeepSpeed uses its CPU accelerator. Overrides after the recipe are the tests' business.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
CONFIGS = RECIPES / "accelerate_configs"
FSDP_HARNESS = REPO / "tests" / "pipeline" / "trainer_fsdp_cpu.py"
#: accelerate's settings in the environment of the test process that would override the config file's
LAUNCHER_ENV = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_MIXED_PRECISION",
                "ACCELERATE_DEEPSPEED_ZERO3_INIT")


def launch_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONFAULTHANDLER": "1", **extra,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for name in LAUNCHER_ENV:
        env.pop(name, None)
    return env


def free_port() -> int:
    """A TCP port free on this host now, for a launch's rendezvous: launches of parallel test workers (pytest -n)
    must not meet on a config's fixed `main_process_port`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launcher(config: str, processes: int = 2) -> list[str]:
    """`accelerate launch --config_file recipes/accelerate_configs/<config>` for `processes` processes on a free
    port, up to the launcher's own options and the script."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
            "--num_processes", str(processes), "--main_process_port", str(free_port())]


def launch_command(config: str | None, processes: int = 2, launcher: tuple[str, ...] = ()) -> list[str]:
    """The command line up to the recipe: 1 process without a config, else `accelerate launch` with it and the
    `launcher` options."""
    if config is None:
        return [sys.executable, "-m", "hf_sentcl.run"]
    entry = [str(FSDP_HARNESS)] if config == "fsdp.yaml" else ["-m", "hf_sentcl.run"]
    return [*accelerate_launcher(config, processes), *launcher, *entry]


def launch(config: str | None, recipe: str | Path, output: Path, *overrides: str, processes: int = 2,
           launcher: tuple[str, ...] = (), timeout: float = 600,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `recipe` (a path, or a name under recipes/) with `config` and the `launcher` options, into `output`, and
    wait for it.

    Under the CPU FSDP harness a worker that dies of SIGSEGV is relaunched once, from `output` as it was before the
    launch, with a warning that carries the workers' faulthandler stacks: FSDP on CPU processes is an emulation that
    torch does not support (`trainer_fsdp_cpu.py`), and CI saw one worker crash once in ~30 launches while saving a
    checkpoint (pytorch's CPU state-dict offload has had use-after-free bugs, Lightning-AI/pytorch-lightning#21804).
    Any other failure, or a second crash, is the launch's result."""
    recipe = Path(recipe) if Path(recipe).is_file() else RECIPES / recipe
    command = [*launch_command(config, processes, launcher), str(recipe), "--output_dir", str(output), *overrides]
    run = functools.partial(subprocess.run, command, capture_output=True, text=True, env=env or launch_env(),
                            timeout=timeout)
    if config != "fsdp.yaml":
        return run()
    with tempfile.TemporaryDirectory() as keep:
        before = Path(keep) / "output"
        if output.exists():
            shutil.copytree(output, before, symlinks=True)
        result = run()
        if not died_of_native_crash(result):
            return result
        warnings.warn(f"CPU FSDP harness: a worker crashed in native code; relaunched once.\n{native_crash(result)}",
                      stacklevel=2)
        shutil.rmtree(output, ignore_errors=True)
        if before.exists():
            shutil.copytree(before, output, symlinks=True)
        return run()


def died_of_native_crash(result: subprocess.CompletedProcess) -> bool:
    """Whether a worker of the launch died of SIGSEGV (torchrun's report: `exitcode  : -11`)."""
    return result.returncode != 0 and re.search(r"exitcode\s*:\s*-11\b", result.stderr) is not None


def native_crash(result: subprocess.CompletedProcess) -> str:
    """The workers' faulthandler reports (PYTHONFAULTHANDLER: the Python stack of every thread at the crash)."""
    lines = result.stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if "Fatal Python error" in line]
    return "\n".join("\n".join(lines[i:i + 40]) for i in starts) or "(no faulthandler report)"


def failure(result: subprocess.CompletedProcess) -> str:
    """A finished launch's errors (each process's, which the launcher's own traceback would push out of a tail) and
    the tail of its output, for an assertion message."""
    errors = dict.fromkeys(line for line in result.stderr.splitlines() if "Error" in line or line.startswith("error:"))
    return (f"exit {result.returncode}\n--- errors\n" + "\n".join(list(errors)[:20]) +
            f"\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-4000:]}")


def results_of(output: Path) -> dict:
    return json.loads((output / "results.json").read_text())


def export_weights(output: Path) -> dict[str, torch.Tensor]:
    return load_file(output / "export" / "model.safetensors")


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys=None) -> float:
    """Max |a - b| over `keys` (default: the tensors both hold with the same shape; there must be some)."""
    keys = sorted(keys if keys is not None else (k for k in a.keys() & b.keys() if a[k].shape == b[k].shape))
    assert keys
    return max((a[k].double() - b[k].double()).abs().max().item() for k in keys)


def cut_back(folder: Path, step: int) -> Path:
    """`folder` as a run killed right after its checkpoint-`step` was complete: later checkpoints and everything a
    finished run adds (results, encoder, export) removed."""
    for path in folder.iterdir():
        step_of = int(path.name.split("-")[1]) if path.name.startswith("checkpoint-") else None
        if step_of is None or step_of > step:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return folder


def nudge_checkpoint(checkpoint: Path, amount: float = 1e-3) -> int:
    """Add `amount` to every weight a resume reads from `checkpoint`, in place: model.safetensors (1 process, DDP),
    and under DeepSpeed the fp32 master partitions in each rank's optimizer state and the module in the model state
    (the resumed engine takes its weights from those). Returns the number of tensors changed."""
    from safetensors.torch import save_file

    from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE
    from hf_sentcl.trainers.checkpoint_files import write_completion_mark

    changed = 0
    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        state = {k: v + amount if v.is_floating_point() else v for k, v in load_file(weights).items()}
        save_file(state, weights, metadata={"format": "pt"})
        changed += len(state)
    for path in sorted(checkpoint.glob("global_step*/*.pt")):
        saved = torch.load(path, weights_only=False)
        if "optimizer_state_dict" in saved:
            optimizer = saved["optimizer_state_dict"]
            for key in ("single_partition_of_fp32_groups", "fp32_flat_groups"):  # ZeRO-2, ZeRO-3
                for group in optimizer.get(key, []):
                    group.data.add_(amount)
                    changed += 1
        elif isinstance(saved.get("module"), dict):
            for tensor in saved["module"].values():
                if tensor.is_floating_point() and tensor.numel():
                    tensor.add_(amount)
                    changed += 1
        torch.save(saved, path)
    mark = checkpoint / CHECKPOINT_COMPLETE
    if changed and mark.is_file():  # changed on purpose: record the new crc32s, or a resume skips it as damaged
        write_completion_mark(checkpoint, json.loads(mark.read_text())["global_step"])
    return changed
