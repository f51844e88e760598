"""The method registry finds the method folders of `hf_sentcl.methods` and the methods other installed packages add
through the `hf_sentcl.methods` entry-point group; a broken plug-in is skipped with a warning that names it."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import random_sentences, write_yaml_recipe
from safetensors.torch import load_file

import hf_sentcl.methods
from hf_sentcl.registry import METHODS, PAPERS, MethodRegistry, MethodSpec, folder_methods

REPO = Path(__file__).resolve().parents[2]

#: a method a user's own package adds: SimCSE's InfoNCE plus a weighted uniformity term (Wang and Isola 2020)
PLUGIN_INIT = '''
from hf_sentcl.registry import MethodSpec, Paper

METHOD = MethodSpec(
    name="uniform_simcse",
    paper=Paper("A. User", "InfoNCE with a uniformity term", "a lab report", None, "@misc{user2026}"),
    config_path="sentcl_uniform.method.UniformConfig",
    trainer_path="sentcl_uniform.method.UniformTrainer",
    text_columns=("text",),
    summary="SimCSE plus a weighted uniformity term (a user's plug-in).",
)
'''
PLUGIN_METHOD = '''
from dataclasses import dataclass, field

import torch

from hf_sentcl.configs.arguments import SentCLTrainingArguments
from hf_sentcl.configs.contrastive import ContrastiveArguments
from hf_sentcl.losses import info_nce
from hf_sentcl.trainers.base import ContrastiveTrainer


@dataclass
class UniformConfig(ContrastiveArguments, SentCLTrainingArguments):
    uniformity_weight: float = field(default=0.1, metadata={"help": "Weight of the uniformity term."})


class UniformTrainer(ContrastiveTrainer):
    dropout_copies = 2

    def contrastive_loss(self, views, groups=None):
        z = torch.nn.functional.normalize(views[0].float(), dim=-1)
        uniformity = torch.pdist(z).pow(2).mul(-2).exp().mean().log()
        loss = info_nce(views[0], views[1], self.args.temperature) + self.args.uniformity_weight * uniformity
        return loss, {"uniformity": uniformity.detach(), "weight": torch.tensor(self.args.uniformity_weight)}
'''


def write_package(root: Path, entry_points: str, files: dict[str, str]) -> Path:
    """A source package `root` with a pyproject declaring `entry_points` in the hf_sentcl.methods group."""
    (root / "src").mkdir(parents=True)
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{root.name}"
        version = "0.1"
        [project.entry-points."hf_sentcl.methods"]
        {entry_points}
        """))
    for name, text in files.items():
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_text(text)
    return root


def pip_install(package: Path, target: Path) -> Path:
    """`pip install` of `package` into the folder `target` (offline: the venv's setuptools builds it)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(package)], check=True, capture_output=True, text=True)
    return target


def test_every_method_folder_is_registered():
    folders = [m.name for m in pkgutil.iter_modules(hf_sentcl.methods.__path__)]
    assert "angle" in folders
    for name in folders:
        for spec in folder_methods(importlib.import_module(f"hf_sentcl.methods.{name}")):
            assert METHODS[spec.name] is spec
            assert spec.config_class and spec.trainer_class  # the lazy paths resolve


def test_a_folder_declares_one_method_or_a_tuple_of_them():
    one = MethodSpec(name="one", config_path="a.b", trainer_path="a.c", text_columns=("text",), summary="s")
    two = MethodSpec(name="two", config_path="a.b", trainer_path="a.d", text_columns=("text",), summary="s")
    assert folder_methods(SimpleNamespace(METHOD=one)) == (one,)
    assert folder_methods(SimpleNamespace(METHODS=[one, two])) == (one, two)
    simcse = importlib.import_module("hf_sentcl.methods.simcse")
    assert [spec.name for spec in folder_methods(simcse)] == ["simcse", "simcse_sup"]
    assert METHODS["simcse"].paper is METHODS["simcse_sup"].paper is simcse.PAPER


def test_an_installed_package_adds_a_method_that_trains(tmp_path, tiny_bert_dir, senteval_dir):
    site = pip_install(write_package(tmp_path / "sentcl-uniform", 'uniform_simcse = "sentcl_uniform:METHOD"', {
        "sentcl_uniform/__init__.py": PLUGIN_INIT, "sentcl_uniform/method.py": PLUGIN_METHOD}), tmp_path / "site")
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(64, seed=3)) + "\n")
    recipe = write_yaml_recipe(
        tmp_path, method="uniform_simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(senteval_dir), uniformity_weight=0.5, global_train_batch_size=8, max_seq_length=16,
        max_steps=8, logging_steps=1, learning_rate=1e-3, use_cpu=True, eval_before_training=False,
        eval_tasks=["sts"], save_steps=8, eval_steps=8, seed=0)
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(recipe), "--output_dir", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "uniform_simcse" and results["train"]["global_step"] == 8
    assert results["recipe_settings"]["uniformity_weight"] == 0.5  # the plug-in's own key reached the run
    losses = [row["loss"] for row in results["train"]["loss_curve"]]
    assert losses[-1] < losses[0]
    before, after = load_file(tiny_bert_dir / "model.safetensors"), load_file(out / "model.safetensors")
    changed = [k for k in after if k.removeprefix("backbone.") in before
               and not before[k.removeprefix("backbone.")].equal(after[k])]
    assert changed
    listed = subprocess.run([sys.executable, "-m", "hf_sentcl.run", "--help"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert "uniform_simcse" in listed.stdout  # the CLI lists methods from the registry


@pytest.mark.parametrize("value, problem", [
    ("no_such_module_xyz:METHOD", "No module named 'no_such_module_xyz'"),
    ("sentcl_misnamed:METHOD", "its MethodSpec is named 'other'"),
    ("sentcl_misnamed:NOT_A_SPEC", "not a hf_sentcl.registry.MethodSpec"),
])
def test_a_broken_entry_point_is_skipped_with_a_warning_naming_it(tmp_path, monkeypatch, value, problem):
    site = pip_install(write_package(tmp_path / "sentcl-broken", f'broken = "{value}"', {
        "sentcl_misnamed/__init__.py": "from hf_sentcl.registry import MethodSpec\nNOT_A_SPEC = 1\n"
        "METHOD = MethodSpec(name='other', config_path='a.b', trainer_path='a.c', text_columns=('text',), "
        "summary='s')\n"}), tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    registry = MethodRegistry()
    with pytest.warns(UserWarning, match=rf"method entry point 'broken = {value}' of sentcl-broken is skipped") as w:
        names = set(registry)
    assert problem in str(w[0].message)
    assert "broken" not in names and {"simcse", "angle"} <= names


def test_a_plug_in_may_not_take_a_built_in_name(tmp_path, monkeypatch):
    site = pip_install(write_package(tmp_path / "sentcl-clash", 'simcse = "sentcl_clash:METHOD"', {
        "sentcl_clash/__init__.py": "from hf_sentcl.registry import MethodSpec\n"
        "METHOD = MethodSpec(name='simcse', config_path='a.b', trainer_path='a.c', text_columns=('text',), "
        "summary='s')\n"}), tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    registry = MethodRegistry()
    with pytest.warns(UserWarning, match="method 'simcse' is already registered"):
        assert registry["simcse"].config_path == "hf_sentcl.methods.simcse.config.SimCSEConfig"



def test_the_per_method_tests_run_every_registered_method():
    from helpers import METHOD_SETTINGS

    assert set(METHODS) <= {settings["method"] for settings in METHOD_SETTINGS.values()}


def test_the_reported_figures_are_the_averages_of_their_tasks():
    """A paper's copied task figures average to its reported 7-STS figure (rounding of the source aside: PromptBERT's
    README averages 5 seeds per task and overall), so a figure mistyped while copying fails here."""
    papers = [spec.paper for spec in METHODS.values() if spec.paper is not None] + list(PAPERS.values())
    checked = 0
    for paper in papers:
        for result in paper.reported:
            if result.tasks is not None:
                assert len(result.tasks) == 7, result.setting
                assert abs(sum(result.tasks) / 7 - result.avg) <= 0.05, result.setting
                checked += 1
    assert checked >= 5
    assert METHODS["simcse"].paper.figure("unsup-SimCSE-BERT-base").avg == 76.25
    with pytest.raises(KeyError, match="no reported setting 'BERT-large'"):
        METHODS["simcse"].paper.figure("BERT-large")
