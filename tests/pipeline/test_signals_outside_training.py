"""Signals nobody had documented, sent as a user, a terminal or a scheduler sends them (docs/reliability.md):

- SIGTERM during the seconds of imports, before the run's handlers were installed: noted, exit 75 with
  preempted.json, not death by signal;
- SIGTERM during the evaluation before training: the evaluation stops at once (not after the whole suite), exit 75;
  a requeued run does not evaluate again what an earlier launch finished;
- Ctrl-C (SIGINT) in training, on one process and to `accelerate launch`: a checkpoint and exit 75, no traceback; a
  second Ctrl-C stops at once (130);
- SIGUSR1 to a launch's whole process group kills the launcher (its default action): the workers, in sessions of
  their own, get SIGTERM from the kernel and checkpoint instead of training on as orphans;
- a second run into an output_dir that a live run still holds waits, then is refused naming the holder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import tiny_simcse_recipe
from launching import REPO, accelerate_launcher, launch_env

from hf_sentcl.common import exits
from hf_sentcl.common.layout import EVAL_BEFORE_JSON, PREEMPTED_JSON, RUN_COMPLETE_JSON
from hf_sentcl.recipe.run_folder import latest_complete_checkpoint

pytestmark = pytest.mark.slow

PROBE = REPO / "tests" / "pipeline" / "phase_probe.py"


def recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path, **changes) -> Path:
    return tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir, resume_from_checkpoint="auto", **changes)


def start(command: list[str], probes: Path | None = None, pause: str = "", pause_s: float = 0.0) -> subprocess.Popen:
    env = launch_env(HF_SENTCL_PROBE_DIR=str(probes or ""), HF_SENTCL_PROBE_PAUSE=pause,
                     HF_SENTCL_PROBE_PAUSE_S=str(pause_s))
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=REPO, start_new_session=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def probe_command(recipe_path: Path, output: Path, processes: int = 1) -> list[str]:
    launcher = [sys.executable] if processes == 1 else accelerate_launcher("multi_cpu.yaml", processes)
    return [*launcher, str(PROBE), str(recipe_path), "--output_dir", str(output)]


def test_sigterm_during_the_imports_is_noted_and_the_run_stops_before_training(tmp_path, tiny_bert_dir, senteval_dir):
    output = tmp_path / "run"
    run = start([sys.executable, "-m", "hf_sentcl.run", str(recipe(tmp_path, tiny_bert_dir, senteval_dir)),
                 "--output_dir", str(output)])
    time.sleep(0.5)  # the interpreter is up and importing torch and transformers (seconds)
    run.send_signal(signal.SIGTERM)
    status, out = finish(run)
    assert status == exits.PREEMPTED, out[-3000:]
    note = json.loads((output / PREEMPTED_JSON).read_text())
    assert note["signal"] == "SIGTERM" and note["step"] == 0 and note["checkpoint"] is None, note
    assert "before training" in note["when"] and "Traceback" not in out
    assert not list(output.glob("checkpoint-*"))


def test_a_signal_in_the_evaluation_before_training_stops_it_and_a_requeue_keeps_finished_scores(
        tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    path = recipe(tmp_path, tiny_bert_dir, senteval_dir, eval_before_training="true")
    run = start(probe_command(path, output), probes, pause="suites", pause_s=120)  # a suite that takes minutes
    wait_for(probes / "suites.0", run)
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    status, out = finish(run)
    assert status == exits.PREEMPTED and time.monotonic() - signalled < 15, out[-3000:]
    assert "before training" in json.loads((output / PREEMPTED_JSON).read_text())["when"]
    assert not (output / EVAL_BEFORE_JSON).exists()  # an evaluation cut off is not kept

    # requeued: the evaluation before training completes; stopped in training, then requeued to the end
    run = start(probe_command(path, output), probes, pause="step-2", pause_s=2)
    wait_for(probes / "step-2.0", run)
    run.send_signal(signal.SIGTERM)
    status, out = finish(run)
    assert status == exits.PREEMPTED and (output / EVAL_BEFORE_JSON).is_file(), out[-3000:]
    status, out = finish(start(probe_command(path, output), probes))
    assert status == exits.OK, out[-3000:]
    assert "Scores before training reused" in out
    results = json.loads((output / "results.json").read_text())
    assert "before" in results["sts"] and "after" in results["sts"]


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_checkpoints_and_stops_without_a_traceback(processes, tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    path = recipe(tmp_path, tiny_bert_dir, senteval_dir)
    run = start(probe_command(path, output, processes), probes, pause="step-2", pause_s=1.5)
    wait_for(probes / "step-2.0", run)
    run.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reaches the command it runs (the launcher forwards it)
    status, out = finish(run)
    assert status == (exits.PREEMPTED if processes == 1 else 1), out[-3000:]
    note = json.loads((output / PREEMPTED_JSON).read_text())
    assert note["signal"] == "SIGINT" and latest_complete_checkpoint(output).name == f"checkpoint-{note['step']}"
    assert "KeyboardInterrupt" not in out and "Traceback" not in out.split("exit status")[0][-5000:]


def test_a_second_ctrl_c_stops_at_once(tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    run = start(probe_command(recipe(tmp_path, tiny_bert_dir, senteval_dir), output), probes, pause="step-2",
                pause_s=60)
    wait_for(probes / "step-2.0", run)
    run.send_signal(signal.SIGINT)
    time.sleep(0.5)
    signalled = time.monotonic()
    run.send_signal(signal.SIGINT)
    status, out = finish(run)
    assert status == exits.INTERRUPTED and time.monotonic() - signalled < 10, out[-3000:]
    assert "second Ctrl-C" in out


def test_usr1_to_the_launch_group_stops_the_orphaned_workers_with_a_checkpoint(tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    path = recipe(tmp_path, tiny_bert_dir, senteval_dir, max_steps=40, save_steps=20, eval_steps=20)
    launch = start(probe_command(path, output, 2), probes, pause="step", pause_s=0.3)
    wait_for(probes / "step-3.1", launch)
    workers = [int((probes / f"step-3.{rank}").read_text().split()[1]) for rank in (0, 1)]
    os.killpg(launch.pid, signal.SIGUSR1)  # the launcher's group: the workers have sessions of their own
    finish(launch)
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
              for pid in workers):
        assert time.monotonic() < deadline, "the orphaned workers trained on"
        time.sleep(0.1)
    note = json.loads((output / PREEMPTED_JSON).read_text())
    assert note["signal"] == "SIGTERM" and note["step"] < 40, note
    assert latest_complete_checkpoint(output).name == f"checkpoint-{note['step']}"
    assert not (output / RUN_COMPLETE_JSON).exists()


def test_a_run_into_a_folder_another_live_run_holds_waits_then_is_refused(tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    path = recipe(tmp_path, tiny_bert_dir, senteval_dir, max_steps=400, save_steps=200, eval_steps=200)
    first = start(probe_command(path, output), probes, pause="step-2", pause_s=120)
    wait_for(probes / "step-2.0", first)
    try:
        env = launch_env(HF_SENTCL_OUTPUT_DIR_WAIT_S="2")
        second = subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(path), "--output_dir", str(output)],
                                capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == exits.BAD_INPUT, second.stderr[-3000:]
    assert f"pid {first.pid}" in second.stderr and "another run still writes" in second.stderr
