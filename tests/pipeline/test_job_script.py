"""The SLURM job script of docs/reliability.md, taken from the page itself, under an emulated scheduler
(`tests/pipeline/scheduler_emulator.py`): 2 gloo processes under `accelerate launch`, a checkpoint save that takes
seconds (the probe holds every save `SAVE_S` seconds, as a real-sized model's takes), and SLURM's behaviour when the
batch script exits (whatever is left of the job is SIGKILLed at once).

1. Preemption: SIGTERM to every process of the job mid-training. The checkpoint of the next step must complete,
   `preempted.json` must name it, and the script must exit only after that.
2. Requeued (the same script), the time limit: SIGUSR1 to the batch script alone (`--signal=B:USR1@...`). It resumes
   where 1 stopped, checkpoints again, and calls `scontrol requeue` (a stand-in on PATH records the call).
3. Requeued: it resumes from 2's checkpoint, trains the rest, exports and exits 0.

The substitutions below (launcher, script, output folder) must each match the page once, so a changed page fails
here rather than drifting from what is tested.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_simcse_recipe
from launching import CONFIGS, REPO, free_port, launch_env

from hf_sentcl.common.layout import PREEMPTED_JSON, RUN_COMPLETE_JSON
from hf_sentcl.recipe.run_folder import latest_complete_checkpoint

pytestmark = pytest.mark.slow

DOCS = REPO / "docs" / "reliability.md"
PROBE = REPO / "tests" / "pipeline" / "phase_probe.py"
EMULATOR = REPO / "tests" / "pipeline" / "scheduler_emulator.py"
SAVE_S = 4.0  # each checkpoint save takes this long (the probe's pause inside it)
JOB_ID = "4242"


def docs_job_script() -> str:
    """The first bash block after the page's '### SLURM' heading."""
    text = DOCS.read_text()
    section = text[text.index("### SLURM\n"):]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def substitute(script: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert script.count(old) == 1, f"docs/reliability.md's job script no longer has {old!r} once"
        script = script.replace(old, new)
    return script


def job_script(tmp_path: Path, recipe: Path, output: Path) -> Path:
    launcher = (f"{sys.executable} -m accelerate.commands.launch --config_file {CONFIGS / 'multi_cpu.yaml'} "
                f"--num_processes 2 --main_process_port {free_port()}")
    script = substitute(docs_job_script(), {
        "accelerate launch --config_file recipes/accelerate_configs/ddp.yaml": launcher,
        "-m hf_sentcl.run recipes/simcse_bert.yaml": f"{PROBE} {recipe}",
        "output_dir=outputs/simcse_bert": f"output_dir={output}",
    })
    path = tmp_path / "job.sh"
    path.write_text(script)
    return path


def scheduler_env(tmp_path: Path, probes: Path) -> dict[str, str]:
    """The job's environment: a recording `scontrol` on PATH, SLURM's job id, the probe's notes and save pause."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n")
    scontrol.chmod(0o755)
    return launch_env(PATH=f"{bin_dir}:{launch_env()['PATH']}", SLURM_JOB_ID=JOB_ID,
                      HF_SENTCL_PROBE_DIR=str(probes), HF_SENTCL_PROBE_PAUSE="save",
                      HF_SENTCL_PROBE_PAUSE_S=str(SAVE_S))


def emulate(tmp_path: Path, script: Path, output: Path, probes: Path, when: str | None, signal_name: str = "TERM",
            to: str = "job") -> dict:
    """One launch of the job script under the emulated scheduler; its timeline."""
    for note in probes.glob("*"):
        note.unlink()
    timeline = tmp_path / "timeline.json"
    options = ["--when", str(probes / when), "--signal", signal_name, "--to", to] if when else []
    done = subprocess.run(
        [sys.executable, str(EMULATOR), *options, "--grace", "0", "--watch", str(output), "--timeline",
         str(timeline), "--timeout", "400", "--", "bash", str(script)],
        env=scheduler_env(tmp_path, probes), cwd=REPO, capture_output=True, text=True, timeout=500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(timeline.read_text())
    print(json.dumps(result["events"]), "\n", done.stdout[-2000:])
    return result


def event_time(timeline: dict, name: str) -> float | None:
    return next((e["t"] for e in timeline["events"] if e["event"] == name), None)


def write_recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path) -> Path:
    return tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir, max_steps=14)


def test_the_documented_job_script_keeps_its_checkpoint_through_preemption_and_the_time_limit(
        tmp_path, tiny_bert_dir, senteval_dir):
    output, probes = tmp_path / "run", tmp_path / "probes"
    probes.mkdir()
    script = job_script(tmp_path, write_recipe(tmp_path, tiny_bert_dir, senteval_dir), output)

    # 1. preemption: SIGTERM to every process of the job inside step 6 (after checkpoint-4)
    first = emulate(tmp_path, script, output, probes, when="step-5.0")
    note = json.loads((output / PREEMPTED_JSON).read_text())
    checkpoint = latest_complete_checkpoint(output)
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{note['step']}" and note["step"] >= 6, first
    mark_at = event_time(first, f"{checkpoint.name}/checkpoint_complete.json")
    exit_at = event_time(first, "job script exited")
    assert mark_at is not None and mark_at >= SAVE_S - 0.5, first  # the save really took seconds
    assert exit_at is not None and exit_at > mark_at, first  # the script outlived the checkpoint
    assert not (tmp_path / "scontrol.log").exists()  # preemption: SLURM requeues the job itself

    # 2. requeued; the time limit: SIGUSR1 to the batch script alone, a few steps later
    second = emulate(tmp_path, script, output, probes, when=f"step-{note['step'] + 2}.0", signal_name="USR1",
                     to="batch")
    later = json.loads((output / PREEMPTED_JSON).read_text())
    assert later["started_at_step"] == note["step"] and later["step"] > note["step"], second
    assert latest_complete_checkpoint(output).name == f"checkpoint-{later['step']}"
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", JOB_ID]

    # 3. requeued: trains the rest from there and finishes
    third = emulate(tmp_path, script, output, probes, when=None)
    assert third["status"] == 0, third
    results = json.loads((output / "results.json").read_text())
    assert results["train"]["started_at_step"] == later["step"] and results["train"]["global_step"] == 14
    assert (output / RUN_COMPLETE_JSON).is_file() and not (output / PREEMPTED_JSON).exists()
