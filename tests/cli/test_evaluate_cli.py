"""`hf-sentcl evaluate` on the tiny BERT and the tiny SentEval layout."""

import json

import pytest
from helpers import write_tiny_glue

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.evaluate import main
from hf_sentcl.evaluation.sts import STSEvaluator


def evaluate(tmp_path, model_dir, data_dir, *extra, name="out.json"):
    output = tmp_path / name
    argv = ["--model", str(model_dir), "--data-dir", str(data_dir), "--sts-tasks", "STS12,STSBenchmark",
            "--output", str(output), "--device", "cpu", *extra]
    assert main(argv) == 0
    return json.loads(output.read_text()), output


def test_results_json_matches_evaluator(tmp_path, tiny_bert_dir, senteval_dir):
    """The JSON holds the settings and each task's score, equal (to 4 decimals) to running the evaluator on the
    encoder directly; a Markdown table is written beside it."""
    results, output = evaluate(tmp_path, tiny_bert_dir, senteval_dir)
    assert results["model"] == str(tiny_bert_dir)
    assert results["pooling"] == "cls" and results["pooling_layer"] == -1
    assert results["sts_mode"] == "all" and results["sick_split"] == "test" and results["precision"] == "fp32"
    assert {"STS12", "STSBenchmark", "Avg"} <= set(results)
    assert not {"STS13", "SICKRelatedness"} & set(results)
    expected = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"))(SentenceEncoder.load(str(tiny_bert_dir)))
    for task in ("STS12", "STSBenchmark", "Avg"):
        assert results[task] == pytest.approx(expected[task], abs=1e-4)
    table = output.with_suffix(".md").read_text()
    assert "STS12" in table and "STS-B" in table and "`all`" in table


def test_mode_and_pooling_recorded(tmp_path, tiny_bert_dir, senteval_dir):
    """--sts-mode wmean and --pooling mean are recorded and used."""
    results, _ = evaluate(tmp_path, tiny_bert_dir, senteval_dir, "--sts-mode", "wmean", "--pooling", "mean")
    assert results["sts_mode"] == "wmean" and results["pooling"] == "mean"
    encoder = SentenceEncoder.load(str(tiny_bert_dir), pooling="mean")
    expected = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"), mode="wmean")(encoder)
    assert results["STS12"] == pytest.approx(expected["STS12"], abs=1e-4)
    assert results["STSBenchmark"] == pytest.approx(expected["STSBenchmark"], abs=1e-4)


def test_bf16_recorded(tmp_path, tiny_bert_dir, senteval_dir):
    """--bf16 is recorded as the precision."""
    results, _ = evaluate(tmp_path, tiny_bert_dir, senteval_dir, "--bf16", "--sts-mode", "mean")
    assert results["precision"] == "bf16" and results["sts_mode"] == "mean"


def test_saved_encoder_evaluated_with_its_own_settings(tmp_path, tiny_bert_dir, senteval_dir):
    """A saved encoder is evaluated with its saved pooling (here mean) when --pooling is not given."""
    SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").save_pretrained(tmp_path / "enc")
    results, _ = evaluate(tmp_path, tmp_path / "enc", senteval_dir)
    assert results["pooling"] == "mean"
    plain, _ = evaluate(tmp_path, tiny_bert_dir, senteval_dir, "--pooling", "mean", name="plain.json")
    assert results["STS12"] == pytest.approx(plain["STS12"], abs=1e-6)


def test_pooling_flag_overrides_saved_inference_pooling(tmp_path, tiny_bert_dir, senteval_dir):
    """--pooling is "the pooling to evaluate with": it must win over a saved encoder's inference_pooling."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", inference_pooling="last2_avg")
    encoder.save_pretrained(tmp_path / "enc")
    results, _ = evaluate(tmp_path, tmp_path / "enc", senteval_dir, "--pooling", "mean")
    assert results["pooling"] == "mean"
    reference, _ = evaluate(tmp_path, tiny_bert_dir, senteval_dir, "--pooling", "mean", name="reference.json")
    assert results["STS12"] == pytest.approx(reference["STS12"], abs=1e-6)


def test_missing_data_dir_returns_2(tmp_path, tiny_bert_dir, monkeypatch, capsys):
    """Without --data-dir and HF_SENTCL_DATA the CLI exits 2 with the how-to message (before loading a model)."""
    monkeypatch.delenv("HF_SENTCL_DATA", raising=False)
    assert main(["--model", str(tiny_bert_dir), "--output", str(tmp_path / "x.json")]) == 2
    assert "HF_SENTCL_DATA" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_data_dir_from_environment(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    """HF_SENTCL_DATA is used when --data-dir is not given."""
    monkeypatch.setenv("HF_SENTCL_DATA", str(senteval_dir))
    output = tmp_path / "env.json"
    assert main(["--model", str(tiny_bert_dir), "--sts-tasks", "STSBenchmark", "--output", str(output)]) == 0
    assert "STSBenchmark" in json.loads(output.read_text())


@pytest.mark.parametrize("flag, value, message", [("--tasks", "sts,paraphrase", "paraphrase"),
                                                   ("--sts-tasks", "STS17", "STS17")])
def test_unknown_suite_or_task_returns_2(tiny_bert_dir, senteval_dir, capsys, flag, value, message):
    """Unknown suites and STS task names exit 2 naming them."""
    assert main(["--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), flag, value]) == 2
    assert message in capsys.readouterr().err


def test_dims_scores_each_prefix(tmp_path, tiny_bert_dir, senteval_dir):
    """--dims 16,8 adds the STS scores of the first 16 and 8 dimensions, equal to scoring those columns directly."""
    results, output = evaluate(tmp_path, tiny_bert_dir, senteval_dir, "--dims", "16,8")
    assert set(results["sts_by_dim"]) == {"16", "8"}
    evaluator = STSEvaluator(senteval_dir, tasks=("STS12", "STSBenchmark"))
    embeddings = evaluator.embed(SentenceEncoder.load(str(tiny_bert_dir)))
    expected = evaluator.score(embeddings[:, :8])
    assert results["sts_by_dim"]["8"]["STS12"] == pytest.approx(expected["STS12"], abs=1e-4)
    assert results["sts_by_dim"]["8"]["STS12"] != pytest.approx(results["STS12"], abs=1e-3)
    assert "first 8 dims" in output.with_suffix(".md").read_text()


@pytest.mark.parametrize("value", ["16,x", "0", "-8"])
def test_bad_dims_return_2(tiny_bert_dir, senteval_dir, capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(tiny_bert_dir), "--data-dir", str(senteval_dir), f"--dims={value}"])
    assert exit_.value.code == 2
    assert "--dims" in capsys.readouterr().err


@pytest.mark.slow
def test_glue_suite_is_written_to_the_results_json(tmp_path, tiny_bert_dir):
    """`--tasks glue` fine-tunes on each GLUE task and writes every task's runs into --output's JSON, not only into
    the printed table."""
    data = write_tiny_glue(tmp_path / "glue")
    output = tmp_path / "out.json"
    assert main(["--model", str(tiny_bert_dir), "--data-dir", str(data), "--tasks", "glue", "--output", str(output),
                 "--device", "cpu"]) == 0
    results = json.loads(output.read_text())
    assert results["tasks"] == ["glue"] and set(results["glue"]) == {"sst2", "mrpc", "stsb"}
    sst2 = results["glue"]["sst2"]
    assert sst2["train_examples"] == 48 and len(sst2["runs"]) == 1
    assert "| sst2 |" in output.with_suffix(".md").read_text()


def test_sts_only_options_without_the_sts_suite_are_refused(tmp_path, senteval_dir, capsys):
    """--whitening and --dims score STS: with --tasks transfer they did nothing, silently; now exit 2 before loading
    (this model does not exist)."""
    for extra in (["--whitening", "eval"], ["--dims", "16"]):
        argv = ["--model", str(tmp_path / "no-model"), "--data-dir", str(senteval_dir), "--tasks", "transfer", *extra]
        assert main(argv) == 2
        assert f"{extra[0]} score the STS tasks" in capsys.readouterr().err
