"""ConSERT recipes: config errors that name the key, the stages of the chained modes, the NLI file check, and
the papers' settings in the shipped recipes."""

import dataclasses

import pytest
from helpers import write_yaml_recipe

from hf_sentcl.cli.train import main
from hf_sentcl.methods.consert.config import ConSERTConfig
from hf_sentcl.methods.consert.stages import (
    consert_stages,
)
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe


@pytest.mark.parametrize(
    "overrides,key",
    [(dict(augmentation1="cutout"), "augmentation1"), (dict(augmentation2="adversarial"), "augmentation2"),
     (dict(token_cutoff_rate=1.0), "token_cutoff_rate"), (dict(dropout_rate=-0.1), "dropout_rate"),
     (dict(temperature=0), "temperature"), (dict(supervised_mode="semi"), "supervised_mode"),
     (dict(adversarial=True), "adversarial"), (dict(supervised_mode="sup", adversarial=True), "adversarial"),
     (dict(nli_source="senteval"), "nli_source"), (dict(supervised_mode="joint", nli_source=None), "nli_source"),
     (dict(supervised_learning_rate=1e-5), "supervised_learning_rate"), (dict(alpha=-1), "alpha"),
     (dict(supervised_batch_size=16), "supervised_batch_size"),
     (dict(supervised_mode="sup-unsup", nli_source="senteval", supervised_batch_size=0), "supervised_batch_size"),
     (dict(supervised_mode="sup", nli_source="senteval", perturbation="p+", margin=0.1), "perturbation"),
     (dict(supervised_mode="joint", adversarial=True, adversarial_epsilon=0), "adversarial_epsilon")],
)
def test_config_errors_name_the_key(tmp_path, overrides, key):
    settings = dict(output_dir=str(tmp_path), use_cpu=True)
    settings.update(overrides)
    with pytest.raises(ValueError, match=key):
        ConSERTConfig(**settings)




def test_stages_of_chained_modes(tmp_path):
    """joint-unsup: stage 1 joint on NLI into <output_dir>/stage-1 with the supervised_* settings and no push;
    stage 2 unsup on the unlabeled text from stage 1's export into output_dir; a checkpoint to resume picks the
    stage by its folder. Single modes: one stage."""
    recipe = parse_recipe(write_yaml_recipe(
        tmp_path, method="consert", supervised_mode="joint-unsup", nli_source="senteval", unlabeled_sts="all",
        output_dir=str(tmp_path / "out"), learning_rate=5e-7, supervised_learning_rate=2e-5,
        supervised_num_train_epochs=2, adversarial=True, head="none", pooling="mean", supervised_batch_size=16,
        per_device_train_batch_size=96, train_subset_size=100,
    ))
    first, second = consert_stages(recipe)
    assert first.training.supervised_mode == "joint" and second.training.supervised_mode == "unsup"
    assert first.training.output_dir == str(tmp_path / "out" / "stage-1")
    assert (first.training.learning_rate, first.training.num_train_epochs) == (2e-5, 2.0)
    assert (first.training.per_device_train_batch_size, second.training.per_device_train_batch_size) == (16, 96)
    assert first.training.global_train_batch_size == 16
    # the few-shot subset limits stage 2's unlabeled text, not stage 1's NLI pairs
    assert (first.data.train_subset_size, second.data.train_subset_size) == (None, 100)
    assert first.training.adversarial and not first.training.push_to_hub
    assert first.model.model_name_or_path == recipe.model.model_name_or_path
    assert second.model.model_name_or_path == str(tmp_path / "out" / "stage-1" / "export")
    assert second.training.output_dir == str(tmp_path / "out")
    assert (second.training.learning_rate, second.training.num_train_epochs) == (5e-7, 1.0)
    assert second.training.nli_source is None and not second.training.adversarial
    assert second.data.unlabeled_sts == "all"

    assert first.training.resume_from_checkpoint is None and second.training.resume_from_checkpoint is None

    def resuming(checkpoint):
        training = dataclasses.replace(recipe.training, resume_from_checkpoint=checkpoint)
        return dataclasses.replace(recipe, training=training)

    stage_one_checkpoint = str(tmp_path / "out" / "stage-1" / "checkpoint-4")
    first, second = consert_stages(resuming(stage_one_checkpoint))
    assert first.training.resume_from_checkpoint == stage_one_checkpoint
    assert second.training.resume_from_checkpoint is None
    resumed_second = resuming(str(tmp_path / "out" / "checkpoint-8"))
    with pytest.raises(ValueError, match="stage-1/export"):
        consert_stages(resumed_second)
    (tmp_path / "out" / "stage-1" / "export").mkdir(parents=True)
    (only,) = consert_stages(resumed_second)
    assert only.training.supervised_mode == "unsup" and only.training.resume_from_checkpoint.endswith("checkpoint-8")
    # `auto` finds stage 1's last checkpoint when stage 2 stopped before its first: a finished stage 1 is not rerun
    (tmp_path / "out" / "stage-1" / "run_complete.json").write_text("{}\n")
    (only,) = consert_stages(resuming(stage_one_checkpoint))
    assert only.training.supervised_mode == "unsup" and only.training.resume_from_checkpoint is None

    single = parse_recipe(write_yaml_recipe(tmp_path, method="consert", unlabeled_sts="all", output_dir="x"))
    assert consert_stages(single) == [single]
    unused = parse_recipe(write_yaml_recipe(tmp_path, method="consert", supervised_mode="joint", nli_source="senteval",
                                       unlabeled_sts="all", output_dir="x"))
    with pytest.raises(ValueError, match="unlabeled_sts"):
        consert_stages(unused)


def test_validation_names_the_missing_nli_file(tmp_path, senteval_dir, tiny_bert_dir, capsys):
    """Before any model loads: a joint recipe whose SNLI split is missing exits 2 naming the file."""
    recipe = write_yaml_recipe(tmp_path, method="consert", supervised_mode="joint", nli_source="senteval",
                          sts_data_dir=str(senteval_dir), model_name_or_path=str(tiny_bert_dir), head="none",
                          output_dir=str(tmp_path / "out"))
    assert main([str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "SNLI/s1.train" in err and "nli_splits" in err
    unsup_without_text = write_yaml_recipe(tmp_path, method="consert", sts_data_dir=str(senteval_dir), head="none",
                                      model_name_or_path=str(tiny_bert_dir), output_dir=str(tmp_path / "out"))
    with pytest.raises(RecipeError, match="unlabeled_sts"):
        validate_recipe(parse_recipe(unsup_without_text))


@pytest.mark.parametrize(
    "name", ["consert_bert", "consert_bert_joint", "consert_bert_joint_unsup", "consert_bert_sup_unsup",
             "consert_minilm", "consert_minilm_joint"]
)
def test_recipes_carry_the_paper_settings(repo_root, monkeypatch, name):
    """Section 4.1: mean pooling in training, no head, tau 0.1, alpha 0.15, batch 96, max_len 64, 10% warm-up,
    STS-B dev every 200 steps (MiniLM: 25), encoder dropout off; BERT recipes evaluate with last2_avg."""
    monkeypatch.setenv("HF_SENTCL_DATA", "/data/senteval")
    recipe = parse_recipe(repo_root / "recipes" / f"{name}.yaml")
    args = recipe.training
    assert recipe.method == "consert" and recipe.model.pooling == "mean" and recipe.model.head == "none"
    assert (args.temperature, args.alpha, args.per_device_train_batch_size) == (0.1, 0.15, 96)
    assert (recipe.data.max_seq_length, args.warmup_steps, args.encoder_dropout) == (64, 0.1, False)
    joint = name in ("consert_bert_joint", "consert_minilm_joint")
    # the joint recipes take the authors' joint script's clean + token cutoff 0.1 (the paper gives none)
    assert (args.token_cutoff_rate, args.feature_cutoff_rate, args.dropout_rate) == (0.1 if joint else 0.15, 0.2, 0.2)
    assert args.load_best_model_at_end and args.metric_for_best_model == "stsb_spearman"
    if name.startswith("consert_bert"):
        assert recipe.model.model_name_or_path == "bert-base-uncased"
        assert recipe.model.inference_pooling == "last2_avg" and args.eval_steps == 200
    if name == "consert_bert":
        assert (args.supervised_mode, args.learning_rate) == ("unsup", 5e-7)
        assert (args.augmentation1, args.augmentation2) == ("shuffle", "feature_cutoff")
        assert recipe.data.unlabeled_sts == "all"
    if joint:
        assert args.supervised_mode == "joint" and recipe.data.unlabeled_sts is None and args.nli_source
        assert (args.augmentation1, args.augmentation2) == ("none", "token_cutoff")
    if name == "consert_bert_sup_unsup":  # stage 1: SBERT's settings (batch 16, lr 2e-5, 1 epoch)
        first, second = consert_stages(recipe)
        assert (first.training.supervised_mode, second.training.supervised_mode) == ("sup", "unsup")
        assert first.training.per_device_train_batch_size == 16 and first.training.learning_rate == 2e-5
        assert first.training.num_train_epochs == 1
        assert second.training.per_device_train_batch_size == 96 and second.training.learning_rate == 5e-7
    if name == "consert_bert_joint_unsup":
        assert args.supervised_mode == "joint-unsup" and recipe.data.unlabeled_sts == "all"
        assert args.learning_rate == 5e-7 and args.supervised_learning_rate is not None
