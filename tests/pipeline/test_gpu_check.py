"""benchmarks/gpu_check.py imports everywhere and refuses clearly without a CUDA device (it runs on a GPU machine);
what a CPU can check of it and of benchmarks/gpu_bundle.py: the package check and the bundle it installs, the weight
comparisons, the process counts and the whole runs' command lines."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def load_script():
    """benchmarks/gpu_check.py loaded by its path; its `gpu_bundle` is the module benchmarks/gpu_bundle.py it uses."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def isolate(monkeypatch, scratch: Path | None = None) -> None:
    """sys.path, PYTHONPATH and the bundle marker as they were, after the test (the check changes them); with
    `scratch`, the bundle's site folder (a `tempfile.mkdtemp`) made there, not left in the machine's /tmp."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    if scratch is not None:
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for name in ("PYTHONPATH", "GPU_CHECK_SITE"):
        monkeypatch.setenv(name, "")  # remembers the value (or its absence) to restore
        monkeypatch.delenv(name)


def test_gpu_check_refuses_without_cuda(capsys, monkeypatch):
    gpu_check = load_script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    isolate(monkeypatch)
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "python benchmarks/gpu_check.py" in err
    assert set(gpu_check.CHECKS) >= {"fp32", "tf32", "bf16", "fp16", "single", "ddp2", "fsdp", "zero3", "resume",
                                     "host_syncs", "fsdp_run", "zero3_run", "perf", "profile"}


def test_gpu_check_table_has_one_row_per_check():
    gpu_check = load_script()
    rows = {"fp16": {"ok": True, "step_ms": 41.25, "note": "last loss 1.0"},
            "zero3": {"ok": None, "step_ms": None, "note": "skipped"},
            "ddp2": {"ok": False, "step_ms": None, "note": "exit 1"}}
    lines = gpu_check.table(rows).splitlines()
    assert lines[2].split()[:3] == ["fp16", "pass", "41.2"] or lines[2].split()[:3] == ["fp16", "pass", "41.3"]
    assert lines[3].split()[:2] == ["zero3", "skip"] and lines[4].split()[:2] == ["ddp2", "FAIL"]


@pytest.mark.parametrize("check", ["fp32", "tf32", "bf16", "fp16"])
def test_every_precision_check_has_settings(check):
    assert check in load_script().PRECISION_SETTINGS


def test_the_bundle_module_imports_only_the_standard_library():
    """benchmarks/gpu_bundle.py runs before torch, transformers, ... are known to exist: its module-level imports
    are the standard library's."""
    bundle = load_script().gpu_bundle
    assert Path(bundle.__file__).resolve() == SCRIPT.with_name("gpu_bundle.py")
    tree = ast.parse(Path(bundle.__file__).read_text())
    imported = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert imported and {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}


@pytest.mark.slow
def test_the_script_imports_its_bundle_module_and_refuses_without_cuda(tmp_path):
    """Run as `python benchmarks/gpu_check.py` (as it is, and as its workers are): it finds gpu_bundle.py beside it
    and refuses a machine without CUDA before anything is installed (exit 2)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT), "--wheels", str(tmp_path / "none")], env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "none").exists()


# ------------------------------------------------------------------------------------------------ packages
@pytest.fixture
def on_a_gpu(monkeypatch, tmp_path):
    """The check as on a GPU machine (CUDA there), with sys.path, PYTHONPATH and the bundle marker restored after."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    isolate(monkeypatch, tmp_path)
    return load_script()


def lacking(gpu_check, monkeypatch, *names):
    """Make the packages `names` unfindable: neither their module nor their distribution."""
    bundle = gpu_check.gpu_bundle
    find_spec, version = importlib.util.find_spec, bundle.installed_version
    monkeypatch.setattr(bundle.importlib.util, "find_spec", lambda name, *a: None if name in names else find_spec(
        name, *a))
    monkeypatch.setattr(bundle, "installed_version", lambda dist: None if dist in names else version(dist))


def test_missing_packages_are_named_in_one_message_with_the_bundle_command(on_a_gpu, monkeypatch, tmp_path, capsys):
    """Everything missing is named at once, before any work, with the command that prepares the bundle; exit 2."""
    gpu_check = on_a_gpu
    lacking(gpu_check, monkeypatch, "datasets", "deepspeed")
    monkeypatch.setattr(gpu_check, "write_model", lambda *a, **k: pytest.fail("work started"))
    assert gpu_check.main(["--wheels", str(tmp_path / "none")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("gpu_check:") == 1 and "missing datasets, deepspeed " in captured.err
    assert f"make gpu-bundle GPU_PYTHON={THIS_PYTHON}" in captured.err and "no wheel files" in captured.err
    # deepspeed is needed by the zero3 checks alone
    assert gpu_check.main(["--wheels", str(tmp_path / "none"), "--only", "fp32,fsdp"]) == 2
    assert "missing datasets (" in capsys.readouterr().err


def test_a_transformers_older_than_pyproject_asks_counts_as_missing(on_a_gpu, tmp_path, capsys):
    """A GPU image's transformers 5.17 (first on sys.path) is below pyproject.toml's >= 5.24: missing."""
    gpu_check = on_a_gpu
    old = tmp_path / "old"
    (old / "transformers").mkdir(parents=True)
    (old / "transformers" / "__init__.py").write_text("")
    (old / "transformers-5.17.0.dist-info").mkdir()
    (old / "transformers-5.17.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\n"
                                                                     "Version: 5.17.0\n")
    sys.path.insert(0, str(old))
    importlib.invalidate_caches()
    assert gpu_check.gpu_bundle.missing_packages(["fp32"]) == ["transformers>=5.24 (5.17.0 installed)"]
    assert gpu_check.main(["--wheels", str(tmp_path / "none")]) == 2
    assert "missing transformers>=5.24 (5.17.0 installed) (" in capsys.readouterr().err


def probe_wheel(folder: Path, name: str = "hfsentcl_probe_pkg", value: int = 42) -> Path:
    """A wheel of a one-module package (`name`, VALUE = `value`)."""
    modules = {f"{name}/__init__.py": f"VALUE = {value}\n"}
    return load_script().gpu_bundle.write_wheel(folder, name.replace("_", "-"), "1.0", modules)


def test_a_missing_package_is_installed_from_the_bundle_and_the_check_starts_again(on_a_gpu, monkeypatch,
                                                                                     tmp_path):
    """The bundle's wheels go into a scratch site folder, first on sys.path and PYTHONPATH, and the check restarts
    (pip replaced by unpacking the wheels, as it does; the restart by going on, which now finds every package and
    starts the work)."""
    gpu_check = on_a_gpu
    bundle = gpu_check.gpu_bundle
    wheels = tmp_path / "wheels"
    probe_wheel(wheels)
    (wheels / "bundle.json").write_text(json.dumps({"python": THIS_PYTHON}))
    monkeypatch.setitem(bundle.IMPORTS, "hfsentcl_probe_pkg", "hfsentcl-probe-pkg")
    pip_calls, restarts = [], []

    def pip(command, **kwargs):
        pip_calls.append(command)
        target = Path(command[command.index("--target") + 1])
        for wheel in (a for a in command if a.endswith(".whl")):
            zipfile.ZipFile(wheel).extractall(target)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(bundle.subprocess, "run", pip)
    monkeypatch.setattr(bundle, "restart", lambda script, argv: restarts.append((script, argv)))
    monkeypatch.setattr(gpu_check, "write_model", started)
    argv = ["--wheels", str(wheels), "--only", "fp32", "--workdir", str(tmp_path / "work")]
    with pytest.raises(Started):
        gpu_check.main(argv)
    assert len(pip_calls) == 1 and "--no-index" in pip_calls[0] and restarts == [(SCRIPT, argv)]
    site = os.environ["GPU_CHECK_SITE"]
    assert sys.path[0] == site and os.environ["PYTHONPATH"].split(os.pathsep)[0] == site
    assert importlib.import_module("hfsentcl_probe_pkg").VALUE == 42
    sys.modules.pop("hfsentcl_probe_pkg")


def test_a_bundle_for_another_python_is_not_installed(on_a_gpu, monkeypatch, tmp_path, capsys):
    gpu_check = on_a_gpu
    wheels = tmp_path / "wheels"
    probe_wheel(wheels)
    (wheels / "bundle.json").write_text(json.dumps({"python": "3.9"}))
    lacking(gpu_check, monkeypatch, "datasets")
    monkeypatch.setattr(gpu_check.gpu_bundle.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    assert gpu_check.main(["--wheels", str(wheels), "--only", "fp32"]) == 2
    err = capsys.readouterr().err
    assert f"prepared for Python 3.9, this is Python {THIS_PYTHON}" in err
    assert f"make gpu-bundle GPU_PYTHON={THIS_PYTHON}" in err


@pytest.mark.slow
def test_missing_packages_are_installed_from_carried_wheels(tmp_path, monkeypatch):
    """A bare GPU machine lacks some packages: the check installs them with pip from the wheel folder carried with
    the tree (offline, --no-index) and its workers find them through PYTHONPATH."""
    bundle = load_script().gpu_bundle
    wheels = tmp_path / "wheels"
    probe_wheel(wheels)
    isolate(monkeypatch, tmp_path)
    assert bundle.install_bundle(tmp_path / "nothing") == (None, f"there are no wheel files in {tmp_path}/nothing")
    site, why = bundle.install_bundle(wheels)
    assert why is None
    bundle.use_site(site)
    found = subprocess.run([sys.executable, "-c", "import hfsentcl_probe_pkg as p; print(p.VALUE)"],
                           capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "42"


def test_the_bundle_leaves_torch_and_what_only_torch_needs_out(tmp_path):
    """make gpu-bundle resolves pyproject.toml's dependencies (less torch) and deepspeed's against a torch without
    dependencies, for the GPU machine's CPython on manylinux x86_64."""
    bundle = load_script().gpu_bundle
    stub, pin = bundle.torch_stub(tmp_path / "stubs", "2.13.0+cpu")
    assert pin == "torch==2.13.0+gpucheckstub" and stub.name == "torch-2.13.0+gpucheckstub-py3-none-any.whl"
    metadata = zipfile.ZipFile(stub).read("torch-2.13.0+gpucheckstub.dist-info/METADATA").decode()
    assert "Requires-Dist" not in metadata and "Version: 2.13.0+gpucheckstub" in metadata
    requirements = bundle.bundle_requirements(tmp_path / "deepspeed-0.19.8-py3-none-any.whl")
    names = [bundle.requirement_name(r) for r in requirements[:-1]]
    assert "torch" not in names and {"transformers", "datasets", "peft", "sentence-transformers"} <= set(names)
    assert not set(names) & bundle.UNUSED_DEPENDENCIES  # the embedded model's 81 MiB alias: the check never loads it
    assert requirements[-1].endswith("deepspeed-0.19.8-py3-none-any.whl")
    assert all(bundle.TORCH_ONLY.match(n) for n in ("torch", "triton", "nvidia-cublas-cu12", "nvidia-nccl-cu13"))
    assert not any(bundle.TORCH_ONLY.match(n) for n in ("nvidia-ml-py", "torchmetrics", "transformers"))
    assert not any(bundle.TORCH_ONLY.match(p.split("==")[0]) for p in bundle.tested_versions())
    command = bundle.bundle_download_command("3.12", "2.28", stub.parent, tmp_path / "c", tmp_path / "r", tmp_path)
    assert command[3:5] == ["download", "--disable-pip-version-check"] and "--only-binary=:all:" in command
    assert command[command.index("--python-version") + 1] == "3.12" and command[command.index("--abi") + 1] == "cp312"
    platforms = {command[i + 1] for i, a in enumerate(command) if a == "--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"} <= platforms
    assert "manylinux_2_29_x86_64" not in platforms


def test_the_bundle_leaves_out_what_the_gpu_image_has(tmp_path):
    """--leave-out drops the named distributions' wheels (any spelling of the name), and a name that matches no
    wheel is reported rather than ignored (a typo would otherwise carry the whole bundle)."""
    bundle = load_script().gpu_bundle
    files = [tmp_path / n for n in ("numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl",
                                    "scikit_learn-1.9.1-cp312-cp312-manylinux_2_28_x86_64.whl",
                                    "transformers-5.24.0-py3-none-any.whl",
                                    "hf_xet-1.8.0-cp38-abi3-manylinux2014_x86_64.whl")]
    kept, left, unmatched = bundle.leave_out_wheels(files, ["numpy", " scikit-learn", "HF_Xet ", ""])
    assert [f.name.split("-")[0] for f in kept] == ["transformers"] and len(left) == 3 and unmatched == []
    assert bundle.leave_out_wheels(files, ["nunpy"]) == (files, [], ["nunpy"])
    assert bundle.leave_out_wheels(files, []) == (files, [], [])


# ------------------------------------------------------------------------------------------------ 1 and N processes
@pytest.mark.parametrize("gpus, sharded, ddp_backend, shared", [(1, 1, "gloo", True), (2, 2, "nccl", False),
                                                               (4, 2, "nccl", False)])
def test_process_counts_follow_the_gpus_up_to_two(gpus, sharded, ddp_backend, shared):
    layout = load_script().plan(gpus)
    assert (layout["sharded"], layout["ddp_processes"], layout["ddp_backend"]) == (sharded, 2, ddp_backend)
    assert layout["ddp_shares_gpu"] is shared
    assert ("not sharded across processes" in layout["sharded_note"]) is (gpus == 1)
    assert ("sharing" in layout["ddp_note"]) is shared


def test_no_gpu_gives_no_process_count():
    with pytest.raises(ValueError, match="no CUDA device"):
        load_script().plan(0)


def test_weights_are_compared_tensor_by_tensor(tmp_path):
    """max |reference - other| over every weight of the reference; a lost or reshaped weight fails the comparison;
    a comparison passes at most at the tolerance."""
    from safetensors.torch import save_file

    gpu_check = load_script()
    reference = {"a": torch.zeros(3, 2), "b": torch.ones(4)}
    other = {"a": torch.tensor([[0, 0], [0, -3e-5], [0, 0]]), "b": torch.ones(4) + 1e-6, "extra": torch.ones(1)}
    difference, problem = gpu_check.max_difference(reference, other)
    assert problem is None and difference == pytest.approx(3e-5, rel=1e-3)
    assert gpu_check.max_difference(reference, reference) == (0.0, None)
    difference, problem = gpu_check.max_difference(reference, {"a": torch.zeros(3, 2)})
    assert math.isinf(difference) and "1 weights missing (b)" in problem
    assert "other shapes: b" in gpu_check.max_difference(reference, {**reference, "b": torch.ones(5)})[1]
    save_file(reference, str(tmp_path / "r.safetensors"))
    save_file(other, str(tmp_path / "o.safetensors"))
    difference, problem = gpu_check.compare_weights(tmp_path / "r.safetensors", tmp_path / "o.safetensors")
    assert problem is None and difference == pytest.approx(3e-5, rel=1e-3)
    run = {"ok": True, "step_ms": 70.0, "note": "last loss 0.1"}
    tolerance = gpu_check.WEIGHT_TOLERANCE
    assert tolerance == 1e-4
    passed = gpu_check.comparison_verdict(run, 3e-6, None, "1 GPU: 2 gloo ranks sharing it")
    assert passed["ok"] and passed["note"].startswith("max |dW| vs 1 process 3e-06 (tolerance 0.0001); 1 GPU")
    assert not gpu_check.comparison_verdict(run, 2 * tolerance, None, "")["ok"]
    assert not gpu_check.comparison_verdict(run, math.inf, "1 weights missing (b)", "")["ok"]
    assert not gpu_check.comparison_verdict({**run, "ok": False}, 0.0, None, "")["ok"]


def test_comparisons_train_alike_and_launch_the_configs_in_fp32(tmp_path):
    """1 and N processes: fp32 without TF32; FSDP and ZeRO-3 launched with the shipped configs, `--mixed_precision
    no` (the configs say bf16), as many processes as GPUs up to 2; DDP 2 processes."""
    gpu_check = load_script()
    assert gpu_check.COMPARISON["precision"] == "fp32" and gpu_check.COMPARISON["tf32"] is False
    for gpus, processes in ((1, "1"), (2, "2"), (4, "2")):
        args = SimpleNamespace(gpus=gpus, workdir=tmp_path, steps=30)
        for check, config in (("fsdp", "fsdp.yaml"), ("zero3", "deepspeed_zero3.yaml")):
            command = gpu_check.worker_command(check, args, {})
            assert str(gpu_check.ACCELERATE_CONFIGS / config) in command
            assert command[command.index("--num_processes") + 1] == processes
            assert command[command.index("--mixed_precision") + 1] == "no"
        ddp = gpu_check.worker_command("ddp2", args, {})
        assert "torch.distributed.run" in ddp and ddp[ddp.index("--nproc_per_node") + 1] == "2"


# ------------------------------------------------------------------------------------------------ whole runs
@pytest.mark.parametrize("check, config", [("fsdp_run", "fsdp.yaml"), ("zero3_run", "deepspeed_zero3.yaml")])
@pytest.mark.parametrize("processes", [1, 2])
def test_whole_runs_launch_the_shipped_recipe_with_its_defaults(check, config, processes, tmp_path):
    """Only the model, the data and the step counts are overridden: the "before" evaluation, the best checkpoint
    and the config's precision stay the shipped recipe's."""
    gpu_check = load_script()
    inputs = {"model_name_or_path": tmp_path / "minilm", "train_file": tmp_path / "t.txt",
              "sts_data_dir": tmp_path / "senteval"}
    command = gpu_check.whole_run_command(check, inputs, tmp_path / "out", processes)
    recipe = str(gpu_check.REPO / "recipes" / "simcse_bert.yaml")
    assert command[command.index("hf_sentcl.run") + 1] == recipe and Path(recipe).is_file()
    configs = gpu_check.REPO / "recipes" / "accelerate_configs"
    assert command[command.index("--config_file") + 1] == str(configs / config)
    assert command[command.index("--num_processes") + 1] == str(processes)
    overridden = {a.removeprefix("--") for a in command[command.index(recipe) + 1:] if a.startswith("--")}
    assert overridden == {"model_name_or_path", "train_file", "sts_data_dir", "max_steps", "eval_steps", "save_steps",
                          "output_dir"}
    assert "--mixed_precision" not in command
    assert not any(word in " ".join(command) for word in ("eval_before_training", "load_best_model_at_end",
                                                          "precision", "dropout"))
    assert command[command.index("--max_steps") + 1] == "20" and command[command.index("--eval_steps") + 1] == "10"


def test_whole_run_results_must_hold_the_shipped_defaults():
    """results.json of a whole run: 20 steps, the config's bf16, the processes launched, "before" and "after" STS
    scores and a best step (load_best_model_at_end)."""
    gpu_check = load_script()
    good = {"train": {"global_step": 20, "best_step": 10}, "parallelism": {"precision": "bf16", "processes": 1},
            "sts": {"before": {"Avg": 10.0}, "after": {"Avg": 12.0}}}
    assert gpu_check.whole_run_problems(good, True, 1) == []
    assert gpu_check.whole_run_problems({**good, "parallelism": {"precision": "fp32", "processes": 1}}, True, 1) == [
        "precision fp32, not the config's bf16"]
    assert gpu_check.whole_run_problems({**good, "sts": {"after": {"Avg": 1.0}}}, True, 1) == [
        'no "before" STS scores']
    assert gpu_check.whole_run_problems({**good, "train": {"global_step": 20, "best_step": None}}, True, 1) == [
        "no best_step (load_best_model_at_end)"]
    assert gpu_check.whole_run_problems(good, False, 2) == ["1 processes, not 2", "no export"]


@pytest.mark.slow
def test_the_compared_training_writes_its_final_weights(tmp_path, monkeypatch):
    """The 1-process run of the comparisons (here on a CPU, on a tiny BERT, 2 steps) writes its final weights, every
    tensor of the encoder, and measures how far they moved."""
    from safetensors.torch import load_file

    gpu_check = load_script()
    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    monkeypatch.setattr(gpu_check, "MODEL_CONFIG", tiny)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = gpu_check.worker("single", tmp_path, 2, {})
    weights = load_file(result["weights"])
    assert any(k.endswith("word_embeddings.weight") for k in weights) and all(
        v.dtype == torch.float32 for v in weights.values())
    assert 0 < result["moved"] < gpu_check.MIN_MOVED and not result["ok"]  # 2 steps move less than 30
    assert "weights moved up to" in result["note"]


# ------------------------------------------------------------------------------------------------ the GPU step
def load_benchmark():
    """benchmarks/train_vs_sentence_transformers.py loaded by its path (its folder on sys.path for its helpers)."""
    folder = SCRIPT.parent
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    spec = importlib.util.spec_from_file_location("train_vs_st", folder / "train_vs_sentence_transformers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flash", [False, True])
def test_perf_runs_the_benchmark_compiled_and_not_on_the_gpu(flash, tmp_path, monkeypatch, tiny_bert_dir):
    """`perf`'s command is the training benchmark on CUDA in bf16 at batch 64, max_len 32, with compile_layers, [CLS]
    pooling, the whole model compiled with CUDA graphs (and the FlashAttention route when installed) as variants whose
    keys the recipe parser accepts."""
    gpu_check, benchmark = load_script(), load_benchmark()
    monkeypatch.setattr(sys, "path", list(sys.path))
    args = SimpleNamespace(workdir=tmp_path)
    command = gpu_check.perf_command(args, tmp_path / "corpus.txt", tmp_path / "perf.json", flash)
    assert command[1].endswith("train_vs_sentence_transformers.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parsed = benchmark.parse_args(command[2:])
    assert (parsed.device, parsed.precisions, parsed.batch_size, parsed.max_seq_length) == ("cuda", ["bf16"], 64, 32)
    assert not parsed.sts and not parsed.gemm and parsed.rounds == 2
    variants = benchmark.parse_variants(parsed.variant)
    expected = {"hf_sentcl+compiled": {"compile_layers": True}, "hf_sentcl+cls": {"pooling": "cls", "head": "mlp"},
                "hf_sentcl+graphs": {"torch_compile": True, "torch_compile_mode": "reduce-overhead",
                                     "pad_to_multiple_of": 8}}
    if flash:
        expected["hf_sentcl+varlen"] = {"attn_implementation": "flash_attention_2"}
        expected["hf_sentcl+varlen+compiled"] = {"attn_implementation": "flash_attention_2", "compile_layers": True}
    assert variants == expected
    monkeypatch.undo()  # the recipes are parsed as on this CPU: only their keys are checked
    from hf_sentcl.configs import arguments

    monkeypatch.setattr(arguments, "cpu_compiler_problem", lambda: None)  # nothing compiles here (CI may lack g++)
    parsed.device, parsed.model, parsed.train_file = "cpu", str(tiny_bert_dir), str(tmp_path / "corpus.txt")
    (tmp_path / "corpus.txt").write_text("one sentence\nanother one\n")
    for overrides in variants.values():
        recipe = benchmark.hf_recipe(parsed, True, overrides, str(tmp_path / "out"))
        assert recipe.training.compile_layers is overrides.get("compile_layers", False)
        assert recipe.training.torch_compile is overrides.get("torch_compile", False)
        assert recipe.training.torch_compile_mode == overrides.get("torch_compile_mode")
        assert recipe.data.pad_to_multiple_of == overrides.get("pad_to_multiple_of")
        expected_pooling = (overrides.get("pooling", "mean"), overrides.get("head", "none"))
        assert (recipe.model.pooling, recipe.model.head) == expected_pooling


def test_perf_row_gives_each_configurations_share_of_the_cards_peak():
    gpu_check, benchmark = load_script(), load_benchmark()
    assert benchmark.dense_bf16_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert benchmark.dense_bf16_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert benchmark.dense_bf16_peak_tflops("NVIDIA H200") == 989.4
    assert benchmark.dense_bf16_peak_tflops("Tesla T4") is None
    runs = {"hf_sentcl bf16": [{"train_examples_per_second": 2000.0, "train_step_seconds": 0.032,
                                "first_step_seconds": 0.5}],
            "sentence-transformers bf16": [{"train_examples_per_second": 1000.0, "train_step_seconds": 0.064,
                                            "first_step_seconds": 0.4}],
            "hf_sentcl+compiled bf16": [{"train_examples_per_second": 2500.0, "train_step_seconds": 0.0256,
                                         "first_step_seconds": 40.0}]}
    peak = {"gflops": 989.4e3, "peak_of": "NVIDIA H200", "layer_parameters": 85_000_000,
            "real_tokens_per_step": 2 * 64 * 20, "padded_tokens_per_step": 2 * 64 * 32, "steps": 40}
    names = ["hf_sentcl", "sentence-transformers", "hf_sentcl+compiled"]
    report = benchmark.summarize(SimpleNamespace(rounds=1, threads=16, batch_size=64, max_seq_length=32,
                                                 train_samples=2560, precisions=["bf16"]),
                                 runs, {}, names, {}, peak)
    row = gpu_check.perf_summary(json.loads(json.dumps(report, default=str)))
    share = 6 * 85e6 * 2560 / 989.4e12 / 0.032
    assert row["ok"] and row["step_ms"] == pytest.approx(32.0)
    assert f"hf_sentcl: 2000 ex/s, step 32.0 ms, first 0.5 s, {100 * share:.1f}% of peak, 2.00x ST" in row["note"]
    assert "hf_sentcl+compiled: 2500 ex/s, step 25.6 ms, first 40.0 s" in row["note"]
    runs["hf_sentcl+compiled bf16"] = [{"train_examples_per_second": None}]
    report = benchmark.summarize(SimpleNamespace(rounds=1, threads=16, batch_size=64, max_seq_length=32,
                                                 train_samples=2560, precisions=["bf16"]), runs, {}, names, {}, peak)
    assert gpu_check.perf_summary(report)["ok"] is False


def test_seeded_sts_is_the_mean_over_the_seeds_with_the_averages_spread():
    benchmark = load_benchmark()
    per_seed = {1: {"STS12": 70.0, "Avg": 78.0}, 2: {"STS12": 72.0, "Avg": 79.0}, 3: {"STS12": 71.0, "Avg": 80.5}}
    means = benchmark.seed_means(per_seed)
    assert means["STS12"] == pytest.approx(71.0) and means["Avg"] == pytest.approx(79.1666667)
    assert means["Avg_sd"] == pytest.approx(((78 - 79.1666667) ** 2 + (79 - 79.1666667) ** 2
                                             + (80.5 - 79.1666667) ** 2) ** 0.5 / 2 ** 0.5)
    assert means["seeds"] == 3 and benchmark.seed_means({7: {"Avg": 80.0}})["Avg_sd"] == 0.0
    assert benchmark.parse_args(["--seeds", "1,2,3", "--train-file", "x"]).seeds == [1, 2, 3]
    assert benchmark.parse_args(["--seed", "5", "--train-file", "x"]).seeds == [5]


def test_profile_check_profiles_both_sides_on_the_gpu_and_reports_the_busy_time(tmp_path, monkeypatch):
    """`profile` runs the benchmark's --profile on CUDA in bf16 at the perf setting; its row fails when a step has
    no GPU-busy time (a profile taken without CUDA activity) and gives each side's busy and wall time."""
    gpu_check, benchmark = load_script(), load_benchmark()
    command = gpu_check.profile_command(SimpleNamespace(workdir=tmp_path), tmp_path / "c.txt", tmp_path / "p.json")
    assert command[1].endswith("train_vs_sentence_transformers.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parsed = benchmark.parse_args(command[2:])
    assert (parsed.device, parsed.precisions, parsed.profile, parsed.batch_size, parsed.max_seq_length) == (
        "cuda", ["bf16"], True, 64, 32)
    assert not parsed.sts and not parsed.variant and not parsed.padded_row  # hf_sentcl's default and ST only
    assert parsed.train_samples >= 3 * 64  # the profiler needs 3 steps
    steps = {"hf_sentcl bf16": {"wall_ms": 108.0, "device_busy_ms": 12.9, "device_kernels": 1342},
             "sentence-transformers bf16": {"wall_ms": 163.0, "device_busy_ms": 16.5, "device_kernels": 2633}}
    row = gpu_check.profile_summary({"profile": steps})
    assert row["ok"] and "hf_sentcl: GPU busy 12.9 of 108.0 ms (1342 kernels)" in row["note"]
    assert "sentence-transformers: GPU busy 16.5 of 163.0 ms (2633 kernels)" in row["note"]
    for busy, kernels in ((None, None), (0.0, 0), (12.9, 0)):  # not on the GPU, or no CUDA activity recorded
        steps["hf_sentcl bf16"].update(device_busy_ms=busy, device_kernels=kernels)
        assert gpu_check.profile_summary({"profile": steps})["ok"] is False
    assert gpu_check.profile_summary({"profile": {}})["ok"] is False
    report = "\n".join(["hf_sentcl bf16: one step, 108 ms wall", "  forward     31.7 ms  35.0%   aten::addmm 4.1",
                         "  GPU busy    12.9 ms  11.9%   (1342 kernels and copies)", "  Name   Self CPU %",
                         "aten::mm   47.60%   776.396ms"])
    assert gpu_check.profile_lines(report).splitlines() == report.splitlines()[:3]


def test_benchmark_checks_run_the_benchmark_on_their_corpus_and_report_its_failure(tmp_path, monkeypatch):
    """perf and profile share one runner: a corpus of `steps` batches, the command's JSON summarised, its log kept,
    and a failed or timed-out benchmark a FAIL row with the end of its output."""
    gpu_check = load_script()
    args = SimpleNamespace(workdir=tmp_path)
    seen = {}

    def finished(command, **kwargs):
        seen["corpus_lines"] = len(Path(command[0]).read_text().splitlines())
        Path(command[1]).write_text(json.dumps({"value": 3}))
        return SimpleNamespace(returncode=0, stdout="table\n", stderr="")

    monkeypatch.setattr(gpu_check.subprocess, "run", finished)
    row = gpu_check.benchmark_check(args, "perf", lambda corpus, output: [str(corpus), str(output)], 2,
                                    lambda report: {"ok": True, "step_ms": None, "note": str(report["value"])})
    assert row == {"ok": True, "step_ms": None, "note": "3"} and seen["corpus_lines"] == 2 * gpu_check.GLOBAL_BATCH
    assert (tmp_path / "log-perf.txt").read_text() == "table\n"
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda command, **kwargs: SimpleNamespace(
        returncode=1, stdout="", stderr="Traceback\nRuntimeError: CUDA out of memory"))
    row = gpu_check.benchmark_check(args, "profile", lambda corpus, output: [str(corpus), str(output)], 2,
                                    gpu_check.profile_summary)
    assert row["ok"] is False and "exit 1" in row["note"] and "CUDA out of memory" in row["note"]

    def too_slow(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(gpu_check.subprocess, "run", too_slow)
    row = gpu_check.benchmark_check(args, "perf", lambda corpus, output: [str(corpus), str(output)], 2,
                                    gpu_check.perf_summary)
    assert row["ok"] is False and f"timed out after {gpu_check.PERF_TIMEOUT} s" in row["note"]


def test_step_profile_counts_the_gpus_busy_time_once_and_no_label_as_work():
    """The profile's GPU-busy time (what tells a launch-bound step from a GPU-bound one) is the union of the kernels'
    intervals: overlapping or nested kernels count once, CPU operators and the labels' GPU-timeline annotations not
    at all. The events are torch's own FunctionEvents, as the profiler returns them."""
    load_benchmark()  # puts benchmarks/ on sys.path
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent
    from training_cost import device_activity

    def event(start, end, device=DeviceType.CUDA, annotation=False):
        return FunctionEvent(id=start, name="kernel", thread=0, start_us=start, end_us=end, device_type=device,
                             is_user_annotation=annotation)

    events = [event(0, 1000), event(500, 2000), event(100, 200),  # 2 ms: overlapping and nested kernels
              event(3000, 3500),  # 0.5 ms more
              event(0, 9000, DeviceType.CPU), event(0, 9000, annotation=True)]
    assert device_activity(events) == (2.5, 4)
    assert device_activity([]) == (0.0, 0)


def test_cpu_step_profile_has_no_gpu_figures(tiny_bert_dir, tmp_path):
    """On the CPU the one-step profile is as before: phases and wall time, no GPU-busy figures."""
    benchmark = load_benchmark()
    from training_cost import profile_training_step

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"sentence number {i} of the profile" for i in range(64)) + "\n")
    args = benchmark.parse_args(["--model", str(tiny_bert_dir), "--train-file", str(corpus), "--batch-size", "8",
                                 "--train-samples", "64", "--precisions", "fp32"])
    trainer, encoder = benchmark.build_hf(args, False, {}, str(tmp_path / "out"))
    step = profile_training_step(trainer, encoder)
    assert step.device_busy_ms is None and step.device_kernels is None
    assert step.wall_ms > 0 and step.phase_ms["forward"] > 0 and step.phase_ms["backward"] > 0
    assert "GPU busy" not in step.report("cpu")
