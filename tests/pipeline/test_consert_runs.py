"""ConSERT runs end to end: a chained run continues from the first stage's weights; the card names the NLI pairs."""

import json

import pytest
import torch
from helpers import changed_keys, snapshot, write_snli, write_yaml_recipe

import hf_sentcl.pipeline.train as run_module
from hf_sentcl import SentenceEncoder
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.parser import parse_recipe


@pytest.mark.slow
def test_chained_run_continues_from_the_first_stages_weights(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    """joint-unsup through `run`: stage 2's encoder starts from exactly stage 1's final weights, stage 1 really
    trained, stage 2 trained further; stage 1's results sit in output_dir/stage-1, the final ones in output_dir."""
    snli = tmp_path / "SNLI"
    write_snli(snli, "dev", n=12, seed=20)
    built = []
    original_build = run_module.build_encoder

    def recording_build(recipe):
        encoder = original_build(recipe)
        built.append((encoder, snapshot(encoder.backbone)))
        return encoder

    monkeypatch.setattr(run_module, "build_encoder", recording_build)
    out = tmp_path / "out"
    recipe = parse_recipe(write_yaml_recipe(
        tmp_path, method="consert", supervised_mode="joint-unsup", nli_source=str(snli), nli_splits=["dev"],
        unlabeled_sts="all", sts_data_dir=str(senteval_dir), model_name_or_path=str(tiny_bert_dir), pooling="mean",
        head="none", inference_pooling="last2_avg", output_dir=str(out), per_device_train_batch_size=4,
        max_train_samples=12, max_seq_length=16, learning_rate="1e-3", supervised_learning_rate="1e-3",
        eval_strategy='"no"', save_strategy='"no"', load_best_model_at_end=False, eval_before_training=False,
        use_cpu=True, seed=0, warmup_steps=0,
    ))
    results = run(recipe)

    (first, first_start), (second, second_start) = built
    assert all(torch.equal(v, second_start[k]) for k, v in first.backbone.state_dict().items())
    assert changed_keys(first_start, first.backbone)  # stage 1 trained
    assert changed_keys(second_start, second.backbone)  # stage 2 trained further
    assert second.config.inference_pooling == "last2_avg"

    stage_one = json.loads((out / "stage-1" / "results.json").read_text())
    assert stage_one["train"]["global_step"] == 3 and set(stage_one["sts"]) == {"after"}
    final = json.loads((out / "results.json").read_text())  # run() returns the last stage's results
    assert final["model_name_or_path"] == results["model_name_or_path"] == str(out / "stage-1" / "export")
    assert final["train"]["global_step"] == results["train"]["global_step"] == 3
    assert SentenceEncoder.from_pretrained(out).config.inference_pooling == "last2_avg"


def test_card_names_the_nli_pairs_of_a_joint_run(repo_root, senteval_dir, monkeypatch):
    """results.json / the model card name the NLI source of a sup/joint stage, not the (unset) unlabeled text."""
    from hf_sentcl.recipe.metadata import training_data_summary
    from hf_sentcl.recipe.plan import plan_run

    monkeypatch.setenv("HF_SENTCL_DATA", str(senteval_dir))
    joint = parse_recipe(repo_root / "recipes" / "consert_minilm_joint.yaml")
    summary = training_data_summary(plan_run(joint).stages[-1], 10, ("premise", "hypothesis"))
    assert summary["source"] == "nli_source"
    assert summary["name"].startswith("senteval '") and str(senteval_dir) in summary["name"]
    unsup = parse_recipe(repo_root / "recipes" / "consert_minilm.yaml")
    assert training_data_summary(plan_run(unsup).stages[-1], 10, ("text",))["source"] == "unlabeled_sts"
