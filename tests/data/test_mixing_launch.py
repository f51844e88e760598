"""Two gloo CPU processes (`accelerate launch`, multi_cpu.yaml) train on two datasets: at every step both processes
draw from the same dataset (their in-batch negatives are gathered into one loss), never the same examples, and the
per-dataset losses reach the log (tests/data/mixing_probe.py records each process's batches)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from launching import accelerate_launcher, failure, launch_env

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("mixing_probe.py")


STEPS = 12  # 8 steps an epoch (32 + 32 examples, 2 processes x 4): the checkpoint at step 10 is inside epoch 1


def launch_probe(recipe, output, *overrides):
    """The probe launched on 2 gloo processes; each process's records (step, dataset, first token ids)."""
    command = [*accelerate_launcher("multi_cpu.yaml", 2), "--mixed_precision", "no", str(PROBE), str(recipe),
               "--output_dir", str(output), *overrides]
    result = subprocess.run(command, capture_output=True, text=True, env=launch_env(), timeout=600)
    assert result.returncode == 0, failure(result)
    return [json.loads((output / f"probe_rank{k}.json").read_text()) for k in range(2)]


def test_two_processes_draw_from_one_dataset_per_step(tmp_path, tiny_bert_dir, senteval_dir, train_files):
    """Also through a resume in the second epoch (where the sampler sits under accelerate's BatchSamplerShard and
    batch skipper, which the Trainer's set_epoch does not reach): the same batches on each process."""
    text = {"path": str(train_files["text"]), "columns": {"sent0": "text", "sent1": "text"}}
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(yaml.safe_dump({
        "method": "simcse_sup", "model_name_or_path": str(tiny_bert_dir), "sts_data_dir": str(senteval_dir),
        "train_file": [str(train_files["triplets"]), text], "mixing": "proportional",
        "per_device_train_batch_size": 4, "max_seq_length": 16, "use_cpu": True, "seed": 0, "max_steps": STEPS,
        "logging_steps": 2, "eval_strategy": "no", "save_strategy": "steps", "save_steps": 10, "save_total_limit": 2,
        "load_best_model_at_end": False, "eval_before_training": False, "eval_tasks": [], "learning_rate": 1e-4,
        "warmup_steps": 0, "precision": "fp32", "export": False,
    }))
    output = tmp_path / "out"
    ranks = launch_probe(recipe, output)
    assert [len(r) for r in ranks] == [STEPS, STEPS], ranks
    for step, (a, b) in enumerate(zip(*ranks)):
        assert a["step"] == b["step"] == step
        assert a["dataset"] == b["dataset"], f"step {step}: rank 0 drew dataset {a['dataset']}, rank 1 {b['dataset']}"
        assert a["first_ids"] != b["first_ids"]  # each process its own examples
    assert {r["dataset"] for r in ranks[0]} == {0, 1}
    curve = json.loads((output / "results.json").read_text())["train"]["loss_curve"]
    assert {key for entry in curve for key in entry if key.startswith("loss_")} == {"loss_triplets", "loss_train"}
    resumed = launch_probe(recipe, tmp_path / "resumed", "--resume_from_checkpoint", str(output / "checkpoint-10"))
    assert resumed == [r[10:] for r in ranks]
