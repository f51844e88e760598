"""A run's log never goes silent through its long phases (each logs its start and its end with the duration, in order),
and `export: false` ends a run after its results, without the export and its MTEB-protocol scoring."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_simcse_recipe
from launching import REPO, launch_env

from hf_sentcl.common import exits
from hf_sentcl.common.layout import RUN_COMPLETE_JSON

pytestmark = pytest.mark.slow


def write_recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path, **changes) -> Path:
    return tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir, corpus_lines=32, corpus_seed=3,
                              **{"max_steps": 2, "save_steps": 2, "eval_steps": 2, "eval_before_training": "true",
                                 **changes})


def run(recipe: Path, output: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(recipe), "--output_dir", str(output),
                           *overrides], capture_output=True, text=True, env=launch_env(), cwd=REPO, timeout=300)


def test_every_long_phase_says_when_it_starts_and_ends(tmp_path, tiny_bert_dir, senteval_dir):
    done = run(write_recipe(tmp_path, tiny_bert_dir, senteval_dir), tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stderr
    phases = ["Evaluation before training", "STS", "Health check of the trained encoder", "Final evaluation", "Export"]
    positions = []
    for name in phases:
        start = re.search(rf"INFO hf_sentcl: {re.escape(name)}(: [^\n]*)? \.\.\.", log)
        end = re.search(rf"INFO hf_sentcl: {re.escape(name)} done in \d+\.\d s\.", log)
        assert start and end and start.start() < end.start(), (name, log[-4000:])
        positions.append(start.start())
    assert positions[0] < positions[2] < positions[3] < positions[4]  # before, health check, after, export


def test_export_false_ends_the_run_after_its_results(tmp_path, tiny_bert_dir, senteval_dir):
    output = tmp_path / "out"
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, eval_before_training="false",
                          resume_from_checkpoint="auto")
    done = run(recipe, output, "--export", "false")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (output / "export").exists() and (output / "results.json").is_file()
    assert "Export skipped (export: false)" in done.stderr and '"skipped": "export: false"' in (
        output / "results.json").read_text()
    assert (output / RUN_COMPLETE_JSON).is_file()
    again = run(recipe, output, "--export", "false")
    assert again.returncode == exits.OK and "nothing to do" in again.stdout


def test_push_without_the_export_is_refused_before_work(tmp_path, tiny_bert_dir, senteval_dir):
    done = run(write_recipe(tmp_path, tiny_bert_dir, senteval_dir), tmp_path / "out", "--export", "false",
               "--push_to_hub", "true", "--hub_model_id", "org/name")
    assert done.returncode == exits.BAD_INPUT, done.stderr[-3000:]
    assert "export is false" in done.stderr and "Traceback" not in done.stderr


def test_trainer_logs_print_numbers_with_and_without_a_terminal(capsys):
    """Under the progress bars and without them, the logs are numbers (`'loss': 1.327`), not quoted strings."""
    from types import SimpleNamespace

    from transformers import PrinterCallback, ProgressCallback

    from hf_sentcl.trainers.callbacks import LogLinePrinter, NumbersProgressCallback, print_logs_as_numbers

    callbacks = [PrinterCallback(), ProgressCallback()]
    trainer = SimpleNamespace(pop_callback=lambda kind: next((c for c in callbacks if isinstance(c, kind)), None),
                              add_callback=callbacks.append)
    print_logs_as_numbers(trainer)
    assert any(isinstance(c, LogLinePrinter) for c in callbacks)
    assert any(isinstance(c, NumbersProgressCallback) for c in callbacks)
    state = SimpleNamespace(is_world_process_zero=True, is_local_process_zero=True)
    logs = {"loss": 1.32712, "grad_norm": 8.8581, "total_flos": 3.0}
    written = []
    bar = NumbersProgressCallback()
    bar.training_bar = SimpleNamespace(write=written.append)
    bar.on_log(None, state, None, logs=logs)
    LogLinePrinter().on_log(None, state, None, logs=logs)
    assert written == ["{'loss': 1.327, 'grad_norm': 8.858}"]
    assert capsys.readouterr().out.strip() == "{'loss': 1.327, 'grad_norm': 8.858}"
