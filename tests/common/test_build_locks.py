"""C++ extension build locks left by a killed build (`hf_sentcl.common.build_locks`): torch's own JIT build through
a stale lock, a live lock left alone, a preemption signal during the wait, the setting and the CLI's install."""

import logging
import os
import shutil
import signal
import threading
import time

import pytest
from helpers import random_sentences, write_recipe
from torch.utils import cpp_extension, file_baton

from hf_sentcl.cli import train as train_cli
from hf_sentcl.cli.train import main as run_main
from hf_sentcl.common import build_locks
from hf_sentcl.common.build_locks import STALE_ENV, guard_extension_builds, guarded_wait, remove_if_stale
from hf_sentcl.common.preemption import Preempted, stop_watching, watch_signals

HOUR_AGO = time.time() - 3600


@pytest.fixture
def guarded(monkeypatch):
    """torch's build functions guarded for one test, then given back as they were."""
    monkeypatch.setattr(cpp_extension, "_jit_compile", cpp_extension._jit_compile)
    monkeypatch.setattr(file_baton.FileBaton, "wait", file_baton.FileBaton.wait)
    assert guard_extension_builds()


def killed_build(folder, age: float = 3600.0):
    """A build folder as a build killed half-way leaves it: its lock and a partial ninja file, untouched for `age`."""
    folder.mkdir(parents=True)
    for name in ("lock", "build.ninja"):
        (folder / name).write_text("")
    then = time.time() - age
    for path in (folder / "lock", folder / "build.ninja", folder):
        os.utime(path, (then, then))
    return folder / "lock"


def finished_within(seconds: float, work) -> dict:
    """Run `work` in a daemon thread (a wait that never ends must not hold pytest); its result or error."""
    outcome = {}

    def run():
        try:
            outcome["result"] = work()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return outcome


@pytest.mark.skipif(shutil.which("c++") is None, reason="torch's JIT build needs a C++ compiler")
def test_torchs_own_build_clears_a_killed_builds_lock_and_builds(guarded, tmp_path, caplog):
    """`torch.utils.cpp_extension.load` on a folder whose lock a killed build left an hour ago: the guarded wait
    removes it, the build starts over in this process and the library is built. Unguarded, the same call waits for
    the lock forever."""
    source = tmp_path / "tiny_op.cpp"
    source.write_text('extern "C" int hf_sentcl_tiny_op() { return 42; }\n')
    lock = killed_build(tmp_path / "build")
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        outcome = finished_within(120, lambda: cpp_extension.load(
            "hf_sentcl_tiny_op", [str(source)], build_directory=str(lock.parent), is_python_module=False))
    assert "error" not in outcome, outcome.get("error")
    assert os.path.isfile(outcome["result"]) and (lock.parent / "tiny_op.o").is_file() and not lock.exists()
    assert f"Removed the C++ extension build lock {lock}" in caplog.text


def test_a_live_builds_lock_is_waited_for_and_left_alone(monkeypatch, tmp_path, caplog):
    """A lock whose folder changed a moment ago belongs to a build in progress: the wait logs what it waits for
    (here after 0.2 s) and returns when the builder removes the lock, without touching it."""
    monkeypatch.setattr(build_locks, "NOTICE_SECONDS", 0.2)
    monkeypatch.setattr(build_locks, "CHECK_SECONDS", 0.05)
    lock = killed_build(tmp_path / "build", age=0.0)
    assert not remove_if_stale(lock, stale=600.0) and lock.exists()
    threading.Timer(0.6, lock.unlink, kwargs={"missing_ok": True}).start()  # the builder finishing
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        outcome = finished_within(30, lambda: guarded_wait(file_baton.FileBaton(str(lock))))
    assert outcome == {"result": None}
    assert f"for the C++ extension build lock {lock}" in caplog.text and "Removed" not in caplog.text


def test_a_lock_is_stale_after_the_set_quiet_time(monkeypatch, tmp_path):
    lock = killed_build(tmp_path / "build", age=30.0)
    monkeypatch.setenv(STALE_ENV, "60")
    assert not remove_if_stale(lock, build_locks.stale_seconds()) and lock.exists()
    monkeypatch.setenv(STALE_ENV, "20")
    assert remove_if_stale(lock, build_locks.stale_seconds()) and not lock.exists()


def test_a_preemption_signal_stops_the_wait(tmp_path):
    """The wait comes before the first step: a signal there stops the run (`Preempted`, exit 75) instead of
    waiting on; the lock is left to its builder."""
    lock = killed_build(tmp_path / "build", age=0.0)
    watch_signals(["SIGUSR2"])
    signal_later = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2))  # handled in this (the main) thread
    try:
        signal_later.start()
        outcome = finished_within(30, lambda: guarded_wait(file_baton.FileBaton(str(lock))))
    finally:
        signal_later.cancel()  # a wait that ended early must not leave SIGUSR2's default action (exit) to come
        signal_later.join()
        stop_watching()
    assert isinstance(outcome.get("error"), Preempted), outcome
    assert "while waiting for the C++ extension build lock" in str(outcome["error"]) and "rerun the same" in str(
        outcome["error"])
    assert lock.exists()


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_a_malformed_setting_is_refused_before_work_by_a_deepspeed_run(value, monkeypatch, tmp_path, tiny_bert_dir,
                                                                        senteval_dir, guarded, capsys):
    """The CLI installs the guard for a launch that asks for DeepSpeed (stood in for here: DeepSpeed's own setup
    needs the launcher's process group), before any work: a malformed setting is exit 2 naming it, and no run
    folder is made. A plain run does not install it (it builds no C++ op)."""
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=1)) + "\n")
    recipe = write_recipe(tmp_path, method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus,
                          sts_data_dir=senteval_dir, output_dir=tmp_path / "out", max_steps=2, use_cpu=True,
                          per_device_train_batch_size=4)
    monkeypatch.setattr(train_cli, "requested_sharding", lambda args: "DeepSpeed ZeRO-2")
    monkeypatch.setenv(STALE_ENV, value)
    assert run_main([str(recipe)]) == 2
    assert f"{STALE_ENV}={value!r}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_plain_run_leaves_torchs_build_functions_alone(monkeypatch, tmp_path, tiny_bert_dir, senteval_dir):
    monkeypatch.setattr(train_cli, "guard_extension_builds", lambda: pytest.fail("guarded a run without DeepSpeed"))
    monkeypatch.setattr(train_cli, "watched_run", lambda work, signals: 0)  # the recipe's check is enough here
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=1)) + "\n")
    recipe = write_recipe(tmp_path, method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus,
                          sts_data_dir=senteval_dir, output_dir=tmp_path / "out", use_cpu=True,
                          per_device_train_batch_size=4)
    assert run_main([str(recipe)]) == 0
