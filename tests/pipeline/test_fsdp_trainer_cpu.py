"""The Trainer-level FSDP2 run on this CPU (`trainer_fsdp_cpu.py`: fsdp.yaml's plugin on a 1-process gloo group, as
`accelerate launch --num_processes 1` gives a GPU worker) goes through every step after `train()`: best-checkpoint
reload, full-state-dict save, the final encoder reloaded whole onto the training device, final evaluation, export.
And `HF_SENTCL_HANG_DUMP_S`, the opt-in stack dump of a run that hangs or crawls."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import random_sentences, write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "trainer_fsdp_cpu.py"


@pytest.fixture
def recipe(tmp_path, tiny_bert_dir, senteval_dir):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(32, seed=3)) + "\n")
    return write_recipe(
        tmp_path, method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"), pooling="cls", head="mlp",
        global_train_batch_size=8, max_steps=4, eval_steps=2, save_steps=2, logging_steps=2, precision="fp32",
        dropout=0, eval_before_training=False, max_seq_length=16, per_device_eval_batch_size=16,
    )


def run(command: list[str], dump_after: float, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_SENTCL_HANG_DUMP_S": str(dump_after),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def test_trainer_fsdp2_run_finishes_evaluates_and_exports(recipe, tmp_path):
    """Under FSDP2 the run ends like an unsharded one (a hang or crawl after train() would print every stack after
    4 minutes and fail here with them)."""
    result = run([sys.executable, str(HARNESS), str(recipe)], dump_after=240, timeout=300)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    out = tmp_path / "out"
    assert "1 process, FSDP2 (gloo on cpu)" in result.stdout
    assert (out / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()
    assert f"Final encoder reloaded whole from {out} onto cpu." in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["parallelism"]["strategy"] == "FSDP2" and results["train"]["global_step"] == 4
    assert set(results["sts"]) == {"after"} and (out / "export" / "config.json").is_file()


def test_hang_dump_prints_the_stacks_and_ends_the_run(recipe, tmp_path):
    """HF_SENTCL_HANG_DUMP_S=N: a run still going after N seconds prints every thread's stack and exits 1."""
    result = run([sys.executable, "-m", "hf_sentcl.run", str(recipe), "--use_cpu", "true"], dump_after=0.5,
                 timeout=120)
    assert result.returncode == 1, result.stderr[-4000:]
    # faulthandler prints at most 100 frames, innermost first: deep in an import, hf_sentcl's own frames fall off
    assert "HF_SENTCL_HANG_DUMP_S: still running after 0.5 s" in result.stderr
    assert "(most recent call first)" in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()
