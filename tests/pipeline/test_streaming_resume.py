"""`streaming: true` on real launches. Two gloo processes train on disjoint examples that cover the data once per
epoch (each process's examples recorded by `stream_probe.py`). Exact resume mid-stream, on 1 process and on 2 gloo
processes: the streamed command with `resume_from_checkpoint: auto`, SIGTERM in a training step after the stream has
passed an epoch's end, requeued: it continues with the next unseen examples (each checkpoint's
`stream_state_<rank>.json`) and ends with the uninterrupted streamed run's weights (max |dW| <= 1e-6, dropout on).
The launch helpers are the preemption tests'.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import random_sentences
from launching import REPO, accelerate_launcher, launch_env, max_difference
from test_preemption import Stop, finish, preempt, start, train_summary, weights

pytestmark = pytest.mark.slow

MAX_STEPS = 20
#: 62 rows, 4 a global batch: 15 batches an epoch (2 rows dropped), so step 18 is in the second epoch
STOP = Stop("mid-stream step, second epoch", "step-17", "one", signal.SIGTERM, 18)


def streamed_recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path, processes: int, rows: int = 62,
                    **overrides) -> Path:
    corpus = tmp_path / "train.txt"
    corpus.write_text("".join(f"{s} id{i}\n" for i, s in enumerate(random_sentences(rows, seed=7))))
    values = {
        "method": "simcse", "model_name_or_path": tiny_bert_dir, "train_file": corpus, "sts_data_dir": senteval_dir,
        "streaming": "true", "buffer_size": 16, "global_train_batch_size": 4, "max_seq_length": 16,
        "max_steps": MAX_STEPS, "save_steps": 6, "eval_strategy": "no", "load_best_model_at_end": "false",
        "logging_steps": 1, "learning_rate": "1e-3", "use_cpu": "true", "seed": 0, "dropout": 0.1,
        "eval_before_training": "false", "eval_tasks": "[]", "resume_from_checkpoint": "auto",
        **overrides,
    }
    path = tmp_path / f"recipe-{processes}.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


@pytest.mark.parametrize("processes", [1, 2], ids=["1-process", "2-processes"])
def test_sigterm_mid_stream_then_auto_ends_as_the_uninterrupted_streamed_run(processes, tmp_path, tiny_bert_dir,
                                                                           senteval_dir):
    recipe_path = streamed_recipe(tmp_path, tiny_bert_dir, senteval_dir, processes)
    code, log = finish(start(processes, recipe_path, tmp_path / "full", tmp_path / "probes-full"))
    assert code == 0, log[-3000:]
    expected = weights(tmp_path / "full")
    cleaning = train_summary(tmp_path / "full")["data_cleaning"]
    assert cleaning["streaming"] and cleaning["epoch_tail_rows_dropped"] == 2, cleaning

    output = tmp_path / "run"
    line, _ = preempt(STOP, processes, recipe_path, output, tmp_path / "probes-stop")
    state = json.loads((output / "checkpoint-18" / "stream_state_0.json").read_text())
    assert state["global_batches_read"] == 18 and state["split"]["processes"] == processes, state

    code, log = finish(start(processes, recipe_path, output, tmp_path / "probes-requeue"))
    assert code == 0, log[-3000:]
    summary = train_summary(output)
    assert (summary["started_at_step"], summary["steps_run"]) == (18, 2)
    difference = max_difference(weights(output), expected)
    print(f"\n[{processes} process(es), streamed] {line}; requeued: max |dW| {difference:.1e}")
    assert difference <= 1e-6


def test_two_processes_train_on_disjoint_examples_that_cover_each_epoch(tmp_path, tiny_bert_dir, senteval_dir):
    """40 rows, 2 processes x 2 examples a step: 10 steps an epoch; over 20 steps each process trains on 40 examples,
    and in each of the 2 epochs the two processes' examples are disjoint and together every row once."""
    recipe_path = streamed_recipe(tmp_path, tiny_bert_dir, senteval_dir, 2, rows=40, save_steps=100)
    ids_dir = tmp_path / "ids"
    command = [*accelerate_launcher("multi_cpu.yaml", 2), str(REPO / "tests" / "pipeline" / "stream_probe.py"),
               str(recipe_path), "--output_dir", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, env=launch_env(HF_SENTCL_STREAM_IDS=str(ids_dir)),
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = {rank: (ids_dir / f"ids.{rank}").read_text().splitlines()[:MAX_STEPS * 2] for rank in (0, 1)}
    every_row = (tmp_path / "train.txt").read_text().splitlines()
    for epoch in range(2):
        parts = [trained[rank][epoch * 20:(epoch + 1) * 20] for rank in (0, 1)]
        assert not set(parts[0]) & set(parts[1]), f"epoch {epoch}: examples shared by both processes"
        assert sorted(parts[0] + parts[1]) == sorted(every_row), f"epoch {epoch}: not every row once"
