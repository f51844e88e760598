"""TrainingCostCallback: step time excludes evaluation/saving intervals and the warm-up step."""

import types

import pytest

from hf_sentcl.trainers import callbacks
from hf_sentcl.trainers.callbacks import TrainingCostCallback


def test_step_time_leaves_out_evaluation_and_first_step(monkeypatch):
    clock = iter([0.0, 10.0, 11.0, 12.0, 50.0, 51.5])  # step ends; the 12 -> 50 interval holds an evaluation
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    cost = TrainingCostCallback()
    args = types.SimpleNamespace()
    for step in range(6):
        cost.on_step_end(args, None, None)
        if step == 3:
            cost.on_evaluate(args, None, None)
    # the first step has no measured interval (warm-up); 12 -> 50 holds the evaluation and is left out
    assert cost.step_seconds == pytest.approx([10.0, 1.0, 1.0, 1.5])
    summary = cost.summary(examples_per_step=64)
    assert summary["train_steps_measured"] == 4
    assert summary["train_examples_per_second"] == pytest.approx(64 * 4 / 13.5)
    assert summary["train_step_seconds"] == pytest.approx(1.5)


def test_save_interrupts_like_evaluation(monkeypatch):
    clock = iter([0.0, 1.0, 30.0, 31.0])
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    cost = TrainingCostCallback()
    for step in range(4):
        cost.on_step_end(None, None, None)
        if step == 1:
            cost.on_save(None, None, None)
    assert cost.step_seconds == pytest.approx([1.0, 1.0])


def test_peak_rss_is_read_after_reset():
    cost = TrainingCostCallback()
    args = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"))
    cost.on_train_begin(args, None, None)
    payload = bytearray(64 * 2**20)  # touch 64 MiB so the high-water mark must cover it
    payload[:: 4096] = b"x" * len(payload[:: 4096])
    cost.on_train_end(args, None, None)
    if cost.peak_memory_kind is None:
        pytest.skip("this kernel does not let a process reset its peak RSS")
    assert cost.peak_memory_bytes >= 64 * 2**20
    assert cost.summary(1)["train_peak_memory_kind"] == "process_peak_rss"
