"""A batch scheduler's signals, emulated around a job script, for the job-script tests (and by hand, for timelines):

    python tests/pipeline/scheduler_emulator.py --when 'PROBES/step-6.0' --signal TERM --to job \
        --watch OUTPUT_DIR --timeline timeline.json -- bash job.sh

The job script runs in a session of its own. Once a file matching `--when` exists, the emulator sends `--signal` to
every process of the job (`--to job`: what SLURM does on preemption, `scancel` or Kubernetes to a pod) or to the
script alone (`--to batch`: SLURM's `--signal=B:USR1@...` before the time limit). When the script exits, SLURM ends
the job: whatever is left is sent SIGKILL `--grace` seconds later (0: at once), and everything is SIGKILLed
`--kill-after` seconds after the signal (the partition's GraceTime) if it is still running then. The emulator is a
child subreaper, so workers whose launcher died are still found and killed, as a job's cgroup would be.

The timeline (seconds from the signal): each `checkpoint-N/checkpoint_complete.json` and `preempted.json` under
`--watch` as it appears, the script's exit and status, and what was SIGKILLed. Printed as JSON and written to
`--timeline`.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below `root`."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(text.split(" ", 1)[0]))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def signal_all(pids: list[int], number: int) -> list[int]:
    sent = []
    for pid in pids:
        try:
            os.kill(pid, number)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


class Observer:
    """Notes when files appear under the watched folder, relative to the signal time."""

    def __init__(self, watch: Path | None):
        self.watch, self.events = watch, []
        self.seen = self.files()  # what an earlier launch left is not news (a rewritten file is)

    def files(self) -> dict[str, int]:
        """The watched files there now, with their modification times."""
        if self.watch is None:
            return {}
        found = {}
        for pattern in ("checkpoint-*/checkpoint_complete.json", "preempted.json"):
            for path in glob.glob(str(self.watch / pattern)):
                try:
                    found[path] = os.stat(path).st_mtime_ns
                except OSError:
                    pass
        return found

    def poll(self) -> None:
        for path, mtime in self.files().items():
            if self.seen.get(path) != mtime:
                self.seen[path] = mtime
                self.events.append({"t": time.monotonic(), "event": str(Path(path).relative_to(self.watch))})

    def mark(self, event: str, **details) -> None:
        self.events.append({"t": time.monotonic(), "event": event, **details})

    def timeline(self, t0: float) -> list[dict]:
        """The events in order, their times in seconds from `t0` (the signal, else the start)."""
        return [{**e, "t": round(e["t"] - t0, 3)} for e in sorted(self.events, key=lambda e: e["t"])]


def run(args: argparse.Namespace) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    observer = Observer(Path(args.watch) if args.watch else None)
    job = subprocess.Popen(args.command, start_new_session=True)
    start, t0, status, exited_at = time.monotonic(), None, None, None
    while True:
        now = time.monotonic()
        if t0 is None and args.when and glob.glob(args.when):
            t0 = now
            targets = [job.pid] if args.to == "batch" else [job.pid, *descendants(os.getpid())]
            sent = signal_all(sorted(set(targets)), getattr(signal, f"SIG{args.signal}"))
            observer.mark(f"SIG{args.signal} to {args.to}", processes=len(sent))
        observer.poll()
        while True:  # reap the script and any orphan handed to this subreaper
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == job.pid:
                status, exited_at = os.waitstatus_to_exitcode(code), now
                observer.mark("job script exited", status=status)
        late = t0 is not None and args.kill_after is not None and now - t0 >= args.kill_after
        if (exited_at is not None and now - exited_at >= args.grace) or late:
            left = descendants(os.getpid())
            if left:
                observer.mark("SIGKILL to what is left", processes=len(signal_all(left, signal.SIGKILL)))
            if exited_at is not None or late:
                if exited_at is None:
                    _, code = os.waitpid(job.pid, 0)
                    status = os.waitstatus_to_exitcode(code)
                break
        if now - start > args.timeout:
            signal_all(descendants(os.getpid()), signal.SIGKILL)
            observer.mark("emulator timeout: everything killed")
            break
        time.sleep(POLL_S)
    observer.poll()
    return {"status": status, "signalled": t0 is not None, "events": observer.timeline(t0 or start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--when", help="glob: send the signal once a file matches it (no signal without it)")
    parser.add_argument("--signal", default="TERM", choices=["TERM", "USR1", "INT"])
    parser.add_argument("--to", default="job", choices=["job", "batch"])
    parser.add_argument("--grace", type=float, default=0.0, help="SIGKILL what is left this long after the script")
    parser.add_argument("--kill-after", type=float, help="SIGKILL everything this long after the signal")
    parser.add_argument("--watch", help="output_dir whose checkpoints and preempted.json the timeline notes")
    parser.add_argument("--timeline", help="write the timeline JSON here")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    timeline = run(args)
    text = json.dumps(timeline, indent=1)
    print(text, flush=True)
    if args.timeline:
        Path(args.timeline).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
