"""`python -m hf_sentcl.run` with probes, for the preemption tests: `python tests/pipeline/phase_probe.py RECIPE ...`
(or as the script of `accelerate launch`) runs the same CLI, and each process notes in $HF_SENTCL_PROBE_DIR when it
enters a phase, so a test can send a signal while a process is inside it:

    step-N.R            process R starts training step N (0-based: the step after global step N)
    evaluate.R          process R starts a dev evaluation
    save.R              process R is inside a checkpoint save, its weights written, optimizer and mark not yet
    suites.R            process 0 starts the evaluation suites (before training, in phase `evaluating`, and after)
    final.R             process 0 starts the final evaluation
    export.R            process 0 starts the export

Each note holds the wall-clock time and the process id. $HF_SENTCL_PROBE_PAUSE names a phase (step, evaluate, save,
suites, final, export) or one note (step-2), and the process sleeps $HF_SENTCL_PROBE_PAUSE_S seconds in it: long enough
for the test's signal to arrive inside. Nothing else changes: the run is the user's.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

from transformers import Trainer

import hf_sentcl.pipeline.train as pipeline
from hf_sentcl.cli.train import main
from hf_sentcl.trainers.base import ContrastiveTrainer

PROBE_DIR = Path(os.environ["HF_SENTCL_PROBE_DIR"])
PAUSE = os.environ.get("HF_SENTCL_PROBE_PAUSE", "")
PAUSE_S = float(os.environ.get("HF_SENTCL_PROBE_PAUSE_S", "0"))


def note(phase: str, name: str) -> None:
    """Write the phase's note (the wall-clock time it began) and pause if the test asked for it."""
    path = PROBE_DIR / f"{name}.{os.environ.get('RANK', '0')}"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(f"{time.time():.6f} {os.getpid()}\n")
    os.replace(partial, path)  # whole: the test reads it the moment it appears
    if PAUSE in (phase, name):
        time.sleep(PAUSE_S)


def probed(phase: str, original, name=None):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        note(phase, name(*args) if name else phase)
        return original(*args, **kwargs)

    return wrapper


ContrastiveTrainer.training_step = probed(
    "step", ContrastiveTrainer.training_step, name=lambda trainer, *_: f"step-{trainer.state.global_step}")
ContrastiveTrainer.evaluate = probed("evaluate", ContrastiveTrainer.evaluate)
Trainer._save_optimizer_and_scheduler = probed("save", Trainer._save_optimizer_and_scheduler)
pipeline.evaluate_after = probed("final", pipeline.evaluate_after)
pipeline.evaluate_suites = probed("suites", pipeline.evaluate_suites)
pipeline.publish_run = probed("export", pipeline.publish_run)

if __name__ == "__main__":
    PROBE_DIR.mkdir(parents=True, exist_ok=True)
    sys.exit(main())
