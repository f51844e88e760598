"""`hf_sentcl.train`: a run from Python, from keyword settings alone and from a recipe file with settings over it."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TINY_SIMCSE, random_sentences, tiny_simcse_recipe
from safetensors.torch import load_file

import hf_sentcl
from hf_sentcl.recipe.parser import RecipeError

pytestmark = pytest.mark.slow


def test_train_from_keyword_settings_trains_and_exports(tmp_path, tiny_bert_dir, senteval_dir):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(32, seed=5)) + "\n")
    settings = {**TINY_SIMCSE, "max_steps": 4, "save_steps": 4, "eval_steps": 4, "eval_tasks": ["sts"]}  # Python values
    results = hf_sentcl.train(None, **settings, model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
                              sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"))
    assert results["train"]["global_step"] == 4 and "Avg" in results["sts"]["after"]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["train"]["global_step"] == 4
    losses = [entry["loss"] for entry in results["train"]["loss_curve"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
    trained, initial = load_file(tmp_path / "out" / "export" / "model.safetensors"), load_file(
        tiny_bert_dir / "model.safetensors")
    moved = max((trained[k] - initial[k]).abs().max().item() for k in trained if k in initial
                and trained[k].shape == initial[k].shape and torch.is_floating_point(trained[k]))
    assert moved > 1e-4


def test_train_from_a_recipe_file_with_settings_over_it(tmp_path, tiny_bert_dir, senteval_dir):
    recipe = tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    results = hf_sentcl.train(recipe, max_steps=2, save_steps=2, eval_steps=2, output_dir=str(tmp_path / "out"))
    assert results["train"]["global_step"] == 2 and results["method"] == "simcse"
    with pytest.raises(RecipeError, match="learnig_rate"):
        hf_sentcl.train(recipe, learnig_rate=1e-3, output_dir=str(tmp_path / "typo"))


def test_a_plan_is_read_then_trained(tmp_path, tiny_bert_dir, senteval_dir):
    """`hf_sentcl.plan` checks the run and says what it will do before any model loads; `train(plan)` trains that."""
    recipe = tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    run = hf_sentcl.plan(recipe, max_steps=2, save_steps=2, eval_steps=2, output_dir=str(tmp_path / "out"))
    assert [stage.number for stage in run.stages] == [1] and run.stages[0].train_data is None
    assert run.text_sources == ("train_file",) and run.resume_from is None
    assert run.negatives_batch == run.recipe.training.per_device_train_batch_size
    assert run.data_dir == senteval_dir and run.train_precision == "fp32"
    with pytest.raises(TypeError, match="takes no settings"):
        hf_sentcl.train(run, max_steps=3)
    results = hf_sentcl.train(run)
    assert results["train"]["global_step"] == 2 and results["method"] == "simcse"
    with pytest.raises(RecipeError, match="max_seq_length"):
        hf_sentcl.plan(recipe, max_seq_length=2, output_dir=str(tmp_path / "short"))
