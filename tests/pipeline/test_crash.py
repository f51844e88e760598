"""Crashes for real: a run SIGKILLed once a checkpoint is complete, then resumed with `latest`, ends with the same
weights as the uninterrupted run (one process, and two gloo processes of `accelerate launch`); killing one worker of
a 2-process launch ends the whole launch quickly with a non-zero exit instead of hanging."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import random_sentences
from safetensors.torch import load_file

from hf_sentcl.modeling.health import CHECKPOINT_COMPLETE

REPO = Path(__file__).resolve().parents[2]
KILL_AT = 4  # the checkpoint step after which the run is killed


def launch_command(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "hf_sentcl.run"]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(REPO / "recipes" / "accelerate_configs" / "multi_cpu.yaml"), "-m", "hf_sentcl.run"]


def start(processes: int, recipe: Path, output: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([*launch_command(processes), str(recipe), "--output_dir", str(output), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)


def wait_for_checkpoint(process: subprocess.Popen, output: Path, timeout: float = 300) -> None:
    mark = output / f"checkpoint-{KILL_AT}" / CHECKPOINT_COMPLETE
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)


def workers_of(output: Path) -> list[int]:
    """PIDs of the hf_sentcl.run processes training into `output` (the launcher's workers)."""
    found = subprocess.run(["pgrep", "-f", f"hf_sentcl.run .*--output_dir {output}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_sigkill_then_resume_latest_gives_the_uninterrupted_weights(tmp_path, tiny_bert_dir, senteval_dir, processes):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(24, seed=5)) + "\n")
    values = dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        per_device_train_batch_size=4 // processes, max_seq_length=16, max_steps=12, save_steps=KILL_AT,
        eval_steps=KILL_AT, logging_steps=1, learning_rate="1e-3", use_cpu="true", seed=0, dropout=0.1,
        save_total_limit="null", eval_before_training="false", eval_tasks="[]", load_best_model_at_end="false",
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    full, crash = tmp_path / "full", tmp_path / "crash"
    uninterrupted = start(processes, recipe, full)
    assert uninterrupted.wait() == 0, uninterrupted.stderr.read().decode()[-2000:]

    run = start(processes, recipe, crash)
    wait_for_checkpoint(run, crash)
    victim = run.pid if processes == 1 else workers_of(crash)[-1]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    try:
        code = run.wait(timeout=60)  # a dead peer must end the launch, not hang it
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        pytest.fail("the launch did not end within 60 s of one process being killed")
    assert code != 0 and time.monotonic() - killed_at < 60
    assert not (crash / "model.safetensors").exists()

    resumed = start(processes, recipe, crash, "--resume_from_checkpoint", "latest")
    assert resumed.wait() == 0, resumed.stderr.read().decode()[-2000:]
    train = json.loads((crash / "results.json").read_text())["train"]
    assert (train["started_at_step"], train["steps_run"]) == (KILL_AT, 12 - KILL_AT)  # the remaining steps only
    a, b = load_file(full / "model.safetensors"), load_file(crash / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a), "resumed weights differ from the uninterrupted run's"
