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
