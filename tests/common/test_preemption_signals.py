"""The preemption watch in one process: which signals it takes, what its handler does in each phase, and the
recipe key's check. The whole path (checkpoint, exit status, requeue) is tests/pipeline/test_preemption.py."""

import os
import signal

import pytest

from hf_sentcl.common.preemption import (
    Preempted,
    current_watch,
    set_phase,
    signal_numbers,
    stop_watching,
    watch_signals,
)
from hf_sentcl.methods.simcse.config import SimCSEConfig


@pytest.fixture
def watch():
    yield
    stop_watching()


def test_signal_names_are_read_in_every_spelling():
    assert signal_numbers(["SIGTERM", "usr1", "12"]) == [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2]


@pytest.mark.parametrize("name, reason", [("SIGFOO", "not a signal name"), ("SIGKILL", "cannot be caught")])
def test_a_signal_that_cannot_preempt_is_refused_by_the_recipe_key(name, reason, tmp_path):
    with pytest.raises(ValueError, match=f"preemption_signals: .*{reason}"):
        SimCSEConfig(output_dir=str(tmp_path), preemption_signals=[name])


def test_a_signal_in_training_is_noted_and_the_process_goes_on(watch):
    watched = watch_signals(["SIGUSR2"])
    set_phase("training")
    os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs before kill returns to Python code
    assert watched.requested and watched.received == signal.SIGUSR2 and watched.seconds_since_signal() >= 0


def test_a_signal_while_finishing_stops_process_0_at_once(watch):
    watch_signals(["SIGUSR2"])
    set_phase("finishing")
    with pytest.raises(Preempted, match="resume_from_checkpoint: auto"):
        os.kill(os.getpid(), signal.SIGUSR2)


def test_no_signals_leaves_the_default_actions_and_stopping_restores_handlers(watch):
    before = signal.getsignal(signal.SIGUSR2)
    watch_signals(["SIGUSR2"])
    assert signal.getsignal(signal.SIGUSR2) == current_watch().handle
    watch_signals([])
    assert signal.getsignal(signal.SIGUSR2) == before and not current_watch().signals
