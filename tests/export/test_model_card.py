"""Model card content and metadata, the results files it reads, the MTEB-protocol scores behind its model-index,
and the MTEB result files (checked with the mteb package's own loaders)."""

import json

import mteb
import numpy as np
import pytest
import torch
from helpers import FakeEncoder
from huggingface_hub import ModelCard, metadata_load
from mteb.models import ModelMeta
from mteb.results import TaskResult
from safetensors.torch import save_file

from hf_sentcl.evaluation.mteb import MTEB_FILES, MTEB_STS_DATASETS, MtebScores, mteb_data_problem, mteb_sts_scores
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator
from hf_sentcl.export.card import dev_curve_table, render_model_card, write_model_card
from hf_sentcl.export.mteb_files import check_mteb_folder, rekey_mteb_results, write_mteb_results
from hf_sentcl.export.plan import ExportPlan
from hf_sentcl.export.results import load_results
from hf_sentcl.recipe.metadata import non_default_settings
from hf_sentcl.recipe.parser import parse_recipe

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
    assert "datasets" not in meta  # a local wiki1m_subset.txt is not credited to a Hub dataset by its name
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
    assert 'model_id = "your-username/your-model-name"' in text and str(tmp_path) not in text  # no local path
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
    assert settings["learning_rate"] == 1e-5  # a Hub train_file stays whole (public); a local one by its name alone
    assert settings["train_file"] == "hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"
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
    fresh = mteb_sts_scores(fake_encoder, senteval_dir)
    assert fresh.scores == pytest.approx(reference) and set(fresh.seconds) == set(STS_TASKS)
    assert all(seconds > 0 for seconds in fresh.seconds.values())
    fake_encoder.calls.clear()
    reused = mteb_sts_scores(fake_encoder, senteval_dir, reuse=senteval)  # a run's own mode-"all" scores
    assert reused.scores == pytest.approx(reference)
    (call,) = fake_encoder.calls  # only SICK was encoded again, and only it has a time
    assert set(call["sentences"]) == set(STSEvaluator(senteval_dir, tasks=("SICKRelatedness",),
                                                      sick_split="all").sentences())
    assert list(reused.seconds) == ["SICKRelatedness"]


def test_mteb_table_matches_mteb_tasks():
    for dataset, name, revision in MTEB_STS_DATASETS.values():
        metadata = mteb.get_task(name).metadata
        assert (metadata.dataset["path"], metadata.dataset["revision"], metadata.main_score) == (
            dataset, revision, "cosine_spearman")


def test_mteb_scores_are_claimed_for_senteval_data_only(real_data_dir, senteval_dir, tmp_path):
    """SentEval's copy of every file MTEB's protocol reads stands for MTEB's tasks; a layout that declares its own
    sizes, or lacks a file (here SICK's trial split, which MTEB's SICK-R holds), does not, and the reason names it."""
    assert len(MTEB_FILES) == 52 and {"SICK/SICK_trial.txt", "STS16-en-test/STS.gs.plagiarism.txt"} <= set(MTEB_FILES)
    assert not any(name.startswith("STSBenchmark/sts-train") or name.endswith("sts-dev.csv") for name in MTEB_FILES)
    assert mteb_data_problem(real_data_dir) is None
    assert mteb_data_problem(senteval_dir) == (
        f"{senteval_dir}/STS/STS12-en-test/sizes.json declares sizes other than SentEval's")
    linked = tmp_path / "senteval"
    for name in MTEB_FILES:
        source = real_data_dir / name if name.startswith("SICK/") else real_data_dir / "STS" / name
        target = linked / source.relative_to(real_data_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)
    assert mteb_data_problem(linked) is None
    (linked / "SICK" / "SICK_trial.txt").unlink()
    assert mteb_data_problem(linked) == f"{linked}/SICK/SICK_trial.txt is missing"


def test_mteb_results_folder(tmp_path):
    export_dir = tmp_path / "run" / "export"
    export_dir.mkdir(parents=True)
    save_file({"w": torch.zeros(3, 4)}, export_dir / "model.safetensors")
    results = make_results(training_data={"source": "unlabeled_sts", "name": "stsb"})
    scores = MtebScores(results["mteb_sts"], {"SICKRelatedness": 12.5})
    folder = write_mteb_results(tmp_path / "mteb", scores, name="my-org/simcse-minilm", export_dir=export_dir,
                                max_tokens=512, embed_dim=384, training_tasks={"STSBenchmark"})
    assert folder == tmp_path / "mteb" / "results" / "my-org__simcse-minilm" / "no_revision_available"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([f"{name}.json" for _, name, _ in MTEB_STS_DATASETS.values()] + ["model_meta.json"])
    for path in folder.glob("*.json"):  # the mteb package's own loaders accept every file
        if path.name == "model_meta.json":
            meta = ModelMeta.model_validate_json_resolved(path.read_text())
        else:
            assert TaskResult.from_disk(path).mteb_version == mteb.__version__
    sick = TaskResult.from_disk(folder / "SICK-R.json")
    assert sick.task_name == "SICK-R" and sick.dataset_revision == MTEB_STS_DATASETS["SICKRelatedness"][2]
    assert sick.evaluation_time == 12.5 and sick.get_score() == pytest.approx(0.791234)
    (entry,) = sick.scores["test"]
    assert entry["main_score"] == entry["cosine_spearman"] and entry["languages"] == ["eng-Latn"]
    assert TaskResult.from_disk(folder / "STS12.json").evaluation_time is None  # a reused score has no time
    assert meta.name == "my-org/simcse-minilm" and meta.n_parameters == 12 and meta.embed_dim == 384
    assert meta.training_datasets == {"STSBenchmark"} and meta.revision == "no_revision_available"
    # after a push: filed under the pushed commit, and still accepted by mteb
    moved = rekey_mteb_results(tmp_path / "mteb", "org/pushed", "0123abcd" * 5)
    assert moved == tmp_path / "mteb" / "results" / "org__pushed" / ("0123abcd" * 5) and not folder.exists()
    assert ModelMeta.model_validate_json_resolved((moved / "model_meta.json").read_text()).revision == "0123abcd" * 5
    assert len(check_mteb_folder(moved)) == 7
    (moved / "STS12.json").write_text(json.dumps({"task_name": "STS12"}))
    with pytest.raises(ValueError, match="mteb rejects .*STS12.json"):
        check_mteb_folder(moved)


EVALUATE_OUTPUT = {
    "model": "embedded:all-MiniLM-L6-v2", "pooling": "mean", "pooling_layer": -1, "tasks": ["sts", "transfer"],
    "sts_mode": "all", "sick_split": "test", "precision": "fp32", **scores(5.0),
    "transfer": {"MR": 75.5, "CR": 80.25, "Avg": 77.875},
}


def test_evaluate_output_feeds_the_card(tmp_path):
    path = tmp_path / "res.json"
    path.write_text(json.dumps(EVALUATE_OUTPUT))
    results = load_results(path)
    assert results["sts"] == {"evaluated": {k: EVALUATE_OUTPUT[k] for k in (*STS_TASKS, "Avg")}}
    assert results["transfer"] == {"evaluated": EVALUATE_OUTPUT["transfer"]}
    results.update(MtebScores(make_results()["mteb_sts"]).to_results())
    card = ModelCard.load(write_model_card(tmp_path, PLAN, results, repo_id="org/name"))
    assert len(card.data.eval_results) == 7 and card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "| this model | 65.00 |" in card.text and "| this model | 75.50 | 80.25 |" in card.text
    assert "exported with hf_sentcl" in card.text and "unknown" not in card.text


def parallelism(processes: int, strategy: str, backend: str | None, device: str, precision: str) -> dict:
    """results.json's `parallelism`, in the shape `effective_parallelism` writes it (batch 32 per process)."""
    return {"processes": processes, "strategy": strategy, "distributed_type": "MULTI_GPU", "backend": backend,
            "device": device, "precision": precision, "per_device_train_batch_size": 32,
            "global_train_batch_size": 32 * processes}


@pytest.mark.parametrize(
    "run, stated",
    [
        (parallelism(2, "FSDP2", "nccl", "cuda", "bf16"),
         "2 processes, FSDP2 (nccl on cuda), bf16, global batch 64 (32 per process)"),
        (parallelism(4, "DeepSpeed ZeRO-3", "nccl", "cuda", "fp16"),
         "4 processes, DeepSpeed ZeRO-3 (nccl on cuda), fp16, global batch 128 (32 per process)"),
        (parallelism(1, "single process", None, "cpu", "fp32"), "1 process (cpu), fp32, batch 32"),
    ],
)
def test_card_states_the_parallelism_of_results_json(tmp_path, run, stated):
    """The training details say what the run trained on, read from results.json through `load_results`."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(make_results(parallelism=run)))
    text = write_model_card(tmp_path / "export", PLAN, load_results(path), repo_id="org/name").read_text()
    training = text[text.index("## Training"):text.index("### Recipe settings")]
    assert f"- **Parallelism:** {stated}.\n" in training


def test_card_without_parallelism_leaves_the_line_out(card_path):
    assert "Parallelism" not in card_path.read_text()  # results.json of a run that did not record it


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "is not a JSON file"),
        ("[1, 2]", "holds a JSON list"),
        ('{"accuracy": 1}', "neither a run's results.json"),
        ('{"method": "simcse", "sts": {}}', "holds no STS or transfer scores"),
        ('{"model": "m", "tasks": ["sts"], "MR": 70}', "holds none of the tasks STS12"),
        ('{"model": "m", "tasks": ["sts"], "STS12": NaN}', "not finite"),
        ('{"method": "simcse", "sts": {"after": {"STS12": "high"}}}', "not finite numbers"),
        ('{"method": "simcse", "sts": {"after": {"STS12": 70}}, "parallelism": {"processes": 0}}',
         r"'parallelism.processes' should be a positive integer, not 0"),
    ],
)
def test_unusable_results_files_are_refused(tmp_path, content, message):
    path = tmp_path / "res.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_results(path)
