"""C++ extension build locks left by a killed build (`hf_sentcl.common.build_locks`): torch's own JIT build through
a stale lock; a live lock left alone (a changing folder, or a process building there); a lock another process
removed; a preemption signal during the wait; the setting and the CLI's install."""

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from helpers import random_sentences, write_recipe
from torch.utils import cpp_extension, file_baton

from hf_sentcl.cli import train as train_cli
from hf_sentcl.cli.train import main as run_main
from hf_sentcl.common import build_locks, preemption
from hf_sentcl.common.build_locks import (
    STALE_ENV,
    StaleBuildLock,
    guard_extension_builds,
    guarded_wait,
    last_change,
    remove_if_stale,
)


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


@pytest.mark.skipif(shutil.which("c++") is None or not cpp_extension.is_ninja_available(),
                    reason="torch's JIT build needs a C++ compiler and ninja")
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
    and returns when the builder removes the lock, without touching it."""
    monkeypatch.setattr(build_locks, "NOTICE_SECONDS", 0.0)
    monkeypatch.setattr(build_locks, "CHECK_SECONDS", 0.05)
    lock = killed_build(tmp_path / "build", age=0.0)
    assert not remove_if_stale(lock, stale=600.0) and lock.exists()

    def builder_finishes():  # once the wait has said what it waits for
        deadline = time.monotonic() + 20
        while "for the C++ extension build lock" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        lock.unlink()

    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        threading.Thread(target=builder_finishes, daemon=True).start()
        outcome = finished_within(30, lambda: guarded_wait(file_baton.FileBaton(str(lock))))
    assert outcome == {"result": None}
    assert f"for the C++ extension build lock {lock}" in caplog.text and "Removed" not in caplog.text


def test_an_old_lock_is_live_while_a_process_here_works_in_its_folder(tmp_path):
    """torch runs ninja (and ninja the compiler) in the build folder: an hour without a change is then one long
    compile, not a killed build."""
    lock = killed_build(tmp_path / "build")
    compiler = subprocess.Popen(["sleep", "60"], cwd=lock.parent)
    try:
        assert not remove_if_stale(lock, stale=600.0) and lock.exists()
    finally:
        compiler.kill()
        compiler.wait()
    assert remove_if_stale(lock, stale=600.0) and not lock.exists()


def test_a_file_vanishing_while_the_folder_is_read_is_a_change(monkeypatch, tmp_path):
    """ninja deletes each object's dependency file right after its compile: a file gone between the listing and
    its stat is a live build's change, not a folder quiet since the epoch."""
    lock = killed_build(tmp_path / "build")

    def vanished(*args, **kwargs):
        raise FileNotFoundError("tiny_op.o.d")

    class Listing(list):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    scandir = os.scandir
    monkeypatch.setattr(build_locks.os, "scandir", lambda folder: Listing([SimpleNamespace(stat=vanished)])
                        if folder == lock.parent else scandir(folder))
    assert last_change(lock.parent) >= time.time() - 5
    assert not remove_if_stale(lock, stale=600.0) and lock.exists()


def test_a_lock_another_waiter_removed_makes_this_one_build_too(monkeypatch, tmp_path):
    """The waiter that did not remove a stale lock must not load what the killed build left: once the lock is
    gone it starts the build over as well (and waits for the remover's build, or finds nothing left to do)."""
    monkeypatch.setattr(build_locks, "CHECK_SECONDS", 0.05)
    monkeypatch.setattr(build_locks, "remove_if_stale", lambda lock, stale: False)  # the other waiter is faster
    lock = killed_build(tmp_path / "build")
    threading.Timer(0.5, lock.unlink, kwargs={"missing_ok": True}).start()
    outcome = finished_within(30, lambda: guarded_wait(file_baton.FileBaton(str(lock))))
    assert isinstance(outcome.get("error"), StaleBuildLock), outcome


def test_a_lock_is_stale_after_the_set_quiet_time(monkeypatch, tmp_path):
    lock = killed_build(tmp_path / "build", age=30.0)
    monkeypatch.setenv(STALE_ENV, "60")
    assert not remove_if_stale(lock, build_locks.stale_seconds()) and lock.exists()
    monkeypatch.setenv(STALE_ENV, "20")
    assert remove_if_stale(lock, build_locks.stale_seconds()) and not lock.exists()


@pytest.fixture
def fresh_watch(monkeypatch):
    """A preemption watch of this test's own, gone afterwards (a noted signal must not reach later tests)."""
    monkeypatch.setattr(preemption, "_watch", preemption.Watch())
    yield
    preemption.stop_watching()


def test_a_preemption_signal_leaves_the_wait_to_the_builder(fresh_watch, monkeypatch, tmp_path):
    """The wait is setup work: a signal there is noted, and the process waits on for the builder (which keeps
    building) instead of leaving, which would make the launcher kill the builder half-way."""
    monkeypatch.setattr(build_locks, "CHECK_SECONDS", 0.05)
    lock = killed_build(tmp_path / "build", age=0.0)
    watched = preemption.watch_signals(["SIGUSR2"])
    signal_later = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2))  # handled in this (the main) thread
    builder_finishes = threading.Timer(0.8, lock.unlink, kwargs={"missing_ok": True})
    try:
        signal_later.start()
        builder_finishes.start()
        outcome = finished_within(30, lambda: guarded_wait(file_baton.FileBaton(str(lock))))
    finally:
        for timer in (signal_later, builder_finishes):  # none may fire after the watch is gone (SIGUSR2: exit)
            timer.cancel()
            timer.join()
    assert watched.requested and outcome == {"result": None}


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
    monkeypatch.setattr(train_cli, "requests_deepspeed", lambda args: True)
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
