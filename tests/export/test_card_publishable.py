"""Issue 55 item 2: a model card that can be published as it is. Its metadata carries the license, the language,
a sentence-similarity widget and the model-index (validated by `huggingface_hub.ModelCard`); it names no local path;
it lists every hyperparameter that shaped the run; `datasets:` holds only datasets the run declared; a checkpoint
export finds its run's history; and a push leaves the card's internal inputs file out."""

import json
import shutil
from pathlib import Path

import pytest
from fake_hub import TOKEN, FakeHub
from huggingface_hub import HfApi, ModelCard, close_session, constants

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main as export_main
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.evaluation.mteb import MtebScores
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.export.bundle import export_with_card
from hf_sentcl.export.card import rewrite_model_card, write_model_card
from hf_sentcl.export.card_fields import PLACEHOLDER_ID
from hf_sentcl.export.mteb_meta import check_license
from hf_sentcl.export.plan import ExportPlan
from hf_sentcl.export.publish import push_export
from hf_sentcl.export.results import CARD_INPUTS, load_results
from hf_sentcl.hub.upload import LOCAL_ONLY_FILES, upload_plan

PLAN = ExportPlan(pooling="mean", source_layers=2, kept_layers=2, head="none", hidden_size=32, max_seq_length=64)
SCORES = {task: 70.0 + i for i, task in enumerate(STS_TASKS)}


def evaluated_results(tmp_path, model: str) -> dict:
    """`hf-sentcl evaluate --output` of `model` (read with `load_results`) plus MTEB-protocol scores."""
    path = tmp_path / "res.json"
    path.write_text(json.dumps({"model": model, "pooling": "mean", "pooling_layer": -1, "tasks": ["sts"],
                                "sts_mode": "all", "sick_split": "test", **SCORES}))
    results = load_results(path)
    results.update(MtebScores(SCORES).to_results())
    return results


def tiny_encoder(backbone_dir) -> SentenceEncoder:
    return SentenceEncoder.from_backbone(str(backbone_dir), pooling="mean").eval()


# ------------------------------------------------------------------------------------------------ 2a, 2b: metadata
def test_metadata_has_license_language_widget_and_model_index(tmp_path):
    """The embedded MiniLM exported with a license: the metadata parses with huggingface_hub and holds the license,
    the base model's language (its card says `en`), the widget and the 7 MTEB results."""
    encoder = SentenceEncoder.from_backbone(EMBEDDED_MODEL_ALIAS, pooling="mean").eval()
    out = tmp_path / "out"
    export_with_card(encoder, out, evaluated_results(tmp_path, EMBEDDED_MODEL_ALIAS), verify=False,
                     license_id="apache-2.0")
    text = (out / "README.md").read_text()
    data = ModelCard(text).data  # the YAML front matter parses, model-index included (errors are not ignored)
    assert data == ModelCard.load(out / "README.md").data
    assert data.license == "apache-2.0" and check_license(data.license) is None
    assert data.language == "en"
    assert len(data.eval_results) == 7 and {r.metric_type for r in data.eval_results} == {"cos_sim_spearman"}
    (example,) = data.widget
    assert isinstance(example["source_sentence"], str) and example["source_sentence"]
    assert len(example["sentences"]) >= 2 and all(isinstance(s, str) and s for s in example["sentences"])
    # the push renders the card again for its repository, with the same license and language
    pushed = ModelCard.load(rewrite_model_card(out, "my-org/minilm")).data
    assert (pushed.license, pushed.language, pushed.widget) == ("apache-2.0", "en", data.widget)


def test_language_given_wins_and_unknown_stays_out(tiny_bert_dir, tmp_path):
    """A language given by the command line or the recipe is used; a base without a card gives none."""
    export_with_card(tiny_encoder(tiny_bert_dir), tmp_path / "de", {}, verify=False, language="de")
    assert ModelCard.load(tmp_path / "de" / "README.md").data.language == "de"
    export_with_card(tiny_encoder(tiny_bert_dir), tmp_path / "none", {}, verify=False)
    data = ModelCard.load(tmp_path / "none" / "README.md").data
    assert data.language is None and data.license is None and data.eval_results is None and data.widget


def test_cli_license_reaches_the_card_metadata(tiny_bert_dir, tmp_path):
    assert export_main([str(tiny_bert_dir), str(tmp_path / "out"), "--pooling", "mean", "--license", "mit"]) == 0
    assert ModelCard.load(tmp_path / "out" / "README.md").data.license == "mit"
    assert export_main([str(tiny_bert_dir), str(tmp_path / "de"), "--pooling", "mean", "--language", "de"]) == 0
    assert ModelCard.load(tmp_path / "de" / "README.md").data.language == "de"


# ------------------------------------------------------------------------------------------------ 2c: no local path
def test_card_names_no_local_path(tiny_bert_dir, tmp_path):
    """Without a repo id the snippets load a placeholder the card says to replace; the base model, the settings
    and the training data are named without their folders."""
    base = shutil.copytree(tiny_bert_dir, tmp_path / "my-base")
    results = {
        "method": "simcse_sup", "model_name_or_path": str(base), "sts": {"after": SCORES},
        "recipe_settings": {"method": "simcse_sup", "model_name_or_path": str(base), "tokenizer_name": str(base)},
        "training_data": {"source": "nli_source", "name": f"file '{tmp_path}/data/nli.csv'", "examples": 12,
                          "columns": ["sent0", "sent1"], "max_seq_length": 32},
    }
    out = tmp_path / "runs" / "my-run" / "export"
    out.parent.mkdir(parents=True)
    export_with_card(tiny_encoder(base), out, results, verify=False)
    text = (out / "README.md").read_text()
    assert str(tmp_path) not in text and "/tmp/" not in text
    assert f'SentenceTransformer("{PLACEHOLDER_ID}")' in text and f'model_id = "{PLACEHOLDER_ID}"' in text
    assert f"Replace `{PLACEHOLDER_ID}` below with the Hub id" in text
    assert "\n# my-run\n" in text and "from `my-base`" in text and "| `model_name_or_path` | `my-base` |" in text
    assert "file 'nli.csv'" in text
    pushed = rewrite_model_card(out, "my-org/my-run").read_text()  # with a repo id: it, and no placeholder
    assert 'model_id = "my-org/my-run"' in pushed and PLACEHOLDER_ID not in pushed


# ------------------------------------------------------------------------------------------------ 2e: hyperparameters
@pytest.mark.parametrize("method, temperature", [("simcse", 0.05), ("consert", 0.1)])
def test_every_shaping_hyperparameter_is_listed(tmp_path, method, temperature):
    """Learning rate, temperature, max length and seed are listed even at their defaults; the push keeps them."""
    results = {"method": method, "sts": {"after": SCORES},
               "recipe_settings": {"method": method, "learning_rate": 3e-05, "logging_steps": 5}}
    path = write_model_card(tmp_path, PLAN, results, repo_id="org/name")
    for text in (path.read_text(), rewrite_model_card(tmp_path, "org/other").read_text()):
        settings = text[text.index("### Recipe settings"):]
        for row in ("| `learning_rate` | `3e-05` |", f"| `temperature` | `{temperature}` |", "| `seed` | `42` |",
                    "| `max_seq_length` | `", "| `per_device_train_batch_size` | `", "| `num_train_epochs` | `",
                    "| `logging_steps` | `5` |"):
            assert row in settings, row


# ------------------------------------------------------------------------------------------------ 2f: datasets
@pytest.mark.parametrize(
    "data, datasets",
    [
        ({"source": "train_file", "name": "wiki1m_subset.txt"}, None),
        ({"source": "train_file", "name": "wiki1m_for_simcse.txt"}, None),
        ({"source": "dataset_name", "name": "my-org/sentences"}, ["my-org/sentences"]),
        ({"source": "train_file", "name": "hf://datasets/my-org/corpus@v1/wiki.txt"}, ["my-org/corpus"]),
        ({"source": "nli_source", "name": "file 'hf://datasets/my-org/nli/train.csv'"}, ["my-org/nli"]),
        ({"source": "nli_source", "name": "dataset 'stanfordnlp/snli' (train)"}, ["stanfordnlp/snli"]),
    ],
)
def test_datasets_are_only_those_the_run_declared(tmp_path, data, datasets):
    path = write_model_card(tmp_path, PLAN, {"method": "simcse", "sts": {"after": SCORES}, "training_data": data})
    card = ModelCard.load(path)
    assert card.data.datasets == datasets
    if data["source"] == "train_file" and datasets is None:
        assert f"the local file `{data['name']}` (`train_file`; not published with this model)" in card.text


def test_a_local_dataset_folder_is_not_a_hub_dataset(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    data = {"source": "dataset_name", "name": str(folder)}
    path = write_model_card(tmp_path / "out", PLAN, {"method": "simcse", "training_data": data, "sts": {"a": SCORES}})
    assert ModelCard.load(path).data.datasets is None and str(tmp_path) not in path.read_text()


# ------------------------------------------------------------------------------------------------ 2d: checkpoints
@pytest.fixture
def run_with_checkpoint(tiny_bert_dir, tmp_path):
    """A finished 8-step run (best dev checkpoint: step 6) and its checkpoint-4 with trainer_state.json."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoint-4"
    tiny_encoder(tiny_bert_dir).save_pretrained(checkpoint)
    dev = [{"step": s, "epoch": s / 8, "eval_stsb_spearman": 50.0 + s} for s in (2, 4)]
    (checkpoint / "trainer_state.json").write_text(json.dumps({
        "global_step": 4, "max_steps": 8, "best_global_step": 4, "best_metric": 54.0,
        "log_history": [{"step": 1, "loss": 2.0}, *dev]}))
    (run / "results.json").write_text(json.dumps({
        "method": "simcse", "model_name_or_path": str(tiny_bert_dir), "sts_mode": "all",
        "sts": {"before": {k: v - 20 for k, v in SCORES.items()}, "after": SCORES},
        "train": {"global_step": 8, "best_step": 6, "best_dev_stsb_spearman": 56.0, "dev_curve": []},
        "recipe_settings": {"method": "simcse", "train_file": "wiki1m_subset.txt", "learning_rate": 1e-3},
        "training_data": {"source": "train_file", "name": "wiki1m_subset.txt", "examples": 24,
                          "max_seq_length": 16, "columns": ["text"]},
        "versions": {"transformers": "5.0.0"},
    }))
    return run, checkpoint


def assert_has_run_history(text: str, run_dir) -> None:
    training = text[text.index("## Training"):]
    assert "trained with hf_sentcl's `simcse` recipe" in text and "gao2021simcse" in text  # method and citation
    assert "- **Data:** the local file `wiki1m_subset.txt`" in training
    assert "- **Steps:** 4 (`checkpoint-4` of a run of 8 steps)" in training
    assert "- **Checkpoint:** step 4, the best of 2 STS-B dev evaluations" in training
    assert "| `learning_rate` | `0.001` |" in training and "| `temperature` | `0.05` |" in training
    assert "| after training |" not in text  # the run's final model (step 6) is not this checkpoint
    assert str(run_dir) not in text


def test_checkpoint_export_with_evaluate_results_finds_the_run(run_with_checkpoint, senteval_dir, tmp_path):
    """`export run/checkpoint-4 --results` of `hf-sentcl evaluate` (which names the checkpoint, not the base):
    method, base model, data, citation, settings and the checkpoint's progress come from the run."""
    run, checkpoint = run_with_checkpoint
    evaluated = tmp_path / "ev.json"
    evaluated.write_text(json.dumps({"model": str(checkpoint), "pooling": "mean", "pooling_layer": -1, "tasks": ["sts"],
                                     "sts_mode": "all", **SCORES}))
    assert export_main([str(checkpoint), str(tmp_path / "out"), "--results", str(evaluated), "--no-verify",
                        "--data-dir", str(senteval_dir)]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert_has_run_history(text, run)
    assert f"from `{run.parent.parent.name}" not in text and "from `checkpoint-4`" not in text
    assert f"| this model | {SCORES['STS12']:.2f} |" in text


def test_checkpoint_export_with_the_runs_results_drops_the_final_scores(run_with_checkpoint, senteval_dir,
                                                                         tmp_path):
    """Without --results the run's results.json is read: its "after" scores are the final model's, not step 4's."""
    run, checkpoint = run_with_checkpoint
    out = tmp_path / "out"
    assert export_main([str(checkpoint), str(out), "--data-dir", str(senteval_dir), "--no-verify"]) == 0
    text = (out / "README.md").read_text()
    assert_has_run_history(text, run)
    assert "| before training |" in text


# ------------------------------------------------------------------------------------------------ 2g: the push
@pytest.fixture
def online(monkeypatch):
    """Offline mode lifted for a push to the local fake Hub only (the default endpoint is a closed local port)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield monkeypatch
    close_session()


def test_push_leaves_the_card_inputs_out(online, export_dir):
    """hf_sentcl_card.json stays local: not in the upload plan (what --dry-run lists) nor in the commit."""
    assert CARD_INPUTS in LOCAL_ONLY_FILES and (export_dir / CARD_INPUTS).is_file()
    assert CARD_INPUTS not in [f.path for f in upload_plan(export_dir)]
    with FakeHub() as hub:
        online.setattr(constants, "ENDPOINT", hub.url)
        result, _ = push_export(export_dir, "my-org/encoder", api=HfApi(endpoint=hub.url, token=TOKEN))
    (commit,) = hub.commits
    assert CARD_INPUTS not in commit.files and "README.md" in commit.files and "model.safetensors" in commit.files
    assert sorted(commit.files) == sorted(f.path for f in result.files)


def test_a_hub_training_file_keeps_its_dataset_id_on_the_card(tmp_path):
    """The quickstart's `train_file: hf://datasets/princeton-nlp/...`: the results keep the address whole, so the
    card's `datasets:` names the Hub dataset (a local file would be named by its file name alone)."""
    from hf_sentcl.export.results import training_datasets
    from hf_sentcl.recipe.metadata import non_default_settings, training_data_summary
    from hf_sentcl.recipe.parser import parse_recipe
    from hf_sentcl.recipe.plan import plan_run

    quickstart = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    recipe = parse_recipe(quickstart, ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])
    summary = training_data_summary(plan_run(recipe).stages[-1], 4096, ("text",))
    assert summary["name"] == "hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"
    assert training_datasets({"training_data": summary}) == ["princeton-nlp/datasets-for-simcse"]
    assert non_default_settings(recipe)["train_file"] == summary["name"]
    local = parse_recipe(quickstart, ["--output_dir", str(tmp_path / "o2"), "--use_cpu", "true",
                                                     "--train_file", str(tmp_path / "data" / "mine.txt")])
    assert training_data_summary(plan_run(local).stages[-1], 1, ("text",))["name"] == "mine.txt"
