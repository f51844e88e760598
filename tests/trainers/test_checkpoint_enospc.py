"""A full disk hit by ONE of two DDP processes (gloo, `accelerate launch`) while a checkpoint is written: both
processes learn of it (`settle_checkpoint_write`'s all-reduce) and end with the disk-full error and exit 1, rather
than the other one waiting in a barrier until the launcher kills it or the process group times out.

- process 0 fails writing model.safetensors (under DDP only it writes the weights), with best-model tracking on:
  the Trainer follows the weights with a barrier that process 1 must not enter alone;
- process 1 fails writing its rng_state_1.pth, after process 0 wrote everything: process 0 must not wait for it in
  the barrier before the completion mark.

Run as a script, this file is the launched program: `FAIL_RANK`'s process fails on checkpoint-2's `FAIL_FILE`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil  # accelerate's dependency
import pytest


@pytest.mark.slow
@pytest.mark.parametrize(("rank", "target"), [(0, "model.safetensors"), (1, "rng_state_1.pth")])
def test_one_process_out_of_space_ends_both(tmp_path, tiny_bert_dir, senteval_dir, rank, target):
    from helpers import random_sentences

    from hf_sentcl.recipe.run_folder import checkpoint_problems

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=2)) + "\n")
    values = dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        per_device_train_batch_size=2, max_seq_length=16, max_steps=2, save_steps=1, eval_steps=1,
        use_cpu="true", seed=0, eval_before_training="false", eval_tasks="[]",
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    out = tmp_path / "out"
    from launching import accelerate_launcher, launch_env  # here: this file also runs as the launched script

    env = launch_env(FAIL_RANK=str(rank), FAIL_FILE=target)
    command = [*accelerate_launcher("multi_cpu.yaml"), __file__, str(recipe), "--output_dir", str(out)]
    launch = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, stderr = launch.communicate(timeout=150)  # about 15 s when nothing hangs
    except subprocess.TimeoutExpired:  # SIGKILL the launcher and its workers (their own sessions; SIGTERM preempts)
        for process in [*psutil.Process(launch.pid).children(recursive=True), psutil.Process(launch.pid)]:
            process.kill()
        launch.wait()
        pytest.fail("the launch hung: a process waited for one that had failed to write its checkpoint")
    assert launch.returncode == 1, stderr[-4000:]
    # each process ends with the error, none is killed while waiting (their lines may interleave in the shared pipe)
    errors = stderr.split("error: the disk filled up")[1:]
    assert len(errors) == 2, stderr[-4000:]
    assert all(f"checkpoint '{out / 'checkpoint-2'}'" in error for error in errors)
    assert not (out / "checkpoint-2").exists() and checkpoint_problems(out / "checkpoint-1") == []


def fail_on_checkpoint_2(target: str) -> None:
    """Make this process's writer of checkpoint-2's `target` write half of it and raise ENOSPC."""
    import errno

    import torch
    import transformers.modeling_utils

    def failing(real):
        def write(obj, path, *args, **kwargs):
            if not str(path).endswith(f"checkpoint-2/{target}"):
                return real(obj, path, *args, **kwargs)
            Path(path).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write

    transformers.modeling_utils.safe_save_file = failing(transformers.modeling_utils.safe_save_file)
    torch.save = failing(torch.save)


if __name__ == "__main__":
    if os.environ.get("RANK") == os.environ["FAIL_RANK"]:
        fail_on_checkpoint_2(os.environ["FAIL_FILE"])
    from hf_sentcl.cli.train import main

    sys.exit(main(sys.argv[1:]))
