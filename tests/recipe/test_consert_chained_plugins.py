"""Issue 36, finding 3: the in-batch plug-ins (`matryoshka_dims`, `false_negatives: mask`, the IFM/BYOP margin)
under ConSERT's chained modes.

sup-unsup: stage 1 is the NLI pair classifier (cross-entropy on (r1, r2, |r1 - r2|), no in-batch loss), so the
plug-ins go to stage 2 only; joint-unsup: both stages have the NT-Xent, so both carry them. Every stage's recipe
then passes the trainer's own plug-in check (the one that runs when the stage's trainer is built), and the whole
recipe passes `validate_recipe`. A chained stage that cannot take a plug-in is refused by `validate_recipe`."""

import dataclasses
import json

import pytest
from helpers import write_snli, write_yaml_recipe

from hf_sentcl import SentenceEncoder
from hf_sentcl.methods.consert import stages as consert
from hf_sentcl.methods.consert.stages import consert_stages
from hf_sentcl.methods.consert.trainer import ConSERTTrainer
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

PLUGINS = {
    "matryoshka_dims": {"matryoshka_dims": [32, 16], "matryoshka_weights": [1.0, 0.5]},
    "false_negatives": {"false_negatives": "mask"},
    "guide": {"false_negatives": "guide", "guide_model": "embedded:all-MiniLM-L6-v2", "guide_margin": 0.1,
              "guide_margin_strategy": "relative"},
    "perturbation": {"perturbation": "p+n-", "margin": 0.05},
}
OFF = {"matryoshka_dims": None, "matryoshka_weights": None, "false_negatives": "keep", "perturbation": None,
       "margin": 0.0, "guide_model": None, "guide_margin": 0.0, "guide_margin_strategy": "absolute"}


def chained_recipe(tmp_path, files, model_dir, data_dir, mode, **values):
    return parse_recipe(write_yaml_recipe(
        tmp_path, method="consert", supervised_mode=mode, nli_source=str(files["nli"]), train_file=str(files["text"]),
        model_name_or_path=str(model_dir), head="none", pooling="mean", output_dir=str(tmp_path / "out"),
        sts_data_dir=str(data_dir), per_device_train_batch_size=4, **values,
    ))


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("mode", ["sup-unsup", "joint-unsup"])
def test_chained_modes_carry_the_plugin_into_the_stages_that_take_it(tmp_path, train_files, tiny_bert_dir,
                                                                      senteval_dir, mode, plugin):
    asked = PLUGINS[plugin]
    recipe = chained_recipe(tmp_path, train_files, tiny_bert_dir, senteval_dir, mode, **asked)
    validate_recipe(recipe)  # no model loads here

    def values(stage):
        return {key: getattr(stage.training, key) for key in asked}

    first, second = consert_stages(recipe)
    # the unsupervised stage 2 (NT-Xent on the unlabeled text, which writes the final encoder) always carries it
    assert values(second) == asked
    if mode == "sup-unsup":  # stage 1 trains the NLI classifier only: nothing for the plug-in to act on
        assert values(first) == {key: OFF[key] for key in asked}
        assert (first.training.supervised_mode, first.training.matryoshka_dims) == ("sup", None)
    else:  # joint: L_ce + alpha * NT-Xent, whose in-batch loss takes the plug-in
        assert values(first) == asked
    for stage in (first, second):  # what each stage's trainer checks when it is built
        ConSERTTrainer.check_plugins(stage.training, stage.model)


def test_a_stage_that_cannot_take_a_plugin_is_refused_before_any_model_loads(tmp_path, train_files, tiny_bert_dir,
                                                                              senteval_dir, monkeypatch):
    """The guard in `validate_recipe`: had the chain given stage 1 (sup) the plug-in, as it did before the fix, the
    recipe is refused naming the key, the stage and the mode, instead of failing when stage 1's trainer is built."""
    def naive_stages(recipe):  # the stages with the recipe's plug-ins everywhere
        first, second = consert_stages(recipe)
        carried = dataclasses.replace(first.training, matryoshka_dims=recipe.training.matryoshka_dims)
        return [dataclasses.replace(first, training=carried), second]

    monkeypatch.setattr(consert, "consert_stages", naive_stages)
    recipe = chained_recipe(tmp_path, train_files, tiny_bert_dir, senteval_dir, "sup-unsup", matryoshka_dims=[16])
    with pytest.raises(RecipeError, match=r"stage 1 of the 2 that supervised_mode 'sup-unsup' chains: "
                                          r"matryoshka_dims: supervised_mode 'sup' trains ConSERT's NLI classifier"):
        validate_recipe(recipe)


@pytest.mark.slow
def test_sup_unsup_with_both_plugins_runs_both_stages(tmp_path, tiny_bert_dir, senteval_dir):
    """Through `run` (which used to stop when stage 1's trainer was built): stage 1 trains the NLI classifier
    without the plug-ins, stage 2 trains with them, and the final encoder carries the Matryoshka sizes."""
    snli = tmp_path / "SNLI"
    write_snli(snli, "dev", n=8, seed=20)
    out = tmp_path / "out"
    recipe = parse_recipe(write_yaml_recipe(
        tmp_path, method="consert", supervised_mode="sup-unsup", nli_source=str(snli), nli_splits=["dev"],
        unlabeled_sts="all", sts_data_dir=str(senteval_dir), model_name_or_path=str(tiny_bert_dir), pooling="mean",
        head="none", output_dir=str(out), per_device_train_batch_size=4, max_train_samples=8, max_seq_length=16,
        matryoshka_dims=[32, 16], false_negatives="mask", learning_rate="1e-3", eval_strategy='"no"',
        save_strategy='"no"', load_best_model_at_end=False, eval_before_training=False, use_cpu=True, seed=0,
        warmup_steps=0, eval_tasks=["sts"],
    ))
    validate_recipe(recipe)
    run(recipe)
    assert SentenceEncoder.from_pretrained(out / "stage-1").config.matryoshka_dims is None
    assert SentenceEncoder.from_pretrained(out).config.matryoshka_dims == [32, 16]
    final = json.loads((out / "results.json").read_text())
    assert final["train"]["global_step"] == 2 and "sts_by_dim" in final
