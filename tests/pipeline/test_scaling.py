"""Real process groups (2 gloo processes of `accelerate launch`, tiny BERT) for issue 28:

- a sharded accelerate config on this CPU (fsdp.yaml) is refused before work, naming multi_cpu.yaml;
- DDP trains when the recipe leaves modules unreached (pooling_layer below the last, cls_before_pooler + mlp head),
  and the run states its effective parallelism in its log, results.json and model card;
- per method: a 2-process run with a mid-run dev evaluation and checkpoint, resumed from that checkpoint, ends with
  the uninterrupted run's weights, and its export equals a 1-process run's with the same global batch and dropout 0;
- the same for DeepSpeed ZeRO-2 and ZeRO-3 (deepspeed_zero*.yaml on DeepSpeed's CPU accelerator, gloo), where
  deepspeed is installed; ZeRO-2's bf16 engine exports fp32; ConSERT's supervised modes train under ZeRO-2 and are
  refused under ZeRO-3 before work.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import random_sentences
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "recipes" / "accelerate_configs"
pytestmark = pytest.mark.slow


def launch(processes: int, recipe: Path, output: Path, *extra: str, config: str = "multi_cpu.yaml", timeout=600,
           launcher: tuple[str, ...] = ()):
    """Run the recipe in 1 process (`python -m hf_sentcl.run`) or several (`accelerate launch` with `config` and the
    `launcher` options); DeepSpeed, where a config asks for it, uses its CPU accelerator."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")]))}
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_MIXED_PRECISION"):
        env.pop(name, None)
    if processes == 1:
        command = [sys.executable, "-m", "hf_sentcl.run"]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
                   "--num_processes", str(processes), *launcher, "-m", "hf_sentcl.run"]
    return subprocess.run([*command, str(recipe), "--output_dir", str(output), *extra], capture_output=True,
                          text=True, env=env, timeout=timeout)


def write_recipe(tmp_path: Path, tiny_bert_dir, senteval_dir, **overrides) -> Path:
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(32, seed=5)) + "\n")
    values = dict(
        method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
        global_train_batch_size=4, max_seq_length=16, max_steps=8, save_steps=4, eval_steps=4,
        logging_steps=1, learning_rate="1e-3", use_cpu="true", seed=0, dropout=0.0, save_total_limit="null",
        eval_before_training="false", eval_tasks="[]", load_best_model_at_end="false",
        # Adam turns a gradient element that is pure rounding noise (~1e-9, e.g. an embedding row no sentence uses)
        # into a full learning-rate step of random sign; 1e-4 damps those, so 1 and 2 processes stay within 1e-5
        # (with 1e-6 they did on an AVX2 CPU but not on an AVX512 one: BYOP 2.1e-5, ZeRO-3 2.1e-5; with 1e-4,
        # 1.4e-6 and SimCSE 2.9e-6 there, while training still moves the weights by 3.7e-3)
        adam_epsilon="1e-4",
        pad_to_multiple_of=16,  # every batch padded alike on 1 and 2 processes (same summation shapes)
        # the padded path: the unpadded one packs each process's real tokens, so 1 and 2 processes multiply
        # matrices of other shapes and round differently (max export difference 1.8e-5 after Adam's 8 steps);
        # its equality with the padded path is tests/modeling/test_unpadded.py's job
        unpadded="false",
    )
    if overrides.get("supervised_mode") == "joint":  # ConSERT's NLI pairs (premise, hypothesis, label)
        nli = tmp_path / "nli.csv"
        rows = random_sentences(64, seed=6)
        nli.write_text("premise,hypothesis,label\n" + "".join(
            f"{a},{b},{i % 3}\n" for i, (a, b) in enumerate(zip(rows[:32], rows[32:]))))
        values["nli_source"] = nli
        del values["train_file"]  # joint trains on the NLI pairs alone
    values.update(overrides)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return recipe


def test_fsdp_config_on_cpu_is_refused_before_work(tmp_path, tiny_bert_dir, senteval_dir):
    """Finding 0: accelerate would run fsdp.yaml as plain gloo DDP here; every worker exits 2 before loading."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    start = time.monotonic()
    result = launch(2, recipe, tmp_path / "out", config="fsdp.yaml", timeout=180)
    assert result.returncode != 0
    assert "exitcode  : 2" in result.stderr and "multi_cpu.yaml" in result.stderr
    assert "asks for FSDP" in result.stderr
    assert not (tmp_path / "out").exists()  # refused before any work
    assert time.monotonic() - start < 120


def test_ddp_trains_with_unreached_modules_and_states_its_parallelism(tmp_path, tiny_bert_dir, senteval_dir):
    """Finding 7: the mlp head that cls_before_pooler skips and the layer above pooling_layer get no gradient; DDP
    used to fail at step 2 ('Expected to have finished reduction'). Must-hold 2: the log and results.json say
    what ran."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, pooling="cls_before_pooler", head="mlp",
                          pooling_layer=1, max_steps=3, save_strategy="no", eval_strategy="no",
                          # process 0 evaluates alone before training while process 1 waits (finding 12)
                          eval_before_training="true", eval_tasks="[sts]")
    result = launch(2, recipe, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| before training |" in result.stdout
    stated = "2 processes, DDP (gloo on cpu), fp32, global batch 4 (2 per process)"
    assert f"Parallelism: {stated}" in result.stdout
    parallelism = json.loads((tmp_path / "out" / "results.json").read_text())["parallelism"]
    assert parallelism["processes"] == 2 and parallelism["strategy"] == "DDP"
    assert f"- **Parallelism:** {stated}." in (tmp_path / "out" / "export" / "README.md").read_text()  # the card


METHODS = {
    "simcse": {},
    "byop": {"perturbation": "n-", "margin": 0.1, "margin_type": "constant", "head": "mlp"},
    "consert_joint": {"method": "consert", "supervised_mode": "joint", "pooling": "mean", "head": "none",
                      # random augmentations are drawn per process (other rows, other draws on 2 processes):
                      # the two plain views keep the 1- vs 2-process comparison exact
                      "augmentation1": "none", "augmentation2": "none"},
    "clear": {"method": "clear", "augmentation": "del_word", "pooling": "cls", "head": "none"},
    "sg_opt": {"method": "self_guided", "objective": "sg-opt", "projection_size": 16, "temperature": 0.1, "head": "none",
               "view_pooling": "max"},
}


#: methods whose collator draws random augmentations per process, so 1 and 2 processes train on other views
#: (CLEAR's word deletion and MLM masks; measured: max diff 5.7e-3, min update cosine 0.93)
RANDOM_PER_PROCESS = {"clear"}


def export_weights(output: Path) -> dict[str, torch.Tensor]:
    return load_file(output / "export" / "model.safetensors")


def compare(a: dict, b: dict, start: dict | None = None) -> tuple[float, float]:
    """Max absolute difference over the common weight tensors, and the min cosine between the two runs' updates
    (trained minus `start`) over the tensors training moved (1.0 without `start`)."""
    keys = sorted(k for k in a.keys() & b.keys() if a[k].shape == b[k].shape)
    assert keys
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in keys)
    if start is None:
        return diff, 1.0
    # (CLEAR adds a [DEL] token: its embedding table grows a row and is left out of the update comparison)
    keys = [k for k in keys if k in start and start[k].shape == a[k].shape]
    moved = [k for k in keys if (a[k].float() - start[k].float()).norm() > 1e-4]
    cosine = min(torch.nn.functional.cosine_similarity(
        (a[k].float() - start[k].float()).flatten(), (b[k].float() - start[k].float()).flatten(), dim=0).item()
        for k in moved)
    return diff, cosine


@pytest.mark.parametrize("method", list(METHODS))
def test_ddp_resume_and_export_match_one_process(tmp_path, tiny_bert_dir, senteval_dir, method):
    """Must-hold 3: 2 processes with a dev evaluation and a checkpoint at step 4 of 8; resuming from that checkpoint
    ends with the same weights, and the export equals a 1-process run's (same global batch 4, dropout 0)."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, **METHODS[method])
    full, resumed, single = tmp_path / "full", tmp_path / "resumed", tmp_path / "single"
    for processes, output in ((2, full), (1, single)):
        result = launch(processes, recipe, output)
        assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((full / "results.json").read_text())
    assert [e["step"] for e in results["train"]["dev_curve"]] == [4, 8]  # the mid-run dev evaluation ran
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")
    result = launch(2, recipe, resumed, "--resume_from_checkpoint", "latest")
    assert result.returncode == 0, result.stderr[-3000:]

    trained, start = export_weights(full), load_file(Path(tiny_bert_dir) / "model.safetensors")
    resume_diff, resume_cos = compare(trained, export_weights(resumed), start)
    single_diff, single_cos = compare(trained, export_weights(single), start)
    moved, _ = compare(trained, start)
    print(f"\n{method}: resume max diff {resume_diff:.3g}, min update cosine {resume_cos:.9f}; 1-process max diff "
          f"{single_diff:.3g}, min update cosine {single_cos:.9f}; moved {moved:.3g}")
    assert moved >= 1e-3
    assert resume_diff <= 1e-6
    if method in RANDOM_PER_PROCESS:  # resume is exact; 1 vs 2 processes draw other augmentations
        assert single_cos > 0.5, single_cos
        return
    assert single_diff <= 1e-5


#: issue 27's plug-ins on 2 processes: texts repeat across the processes' batches (masked through the gathered text
#: groups) and the Matryoshka prefixes are taken of the gathered embeddings
PLUGINS = {
    "simcse": {"head": "none", "false_negatives": "mask", "matryoshka_dims": "[32, 16, 8]"},
    "sg_opt": {**METHODS["sg_opt"], "false_negatives": "mask"},
}


@pytest.mark.parametrize("method", list(PLUGINS))
def test_plugins_on_two_processes_match_one_process(tmp_path, tiny_bert_dir, senteval_dir, method):
    corpus = tmp_path / "repeated.txt"
    corpus.write_text("\n".join(random_sentences(8, seed=7) * 4) + "\n")  # global batches of 4 hold duplicates
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, train_file=corpus, eval_steps=8, save_steps=8,
                          **PLUGINS[method])
    two, one = tmp_path / "two", tmp_path / "one"
    for processes, output in ((2, two), (1, one)):
        result = launch(processes, recipe, output)
        assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((two / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    assert sum(entry.get("masked_pairs", 0) for entry in history) > 0
    trained, start = export_weights(two), load_file(Path(tiny_bert_dir) / "model.safetensors")
    single_diff, _ = compare(trained, export_weights(one))
    moved, _ = compare(trained, start)
    print(f"\n{method} with plug-ins: 1-process max diff {single_diff:.3g}; moved {moved:.3g}")
    assert moved >= 1e-3
    # on this repeated corpus plain SimCSE (no plug-in) differs by 1.3e-5 between 1 and 2 processes (Adam's steps
    # on rounding noise, see write_recipe); tests/trainers/test_distributed.py checks the gathered mask's order exactly
    assert single_diff <= 2e-5


# ------------------------------------------------------------------------------------------------ DeepSpeed ZeRO
requires_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (`pip install deepspeed`; not a dependency of hf_sentcl): the ZeRO configs "
    "cannot be launched",
)
FP32 = ("--mixed_precision", "no")  # the ZeRO configs ask for bf16; fp32 engines compare exactly with 1 process


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory, tiny_bert_dir, senteval_dir):
    """Exports of 1-process runs (global batch 4, dropout 0) by method, trained once for the ZeRO comparisons."""
    runs = {}

    def export_of(method: str) -> dict[str, torch.Tensor]:
        if method not in runs:
            folder = tmp_path_factory.mktemp(f"one-process-{method}")
            recipe = write_recipe(folder, tiny_bert_dir, senteval_dir, **METHODS[method])
            result = launch(1, recipe, folder / "out")
            assert result.returncode == 0, result.stderr[-3000:]
            runs[method] = export_weights(folder / "out")
        return runs[method]

    return export_of


@requires_deepspeed
@pytest.mark.parametrize("config", ["deepspeed_zero2.yaml", "deepspeed_zero3.yaml"])
def test_deepspeed_zero_resume_and_export_match_one_process(tmp_path, tiny_bert_dir, senteval_dir, one_process_runs,
                                                            config):
    """ZeRO-2/3 on 2 CPU processes: dev evaluation and checkpoint (global_step4/) at step 4 of 8, resumed = the
    uninterrupted run, export = the 1-process run's (same global batch, dropout 0); ZeRO-3's final encoder is
    reloaded on process 0 alone (it used to wait in deepspeed.zero.Init for the finished processes)."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    result = launch(2, recipe, full, config=config, launcher=FP32)
    assert result.returncode == 0, result.stderr[-3000:]
    stage = config[len("deepspeed_zero"):-len(".yaml")]
    assert f"Parallelism: 2 processes, DeepSpeed ZeRO-{stage} (gloo on cpu), fp32" in result.stdout
    assert (full / "checkpoint-4" / "global_step4").is_dir()
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")
    result = launch(2, recipe, resumed, "--resume_from_checkpoint", "latest", config=config, launcher=FP32)
    assert result.returncode == 0, result.stderr[-3000:]

    trained, start = export_weights(full), load_file(Path(tiny_bert_dir) / "model.safetensors")
    resume_diff, _ = compare(trained, export_weights(resumed))
    single_diff, single_cos = compare(trained, one_process_runs("simcse"), start)
    moved, _ = compare(trained, start)
    print(f"\nZeRO-{stage}: resume max diff {resume_diff:.3g}; 1-process max diff {single_diff:.3g}, min update "
          f"cosine {single_cos:.9f}; moved {moved:.3g}")
    assert moved >= 1e-3
    assert resume_diff <= 1e-6
    assert single_diff <= 1e-5


@requires_deepspeed
def test_deepspeed_zero2_bf16_engine_exports_fp32(tmp_path, tiny_bert_dir, senteval_dir):
    """ZeRO-2's bf16 engine holds the module itself in bf16; the final encoder is evaluated and exported in fp32
    (the export's check used to fail: max |difference| 0.034 between the bf16 encoder and its fp32 loads)."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, max_steps=2, save_strategy="no", eval_strategy="no")
    result = launch(2, recipe, tmp_path / "out", config="deepspeed_zero2.yaml")  # the config's bf16
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["parallelism"]["strategy"] == "DeepSpeed ZeRO-2" and results["parallelism"]["precision"] == "bf16"
    assert results["precision"]["weights"] == "float32"
    assert {t.dtype for t in export_weights(tmp_path / "out").values()} == {torch.float32}


@requires_deepspeed
def test_consert_supervised_trains_under_zero2_and_is_refused_under_zero3(tmp_path, tiny_bert_dir, senteval_dir,
                                                                           one_process_runs):
    """ConSERT joint reads its NLI classifier's weight outside the forward: ZeRO-2 keeps weights whole (same export as
    1 process); ZeRO-3 would hand out an empty tensor, so it is refused before any work, naming ZeRO-2."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, **METHODS["consert_joint"])
    refused = launch(2, recipe, tmp_path / "zero3", config="deepspeed_zero3.yaml", launcher=FP32, timeout=180)
    assert refused.returncode != 0 and "exitcode  : 2" in refused.stderr
    assert "cannot run under DeepSpeed ZeRO-3" in refused.stderr and "deepspeed_zero2.yaml" in refused.stderr
    assert not (tmp_path / "zero3").exists()
    result = launch(2, recipe, tmp_path / "zero2", config="deepspeed_zero2.yaml", launcher=FP32)
    assert result.returncode == 0, result.stderr[-3000:]
    trained, start = export_weights(tmp_path / "zero2"), load_file(Path(tiny_bert_dir) / "model.safetensors")
    single_diff, _ = compare(trained, one_process_runs("consert_joint"))
    moved, _ = compare(trained, start)
    print(f"\nConSERT joint, ZeRO-2: 1-process max diff {single_diff:.3g}; moved {moved:.3g}")
    assert moved >= 1e-3 and single_diff <= 1e-5
