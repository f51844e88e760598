"""A training file without the columns its method reads is refused before any model loads: `hf_sentcl.cli.train.main`
exits 2 with one `error:` line naming the recipe, the file, the missing column(s), the file's columns and the method's;
the loader applies the same rule (`hf_sentcl.data.corpus.method_columns`) to every source when the data loads.

Each case runs in-process with `SentenceEncoder.from_backbone`/`from_pretrained` replaced by a function that fails
the test if it is called (tests/recipe/test_preflight.py's style)."""

import csv

import pytest
from helpers import random_sentences, write_yaml_recipe

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main
from hf_sentcl.configs import DataArguments
from hf_sentcl.data.corpus import load_training_data
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.registry import get_method

BATCH = 4


def write_table(path, header, rows=3 * BATCH, delimiter=","):
    """A table of `rows` rows of random sentences under `header`."""
    sentences = random_sentences(rows * len(header), seed=5)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(sentences[i::rows] for i in range(rows))
    return path


@pytest.fixture
def run_recipe(tmp_path, tiny_bert_dir, senteval_dir, capsys, monkeypatch):
    """Run main on a recipe of `method` and `train_file` on the tiny BERT, with any model load failing the test;
    return (exit status, stderr)."""

    def no_model(*args, **kwargs):
        pytest.fail("a model was loaded before the training file's columns were checked")

    monkeypatch.setattr(SentenceEncoder, "from_backbone", no_model)
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", no_model)

    def run(method, train_file, **extra):
        recipe = write_yaml_recipe(
            tmp_path, method=method, model_name_or_path=tiny_bert_dir, train_file=train_file,
            sts_data_dir=senteval_dir, output_dir=tmp_path / "out", per_device_train_batch_size=BATCH,
            max_seq_length=16, **extra,
        )
        code = main([str(recipe)])
        return code, capsys.readouterr().err, recipe

    return run


def assert_refused(code, err, recipe, tmp_path):
    """Exit 2, one `error:` line naming the recipe, no traceback, nothing written."""
    assert code == 2, err
    assert err.startswith(f"error: {recipe}: train_file '") and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_supervised_simcse_on_foo_bar_baz_is_refused_before_the_model_loads(run_recipe, tmp_path):
    """The issue's case: header foo,bar,baz for simcse_sup (sent0, sent1[, hard_neg])."""
    data = write_table(tmp_path / "train.csv", ["foo", "bar", "baz"])
    code, err, recipe = run_recipe("simcse_sup", data)
    assert_refused(code, err, recipe, tmp_path)
    assert f"train_file '{data}' has no columns 'sent0', 'sent1'" in err
    assert "its columns are 'foo', 'bar', 'baz'" in err
    assert "method 'simcse_sup' reads 'sent0', 'sent1' and, where present, 'hard_neg'" in err


@pytest.mark.parametrize("name, header, method, missing", [
    ("pairs.csv", ["sent0", "hard_neg"], "simcse_sup", "has no column 'sent1'"),
    ("pairs.tsv", ["premise", "hypothesis"], "simcse_sup", "has no columns 'sent0', 'sent1'"),
    ("train.txt", None, "simcse_sup", "has no columns 'sent0', 'sent1': its columns are 'text'"),
    ("nli.csv", ["sentence", "label"], "simcse", "has no column 'text': its columns are 'sentence', 'label'"),
])
def test_other_files_without_the_methods_columns(run_recipe, tmp_path, name, header, method, missing):
    """A missing partner column, a .tsv, a plain .txt for a pair method, a one-sentence method's CSV without `text`."""
    path = tmp_path / name
    if header is None:
        path.write_text("\n".join(random_sentences(3 * BATCH, seed=2)) + "\n")
    else:
        write_table(path, header, delimiter="\t" if name.endswith(".tsv") else ",")
    code, err, recipe = run_recipe(method, path)
    assert_refused(code, err, recipe, tmp_path)
    assert f"train_file '{path}' {missing}" in err and f"method '{method}'" in err


def test_files_with_the_methods_columns_pass(tmp_path, tiny_bert_dir, senteval_dir):
    """Triplets and pairs for simcse_sup, and a one-sentence CSV read through `text_column`, pass the checks."""
    cases = [("simcse_sup", ["sent0", "sent1", "hard_neg"], {}), ("simcse_sup", ["sent1", "sent0"], {}),
             ("simcse", ["id", "sentence"], {"text_column": "sentence"}), ("simcse", ["text"], {})]
    for number, (method, header, extra) in enumerate(cases):
        data = write_table(tmp_path / f"train{number}.csv", header)
        recipe = write_yaml_recipe(
            tmp_path, method=method, model_name_or_path=tiny_bert_dir, train_file=data, sts_data_dir=senteval_dir,
            output_dir=tmp_path / "out", per_device_train_batch_size=BATCH, max_seq_length=16, **extra,
        )
        validate_recipe(parse_recipe(recipe))


def test_the_loader_applies_the_same_rule(tmp_path):
    """load_training_data (every source, .json(l) too) refuses with the same words as the check before the model
    loads; a column named by `text_column` is read as `text`."""
    spec = get_method("simcse_sup")
    data = write_table(tmp_path / "train.csv", ["foo", "bar", "baz"])
    with pytest.raises(ValueError, match=r"has no columns 'sent0', 'sent1': its columns are 'foo', 'bar', 'baz'"):
        load_training_data(DataArguments(train_file=str(data)), spec.text_columns, spec.optional_text_columns)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(f'{{"foo": "{s}"}}\n' for s in random_sentences(BATCH, seed=1)))
    with pytest.raises(ValueError, match=r"has no columns 'sent0', 'sent1': its columns are 'foo'"):
        load_training_data(DataArguments(train_file=str(jsonl)), spec.text_columns, spec.optional_text_columns)
    data = write_table(tmp_path / "sentences.csv", ["id", "sentence"])
    dataset, _ = load_training_data(DataArguments(train_file=str(data), text_column="sentence"), ("text",))
    assert dataset.column_names == ["text"] and len(dataset) == 3 * BATCH


def test_json_records_and_datasets_without_the_methods_columns_are_refused(run_recipe, tmp_path, tiny_bert_dir,
                                                                          senteval_dir):
    """A .jsonl file's keys and a `dataset_name` dataset's columns are read from their first example (streamed), so
    they too are refused before any model loads; a dataset with the columns passes."""
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(f'{{"foo": "{s}"}}\n' for s in random_sentences(3 * BATCH, seed=1)))
    code, err, recipe = run_recipe("simcse_sup", jsonl)
    assert_refused(code, err, recipe, tmp_path)
    assert f"train_file '{jsonl}' has no columns 'sent0', 'sent1': its columns are 'foo'" in err
    folder = tmp_path / "pairs"
    folder.mkdir()
    write_table(folder / "train.csv", ["premise", "hypothesis"])
    values = dict(method="simcse_sup", model_name_or_path=tiny_bert_dir, dataset_name=str(folder),
                  sts_data_dir=senteval_dir, output_dir=tmp_path / "out", per_device_train_batch_size=BATCH)
    with pytest.raises(RecipeError, match=rf"dataset '{folder}' has no columns 'sent0', 'sent1': its columns are "
                                          r"'premise', 'hypothesis'"):
        validate_recipe(parse_recipe(write_yaml_recipe(tmp_path, **values)))
    with pytest.raises(RecipeError, match=r"dataset '.*missing' cannot be read"):
        missing = {**values, "dataset_name": str(tmp_path / "missing")}
        validate_recipe(parse_recipe(write_yaml_recipe(tmp_path, **missing)))
    write_table(folder / "train.csv", ["anchor", "positive"])  # sentence-transformers' names: read as sent0, sent1
    validate_recipe(parse_recipe(write_yaml_recipe(tmp_path, **values)))
