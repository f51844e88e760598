"""Model card content and metadata, the MTEB-protocol scores behind its model-index, and the mteb results folder."""

import json

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard, metadata_load
from safetensors.torch import save_file

from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator
from hf_sentcl.export import ExportPlan
from hf_sentcl.model_card import (
    MTEB_STS_DATASETS,
    dev_curve_table,
    mteb_sts_scores,
    non_default_settings,
    render_model_card,
    write_model_card,
    write_mteb_results,
)
from hf_sentcl.parser import parse_recipe

from helpers import FakeEncoder

PLAN = ExportPlan(pooling="cls", source_layers=6, kept_layers=6, head="none", hidden_size=384, max_seq_length=512)


def scores(offset: float) -> dict[str, float]:
    values = {task: 60.0 + offset + 1.37 * i for i, task in enumerate(STS_TASKS)}
    values["Avg"] = float(np.mean(list(values.values())))
    return values


def make_results(**extra) -> dict:
    after = scores(10.0)
    mteb = {**after, "SICKRelatedness": 79.1234}  # SICK-R on all pairs differs from the SentEval test split
    mteb["Avg"] = float(np.mean([mteb[t] for t in STS_TASKS]))
    return {
        "method": "simcse",
        "model_name_or_path": "embedded:all-MiniLM-L6-v2",
        "sts_mode": "all",
        "train": {
            "global_step": 64, "best_step": 48, "best_dev_stsb_spearman": 84.5678, "train_runtime": 201.3,
            "train_loss": 0.0123,
            "dev_curve": [{"step": s, "eval_stsb_spearman": 80.0 + s / 100} for s in (16, 32, 48, 64)],
        },
        "sts": {"before": scores(0.0), "after": after},
        "mteb_sts": mteb,
        "recipe_settings": {"method": "simcse", "learning_rate": 3e-05, "bf16": True},
        "training_data": {"source": "train_file", "name": "wiki1m_subset.txt", "examples": 4096,
                          "max_seq_length": 32, "columns": ["text"]},
        "precision": {"training": "bf16 mixed precision (autocast)", "evaluation": "bf16 autocast",
                      "weights": "float32"},
        "versions": {"transformers": "5.23.0", "sentence-transformers": "6.2.0"},
        **extra,
    }


@pytest.fixture
def card_path(tmp_path):
    return write_model_card(tmp_path, PLAN, make_results(), repo_id="my-org/simcse-minilm")


def test_front_matter(card_path):
    meta = metadata_load(card_path)
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"
    assert {"sentence-transformers", "sentence-similarity", "mteb", "simcse"} <= set(meta["tags"])
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert meta["datasets"] == ["princeton-nlp/datasets-for-simcse"]
    (index,) = meta["model-index"]
    assert index["name"] == "simcse-minilm"
    mteb = make_results()["mteb_sts"]
    assert len(index["results"]) == 7
    for entry, (task, (dataset, name, revision)) in zip(index["results"], MTEB_STS_DATASETS.items(), strict=True):
        assert entry["task"] == {"type": "STS"}
        assert entry["dataset"] == {"name": f"MTEB {name}", "type": dataset, "config": "default", "split": "test",
                                    "revision": revision}
        (metric,) = entry["metrics"]
        assert metric["type"] == "cos_sim_spearman"
        assert metric["value"] == pytest.approx(mteb[task], abs=1e-4)  # 0-100 scale, from the results dict
    sick = index["results"][-1]
    assert sick["dataset"]["name"] == "MTEB SICK-R" and sick["metrics"][0]["value"] == 79.1234


def test_card_loads_with_huggingface_hub(card_path):
    card = ModelCard.load(card_path)
    assert len(card.data.eval_results) == 7 and card.data.model_name == "simcse-minilm"
    sick = card.data.eval_results[-1]
    assert (sick.dataset_type, sick.metric_type, sick.metric_value) == ("mteb/sickr-sts", "cos_sim_spearman", 79.1234)


def test_body_tables_come_from_results(card_path):
    text = card_path.read_text()
    results = make_results()
    after, before = results["sts"]["after"], results["sts"]["before"]
    after_row = "| after training | " + " | ".join(f"{after[t]:.2f}" for t in (*STS_TASKS, "Avg")) + " |"
    before_row = "| before training | " + " | ".join(f"{before[t]:.2f}" for t in (*STS_TASKS, "Avg")) + " |"
    assert after_row in text and before_row in text
    assert "combined with mode `all`" in text
    mteb = results["mteb_sts"]
    assert "| after training | " + " | ".join(f"{mteb[t]:.2f}" for t in (*STS_TASKS, "Avg")) + " |" in text
    assert "9,927 pairs" in text and "4,927 test pairs" in text
    assert "step 48" in text and "84.57" in text  # best dev checkpoint
    assert "| 64 | 80.64 |" in text  # dev curve
    assert "bf16 mixed precision (autocast)" in text and "transformers 5.23.0" in text
    assert "| `learning_rate` | `3e-05` |" in text
    assert "Transfer tasks" not in text  # not run
    assert "gao2021simcse" in text
    assert 'SentenceTransformer("my-org/simcse-minilm")' in text and 'model_id = "my-org/simcse-minilm"' in text
    assert "outputs.last_hidden_state[:, 0]" in text


def test_transfer_table_and_byop_citation(tmp_path):
    results = make_results(transfer={"MR": 81.234, "CR": 86.5, "TREC": 88.0})
    results["recipe_settings"]["perturbation"] = "p+n-"
    text = render_model_card(PLAN, results, model_id="x/y", repo_id="x/y").content
    assert "### Transfer tasks" in text and "| MR | CR | TREC |" in text
    assert "| accuracy | 81.23 | 86.50 | 88.00 |" in text
    assert "Bootstrap Your Own" in text and "gao2021simcse" in text
    results["recipe_settings"]["perturbation"] = "n+p-"
    text = render_model_card(PLAN, results, model_id="x/y", repo_id="x/y").content
    assert "Can contrastive learning avoid shortcut solutions?" in text and "Bootstrap Your Own" not in text


def test_card_without_results_is_valid(tmp_path):
    path = write_model_card(tmp_path, PLAN, {}, repo_id=None)
    meta = metadata_load(path)
    assert "model-index" not in meta and meta["pipeline_tag"] == "sentence-similarity"
    text = path.read_text()
    assert "No evaluation results were supplied" in text
    assert f'model_id = "{tmp_path.resolve()}"' in text  # the snippet loads the folder itself
    export = tmp_path / "my-run" / "export"
    export.mkdir(parents=True)
    assert "\n# my-run\n" in write_model_card(export, PLAN, {}).read_text()  # titled after the run, not "export"


def test_pooling_snippets_follow_the_plan():
    folded = ExportPlan("cls", 12, 12, "pooler", 768, 512)
    dense = ExportPlan("last2_avg", 12, 12, "dense", 768, 512)
    text = render_model_card(folded, {}, model_id="a/b").content
    assert "outputs.pooler_output" in text and "`2_Dense/`" in text
    text = render_model_card(dense, {}, model_id="a/b").content
    assert "output_hidden_states=True" in text and "outputs.hidden_states[-2]" in text
    assert '"3_Dense/model.safetensors"' in text and "`1_WeightedLayerPooling/`" in text


def test_non_default_settings_hide_paths_and_tokens(tmp_path, repo_root):
    recipe = parse_recipe(
        repo_root / "recipes" / "quickstart.yaml",
        ["--output_dir", str(tmp_path), "--hub_token", "hf_secret_value", "--hub_model_id", "me/x",
         "--learning_rate", "1e-5"],
    )
    settings = non_default_settings(recipe)
    assert settings["learning_rate"] == 1e-5 and settings["train_file"] == "wiki1m_for_simcse.txt"
    assert settings["max_train_samples"] == 4096 and settings["method"] == "simcse"
    assert "temperature" not in settings and "per_device_train_batch_size" not in settings  # at their defaults
    assert not {"output_dir", "hub_token", "hub_model_id"} & set(settings)
    assert "hf_secret_value" not in json.dumps(settings)


def test_dev_curve_table_subsamples():
    history = [{"step": 10 * i, "eval_stsb_spearman": 70 + i / 10, "eval_alignment": 0.5} for i in range(1, 51)]
    table = dev_curve_table(history, limit=5)
    lines = table.splitlines()
    assert lines[0] == "| step | STS-B dev Spearman × 100 | alignment |" and len(lines) == 2 + 5
    assert lines[2].startswith("| 10 |") and lines[-1].startswith("| 500 | 75.00 | 0.5000")
    assert dev_curve_table([]) is None


@pytest.fixture(scope="module")
def fake_encoder(senteval_dir):
    sentences = STSEvaluator(senteval_dir, mode="all", sick_split="all").sentences()
    sentences += STSEvaluator(senteval_dir).sentences()
    rng = np.random.default_rng(0)
    return FakeEncoder({s: rng.normal(size=8) for s in sentences})


def test_mteb_scores_use_all_sick_pairs(senteval_dir, fake_encoder):
    reference = STSEvaluator(senteval_dir, mode="all", sick_split="all")(fake_encoder)
    senteval = STSEvaluator(senteval_dir, mode="all")(fake_encoder)
    assert reference["SICKRelatedness"] != pytest.approx(senteval["SICKRelatedness"])
    fake_encoder.calls.clear()
    mteb = mteb_sts_scores(fake_encoder, senteval_dir, senteval, "all")
    assert mteb == pytest.approx(reference)
    (call,) = fake_encoder.calls  # only SICK was encoded again
    assert set(call["sentences"]) == set(STSEvaluator(senteval_dir, tasks=("SICKRelatedness",),
                                                      sick_split="all").sentences())
    # with another averaging mode the STS12-16 numbers are recomputed in mode "all"
    mean_mode = STSEvaluator(senteval_dir, mode="mean")(fake_encoder)
    assert mteb_sts_scores(fake_encoder, senteval_dir, mean_mode, "mean") == pytest.approx(reference)


def test_mteb_results_folder(tmp_path):
    export_dir = tmp_path / "run" / "export"
    export_dir.mkdir(parents=True)
    save_file({"w": torch.zeros(3, 4)}, export_dir / "model.safetensors")
    results = make_results()
    folder = write_mteb_results(tmp_path / "mteb", results, export_dir, PLAN, repo_id="my-org/simcse-minilm")
    assert folder == tmp_path / "mteb" / "my-org__simcse-minilm"
    revision_dir = folder / "no_revision_available"
    names = sorted(p.name for p in revision_dir.iterdir())
    assert names == sorted([f"{name}.json" for _, name, _ in MTEB_STS_DATASETS.values()] + ["model_meta.json"])
    sick = json.loads((revision_dir / "SICK-R.json").read_text())
    assert sick["task_name"] == "SICK-R" and sick["dataset_revision"] == MTEB_STS_DATASETS["SICKRelatedness"][2]
    (entry,) = sick["scores"]["test"]
    assert entry["main_score"] == entry["cosine_spearman"] == pytest.approx(0.791234)
    assert entry["hf_subset"] == "default" and entry["languages"] == ["eng-Latn"]
    meta = json.loads((revision_dir / "model_meta.json").read_text())
    assert meta["name"] == "my-org/simcse-minilm" and meta["n_parameters"] == 12 and meta["embed_dim"] == 384
    assert write_mteb_results(tmp_path / "none", {}, export_dir, PLAN) is None
