"""`python -m hf_sentcl.run`: recipe validation errors (exit 2, `error: ...`) and an end-to-end run on the tiny
BERT with a tiny SentEval layout."""

import json
import logging
import math

import pytest
import torch
from helpers import random_sentences, write_recipe
from huggingface_hub import ModelCard
from transformers import AutoModel

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main
from hf_sentcl.common.layout import MTEB_RESULTS_DIRNAME
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("\n".join(random_sentences(24, seed=3)) + "\n")
    return path


@pytest.fixture
def base_values(tmp_path, corpus, tiny_bert_dir, senteval_dir):
    return dict(
        method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"),
    )


def run_main(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.err


# ------------------------------------------------------------------------------------------ validation
def test_no_arguments_prints_usage(capsys):
    """No recipe: usage and exit status 2; --help: usage and 0."""
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out
    assert main(["--help"]) == 0


def test_missing_train_file_named(tmp_path, base_values, capsys):
    """A train_file that does not exist: exit 2 with the path in the error."""
    recipe = write_recipe(tmp_path, **{**base_values, "train_file": str(tmp_path / "nowhere.txt")})
    code, err = run_main([recipe], capsys)
    assert code == 2
    assert err.startswith("error: ") and "nowhere.txt" in err and "train_file" in err


def test_missing_data_dir_explains_how(tmp_path, base_values, capsys, monkeypatch):
    """No sts_data_dir and no HF_SENTCL_DATA: exit 2 with a message saying how to point at the data."""
    monkeypatch.delenv("HF_SENTCL_DATA", raising=False)
    values = {k: v for k, v in base_values.items() if k != "sts_data_dir"}
    code, err = run_main([write_recipe(tmp_path, **values)], capsys)
    assert code == 2
    assert err.startswith("error: ") and "HF_SENTCL_DATA" in err and "sts_data_dir" in err


def test_nonexistent_data_dir(tmp_path, base_values, capsys):
    """An sts_data_dir that does not exist is named in the error."""
    recipe = write_recipe(tmp_path, **{**base_values, "sts_data_dir": str(tmp_path / "no-data")})
    code, err = run_main([recipe], capsys)
    assert code == 2 and "no-data" in err


def test_local_model_path_must_exist(tmp_path, base_values, capsys):
    """model_name_or_path like ./nope that does not exist is rejected before loading anything."""
    code, err = run_main([write_recipe(tmp_path, **{**base_values, "model_name_or_path": "./nope"})], capsys)
    assert code == 2 and "./nope" in err and "model_name_or_path" in err


def test_batch_of_one_rejected_before_loading(tmp_path, base_values, capsys, monkeypatch):
    """per_device_train_batch_size 1 on one process leaves no in-batch negative: exit 2 naming the key, and no
    model is loaded first."""
    monkeypatch.setattr(SentenceEncoder, "from_backbone", lambda *a, **k: pytest.fail("model loaded"))
    code, err = run_main([write_recipe(tmp_path, **base_values, per_device_train_batch_size=1)], capsys)
    assert code == 2 and "per_device_train_batch_size" in err and "at least 2" in err


def test_unknown_key_exit_code(tmp_path, base_values, capsys):
    """Parse errors also exit 2 with the key named."""
    code, err = run_main([write_recipe(tmp_path, **base_values, learning_rat=0.1)], capsys)
    assert code == 2 and "learning_rat" in err and "learning_rate" in err


def test_cli_override_error_exit_code(tmp_path, base_values, capsys):
    """A bad command-line override exits 2 naming the key."""
    code, err = run_main([write_recipe(tmp_path, **base_values), "--seed", "many"], capsys)
    assert code == 2 and "'seed'" in err


def test_output_dir_is_required(tmp_path, base_values, capsys):
    """A recipe without output_dir is rejected (validate_recipe promises "key 'output_dir' is missing") instead
    of silently writing into ./trainer_output."""
    without_output = {k: v for k, v in base_values.items() if k != "output_dir"}
    recipe = write_recipe(tmp_path, **without_output)
    with pytest.raises(RecipeError, match="output_dir"):
        validate_recipe(parse_recipe(recipe))
    code, err = run_main([recipe], capsys)
    assert code == 2 and "output_dir" in err


def test_exactly_one_training_source(tmp_path, base_values):
    """validate_recipe wants exactly one of train_file / dataset_name / unlabeled_sts."""
    without_source = {k: v for k, v in base_values.items() if k != "train_file"}
    with pytest.raises(RecipeError, match="train_file"):
        validate_recipe(parse_recipe(write_recipe(tmp_path, **without_source)))
    with pytest.raises(RecipeError, match="unlabeled_sts"):
        validate_recipe(parse_recipe(write_recipe(tmp_path, **base_values, unlabeled_sts="stsb")))
    # the valid recipe passes (with a batch its 24 sentences fill)
    validate_recipe(parse_recipe(write_recipe(tmp_path, **base_values, per_device_train_batch_size=8)))


def test_unknown_eval_task(tmp_path, base_values):
    """eval_tasks may only name known suites (sts, transfer)."""
    with pytest.raises(RecipeError, match="eval_tasks.*'paraphrase'"):
        validate_recipe(parse_recipe(write_recipe(tmp_path, **base_values, eval_tasks=["sts", "paraphrase"])))


def test_quickstart_validates_with_the_local_data(repo_root, real_data_dir, monkeypatch):
    """The quickstart as `make quickstart` runs it here: the local Wikipedia subset and SentEval folder, offline.
    (tests/test_hub_data.py validates every recipe against a Hub cache.)"""
    monkeypatch.setenv("HF_SENTCL_DATA", str(real_data_dir))
    subset = real_data_dir.parent / "wiki1m_subset.txt"
    if not subset.is_file():
        pytest.skip(f"no {subset}")
    validate_recipe(parse_recipe(repo_root / "recipes" / "quickstart.yaml", ["--train_file", str(subset)]))


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_end_to_end_run(tmp_path, base_values, senteval_dir, tiny_bert_dir, capsys, caplog):
    """A 6-step SimCSE run: results.json/results.md with before/after rows for the 7 tasks, the best dev
    checkpoint kept and saved, and the saved encoder reloading to the reported numbers. Its STS data declares its
    own sizes, so no MTEB-protocol scores are claimed for it (no model-index, no MTEB files), and the log says why."""
    values = dict(
        base_values, pooling="cls", head="mlp", head_at_inference=False, per_device_train_batch_size=4,
        max_seq_length=16, num_train_epochs=1, eval_steps=3, save_steps=3, logging_steps=2, learning_rate="1e-3",
        use_cpu=True, seed=0, per_device_eval_batch_size=16,
    )
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="hf_sentcl"):
        assert main([str(write_recipe(tmp_path, **values))]) == 0
    printed = capsys.readouterr().out
    assert "before training" in printed and "after training" in printed
    assert any(r.getMessage().startswith("MTEB-protocol scores left out") and
               f"{senteval_dir}/STS/STS12-en-test/sizes.json declares sizes" in r.getMessage() for r in caplog.records)

    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "simcse" and results["sts_mode"] == "all"
    assert set(results["sts"]) == {"before", "after"}
    for row in results["sts"].values():
        assert set(row) == set(STS_TASKS) | {"Avg"}
        assert all(math.isfinite(v) and -100 <= v <= 100 for v in row.values())
        assert row["Avg"] == pytest.approx(sum(row[t] for t in STS_TASKS) / len(STS_TASKS))
    assert results["train"]["global_step"] == 6
    assert results["train"]["best_step"] in (3, 6)
    assert "mteb_sts" not in results and not (out / MTEB_RESULTS_DIRNAME).exists()
    assert ModelCard.load(out / "export" / "README.md").data.eval_results is None

    table = (out / "results.md").read_text()
    assert "| before training |" in table and "| after training |" in table and "`all`" in table
    assert "STS-B" in table and "SICK-R" in table

    reloaded = SentenceEncoder.from_pretrained(out)
    assert reloaded.config.pooling == "cls" and reloaded.config.head == "mlp"
    assert reloaded.config.head_at_inference is False
    again = STSEvaluator(senteval_dir)(reloaded, batch_size=16)
    for task, value in results["sts"]["after"].items():
        assert again[task] == pytest.approx(value, abs=1e-6), task
    # the saved encoder is the best dev checkpoint
    dev = STSEvaluator(senteval_dir, tasks=("STSBenchmark",), split="dev")(reloaded)
    assert dev["STSBenchmark"] == pytest.approx(results["train"]["best_dev_stsb_spearman"], abs=1e-6)
    # and it was trained
    initial = AutoModel.from_pretrained(str(tiny_bert_dir)).state_dict()
    trained = reloaded.backbone.state_dict()
    key = "encoder.layer.1.output.dense.weight"
    assert not torch.equal(trained[key], initial[key])


@pytest.mark.slow
def test_run_on_senteval_data_claims_mteb_scores(tmp_path, base_values, real_data_dir):
    """On SentEval's own STS data a run scores MTEB's protocol (its own mode-`all` STS12-16/STS-B, SICK-R on all
    9,927 pairs), puts it in the card's model-index and writes MTEB result files that mteb's loader reads."""
    from mteb.results import TaskResult

    out = tmp_path / "out"
    recipe = write_recipe(tmp_path, **{**base_values, "sts_data_dir": str(real_data_dir)},
                          per_device_train_batch_size=4, max_steps=2, eval_steps=2, save_steps=2, use_cpu=True,
                          eval_before_training=False)
    assert main([str(recipe)]) == 0
    results = json.loads((out / "results.json").read_text())
    mteb = results["mteb_sts"]
    assert {t: mteb[t] for t in STS_TASKS[:-1]} == {t: results["sts"]["after"][t] for t in STS_TASKS[:-1]}
    sick = STSEvaluator(real_data_dir, tasks=("SICKRelatedness",),
                        sick_split="all")(SentenceEncoder.from_pretrained(out))
    assert mteb["SICKRelatedness"] == pytest.approx(sick["SICKRelatedness"], abs=1e-6)
    assert mteb["SICKRelatedness"] != pytest.approx(results["sts"]["after"]["SICKRelatedness"], abs=1e-3)
    card = ModelCard.load(out / "export" / "README.md")
    assert [r.metric_value for r in card.data.eval_results] == pytest.approx([mteb[t] for t in STS_TASKS], abs=1e-4)
    folder = out / MTEB_RESULTS_DIRNAME / "results" / "hf_sentcl__out" / "no_revision_available"  # named after the run
    assert TaskResult.from_disk(folder / "SICK-R.json").get_score() * 100 == pytest.approx(mteb["SICKRelatedness"],
                                                                                         abs=1e-3)


@pytest.mark.slow
def test_end_to_end_supervised_with_cli_overrides(tmp_path, tiny_bert_dir, senteval_dir):
    """simcse_sup on a sent0,sent1,hard_neg csv, with overrides from the command line; no evaluation."""
    sentences = random_sentences(24, seed=5)
    rows = ["sent0,sent1,hard_neg"] + [f"{sentences[i]},{sentences[i]} .,{sentences[12 + i]}" for i in range(12)]
    (tmp_path / "nli.csv").write_text("\n".join(rows) + "\n")
    recipe = write_recipe(
        tmp_path, method="simcse_sup", model_name_or_path=str(tiny_bert_dir), train_file=str(tmp_path / "nli.csv"),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "sup"), per_device_train_batch_size=4,
        eval_strategy='"no"', save_strategy='"no"', load_best_model_at_end=False, use_cpu=True,
        eval_before_training=False, eval_tasks=[],
    )
    assert main([str(recipe), "--max_steps", "2", "--hard_negative_weight", "0.5"]) == 0
    results = json.loads((tmp_path / "sup" / "results.json").read_text())
    assert results["method"] == "simcse_sup"
    assert results["train"]["global_step"] == 2
    assert results["sts"] == {}
    assert SentenceEncoder.from_pretrained(tmp_path / "sup").encode(["the cat"]).shape == (1, 32)


def test_a_sharded_save_reloads_in_fp32(tmp_path, tiny_bert_dir):
    """Finding 9 of the multi-process issue: a sharded save may write bf16 weights (FSDP's full state dict of a bf16
    run); the final evaluation and the export read the reloaded encoder in fp32."""
    import torch

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.pipeline.train import load_saved_encoder

    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="none")
    encoder.to(torch.bfloat16).save_pretrained(tmp_path / "saved")
    assert {p.dtype for p in SentenceEncoder.from_pretrained(tmp_path / "saved").parameters()} == {torch.bfloat16}
    assert {p.dtype for p in load_saved_encoder(tmp_path / "saved").parameters()} == {torch.float32}


def test_a_sharded_runs_final_encoder_is_reloaded_onto_the_training_device(tmp_path, tiny_bert_dir, monkeypatch):
    """After FSDP or ZeRO-3 the final encoder is reloaded from output_dir, which from_pretrained builds on the CPU:
    it moves to the device training ran on before it is checked, evaluated and exported (left on the CPU, a GPU run
    encoded the whole final evaluation on the one thread `accelerate launch` gives a process). "meta" stands in for
    a GPU here."""
    from types import SimpleNamespace

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.pipeline import train

    SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="none").save_pretrained(tmp_path / "out")
    device = torch.device("meta")
    stage = SimpleNamespace(
        reloads_saved_encoder=True, dev_evaluator=None,
        args=SimpleNamespace(output_dir=str(tmp_path / "out"), device=device, export_adapter=False),
        trainer=SimpleNamespace(accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None))),
    )
    checked_on = []
    monkeypatch.setattr(train, "_check_trained", lambda encoder, *_: checked_on.append(encoder.device))
    assert train.final_encoder(stage).device == device and checked_on == [device]


def test_the_before_evaluation_runs_on_the_training_device(monkeypatch):
    """Under FSDP and DeepSpeed the Trainer leaves the model on the CPU until train() prepares it: the "before"
    evaluation moves it to the training device and back ("meta" stands in for a GPU)."""
    from types import SimpleNamespace

    from hf_sentcl.pipeline import train

    class Encoder:
        device = torch.device("cpu")
        moves: list[torch.device] = []

        def to(self, device):
            self.device = torch.device(device)
            self.moves.append(self.device)
            return self

    encoder, seen = Encoder(), []
    monkeypatch.setattr(train, "evaluate_suites", lambda model, *_: seen.append(model.device) or "scores")
    monkeypatch.setattr(train, "markdown_report", lambda *_: "table")
    monkeypatch.setattr(train, "embedding_note", lambda *_: "note")
    monkeypatch.setattr(train, "before_evaluation_key", lambda *_: {})  # no scores kept from an earlier launch
    monkeypatch.setattr(train, "read_before_scores", lambda *_: None)
    monkeypatch.setattr(train, "keep_before_scores", lambda *_: None)
    recipe = SimpleNamespace(data=SimpleNamespace(eval_before_training=True, sts_mode="all"))
    stage = SimpleNamespace(recipe=recipe, suites=SimpleNamespace(suites=["sts"]), encoder=encoder, eval_mixed=False,
                            args=SimpleNamespace(device=torch.device("meta"), output_dir="unused"))
    assert train.evaluate_before(stage) == {"before": "scores"}
    assert seen == [torch.device("meta")] and encoder.moves == [torch.device("meta"), torch.device("cpu")]
    stage.args.device = torch.device("cpu")  # already there: not moved
    train.evaluate_before(stage)
    assert encoder.moves == [torch.device("meta"), torch.device("cpu")]
