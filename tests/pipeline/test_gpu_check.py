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
