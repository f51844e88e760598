"""`hf-sentcl evaluate --mteb`: mteb's own evaluation of the encoder, offline.

An mteb STS task's data is laid where `datasets` looks for it offline (its cache of prepared datasets, at the path and
revision of the task's metadata), built from the SentEval files of the `senteval_dir` fixture, so that mteb's score
can be compared with hf_sentcl's MTEB-protocol score of the same pairs. A tiny retrieval task (in memory, registered
with mteb by name for the test) checks that any task type runs and that its result files load back through mteb's
`ResultCache`.
"""

import importlib
import json
from pathlib import Path

import pytest

mteb = pytest.importorskip("mteb")

from datasets import Dataset  # noqa: E402
from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402

from hf_sentcl import SentenceEncoder  # noqa: E402
from hf_sentcl.cli import evaluate as evaluate_cli  # noqa: E402
from hf_sentcl.evaluation.mteb import MtebScores, mteb_sts_scores  # noqa: E402

NO_REVISION = "no_revision_available"
RETRIEVAL_TASK = "HfSentclTinyRetrieval"


# ------------------------------------------------------------------------------------------------ fixture builders
def senteval_sts_columns(senteval_dir: Path, task: str) -> dict[str, list]:
    """The test pairs of a SentEval STS task as the columns of MTEB's dataset (sentence1, sentence2, score), read
    from the raw files: STS12's subsets concatenated (rows without a gold score dropped), STS-B's sts-test.csv."""
    rows: list[tuple[str, str, float]] = []
    if task == "STSBenchmark":
        for line in (senteval_dir / "STS" / "STSBenchmark" / "sts-test.csv").read_text().splitlines():
            fields = line.split("\t")
            rows.append((fields[5], fields[6], float(fields[4])))
    else:
        folder = senteval_dir / "STS" / f"{task}-en-test"
        for inputs in sorted(folder.glob("STS.input.*.txt")):
            gold = (folder / inputs.name.replace("STS.input.", "STS.gs.")).read_text().splitlines()
            for pair, score in zip(inputs.read_text().splitlines(), gold):
                if score.strip():
                    first, second = pair.split("\t")[:2]
                    rows.append((first, second, float(score)))
    return {"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows], "score": [r[2] for r in rows]}


def lay_prepared_dataset(cache: Path, task: str, columns: dict[str, list], split: str = "test") -> Path:
    """Put `columns` where `datasets` finds the Hub dataset of mteb's `task` offline: a prepared dataset in its cache,
    `<org>___<name>/default/0.0.0/<revision>/` holding `dataset_info.json` and `<name>-<split>.arrow`, as an online
    `load_dataset(path, revision=...)` leaves it (path and revision from the task's metadata). Offline, `datasets`
    never reads the Hub download cache (it stops at its offline check before `hf_hub_download`)."""
    from datasets import DatasetInfo, SplitDict, SplitInfo
    from datasets.arrow_writer import ArrowWriter

    source = mteb.get_task(task).metadata.dataset
    org, name = source["path"].split("/")
    folder = cache / f"{org}___{name}" / "default" / "0.0.0" / source["revision"]
    folder.mkdir(parents=True)
    table = Dataset.from_dict(columns)
    with ArrowWriter(path=str(folder / f"{name}-{split}.arrow"), features=table.features) as writer:
        writer.write_table(table.data.table)
        writer.finalize()
    splits = SplitDict({split: SplitInfo(split, num_examples=len(table), dataset_name=name)})
    DatasetInfo(dataset_name=name, config_name="default", features=table.features, splits=splits).write_to_directory(
        str(folder)
    )
    return folder


class TinyRetrieval(AbsTaskRetrieval):
    """Two queries over four documents, each query word for word one document (the relevant one), so any encoder
    ranks it first: nDCG@10 = 1."""

    metadata = TaskMetadata(
        name=RETRIEVAL_TASK, type="Retrieval", main_score="ndcg_at_10", category="t2t", modalities=["text"],
        description="A four-document retrieval task for hf_sentcl's tests.", reference=None,
        dataset={"path": "hf-sentcl-tests/tiny-retrieval", "revision": "1" * 40}, eval_splits=["test"],
        eval_langs=["eng-Latn"], date=("2026-01-01", "2026-01-01"), dialect=[], domains=[], task_subtypes=[],
        license="cc-by-4.0", annotations_creators="derived", sample_creation="found", bibtex_citation="",
    )

    def load_data(self, num_proc=None, **kwargs) -> None:
        documents = ["the cat sat on the mat", "stock markets fell sharply today", "a recipe for bread and butter",
                     "rain is expected over the hills"]
        split = RetrievalSplitData(
            corpus=Dataset.from_list([{"id": f"d{i}", "text": text} for i, text in enumerate(documents)]),
            queries=Dataset.from_list([{"id": "q0", "text": documents[1]}, {"id": "q1", "text": documents[3]}]),
            relevant_docs={"q0": {"d1": 1}, "q1": {"d3": 1}},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch) -> Path:
    """A private, empty cache of prepared datasets (where `datasets` looks offline); the session is offline."""
    import datasets

    assert datasets.config.HF_HUB_OFFLINE
    folder = tmp_path / "datasets-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(folder))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", folder)
    return folder


@pytest.fixture
def tiny_retrieval(monkeypatch) -> str:
    """TinyRetrieval registered with mteb under its name, as mteb's own tasks are, for this test only."""
    monkeypatch.setitem(importlib.import_module("mteb.get_tasks")._TASKS_REGISTRY, RETRIEVAL_TASK, TinyRetrieval)
    return RETRIEVAL_TASK


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the command loads a model."""
    def fail(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(evaluate_cli, "load_encoder", fail)


# ------------------------------------------------------------------------------------------------ tests
def test_mteb_sts_scores_equal_hf_sentcl_mteb_protocol_scores(tmp_path, tiny_bert_dir, senteval_dir, datasets_cache,
                                                              capsys):
    """mteb's own STS12 and STSBenchmark scores (cosine Spearman, 0-1) equal x 100 hf_sentcl's MTEB-protocol scores
    of the same pairs (`mteb_sts_scores`) within 0.01; the files are in mteb's layout beside --output, the summary
    says the scores are mteb's, and each task prints a start and an end line."""
    for task in ("STS12", "STSBenchmark"):
        lay_prepared_dataset(datasets_cache, task, senteval_sts_columns(senteval_dir, task))
    output = tmp_path / "mteb.json"
    argv = ["--model", str(tiny_bert_dir), "--pooling", "mean", "--mteb", "STS12,STSBenchmark", "--output",
            str(output), "--device", "cpu"]
    assert evaluate_cli.main(argv) == 0
    summary = json.loads(output.read_text())
    assert summary["source"] == "mteb" and summary["mteb_version"] == mteb.__version__
    assert summary["main_metrics"] == {"STS12": "cosine_spearman", "STSBenchmark": "cosine_spearman"}
    ours = mteb_sts_scores(SentenceEncoder.load(str(tiny_bert_dir), pooling="mean"), senteval_dir).scores
    for task in ("STS12", "STSBenchmark"):
        assert 100 * summary["tasks"][task] == pytest.approx(ours[task], abs=0.01)
    assert abs(ours["STS12"] - ours["STSBenchmark"]) > 0.1  # two different scores, not one number twice
    folder = tmp_path / "mteb_results" / "results" / f"hf_sentcl__{tiny_bert_dir.name}" / NO_REVISION
    assert summary["results_folder"] == str(folder)
    assert sorted(p.name for p in folder.glob("*.json")) == ["STS12.json", "STSBenchmark.json", "model_meta.json"]
    out = capsys.readouterr().out
    assert "[1/2] STS12 (STS): evaluating with mteb" in out and "[2/2] STSBenchmark: cosine_spearman = " in out


def test_retrieval_results_load_back_through_mteb_result_cache(tmp_path, tiny_bert_dir, tiny_retrieval, capsys):
    """A retrieval task runs through mteb; with a run folder as the model and no --output its results go to the run's
    mteb_results/, and mteb's ResultCache loads them under hf_sentcl/<run> at no_revision_available."""
    run = tmp_path / "my-run"
    SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").save_pretrained(run)
    (run / "results.json").write_text("{}")
    assert evaluate_cli.main(["--model", str(run), "--mteb", tiny_retrieval, "--device", "cpu"]) == 0
    loaded = mteb.ResultCache(run / "mteb_results").load_results(models=["hf_sentcl/my-run"], include_remote=False)
    [model] = loaded.model_results
    assert (model.model_name, model.model_revision) == ("hf_sentcl/my-run", NO_REVISION)
    [result] = model.task_results
    assert result.task_name == tiny_retrieval
    assert result.get_score() == pytest.approx(1.0) and result.scores["test"][0]["ndcg_at_10"] == pytest.approx(1.0)
    assert f"[1/1] {tiny_retrieval}: ndcg_at_10 = 1.0000" in capsys.readouterr().out


@pytest.mark.parametrize("value, guess", [
    ("STS-12", "STS12"), ("STS12,STSBenchmarks", "STSBenchmark"), ("MTEB(eng, v2", "MTEB(eng, v2)"),
])
def test_unknown_task_or_benchmark_exits_2_before_the_model_loads(tmp_path, no_model_load, capsys, value, guess):
    output = tmp_path / "out.json"
    assert evaluate_cli.main(["--model", str(tmp_path / "no-model"), "--mteb", value, "--output", str(output)]) == 2
    assert f"did you mean '{guess}'?" in capsys.readouterr().err
    assert not output.exists() and not (tmp_path / "mteb_results").exists()


def test_task_data_missing_offline_exits_2_naming_the_task(tmp_path, datasets_cache, no_model_load, capsys):
    """STS13's data is not in the (empty) cache: exit 2 before the model loads, naming the task, its dataset and that
    it must be downloaded online first."""
    argv = ["--model", str(tmp_path / "no-model"), "--mteb", "STS13", "--output", str(tmp_path / "out.json")]
    assert evaluate_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "STS13 (Hub dataset mteb/sts13-sts" in err and "HF_HUB_OFFLINE is set" in err
    assert "downloaded online first" in err


def test_no_place_for_the_results_exits_2(tmp_path, tiny_bert_dir, no_model_load, capsys):
    """A backbone (no run folder) without --output: nowhere to put mteb_results/, said before the model loads."""
    assert evaluate_cli.main(["--model", str(tiny_bert_dir), "--mteb", "STS12"]) == 2
    assert "give --output" in capsys.readouterr().err


def test_mteb_files_join_an_exports_submission(tmp_path, export_dir, senteval_dir, datasets_cache):
    """A run whose export filed MTEB files: mteb's run files its tasks under the export's ModelMeta (name and
    revision), its STSBenchmark score replaces the export's, STS12's stays, and the submission still checks."""
    from hf_sentcl.export.mteb_files import check_mteb_submission, write_mteb_results

    run = export_dir.parent
    (run / "results.json").write_text("{}")
    folder = write_mteb_results(run / "mteb_results", MtebScores({"STS12": 50.0, "STSBenchmark": 60.0}),
                                name=f"hf_sentcl/{run.name}", export_dir=export_dir, max_tokens=64, embed_dim=32)
    lay_prepared_dataset(datasets_cache, "STSBenchmark", senteval_sts_columns(senteval_dir, "STSBenchmark"))
    assert evaluate_cli.main(["--model", str(export_dir), "--mteb", "STSBenchmark", "--device", "cpu"]) == 0
    scores = {path.stem: json.loads(path.read_text())["scores"]["test"][0]["main_score"]
              for path in folder.glob("STS*.json")}
    assert scores["STS12"] == 0.5 and scores["STSBenchmark"] != 0.6
    meta, tasks = check_mteb_submission(folder)
    assert meta.name == f"hf_sentcl/{run.name}" and sorted(tasks) == ["STS12", "STSBenchmark"]


def test_the_runs_export_card_says_which_scores_mteb_computed(tmp_path, tiny_bert_dir, tiny_retrieval):
    """A run with an export: after `--mteb` the export's card has a section of mteb's own scores that names mteb and
    its version, apart from hf_sentcl's numbers; the card still parses, and a push's re-render keeps the section."""
    from huggingface_hub import ModelCard

    from hf_sentcl.export.bundle import export_with_card
    from hf_sentcl.export.card import rewrite_model_card

    run = tmp_path / "my-run"
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    encoder.save_pretrained(run)
    (run / "results.json").write_text("{}")
    export_with_card(encoder, run / "export", {}, verify=False)
    assert "computed by mteb itself" not in (run / "export" / "README.md").read_text()
    assert evaluate_cli.main(["--model", str(run), "--mteb", tiny_retrieval, "--device", "cpu"]) == 0
    text = (run / "export" / "README.md").read_text()
    assert "### Scores computed by mteb itself" in text and f"mteb {mteb.__version__}'s own evaluation" in text
    assert f"| {tiny_retrieval} | `ndcg_at_10` | 100.00 |" in text
    assert ModelCard(text).data.widget
    assert "computed by mteb itself" in rewrite_model_card(run / "export", "org/name").read_text()
