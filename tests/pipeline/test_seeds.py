"""The multi-seed runner: argument handling, the mean/std summary, and an end-to-end run on the tiny BERT."""

import json
import statistics

import pytest
from helpers import random_sentences

from hf_sentcl.cli.sweep import main
from hf_sentcl.pipeline.sweep import parse_seeds, split_argv, summarize, summary_markdown
from hf_sentcl.recipe.parser import RecipeError


def test_parse_seeds():
    assert parse_seeds("1,2,3") == [1, 2, 3]
    assert parse_seeds("7") == [7]
    for bad, match in (("1,x", "comma-separated integers"), ("", "empty"), ("1,1", "repeats")):
        with pytest.raises(RecipeError, match=match):
            parse_seeds(bad)


def test_split_argv():
    assert split_argv(["r.yaml", "--seeds", "1,2", "--margin", "0.1"]) == ("r.yaml", [1, 2], ["--margin", "0.1"])
    assert split_argv(["r.yaml", "--bf16", "--seeds=3"]) == ("r.yaml", [3], ["--bf16"])
    with pytest.raises(RecipeError, match="--seeds is missing"):
        split_argv(["r.yaml", "--margin", "0.1"])
    with pytest.raises(RecipeError, match="conflicts with --seeds"):
        split_argv(["r.yaml", "--seeds", "1,2", "--seed", "5"])
    with pytest.raises(RecipeError, match="first argument must be the recipe"):
        split_argv(["--seeds", "1", "r.yaml"])


def fake_result(avg, runtime, alignment, before=None):
    sts = {"after": {"STS12": avg - 1, "STSBenchmark": avg + 1, "Avg": avg}}
    if before:
        sts["before"] = before
    curve = [{"step": 16, "eval_alignment": 9.0, "eval_uniformity": -1.0},
             {"step": 32, "eval_alignment": alignment, "eval_uniformity": -2.0}]
    train = {"train_runtime": runtime, "train_samples_per_second": 100 / runtime, "best_dev_stsb_spearman": avg,
             "best_step": 32, "dev_curve": curve}
    return {"recipe": "r.yaml", "method": "simcse", "sts_mode": "all", "sts": sts, "train": train}


def test_summarize_mean_and_sample_std():
    """Mean and sample std (ddof=1) per task and per training figure; dev alignment read at the best step."""
    before = {"STS12": 1.0, "STSBenchmark": 2.0, "Avg": 1.5}
    results = {1: fake_result(70.0, 10.0, 0.2, before), 2: fake_result(72.0, 12.0, 0.3),
               3: fake_result(77.0, 11.0, 0.4)}
    summary = summarize(results)
    assert list(summary["after"]) == ["STS12", "STSBenchmark", "Avg"]
    assert summary["after"]["Avg"]["mean"] == pytest.approx(73.0)
    assert summary["after"]["Avg"]["std"] == pytest.approx(statistics.stdev([70.0, 72.0, 77.0]))
    assert summary["after"]["STS12"]["values"] == [69.0, 71.0, 76.0]
    assert summary["train"]["train_runtime"]["mean"] == pytest.approx(11.0)
    assert summary["train"]["dev_alignment"]["values"] == [0.2, 0.3, 0.4]
    assert summary["before"] == before and summary["seeds"] == [1, 2, 3]
    table = summary_markdown(summary)
    assert "| **mean ± std** |" in table and f"73.00 ± {statistics.stdev([70.0, 72.0, 77.0]):.2f}" in table
    assert summarize({5: fake_result(70.0, 10.0, 0.2)})["after"]["Avg"]["std"] is None  # one seed: no std


def write_recipe(tmp_path, tiny_bert_dir, senteval_dir):
    train = tmp_path / "train.txt"
    train.write_text("\n".join(random_sentences(32, seed=3)) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\npooling: mean\ntrain_file: {train}\n"
        f"sts_data_dir: {senteval_dir}\noutput_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 16\n"
        "eval_steps: 1\nsave_steps: 1\nlogging_steps: 1\nlearning_rate: 1.0e-3\nuse_cpu: true\ndisable_tqdm: true\n"
    )
    return recipe


@pytest.mark.slow
def test_end_to_end_two_seeds(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    """Two seeds with CLI overrides: one run folder per seed, "before" evaluated once, seeds.json/md written with
    the per-seed results and their mean; the seed really changes the run."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    assert main([str(recipe), "--seeds", "3,4", "--perturbation", "p+n-", "--margin", "0.05"]) == 0
    out = tmp_path / "out"
    per_seed = {s: json.loads((out / f"seed-{s}" / "results.json").read_text()) for s in (3, 4)}
    assert "before" in per_seed[3]["sts"] and "before" not in per_seed[4]["sts"]
    assert per_seed[3]["train"]["train_loss"] != per_seed[4]["train"]["train_loss"]
    assert {"eval_alignment", "eval_uniformity"} <= set(per_seed[3]["train"]["dev_curve"][0])
    summary = json.loads((out / "seeds.json").read_text())
    assert summary["seeds"] == [3, 4] and summary["overrides"] == ["--perturbation", "p+n-", "--margin", "0.05"]
    avg = [per_seed[s]["sts"]["after"]["Avg"] for s in (3, 4)]
    assert summary["after"]["Avg"]["values"] == pytest.approx(avg)
    assert summary["after"]["Avg"]["mean"] == pytest.approx(sum(avg) / 2)
    assert summary["after"]["Avg"]["std"] == pytest.approx(statistics.stdev(avg))
    assert "| **mean ± std** |" in (out / "seeds.md").read_text()


def test_bad_override_fails_before_training(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    """An invalid override is reported (exit 2, key named) before any seed runs."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    assert main([str(recipe), "--seeds", "1,2", "--perturbation", "x+", "--margin", "0.1"]) == 2
    assert "key 'perturbation'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_rerun_reuses_finished_seed_runs(tmp_path, tiny_bert_dir, senteval_dir):
    """A rerun with one more seed reads the finished seed's results.json back instead of training it again (without
    the reuse its output_dir would be refused as holding a run), and seeds.json holds both seeds."""
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    fast = ["--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false"]
    assert main([str(recipe), "--seeds", "3", *fast]) == 0
    out = tmp_path / "out"
    first = out / "seed-3" / "results.json"
    stamp, avg = first.stat().st_mtime_ns, json.loads(first.read_text())["sts"]["after"]["Avg"]
    assert main([str(recipe), "--seeds", "3,4", *fast]) == 0
    assert first.stat().st_mtime_ns == stamp and (out / "seed-4" / "results.json").is_file()
    summary = json.loads((out / "seeds.json").read_text())
    assert summary["seeds"] == [3, 4] and summary["after"]["Avg"]["values"][0] == pytest.approx(avg)


@pytest.mark.slow
def test_a_seed_whose_export_failed_fails_the_sweep_after_its_summary(tmp_path, tiny_bert_dir, senteval_dir,
                                                                     monkeypatch, capsys):
    """One seed's export fails: the sweep still writes seeds.json from both seeds' scores, then exits 1 naming the
    run and its error, as `hf_sentcl.run` exits 1 for that run; a rerun that reuses the run exits 1 again."""
    from hf_sentcl.export import publish
    from hf_sentcl.export.plan import ExportError

    export_run = publish.export_run

    def failing_for_seed_4(encoder, results, output_dir, **kwargs):
        if output_dir.endswith("seed-4"):
            raise ExportError("the export check failed (injected).")
        return export_run(encoder, results, output_dir, **kwargs)

    monkeypatch.setattr(publish, "export_run", failing_for_seed_4)
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir)
    fast = ["--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false"]
    assert main([str(recipe), "--seeds", "3,4", *fast]) == 1
    out = tmp_path / "out"
    assert json.loads((out / "seeds.json").read_text())["seeds"] == [3, 4]
    assert (out / "seed-3" / "export").is_dir() and not (out / "seed-4" / "export").exists()
    assert f"error: run {out / 'seed-4'}: the export check failed (injected)." in capsys.readouterr().err.splitlines()
    monkeypatch.setattr(publish, "export_run", export_run)
    assert main([str(recipe), "--seeds", "3,4", *fast]) == 1  # reused, still without its export
    assert "seed-3:" not in capsys.readouterr().err
