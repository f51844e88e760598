"""benchmarks/gpu_check.py imports everywhere and refuses clearly without a CUDA device (it runs on a GPU machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_refuses_without_cuda(capsys, monkeypatch):
    gpu_check = load_script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "python benchmarks/gpu_check.py" in err
    assert set(gpu_check.CHECKS) >= {"fp32", "tf32", "bf16", "fp16", "ddp2", "fsdp", "zero3", "resume", "host_syncs"}


def test_gpu_check_table_has_one_row_per_check():
    gpu_check = load_script()
    rows = {"fp16": {"ok": True, "step_ms": 41.25, "note": "last loss 1.0"},
            "zero3": {"ok": None, "step_ms": None, "note": "skipped"},
            "ddp2": {"ok": False, "step_ms": None, "note": "exit 1"}}
    lines = gpu_check.table(rows).splitlines()
    assert lines[2].split()[:3] == ["fp16", "pass", "41.2"] or lines[2].split()[:3] == ["fp16", "pass", "41.3"]
    assert lines[3].split()[:2] == ["zero3", "skip"] and lines[4].split()[:2] == ["ddp2", "FAIL"]


@pytest.mark.parametrize("check", ["fp32", "tf32", "bf16", "fp16"])
def test_every_precision_check_has_settings(check):
    assert check in load_script().PRECISION_SETTINGS


@pytest.mark.slow
def test_missing_packages_are_installed_from_carried_wheels(tmp_path, monkeypatch):
    """A bare GPU machine lacks some packages: the check installs them from the wheel folder carried with the tree
    (offline, --no-index) and its workers find them through PYTHONPATH."""
    import subprocess
    import sys

    gpu_check = load_script()
    source = tmp_path / "src"
    (source / "hfsentcl_probe_pkg").mkdir(parents=True)
    (source / "hfsentcl_probe_pkg" / "__init__.py").write_text("VALUE = 42\n")
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "hfsentcl-probe-pkg"\nversion = "1.0"\n'
    )
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(source)], check=True)
    monkeypatch.setattr(gpu_check, "NEEDED", {"hfsentcl_probe_pkg": "probe"})
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    assert gpu_check.install_carried_wheels(tmp_path / "nothing") == ["hfsentcl_probe_pkg"]
    assert gpu_check.install_carried_wheels(wheels) == []
    found = subprocess.run([sys.executable, "-c", "import hfsentcl_probe_pkg as p; print(p.VALUE)"],
                           capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "42"


def test_host_sync_rule_allows_one_per_step_after_the_first():
    """transformers' SDPA mask check reads the host once per forward; more than that in any step after the first
    (warm-up) fails the check, and the note names the steps above one and where their syncs came from."""
    from types import SimpleNamespace

    gpu_check = load_script()
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3, log_history=[{"loss": 1.0}]),
                              training_cost=lambda: {"train_step_seconds": 0.01})
    warm_up = [["a.py:1", "masking_utils.py:354"], ["masking_utils.py:354"], ["masking_utils.py:354"]]
    result = gpu_check.host_sync_outcome(trainer, 3, warm_up)
    assert result["ok"] and "step 0: a.py:1, masking_utils.py:354" in result["note"]
    later = [["masking_utils.py:354"], ["masking_utils.py:354", "base.py:9"], []]
    result = gpu_check.host_sync_outcome(trainer, 3, later)
    assert not result["ok"] and "step 1: base.py:9, masking_utils.py:354" in result["note"]


DUMP = """Exported ...
{header}
Thread 0x00007fcf7bfff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/venv/site-packages/tqdm/_monitor.py", line 69 in run

Thread 0x00007fcfcfc30b80 (most recent call first):
  File "/venv/site-packages/torch/nn/modules/linear.py", line 134 in forward
  File "/venv/site-packages/transformers/models/bert/modeling_bert.py", line 301 in forward
  File "/repo/hf_sentcl/modeling/encoder.py", line 345 in map_batches
  File "/repo/hf_sentcl/evaluation/sts.py", line 210 in embed
  File "/repo/hf_sentcl/pipeline/train.py", line 245 in _check_trained
  File "/repo/hf_sentcl/pipeline/train.py", line 214 in final_encoder
  File "/repo/hf_sentcl/pipeline/train.py", line 112 in run_stage
"""


@pytest.mark.parametrize("header", [
    "HF_SENTCL_HANG_DUMP_S: still running after 90 s; every thread's stack follows and the process ends with status 1.",
    "Timeout (0:02:30)!",  # faulthandler's fallback, for a hang that holds the GIL
])
def test_a_hung_whole_run_is_named_by_its_main_threads_frames(header):
    """fsdp_run / zero3_run: when HF_SENTCL_HANG_DUMP_S fires, the note says where the run's main thread was."""
    gpu_check = load_script()
    assert gpu_check.hang_summary("Results: ...\nExported ...\n") is None
    assert gpu_check.hang_summary(DUMP.format(header=header)) == (
        "modules/linear.py:134 forward < modeling/encoder.py:345 map_batches < evaluation/sts.py:210 embed < "
        "pipeline/train.py:245 _check_trained < pipeline/train.py:214 final_encoder"
    )
    assert gpu_check.hang_summary("Timeout (0:00:06)!\nThread 0x1 (most recent call first):\n  <no Python frame>\n") \
        == "no Python frame"


def test_whole_runs_evaluate_on_a_senteval_layout_of_senteval_sizes(tmp_path):
    """The whole runs' final evaluation encodes as much as with SentEval's data (a CPU-bound evaluation shows)."""
    from hf_sentcl.evaluation.sts import KNOWN_PAIRS, STS_TASKS, STSEvaluator

    gpu_check = load_script()
    root = gpu_check.write_senteval(tmp_path / "senteval")
    suite = STSEvaluator(root)
    assert set(suite.data) == set(STS_TASKS)
    assert sum(len(p.scores) for task in suite.data.values() for p in task.values()) == sum(
        n for name, n in KNOWN_PAIRS.items() if "train" not in name and "dev" not in name and "trial" not in name)
    assert len(STSEvaluator(root, tasks=("STSBenchmark",), split="dev").data["STSBenchmark"]["dev"].scores) == 1500
