"""Preemption for real, on 1 process and on 2 gloo processes (`accelerate launch`, multi_cpu.yaml): one command with
`resume_from_checkpoint: auto` is started, preempted and requeued again and again, the way a cluster does it
(one process makes stops 1 and 5 of the chain, then 6 and 7):

1. SIGTERM inside a training step (with 2 processes: to rank 1 only): checkpoint of the next step boundary, exit 75;
2. requeued, SIGUSR1 during a dev evaluation (to every process): that step's checkpoint, exit 75;
3. requeued, SIGTERM during a checkpoint save (rank 1 only): that checkpoint completes, no other, exit 75;
4. requeued, SIGKILL in a step (one process): no chance to save; the launch ends quickly, non-zero;
5. requeued, SIGTERM during the final evaluation (to the process; with 2 processes to the launcher, which forwards
   it): training's last checkpoint is complete, exit 75;
6. requeued: no steps left, evaluates and exports, exit 0, the weights of the uninterrupted run (max |dW| <= 1e-6,
   dropout 0.1);
7. requeued once more: exit 0, nothing to do.

Each launch must have trained only the steps from the previous stop to its own (preempted.json, results.json) and
exited within one step, one checkpoint save and a few seconds of its signal (plus the pause the test put in the
phase). The runs go through `tests/pipeline/phase_probe.py` (the CLI unchanged, plus notes of when each process enters
a phase and a pause inside the one the test signals in). The timeline is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import random_sentences
from launching import REPO, accelerate_launcher, launch_env, max_difference
from safetensors.torch import load_file

from hf_sentcl.common import exits
from hf_sentcl.common.layout import PREEMPTED_JSON, RUN_COMPLETE_JSON

pytestmark = pytest.mark.slow

PROBE = REPO / "tests" / "pipeline" / "phase_probe.py"
MAX_STEPS, EVERY = 12, 4  # checkpoints and dev evaluations at steps 4, 8 and 12
PAUSE_S = 1.0  # the probe's pause inside the signalled phase
#: what a process may take on top of the pause between the signal and its exit: the rest of one step, one checkpoint
#: save, and leaving (a launch's teardown included); steps and saves of the tiny model take well under a second
ALLOWANCE_S = {1: 6.0, 2: 12.0}


def recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path, processes: int) -> Path:
    """SimCSE with dropout, the shipped defaults for checkpoints (best kept, reloaded at the end), tiny data."""
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(64, seed=7)) + "\n")
    values = {
        "method": "simcse", "model_name_or_path": tiny_bert_dir, "train_file": corpus, "sts_data_dir": senteval_dir,
        "global_train_batch_size": 4, "max_seq_length": 16, "max_steps": MAX_STEPS, "save_steps": EVERY,
        "eval_steps": EVERY, "logging_steps": 1, "learning_rate": "1e-3", "use_cpu": "true", "seed": 0,
        "dropout": 0.1, "eval_before_training": "false", "eval_tasks": "[sts]", "resume_from_checkpoint": "auto",
    }
    path = tmp_path / f"recipe-{processes}.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def command(processes: int, recipe_path: Path, output: Path) -> list[str]:
    launcher = [sys.executable] if processes == 1 else accelerate_launcher("multi_cpu.yaml", processes)
    return [*launcher, str(PROBE), str(recipe_path), "--output_dir", str(output)]


def start(processes: int, recipe_path: Path, output: Path, probes: Path, pause: str = "") -> subprocess.Popen:
    env = launch_env(HF_SENTCL_PROBE_DIR=str(probes), HF_SENTCL_PROBE_PAUSE=pause, HF_SENTCL_PROBE_PAUSE_S=str(PAUSE_S))
    return subprocess.Popen(command(processes, recipe_path, output), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the run did not end within {timeout} s")
    return process.returncode, out


def wait_for_note(process: subprocess.Popen, probes: Path, name: str, timeout: float = 300) -> dict[int, int]:
    """Wait until every process that writes `name` (rank 0, or all ranks for training phases) has; their pids."""
    deadline = time.monotonic() + timeout
    while True:
        notes = {int(p.suffix[1:]): int(p.read_text().split()[1]) for p in probes.glob(f"{name}.*")}
        if notes:
            return notes
        assert process.poll() is None, f"the run ended before '{name}':\n{process.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, f"no '{name}' note in {timeout} s"
        time.sleep(0.01)


def weights(output: Path) -> dict[str, torch.Tensor]:
    return load_file(output / "model.safetensors")


def train_summary(output: Path) -> dict:
    return json.loads((output / "results.json").read_text())["train"]


@dataclass(frozen=True)
class Stop:
    """One preemption of the chain: the phase paused in, the note to signal at, who gets which signal, the step
    training must stop at (the last complete checkpoint after it)."""

    label: str
    note: str
    who: str  # "one": the last rank (the process itself with 1 process); "all": every process; "launcher"
    signal: signal.Signals
    stop_step: int


CHAIN = (
    Stop("mid-epoch step", "step-2", "one", signal.SIGTERM, 3),
    Stop("dev evaluation", "evaluate", "all", signal.SIGUSR1, EVERY),
    Stop("checkpoint save", "save", "one", signal.SIGTERM, 2 * EVERY),
    Stop("SIGKILL in a step", "step-9", "one", signal.SIGKILL, 2 * EVERY),
    Stop("final evaluation", "final", "launcher", signal.SIGTERM, MAX_STEPS),
)
#: CI time: one process takes the two SIGTERMs that reach it without a launcher, in a step and in the final
#: evaluation (two launches fewer); the 2-process chain makes the others, the save and the kill on one rank, SIGUSR1
#: on every process
ONE_PROCESS_STOPS = ("mid-epoch step", "final evaluation")
CHAINS = {1: tuple(stop for stop in CHAIN if stop.label in ONE_PROCESS_STOPS), 2: CHAIN}


def uninterrupted_weights(processes: int, recipe_path: Path, folder: Path) -> dict[str, torch.Tensor]:
    code, log = finish(start(processes, recipe_path, folder / "full", folder / "probes-full"))
    assert code == 0, log[-3000:]
    assert train_summary(folder / "full")["steps_run"] == MAX_STEPS
    return weights(folder / "full")


def preempt(stop: Stop, processes: int, recipe_path: Path, output: Path, probes: Path) -> tuple[str, float]:
    """Start the command, send `stop`'s signal inside its phase, wait for the exit; the timeline line and the
    seconds from the signal to the exit."""
    run = start(processes, recipe_path, output, probes, pause=stop.note)
    pids = wait_for_note(run, probes, stop.note)
    if stop.who == "launcher" and processes > 1:
        targets, whom = [run.pid], "the launcher"
    elif stop.who == "one" and processes > 1:
        targets, whom = [pids[max(pids)]], f"rank {max(pids)}"
    else:
        targets, whom = list(pids.values()), "every process"
    signalled = time.time()
    for pid in targets:
        os.kill(pid, stop.signal)
    code, log = finish(run, timeout=120)  # a launch whose processes disagree hangs
    seconds = time.time() - signalled
    if stop.signal == signal.SIGKILL:
        assert code != 0 and f"exit status {exits.PREEMPTED}" not in log, log[-3000:]
        assert not [p for p in output.glob("checkpoint-*/checkpoint_complete.json")
                    if int(p.parent.name.split("-")[1]) > stop.stop_step], "a checkpoint after the kill"
        assert seconds < 60, "a killed process must end the launch, not hang it"
        return f"{stop.label}: {whom} killed at t=0, launch ended (exit {code}) at t={seconds:.2f} s", seconds
    # one process: the distinct status; accelerate launch reports a worker's non-zero exit as its own exit 1
    assert code == (exits.PREEMPTED if processes == 1 else 1), log[-3000:]
    assert f"exit status {exits.PREEMPTED} (preempted)" in log and "resume_from_checkpoint: auto" in log, log[-3000:]
    note = json.loads((output / PREEMPTED_JSON).read_text())
    assert note["step"] == stop.stop_step, note
    assert not (output / RUN_COMPLETE_JSON).exists()
    checkpointed = (output / f"checkpoint-{stop.stop_step}" / "checkpoint_complete.json").stat().st_mtime
    return (f"{stop.label}: {stop.signal.name} to {whom} at t=0, checkpoint-{stop.stop_step} complete at "
            f"t={checkpointed - signalled:+.2f} s, exit {code} at t={seconds:.2f} s; this launch resumed at step "
            f"{note['started_at_step']} and ran {note['steps_run']} steps"), seconds


@pytest.mark.parametrize("processes", [1, 2], ids=["1-process", "2-processes"])
def test_one_command_preempted_again_and_again_ends_as_the_uninterrupted_run(processes, tmp_path, tiny_bert_dir,
                                                                           senteval_dir):
    recipe_path = recipe(tmp_path, tiny_bert_dir, senteval_dir, processes)
    expected = uninterrupted_weights(processes, recipe_path, tmp_path)
    output = tmp_path / "run"
    timeline, resumed_at = [], 0
    for number, stop in enumerate(CHAINS[processes]):
        line, seconds = preempt(stop, processes, recipe_path, output, tmp_path / f"probes-{number}")
        timeline.append(line)
        if stop.signal != signal.SIGKILL:
            note = json.loads((output / PREEMPTED_JSON).read_text())
            # only the remaining steps: from where the last launch left off to this stop
            assert (note["started_at_step"], note["steps_run"]) == (resumed_at, stop.stop_step - resumed_at), line
            assert seconds <= PAUSE_S + ALLOWANCE_S[processes], line
        resumed_at = stop.stop_step  # a SIGKILL's launch resumes from the last complete checkpoint

    code, log = finish(start(processes, recipe_path, output, tmp_path / "probes-requeue"))
    assert code == 0, log[-3000:]
    summary = train_summary(output)
    assert (summary["started_at_step"], summary["steps_run"]) == (MAX_STEPS, 0)
    difference = max_difference(weights(output), expected)
    timeline.append(f"requeued: resumed at step {summary['started_at_step']}, ran {summary['steps_run']} steps, "
                    f"evaluated and exported, exit 0; max |dW| to the uninterrupted run {difference:.1e}")
    assert (output / RUN_COMPLETE_JSON).is_file() and not (output / PREEMPTED_JSON).exists()

    again_code, again_log = finish(start(processes, recipe_path, output, tmp_path / "probes-again"))
    timeline.append(f"requeued again: exit {again_code}, {again_log.strip().splitlines()[-1][:100]}")
    print(f"\n[{processes} process(es)]\n  " + "\n  ".join(timeline))
    assert again_code == 0 and "nothing to do" in again_log.lower(), again_log[-3000:]
    assert train_summary(output) == summary  # not trained or evaluated again
    assert difference <= 1e-6
