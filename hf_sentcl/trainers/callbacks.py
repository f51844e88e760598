"""Training-cost measurement: throughput of the training steps alone and the peak memory of training.

`Trainer`'s own `train_samples_per_second` divides by the whole of `train()`, so periodic STS-B dev evaluations and
checkpoint saves count as training time. Comparing methods (or hf_sentcl with another library) needs the cost of
the steps themselves, which is what `TrainingCostCallback` measures.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from hf_sentcl.common.distributed import any_process
from hf_sentcl.common.logs import trainer_log_line

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _peak_rss_bytes() -> int | None:
    """The process's resident-set high-water mark (Linux), or None where /proc does not say."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Restart the high-water mark from the current RSS (Linux >= 4.0); False if the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class TrainingCostCallback(TrainerCallback):
    """Measures optimizer steps per second outside evaluation and saving, and peak memory during training.

    A step's time is the interval from the end of the previous optimizer step to the end of this one (data loading,
    forward, backward, optimizer). Intervals that contain an evaluation or a checkpoint save are left out, and so
    is the first step (warm-up). Peak memory is the accelerator's peak allocation when training on CUDA, otherwise
    the process's peak resident set during training (which includes the model and optimizer state).
    """

    def __init__(self) -> None:
        self.step_seconds: list[float] = []
        self._last_step_end: float | None = None
        self._interrupted = False
        self._rss_reset = False
        self.peak_memory_bytes: int | None = None
        self.peak_memory_kind: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available() and args.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(args.device)
        else:
            self._rss_reset = _reset_peak_rss()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._last_step_end is not None and not self._interrupted:
            self.step_seconds.append(now - self._last_step_end)
        self._interrupted = False
        self._last_step_end = now

    def _pause(self, *args, **kwargs):
        self._interrupted = True

    on_evaluate = on_save = _pause

    def on_train_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available() and args.device.type == "cuda":
            self.peak_memory_bytes = torch.cuda.max_memory_allocated(args.device)
            self.peak_memory_kind = "cuda_max_allocated"
        elif self._rss_reset:
            self.peak_memory_bytes = _peak_rss_bytes()
            self.peak_memory_kind = "process_peak_rss"

    def summary(self, examples_per_step: int) -> dict[str, float | int | str | None]:
        """`train_steps_measured`, `train_step_seconds` (median), `train_examples_per_second` (examples over
        measured steps / their time) and the peak memory; `examples_per_step` is the global batch size."""
        measured = len(self.step_seconds)
        total = sum(self.step_seconds)
        median = sorted(self.step_seconds)[measured // 2] if measured else None
        return {
            "train_steps_measured": measured,
            "train_step_seconds": median,
            "train_examples_per_second": examples_per_step * measured / total if total > 0 else None,
            "train_peak_memory_mb": None if self.peak_memory_bytes is None else self.peak_memory_bytes / 2**20,
            "train_peak_memory_kind": self.peak_memory_kind,
        }


class StepsRunCallback(TrainerCallback):
    """What this `train()` call trained: the global step it started from (a resumed checkpoint's, else 0) and the
    optimizer steps it ran, so that a resumed run can show it did only the remaining steps."""

    def __init__(self) -> None:
        self.started_at_step = 0
        self.steps_run = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started_at_step = state.global_step  # the checkpoint's state is loaded before this event
        self.steps_run = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps_run += 1

    def summary(self) -> dict[str, int]:
        return {"started_at_step": self.started_at_step, "steps_run": self.steps_run}


class OnTrainBegin(TrainerCallback):
    """Calls `action()` when training begins: after `train()` has prepared the model (DDP, FSDP, DeepSpeed's engine)
    and loaded a checkpoint to resume from, before the first step."""

    def __init__(self, action) -> None:
        self.action = action

    def on_train_begin(self, args, state, control, **kwargs):
        self.action()


class PreemptionCallback(TrainerCallback):
    """Turns a preemption signal noted by `hf_sentcl.common.preemption` into a checkpoint and a stop at the same step
    on every process.

    At every step end, after a dev evaluation and after a checkpoint save, the processes agree whether any of them
    was signalled (the signal may reach one process only, or the processes at different moments): one all-reduce
    of a flag on the CPU gloo group (`any_process`, the agreement a run also makes before training), no device
    sync, 0.33 ms between 2 processes of a loaded 2-core Intel Xeon. Once
    they agree, the step's checkpoint is written (unless the event is that save) and training stops; `stop_step`
    says at which step, for `run_stage` to end the run.
    """

    def __init__(self, watch) -> None:
        self.watch = watch
        self.stop_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.watch.phase = "training"

    def _agreed(self) -> bool:
        return self.stop_step is not None or any_process(self.watch.requested)

    def _stop(self, state, control, save: bool) -> None:
        if self.stop_step is None:
            self.stop_step = state.global_step
        control.should_save = control.should_save or save
        control.should_training_stop = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed():
            self._stop(state, control, save=True)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._agreed():  # the evaluation is done: checkpoint this step now rather than after another step
            self._stop(state, control, save=True)

    def on_save(self, args, state, control, **kwargs):
        if self._agreed():  # this step's checkpoint is complete: stop without another one
            self._stop(state, control, save=False)


class LogLinePrinter(TrainerCallback):
    """Trainer's logs as printed lines of numbers (`trainer_log_line`), on the main process: replaces transformers'
    PrinterCallback, which Trainer adds when disable_tqdm is set and which prints its floats as quoted strings."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs:
            print(trainer_log_line(logs), flush=True)


class NumbersProgressCallback(ProgressCallback):
    """transformers' progress bars, with the logs written under them as numbers (`trainer_log_line`) rather than the
    quoted strings ProgressCallback writes (`'loss': '1.327'`)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            self.training_bar.write(trainer_log_line(logs))


def print_logs_as_numbers(trainer) -> None:
    """Swap the Trainer's log printer for one that prints numbers: `LogLinePrinter` where there is no terminal
    (disable_tqdm), `NumbersProgressCallback` under the progress bars."""
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(LogLinePrinter())
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(NumbersProgressCallback())
