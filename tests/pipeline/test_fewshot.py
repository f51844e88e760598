"""Few-shot training (ConSERT section 5.3): the seeded random subset of the training texts, its wiring into the
plain-text and NLI loaders, and the `hf-sentcl sweep --subset-sizes` sweep end to end on the tiny BERT."""

import dataclasses
import json

import numpy as np
import pytest
from datasets import Dataset
from helpers import random_sentences

from hf_sentcl.cli.sweep import main
from hf_sentcl.configs import DataArguments
from hf_sentcl.data.corpus import load_training_dataset, random_subset
from hf_sentcl.evaluation.plots import plot_fewshot_curve
from hf_sentcl.evaluation.sts import unlabeled_sts_sentences
from hf_sentcl.pipeline.sweep import parse_sizes, split_fewshot_argv, summarize_sweep, sweep_markdown
from hf_sentcl.recipe.parser import RecipeError


def numbered(n):
    return Dataset.from_dict({"text": [f"sentence {i}" for i in range(n)]})


@pytest.mark.slow
def test_random_subset_is_seeded_uniform_and_in_order():
    dataset = numbered(50)
    a, b, c = (random_subset(dataset, 10, seed) for seed in (1, 1, 2))
    assert a["text"] == b["text"] and a["text"] != c["text"]
    indices = [int(t.split()[1]) for t in a["text"]]
    assert len(set(indices)) == 10 and indices == sorted(indices)
    expected = np.sort(np.random.default_rng(1).choice(50, size=10, replace=False))
    assert indices == expected.tolist()
    assert random_subset(dataset, None, 1) is dataset
    assert len(random_subset(dataset, 50, 3)) == 50
    with pytest.raises(ValueError, match="train_subset_size 51"):
        random_subset(dataset, 51, 0)
    # every example is drawn about equally often over many seeds
    counts = np.zeros(50)
    for seed in range(400):
        counts[[int(t.split()[1]) for t in random_subset(dataset, 5, seed)["text"]]] += 1
    assert counts.min() > 10 and counts.max() < 75  # expected 40 each


def test_subset_of_the_unlabeled_sts_texts_and_first_n_unchanged(senteval_dir):
    """train_subset_size draws from the whole corpus; max_train_samples still keeps the first N."""
    everything = unlabeled_sts_sentences(senteval_dir, "all")
    args = dict(unlabeled_sts="all", sts_data_dir=str(senteval_dir))
    subset = load_training_dataset(DataArguments(**args, train_subset_size=7, train_subset_seed=3), ("text",))
    rows = np.sort(np.random.default_rng(3).choice(len(everything), size=7, replace=False))
    assert subset["text"] == [everything[i] for i in rows]
    first = load_training_dataset(DataArguments(**args, max_train_samples=7), ("text",))
    assert first["text"] == everything[:7]
    with pytest.raises(ValueError, match="train_subset_size"):
        DataArguments(**args, train_subset_size=0)


@pytest.mark.slow
def test_subset_of_the_nli_pairs(tmp_path, tiny_bert_dir):
    from transformers import AutoTokenizer

    from hf_sentcl.data.nli import NLITrainData, load_nli_pairs, resolve_nli_source

    path = tmp_path / "pairs.csv"
    sentences = random_sentences(40, seed=4)
    path.write_text("premise,hypothesis,label\n" + "".join(
        f"{sentences[2 * i]},{sentences[2 * i + 1]},{i % 3}\n" for i in range(20)))
    source = resolve_nli_source(str(path), None, None, None)
    data = NLITrainData(source, max_seq_length=16, subset_size=6, subset_seed=5)
    dataset, views, _ = data.build(AutoTokenizer.from_pretrained(tiny_bert_dir))
    rows = np.sort(np.random.default_rng(5).choice(20, size=6, replace=False))
    assert len(dataset) == 6 and views == 2
    assert dataset["labels"] == [load_nli_pairs(source)["label"][i] for i in rows]


def test_parse_sizes_and_argv(tmp_path):
    assert parse_sizes("100,1,10") == [1, 10, 100]
    for bad in ("", "0,10", "10,10", "a"):
        with pytest.raises(RecipeError, match="subset-sizes"):
            parse_sizes(bad)
    assert split_fewshot_argv(["r.yaml", "--subset-sizes", "10,100", "--seeds", "1,2", "--max_steps", "5"]) == (
        "r.yaml", [10, 100], [1, 2], None, ["--max_steps", "5"])
    with pytest.raises(RecipeError, match="both needed"):
        split_fewshot_argv(["r.yaml", "--subset-sizes", "10"])
    with pytest.raises(RecipeError, match="train_subset_size"):
        split_fewshot_argv(["r.yaml", "--subset-sizes", "10", "--seeds", "1", "--train_subset_size", "3"])
    with pytest.raises(RecipeError, match="full-results"):
        split_fewshot_argv(["r.yaml", "--subset-sizes", "10", "--seeds", "1", "--full-results", str(tmp_path / "x")])
    # what the summary reads of --full-results and of the sizes, refused before any run trains (not after all)
    for name, content, words in (("bad.json", "{not json", "cannot be read as JSON"),
                                 ("evaluate.json", json.dumps({"model": "m", "tasks": ["sts"], "Avg": 70.0}),
                                  "holds no STS scores after training"),
                                 ("run.json", json.dumps({"sts": {"after": {"Avg": 70.0}}}), None)):
        (tmp_path / name).write_text(content)
        argv = ["r.yaml", "--subset-sizes", "10", "--seeds", "1", "--full-results", str(tmp_path / name)]
        if words is None:
            assert split_fewshot_argv(argv)[3] == str(tmp_path / name)
            continue
        with pytest.raises(RecipeError, match=f"--full-results .*{words}"):
            split_fewshot_argv(argv)
    with pytest.raises(RecipeError, match="no size is at least 2"):
        split_fewshot_argv(["r.yaml", "--subset-sizes", "1", "--seeds", "1"])


def fake(avg, examples, before=None):
    sts = {"after": {"STS12": avg - 1, "STSBenchmark": avg + 1, "Avg": avg}}
    if before:
        sts["before"] = before
    return {"sts": sts, "sts_mode": "all", "training_data": {"examples": examples}}


@pytest.mark.slow
def test_summary_table_and_plot(tmp_path):
    before = {"STS12": 60.0, "STSBenchmark": 62.0, "Avg": 61.0}
    results = {(10, 1): fake(62.0, 10, before), (10, 2): fake(64.0, 10), (100, 1): fake(70.0, 100),
               (100, 2): fake(71.0, 100)}
    summary = summarize_sweep(results, [1], fake(72.0, 500))
    assert summary["sizes"]["10"]["Avg"]["mean"] == 63.0
    assert summary["sizes"]["10"]["Avg"]["std"] == pytest.approx(np.std([62.0, 64.0], ddof=1))
    assert summary["sizes"]["100"]["seeds"] == [1, 2] and summary["before"] == before
    assert summary["full"]["Avg"] == 72.0 and summary["full_examples"] == 500 and "1" in summary["skipped"]
    table = sweep_markdown(summary)
    assert "| 10 | 2 | 62.00 ± 1.41 | 64.00 ± 1.41 | 63.00 ± 1.41 |" in table
    assert "| 0 (untouched) |" in table and "| 500 (full) |" in table and "Size 1: skipped" in table
    path = plot_fewshot_curve({10: (63.0, 1.4), 100: (70.5, 0.7)}, tmp_path / "f.png", before=61.0, full=72.0)
    assert path.stat().st_size > 1000


@pytest.mark.slow
def test_sweep_end_to_end(tmp_path, tiny_bert_dir, senteval_dir, capsys):
    """Sizes 1, 4, 16 x seeds 1, 2 plus the full-data run: size 1 is skipped, the batch is min(batch, N), every run
    trains on its own seeded subset, and fewshot.json / .md / .png hold the per-size means."""
    train = tmp_path / "train.txt"
    train.write_text("\n".join(random_sentences(40, seed=3)) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\npooling: mean\ntrain_file: {train}\n"
        f"sts_data_dir: {senteval_dir}\noutput_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 8\n"
        "max_steps: 2\neval_strategy: 'no'\nsave_strategy: 'no'\nload_best_model_at_end: false\n"
        "learning_rate: 1.0e-3\nuse_cpu: true\ndisable_tqdm: true\n"
    )
    assert main([str(recipe), "--subset-sizes", "1,4,16", "--seeds", "1,2"]) == 0
    out = tmp_path / "out"
    summary = json.loads((out / "fewshot.json").read_text())
    assert set(summary["sizes"]) == {"4", "16"} and "1" in summary["skipped"]
    assert summary["sizes"]["4"]["examples"] == [4, 4] and summary["full_examples"] == 40
    runs = {(n, s): json.loads((out / f"size-{n}" / f"seed-{s}" / "results.json").read_text())
            for n in (4, 16) for s in (1, 2)}
    assert "before" in runs[4, 1]["sts"] and "before" not in runs[16, 2]["sts"]
    assert runs[4, 1]["training_data"]["train_subset_seed"] == 1
    assert runs[4, 1]["train"]["train_loss"] != runs[4, 2]["train"]["train_loss"]
    avg = [runs[16, s]["sts"]["after"]["Avg"] for s in (1, 2)]
    assert summary["sizes"]["16"]["Avg"]["mean"] == pytest.approx(np.mean(avg))
    assert (out / "fewshot.png").is_file() and "(full)" in (out / "fewshot.md").read_text()
    full = json.loads((out / "full" / "results.json").read_text())
    assert summary["full"]["Avg"] == pytest.approx(full["sts"]["after"]["Avg"])
    assert main([str(recipe), "--subset-sizes", "41", "--seeds", "1"]) == 2  # larger than the 40 texts

    # A rerun with one more seed reuses the finished runs (and the full-data run) and trains only the new one ...
    stamps = {key: (out / f"size-{key[0]}" / f"seed-{key[1]}" / "results.json").stat().st_mtime_ns for key in runs}
    assert main([str(recipe), "--subset-sizes", "4,16", "--seeds", "1,2,3"]) == 0
    assert stamps == {key: (out / f"size-{key[0]}" / f"seed-{key[1]}" / "results.json").stat().st_mtime_ns
                      for key in runs}
    summary = json.loads((out / "fewshot.json").read_text())
    assert summary["sizes"]["16"]["seeds"] == [1, 2, 3]
    assert summary["sizes"]["16"]["Avg"]["values"][:2] == pytest.approx(avg)
    # Display and evaluation-only settings do not count (a run logged without a terminal sets disable_tqdm),
    # a training setting does.
    from hf_sentcl.pipeline.sweep import finished_results
    from hf_sentcl.recipe.parser import parse_recipe

    def rerun(eval_before_training=False, **changes):
        recipe_16_2 = parse_recipe(
            recipe, seed=2, train_subset_size=16, train_subset_seed=2, output_dir=str(out / "size-16" / "seed-2"),
            eval_before_training=eval_before_training,
        )
        return finished_results(dataclasses.replace(
            recipe_16_2, training=dataclasses.replace(recipe_16_2.training, **changes)))

    assert rerun()["train"] == runs[16, 2]["train"]
    assert rerun(disable_tqdm=False) is not None and rerun(eval_before_training=True) is not None
    assert rerun(learning_rate=2e-3) is None
    # ... while a finished run with other training settings is refused before anything trains.
    (out / "size-4" / "seed-9").mkdir()
    (out / "size-4" / "seed-9" / "results.json").write_text(json.dumps({"recipe_settings": {"method": "simcse"}}))
    assert main([str(recipe), "--subset-sizes", "4", "--seeds", "9", "--full-results", str(out / "full" /
                "results.json")]) == 2
    assert "seed-9' already holds a run" in capsys.readouterr().err
    assert not (out / "size-4" / "seed-9" / "model.safetensors").exists()
