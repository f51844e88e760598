"""`precision: auto|fp32|bf16|fp16` (docs/precision.md): the hardware rule, the recipes that use it, and evaluation
that follows it in dev and final evaluation alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import DtypeProbe, build_trainer

from hf_sentcl.common import hardware as P
from hf_sentcl.configs.inputs import DataArguments
from hf_sentcl.configs.precision import eval_mixed_precision
from hf_sentcl.methods.simcse.config import SimCSEConfig
from hf_sentcl.recipe.metadata import precision_summary
from hf_sentcl.recipe.parser import parse_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
#: recipes of the papers' backbones (BERT / RoBERTa), which state the mixed precision and tf32
PAPER_RECIPES = [p for p in RECIPES if re.search(r"_(bert|roberta|d_bert)(_|\.|$)", p.name)]


@pytest.mark.parametrize(
    ("device", "native_cuda", "native_cpu", "expected"),
    [("cuda", True, False, "bf16"), ("cuda", False, False, "fp16"), ("cpu", False, True, "bf16"),
     ("cpu", False, False, "fp32")],
)
def test_auto_follows_the_hardware(device, native_cuda, native_cpu, expected, monkeypatch):
    monkeypatch.setattr(P, "cuda_has_native_bf16", lambda: native_cuda)
    monkeypatch.setattr(P, "cpu_has_native_bf16", lambda: native_cpu)
    assert P.resolve_precision("auto", device) == expected
    assert P.resolve_precision("fp16", device) == "fp16"
    with pytest.raises(ValueError, match="precision must be one of"):
        P.resolve_precision("half", device)


def test_cpu_flags_name_native_bf16(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16\n")
    assert "amx_bf16" in P.cpu_flags(info)
    monkeypatch.setattr(P, "cpu_flags", lambda: {"avx2"})
    assert not P.cpu_has_native_bf16()
    monkeypatch.setattr(P, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert P.cpu_has_native_bf16()


def test_mixed_evaluation_is_fp16_on_a_gpu_without_native_bf16(monkeypatch):
    """A V100/T4 counts as bf16-capable through emulation; mixed evaluation uses fp16 there."""
    monkeypatch.setattr(P, "cuda_has_native_bf16", lambda: False)
    assert P.mixed_eval_dtype(torch.device("cuda")) == torch.float16
    monkeypatch.setattr(P, "cuda_has_native_bf16", lambda: True)
    assert P.mixed_eval_dtype(torch.device("cuda")) == torch.bfloat16


def args(tmp_path, **values) -> SimCSEConfig:
    return SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **values)


def test_the_precision_key_sets_the_flags(tmp_path, monkeypatch):
    from hf_sentcl.configs import precision

    monkeypatch.setattr(precision, "resolve_precision", lambda requested, device: "fp32" if requested == "auto"
                        else requested)
    auto = args(tmp_path, precision="auto")
    assert (auto.bf16, auto.fp16, auto.resolved_precision) == (False, False, "fp32")
    fp16 = args(tmp_path, precision="fp16")
    assert (fp16.bf16, fp16.fp16, fp16.resolved_precision) == (False, True, "fp16")
    with pytest.raises(ValueError, match="keep one of them"):
        args(tmp_path, precision="fp32", bf16=True)
    assert args(tmp_path, bf16=True).resolved_precision == "bf16"  # no key: the flags decide (older recipes)


def test_evaluation_follows_training_unless_eval_bf16_says(tmp_path):
    fp16 = args(tmp_path, precision="fp16")
    assert eval_mixed_precision(DataArguments(), fp16) is True
    assert eval_mixed_precision(DataArguments(eval_bf16=False), fp16) is False
    assert eval_mixed_precision(DataArguments(), args(tmp_path, precision="fp32")) is False
    assert eval_mixed_precision(DataArguments(eval_bf16=True), args(tmp_path, precision="fp32")) is True


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_shipped_recipe_uses_precision_auto(recipe, monkeypatch, tmp_path, capsys):
    """Every recipe says `precision: auto` (a pinned one would need a stated reason) and no bf16/fp16/eval_bf16 key;
    on this CPU (no native bf16) it resolves to fp32 with fp32 evaluation; results.json records it."""
    text = recipe.read_text()
    assert re.search(r"^precision: auto\b", text, re.M), "ship precision: auto (or pin with a comment saying why)"
    assert not re.search(r"^(bf16|fp16|eval_bf16):", text, re.M)
    monkeypatch.setenv("HF_SENTCL_DATA", str(tmp_path / "senteval"))
    parsed = parse_recipe(recipe)
    resolved = parsed.training.resolved_precision
    with capsys.disabled():
        print(f"{recipe.stem}: precision auto -> {resolved}")
    if not P.cpu_has_native_bf16() and not torch.cuda.is_available():
        assert resolved == "fp32" and not eval_mixed_precision(parsed.data, parsed.training)
    summary = precision_summary(parsed, "torch.float32", eval_mixed_precision(parsed.data, parsed.training))
    assert summary["requested"] == "auto" and summary["resolved"] == resolved
    assert summary["training"].endswith("(precision: auto)")


@pytest.mark.parametrize("recipe", PAPER_RECIPES, ids=[p.stem for p in PAPER_RECIPES])
def test_paper_recipes_state_mixed_precision_and_tf32(recipe):
    text = recipe.read_text()
    assert re.search(r"^precision: auto +#.*fp16", text, re.M)
    assert re.search(r"^tf32: true\b", text, re.M)


def test_tf32_without_a_tf32_gpu_is_one_log_line_not_a_warning(tmp_path, monkeypatch, caplog):
    """The papers' recipes set tf32; parsed on a machine without a TF32 GPU the key is dropped with one INFO line
    (it was a UserWarning printed with a line of hf_sentcl's source, once per process of a launch)."""
    import logging
    import warnings

    from hf_sentcl.configs import arguments

    monkeypatch.setenv("HF_SENTCL_DATA", str(tmp_path / "senteval"))
    monkeypatch.setattr(arguments, "has_tf32", lambda: False)
    recipe = next(p for p in PAPER_RECIPES if p.name == "simcse_bert.yaml")
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="hf_sentcl"):
        warnings.simplefilter("error", UserWarning)
        parsed = parse_recipe(recipe)
    assert parsed.training.tf32 is None
    assert [r.getMessage() for r in caplog.records if "tf32" in r.getMessage()] == [
        "tf32: no CUDA GPU with TF32 here; the key has no effect on this machine."]


@pytest.mark.slow
def test_dev_evaluation_precision_is_the_final_evaluations(tmp_path, tiny_bert_dir, senteval_dir, train_files,
                                                            monkeypatch):
    """An fp16 run with eval_bf16: false evaluates STS-B dev in fp32: accelerate's autocast wrapper of the forward
    is taken off for the dev encode (it was kept before, so dev ran fp16 while the final evaluation ran fp32)."""
    trainer = build_trainer(tmp_path, "simcse", tiny_bert_dir, senteval_dir, train_files, max_steps=1)
    trainer.eval_bf16 = False
    trainer.train()
    assert hasattr(trainer.model, "_original_forward")  # accelerate wrapped the forward in fp16 autocast
    probe = DtypeProbe(monkeypatch, trainer)
    trainer.evaluate()
    assert probe.linear and set(probe.linear) == {torch.float32}, probe.linear
    trainer.eval_bf16 = True
    probe.linear.clear()
    trainer.evaluate()
    assert set(probe.linear) == {torch.bfloat16}  # mixed evaluation on a CPU: bf16 (asked for explicitly)
