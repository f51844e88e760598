"""Preemption: a scheduler's signal (SIGTERM, or SIGUSR1 sent ahead of a time limit) turns into a checkpoint and a
clean stop instead of a killed run.

`watch_signals(names)` installs handlers for the run's whole life (the CLI does it once the recipe is read); the
handler only notes the signal, because a checkpoint cannot be written from inside a signal handler and the processes
of a launch must stop at the same step. What happens next depends on where the run is (`Watch.phase`):

- `setup` and `training`: training goes on to the next step boundary (or the end of a dev evaluation or checkpoint
  save in progress); there every process learns whether any of them was signalled
  (`hf_sentcl.trainers.callbacks.PreemptionCallback`), they write one complete checkpoint at that step, stop, and
  the run ends with `Preempted` (exit status `hf_sentcl.common.exits.PREEMPTED`).
- `finishing` (training done and its last checkpoint complete: saving the encoder, the final evaluation, the export):
  process 0 stops at once with `Preempted`; nothing of this phase is marked complete yet, so the requeued run
  (`resume_from_checkpoint: auto`) resumes from the last checkpoint with no steps left and does this phase again.
  The other processes are only waiting for process 0 by then, and carry on waiting.
- `evaluating` (process 0's evaluation before training): process 0 stops the evaluation at once (its scores are
  not needed to resume); every process then agrees to stop before the first step (`hf_sentcl.pipeline.train`).

Ctrl-C (SIGINT) is one of the default signals: the first one checkpoints and stops as above, a second one stops at
once (KeyboardInterrupt; the steps since the last checkpoint are lost). `watch_early()` notes the default signals
from the entry point's first line, before the seconds of imports and recipe checks; `watch_signals` takes over
what it noted. Under a launcher (torchrun, `accelerate launch`), `stop_with_launcher()` asks the kernel for a SIGTERM
when the launcher dies, so workers never train on as orphans after their job has ended.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

logger = logging.getLogger("hf_sentcl")

#: the signals that preempt a run unless the recipe's `preemption_signals` says otherwise
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

Phase = Literal["setup", "evaluating", "training", "finishing"]


class Preempted(Exception):
    """The run stopped on a preemption signal; the message says what was kept and how to resume."""

    def __init__(self, message: str, signal_name: str, step: int | None = None):
        super().__init__(message)
        self.signal_name = signal_name
        self.step = step


def signal_numbers(names: Sequence[str]) -> list[signal.Signals]:
    """The signals named (`SIGTERM`, `TERM` or `15`); ValueError naming the one that is not a catchable signal."""
    found = []
    for name in names:
        text = str(name).strip().upper()
        try:
            number = signal.Signals(int(text)) if text.isdigit() else signal.Signals[
                text if text.startswith("SIG") else f"SIG{text}"]
        except (KeyError, ValueError):
            raise ValueError(
                f"preemption_signals: '{name}' is not a signal name; use names such as SIGTERM, SIGUSR1, SIGUSR2."
            ) from None
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"preemption_signals: {number.name} cannot be caught; a process cannot act on it.")
        found.append(number)
    return found


@dataclass
class Watch:
    """What the handlers have seen in this process."""

    signals: list[signal.Signals] = field(default_factory=list)
    phase: Phase = "setup"
    received: signal.Signals | None = None
    received_at: float | None = None  # time.monotonic() of the first signal
    _previous: dict[signal.Signals, object] = field(default_factory=dict)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def handle(self, number: int, frame) -> None:
        first = self.received is None
        if first:
            self.received, self.received_at = signal.Signals(number), time.monotonic()
        name = signal.Signals(number).name
        if not first and number == signal.SIGINT:  # a second Ctrl-C: the user wants out now
            raise KeyboardInterrupt
        if self.phase == "evaluating":
            raise Preempted(
                f"preempted by {name} during the evaluation before training; nothing was trained: rerun the same "
                "command (with 'resume_from_checkpoint: auto') to start it.", name,
            )
        if self.phase == "finishing" and is_main_process():
            raise Preempted(
                f"preempted by {name} after training, before the final evaluation and export were complete; "
                "training's last checkpoint is complete: rerun the same command with "
                "'resume_from_checkpoint: auto' (or --resume_from_checkpoint latest) to evaluate and export it.",
                name,
            )
        if first:  # logging from a handler could deadlock on the handler's lock; one write to stderr is safe
            where = "after the current step" if self.phase != "finishing" else "(process 0 finishes the run)"
            again = " (Ctrl-C again: stop at once, losing the steps since the last checkpoint)" if (
                number == signal.SIGINT) else ""
            os.write(sys.stderr.fileno(),
                     f"hf_sentcl: {name} received (pid {os.getpid()}): checkpointing and stopping {where}"
                     f"{again}\n".encode())

    def seconds_since_signal(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at


_watch = Watch()


def current_watch() -> Watch:
    return _watch


def watch_signals(names: Sequence[str] | None) -> Watch:
    """Install the preemption handlers for `names` (None: `DEFAULT_SIGNALS`; empty: none) in this process, replacing
    any earlier watch. A signal the earlier watch noted (`watch_early`) is kept when the new watch takes it too, and
    otherwise given its default action now, as if no handler had been installed. Must run in the main thread."""
    global _watch
    earlier = _watch if _watch._previous else Watch()  # a watch still installed (not one stopped after its run)
    stop_watching()
    _watch = Watch(signals=signal_numbers(DEFAULT_SIGNALS if names is None else names))
    for number in _watch.signals:
        _watch._previous[number] = signal.signal(number, _watch.handle)
    if earlier.received is not None:
        if earlier.received in _watch.signals:
            _watch.received, _watch.received_at = earlier.received, earlier.received_at
        else:
            signal.raise_signal(earlier.received)  # the default action the recipe asked to keep
    return _watch


def watch_early() -> Watch:
    """Note the default preemption signals from the very start of an entry point, before the imports and checks that
    take seconds: a signal then is acted on once the run can (see `watch_signals`) instead of killing the process
    without a word or a note. Under a launcher, also `stop_with_launcher`. Only this module and the standard library
    are loaded."""
    stop_with_launcher()
    return watch_signals(None)


#: prctl(2)'s option that sends the calling process a signal when its parent dies
_PR_SET_PDEATHSIG = 1


def stop_with_launcher() -> bool:
    """Under torchrun / `accelerate launch` (TORCHELASTIC_RUN_ID is set), ask Linux to send this worker SIGTERM when
    its launcher dies (e.g. SIGUSR1 sent to a job's whole process group kills the launcher by default): the worker
    then checkpoints and stops like any preempted run, instead of training on, orphaned, after its job has ended or
    been requeued. Returns whether it was set (not on other systems or outside a launcher)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_watching() -> None:
    """Give the watched signals their earlier handlers back."""
    for number, previous in _watch._previous.items():
        signal.signal(number, previous)
    _watch._previous.clear()


def set_phase(phase: Phase) -> None:
    _watch.phase = phase


def is_main_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
