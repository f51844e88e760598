"""Bad input is refused before any model loads: `hf_sentcl.cli.train.main` exits 2 with one `error:` line that names the
key or file (and line), no traceback, and nothing written. Every case runs in-process with a `from_backbone` that
fails the test if it is called."""

import json
import shutil

import pytest
from helpers import random_sentences

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.train import main
from hf_sentcl.data.checks import count_train_examples
from hf_sentcl.modeling.backbone import BackboneError, backbone_config, max_sequence_length

BATCH = 8


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("\n".join(random_sentences(2 * BATCH, seed=3)) + "\n")
    return path


@pytest.fixture
def recipe(tmp_path, corpus, tiny_bert_dir, senteval_dir):
    """A valid simcse recipe file on the tiny BERT (the cases below break one thing each)."""
    values = dict(
        method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
        sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH,
        max_seq_length=16,
    )
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


@pytest.fixture
def refused(tmp_path, recipe, capsys, monkeypatch):
    """Run main on the recipe plus overrides; assert exit 2, one error line, no traceback, no output_dir, no model
    loaded; return the error line."""

    def no_model(*args, **kwargs):
        pytest.fail("a model was loaded before the input was checked")

    monkeypatch.setattr(SentenceEncoder, "from_backbone", no_model)
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", no_model)

    def run(*overrides: str) -> str:
        code = main([str(recipe), *overrides])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error: ") and "Traceback" not in err
        assert not (tmp_path / "out").exists()
        return err

    return run


def test_the_valid_recipe_passes_the_checks(recipe, monkeypatch):
    """The base recipe is fine, so each case below fails for its own reason only."""
    from hf_sentcl.recipe.checks import validate_recipe
    from hf_sentcl.recipe.parser import parse_recipe

    validate_recipe(parse_recipe(recipe))


def test_torch_compile_without_bounded_padding_warns(recipe):
    """transformers' torch_compile recompiles for every new padded batch length; without pad_to_multiple_of the
    check says so (and names the key), with it the recipe is quiet."""
    import warnings

    from hf_sentcl.recipe.checks import validate_recipe
    from hf_sentcl.recipe.parser import parse_recipe

    with pytest.warns(UserWarning, match="'pad_to_multiple_of' is unset"):
        validate_recipe(parse_recipe(recipe, torch_compile=True, torch_compile_mode="reduce-overhead"))
    for overrides in ({"torch_compile": True, "pad_to_multiple_of": 8}, {}):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*pad_to_multiple_of.*")
            validate_recipe(parse_recipe(recipe, **overrides))


# ------------------------------------------------------------------------------------------ training text
@pytest.mark.parametrize("content, message", [(b"", "no usable training text (empty)"),
                                              (b"\n  \n\t\n\n", "no usable training text (blank lines only)")])
def test_empty_or_blank_train_file(tmp_path, refused, content, message):
    path = tmp_path / "blank.txt"
    path.write_bytes(content)
    err = refused("--train_file", str(path))
    assert message in err and str(path) in err


def test_non_utf8_train_file_names_the_line(tmp_path, refused):
    path = tmp_path / "latin1.txt"
    path.write_bytes("a first line\nthe second line\nun caf\u00e9 noir\nlast\n".encode("latin-1"))
    err = refused("--train_file", str(path))
    assert "is not UTF-8 text: line 3" in err and "0xe9" in err and str(path) in err


def test_one_sentence_is_fewer_than_one_global_batch(tmp_path, refused):
    """One sentence used to train with loss 0 (no negative) and export an unchanged model."""
    path = tmp_path / "one.txt"
    path.write_text("a single sentence\n")
    err = refused("--train_file", str(path))
    assert "has 1 usable example(s)" in err and f"fewer than one global batch of {BATCH}" in err
    assert "per_device_train_batch_size" in err


def test_max_train_samples_below_one_batch(refused):
    err = refused("--max_train_samples", "3")
    assert "max_train_samples keeps 3" in err and f"global batch of {BATCH}" in err


@pytest.mark.parametrize("name, content, message", [
    ("corpus.parquetx", "a line\n", "unsupported extension '.parquetx'"),
    ("pairs.csv", "sent0,sent1\n", "no usable training examples (no rows below its header)"),
    ("pairs.json", "[1, 2", "not valid JSON (line 1"),
])
def test_unusable_train_file_types(tmp_path, refused, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    err = refused("--train_file", str(path))
    assert message in err and str(path) in err


def test_count_train_examples_per_format(tmp_path):
    """Usable examples: non-blank lines, non-blank csv/tsv rows below the header, JSON lines or list items."""
    cases = {
        "a.txt": ("one\n\n two \n   \nthree", 3),
        "a.csv": ('sent0,sent1\nx,y\n,\n"multi\nline",z\n', 2),
        "a.tsv": ("text\nx\n\ny\n", 2),
        "a.jsonl": ('{"text": "x"}\n\n{"text": "y"}\n', 2),
        "a.json": ('[{"text": "x"}, {"text": "y"}, {"text": "z"}]', 3),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        assert count_train_examples(path) == expected, name


# ------------------------------------------------------------------------------------------ numbers
@pytest.mark.parametrize("value, message", [
    (".nan", "key 'temperature' is nan"),
    (".inf", "key 'temperature' is inf"),
    ("0", "temperature must be a finite number in (0, inf)"),
    ("-0.05", "temperature must be a finite number in (0, inf)"),
])
def test_temperature(refused, value, message):
    assert message in refused("--temperature", value)


@pytest.mark.parametrize("value, message", [
    ("1e3", "learning_rate must be a finite number in (0, 10.0], got 1000.0"),
    ("-1e-3", "learning_rate must be a finite number in (0, 10.0], got -0.001"),
    ("0", "learning_rate must be a finite number in (0, 10.0]"),
    (".nan", "key 'learning_rate' is nan"),
])
def test_learning_rate(refused, value, message):
    err = refused("--learning_rate", value)
    assert f"error: command line: {message}" in err


@pytest.mark.parametrize("value", ["0", "1", "2", "-5"])
def test_max_seq_length_below_three(refused, value):
    assert f"max_seq_length must be at least 3 tokens ([CLS], a word, [SEP]), got {value}" in refused(
        "--max_seq_length", value
    )


def test_max_seq_length_above_the_models_positions(refused, tiny_bert_dir):
    """The tiny BERT has 64 position embeddings (read from config.json, without loading the weights)."""
    err = refused("--max_seq_length", "100")
    assert "key 'max_seq_length' is 100" in err and "position embeddings for 64 tokens" in err


@pytest.mark.parametrize("overrides, message", [
    (["--perturbation", "p+", "--margin", "5"], "margin must be a finite number in [0, 1.0], got 5.0"),
    (["--perturbation", "p+", "--margin", "-0.1"], "margin must be >= 0"),
    (["--dropout", "1.5"], "dropout must be a finite number in [0, 1), got 1.5"),
    (["--weight_decay", ".nan"], "key 'weight_decay' is nan"),
])
def test_out_of_range_numbers(refused, overrides, message):
    assert message in refused(*overrides)


def test_consert_rates(tmp_path, refused):
    err = refused("--method", "consert", "--token_cutoff_rate", "1.5", "--head", "none")
    assert "token_cutoff_rate must be a finite number in [0, 1), got 1.5" in err


# ------------------------------------------------------------------------------------------ choices and keys
@pytest.mark.parametrize("overrides, message", [
    (["--pooling", "meen"], "key 'pooling' must be one of cls, cls_before_pooler, mean, max, first_last_avg, "
                            "last2_avg, prompt; got 'meen' (did you mean 'mean'?)"),
    (["--head", "mpl"], "key 'head' must be one of none, mlp; got 'mpl' (did you mean 'mlp'?)"),
    (["--sts_mode", "average"], "key 'sts_mode' must be one of all, mean, wmean; got 'average'"),
    (["--inference_pooling", "last_avg"], "did you mean 'last2_avg'?"),
    (["--margin_type", "adaptive"], "key 'margin_type' must be one of constant, dynamic"),
])
def test_unknown_choices(refused, overrides, message):
    err = refused(*overrides)
    assert message in err and "command line" in err


def test_empty_output_dir(refused):
    """`--output_dir ""` used to train into ./trainer_output."""
    assert "key 'output_dir' is empty" in refused("--output_dir", "")


# ------------------------------------------------------------------------------------------ model path
def test_relative_model_path_that_does_not_exist(refused, tmp_path, monkeypatch):
    """A relative path of the Hub-id form is looked up both ways, and the message says so (offline here)."""
    monkeypatch.chdir(tmp_path)
    err = refused("--model_name_or_path", "models/my-bert")
    assert f"no local folder '{tmp_path / 'models' / 'my-bert'}'" in err
    assert "Hub model 'models/my-bert' cannot be looked up (HF_HUB_OFFLINE is set" in err


def test_path_that_cannot_be_a_hub_id(refused, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused("--model_name_or_path", "./checkpoints/run1/best")
    assert "model_name_or_path './checkpoints/run1/best': no folder" in err and "not a Hub id" in err


def test_folder_that_is_not_a_model(refused, tmp_path, tiny_bert_dir):
    folder = tmp_path / "runs"
    shutil.copytree(tiny_bert_dir, folder / "final")
    err = refused("--model_name_or_path", str(folder))
    assert f"the folder '{folder}' is not a model, it has no config.json (looked for {folder / 'config.json'})" in err
    assert f"{folder / 'final'} hold one" in err


def test_config_without_weights(refused, tmp_path, tiny_bert_dir):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    shutil.copy(tiny_bert_dir / "config.json", folder / "config.json")
    err = refused("--model_name_or_path", str(folder))
    assert "has config.json but no weights (looked for model.safetensors, model.safetensors.index.json" in err


def test_config_without_model_type(tmp_path, tiny_bert_dir):
    folder = tmp_path / "typeless"
    shutil.copytree(tiny_bert_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BackboneError, match="has no 'model_type'"):
        backbone_config(str(folder))


def test_position_limit_of_roberta_skips_the_padding_offset(tiny_roberta_dir, tiny_bert_dir):
    """RoBERTa's positions start after padding_idx (64 embeddings, pad 1 -> 62 tokens); BERT's do not."""
    assert max_sequence_length(backbone_config(str(tiny_roberta_dir))) == 62
    assert max_sequence_length(backbone_config(str(tiny_bert_dir))) == 64
    assert max_sequence_length({"model_type": "t5"}) is None


def test_a_global_batch_below_two_is_refused_naming_the_key(refused):
    """The trainer's own rule (`ContrastiveTrainer.check_global_batch`), applied before the model loads."""
    err = refused("--per_device_train_batch_size", "1")
    assert "key 'per_device_train_batch_size' is 1 on 1 process(es)" in err and "need at least 2" in err
