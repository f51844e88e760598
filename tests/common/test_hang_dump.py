"""`hang_dump` (HF_SENTCL_HANG_DUMP_S) in small processes of its own: it ends a block that outlasts N seconds with
every thread's stack and status 1, stays quiet once the block is left, and refuses a value that is not seconds."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_block(block: str, dump_after: str, after: str = "") -> subprocess.CompletedProcess:
    """Run `block` under hang_dump in a fresh interpreter, then `after` outside it."""
    code = ("import time\nfrom hf_sentcl.common.logs import hang_dump\nwith hang_dump():\n"
            + textwrap.indent(block, "    ") + after)
    env = {**os.environ, "HF_SENTCL_HANG_DUMP_S": dump_after,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_a_block_still_running_is_dumped_with_the_busy_threads_frame():
    """The dump comes while the main thread computes (holding the GIL most of the time) and names its frame."""
    result = run_block("def spin():\n    while True:\n        sum(range(1000))\nspin()\n", "0.3")
    assert result.returncode == 1, result.stderr
    assert "HF_SENTCL_HANG_DUMP_S: still running after 0.3 s" in result.stderr
    assert "line 6 in spin" in result.stderr


def test_leaving_the_block_disarms_the_dump():
    """A process that outlives the block (the interpreter's shutdown after a big run) is neither dumped nor ended."""
    result = run_block("pass\n", "0.3", after="time.sleep(1.0)\nprint('done')\n")
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert "still running" not in result.stderr and "Timeout (" not in result.stderr


@pytest.mark.parametrize("value", ["ten", "0", "-5"])
def test_a_value_that_is_not_a_positive_number_of_seconds_is_refused(value, monkeypatch):
    from hf_sentcl.common.logs import hang_dump

    monkeypatch.setenv("HF_SENTCL_HANG_DUMP_S", value)
    with pytest.raises(SystemExit, match=f"HF_SENTCL_HANG_DUMP_S='{value}'"), hang_dump():
        pass
