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


@pytest.mark.parametrize("mixing", ["proportional"])
def test_two_processes_draw_from_one_dataset_per_step(mixing, tmp_path, tiny_bert_dir, senteval_dir, train_files):
    text = {"path": str(train_files["text"]), "columns": {"sent0": "text", "sent1": "text"}}
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(yaml.safe_dump({
        "method": "simcse_sup", "model_name_or_path": str(tiny_bert_dir), "sts_data_dir": str(senteval_dir),
        "train_file": [str(train_files["triplets"]), text], "mixing": mixing, "per_device_train_batch_size": 4,
        "max_seq_length": 16, "use_cpu": True, "seed": 0, "max_steps": 8, "logging_steps": 2, "eval_strategy": "no",
        "save_strategy": "no", "load_best_model_at_end": False, "eval_before_training": False, "eval_tasks": [],
        "learning_rate": 1e-4, "warmup_steps": 0, "precision": "fp32", "export": False,
    }))
    output = tmp_path / "out"
    command = [*accelerate_launcher("multi_cpu.yaml", 2), "--mixed_precision", "no", str(PROBE), str(recipe),
               "--output_dir", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, env=launch_env(), timeout=600)
    assert result.returncode == 0, failure(result)
    ranks = [json.loads((output / f"probe_rank{k}.json").read_text()) for k in range(2)]
    assert [len(r) for r in ranks] == [8, 8], ranks
    for step, (a, b) in enumerate(zip(*ranks)):
        assert a["step"] == b["step"] == step
        assert a["dataset"] == b["dataset"], f"step {step}: rank 0 drew dataset {a['dataset']}, rank 1 {b['dataset']}"
        assert a["first_ids"] != b["first_ids"]  # each process its own examples
    assert {r["dataset"] for r in ranks[0]} == {0, 1}
    curve = json.loads((output / "results.json").read_text())["train"]["loss_curve"]
    assert {key for entry in curve for key in entry if key.startswith("loss_")} == {"loss_triplets", "loss_train"}
