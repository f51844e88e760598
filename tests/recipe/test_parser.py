"""Recipe parsing: YAML -> dataclasses -> CLI overrides, with errors that name the key at fault."""

from pathlib import Path

import pytest

from hf_sentcl.configs import DataArguments, ModelArguments
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.registry import METHODS

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_recipes_directory_is_not_empty():
    """The glob below really finds recipes (so the parametrised test cannot pass vacuously)."""
    assert any(p.name == "quickstart.yaml" for p in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_parses(recipe, monkeypatch, tmp_path):
    """Every recipe in recipes/ parses into the registered method's config with the values it writes."""
    monkeypatch.setenv("HF_SENTCL_DATA", str(tmp_path / "senteval"))
    parsed = parse_recipe(recipe)
    assert parsed.method in METHODS
    assert isinstance(parsed.model, ModelArguments)
    assert isinstance(parsed.data, DataArguments)
    assert type(parsed.training) is METHODS[parsed.method].config_class
    assert isinstance(parsed.training.learning_rate, float) and parsed.training.learning_rate > 0
    assert isinstance(parsed.training.per_device_train_batch_size, int)
    assert parsed.training.output_dir
    # variables are expanded
    if parsed.data.train_file is not None:
        assert "${" not in parsed.data.train_file


def test_quickstart_values_and_expansion(monkeypatch, tmp_path, repo_root):
    """quickstart.yaml: YAML's `3.0e-5` is a float, the corpus is on the Hub, `${HF_SENTCL_DATA}` in an override is
    expanded, pooling/bf16 values kept."""
    monkeypatch.setenv("HF_SENTCL_DATA", "/data/senteval")
    recipe = parse_recipe(repo_root / "recipes" / "quickstart.yaml")
    assert recipe.method == "simcse"
    assert isinstance(recipe.training, SimCSEConfig)
    assert recipe.training.learning_rate == pytest.approx(3e-5)
    assert recipe.training.temperature == pytest.approx(0.05)
    assert recipe.data.train_file == "hf://datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"
    local = parse_recipe(repo_root / "recipes" / "quickstart.yaml", ["--train_file", "${HF_SENTCL_DATA}/../wiki.txt"])
    assert local.data.train_file == "/data/senteval/../wiki.txt"
    assert recipe.model.pooling == "mean" and recipe.model.head == "none"
    assert recipe.training.precision == "auto" and recipe.data.eval_bf16 is None  # evaluation follows training


def test_yaml_string_float_is_coerced(tmp_path):
    """YAML reads `3e-5` (no dot) as a string; it must still become the float 3e-5."""
    recipe = parse_recipe(write(tmp_path, "method: simcse\nlearning_rate: 3e-5\ntemperature: 5e-2\n"))
    assert type(recipe.training.learning_rate) is float
    assert recipe.training.learning_rate == pytest.approx(3e-5)
    assert recipe.training.temperature == pytest.approx(0.05)


def test_unknown_key_names_key_and_suggestion(tmp_path):
    """A misspelt key is an error naming the key and suggesting the right one."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, "method: simcse\nlearning_rat: 1.0e-4\n"))
    message = str(err.value)
    assert "'learning_rat'" in message
    assert "did you mean 'learning_rate'" in message


def test_method_specific_key_rejected_for_other_method(tmp_path):
    """`hard_negative_weight` belongs to simcse_sup only; in a simcse recipe it is unknown."""
    with pytest.raises(RecipeError, match="hard_negative_weight"):
        parse_recipe(write(tmp_path, "method: simcse\nhard_negative_weight: 1.0\n"))
    recipe = parse_recipe(write(tmp_path, "method: simcse_sup\nhard_negative_weight: 1\n"))
    assert isinstance(recipe.training, SupervisedSimCSEConfig)
    assert recipe.training.hard_negative_weight == 1.0 and type(recipe.training.hard_negative_weight) is float


@pytest.mark.parametrize(
    "line, key",
    [
        ("learning_rate: fast", "learning_rate"),
        ("per_device_train_batch_size: 2.5", "per_device_train_batch_size"),
        ("bf16: maybe", "bf16"),
        ("seed: [1, 2]", "seed"),
        ("learning_rate:", "learning_rate"),
    ],
)
def test_wrong_type_names_key(tmp_path, line, key):
    """A value of the wrong type (or an empty value for a required type) is an error naming the key."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, f"method: simcse\n{line}\n"))
    assert f"'{key}'" in str(err.value)
    assert str(tmp_path / "recipe.yaml") in str(err.value)


def test_cli_overrides_take_effect_with_python_types(tmp_path):
    """`--learning_rate 1e-4`, bare `--bf16`, `--seed=3` override the YAML with float / bool / int values."""
    path = write(tmp_path, "method: simcse\nlearning_rate: 3.0e-5\nseed: 42\nbf16: false\nmax_seq_length: 32\n")
    recipe = parse_recipe(path, ["--learning_rate", "1e-4", "--bf16", "--seed=3", "--max-seq-length", "16"])
    training = recipe.training
    assert type(training.learning_rate) is float and training.learning_rate == pytest.approx(1e-4)
    assert training.bf16 is True
    assert type(training.seed) is int and training.seed == 3
    assert recipe.data.max_seq_length == 16


def test_cli_bool_false_and_strings(tmp_path):
    """`--bf16 false` gives False; string keys keep their text; list keys split on commas."""
    path = write(tmp_path, "method: simcse\nbf16: true\n")
    recipe = parse_recipe(path, ["--bf16", "false", "--pooling", "mean", "--eval_tasks", "sts"])
    assert recipe.training.bf16 is False
    assert recipe.model.pooling == "mean"
    assert recipe.data.eval_tasks == ["sts"]


def test_strategy_no_from_yaml(tmp_path):
    """`eval_strategy: no` / `save_strategy: no` (TrainingArguments' own spelling) are the string 'no', although
    YAML 1.1 reads a bare `no` as False."""
    recipe = parse_recipe(write(tmp_path, "method: simcse\neval_strategy: no\nsave_strategy: no\n"
                                          "load_best_model_at_end: false\n"))
    assert recipe.training.eval_strategy == "no"
    assert recipe.training.save_strategy == "no"


def test_strategy_no_from_cli(tmp_path):
    """`--eval_strategy no --save_strategy no` on the command line (as in the README's override style) work."""
    recipe = parse_recipe(write(tmp_path, "method: simcse\nload_best_model_at_end: false\n"),
                          ["--eval_strategy", "no", "--save_strategy", "no"])
    assert recipe.training.eval_strategy == "no"
    assert recipe.training.save_strategy == "no"


def test_quoted_strategy_no(tmp_path):
    """The quoted spelling `"no"` works (the workaround while bare `no` does not)."""
    recipe = parse_recipe(write(tmp_path, 'method: simcse\neval_strategy: "no"\nload_best_model_at_end: false\n'))
    assert recipe.training.eval_strategy == "no"


def test_cli_wrong_type_says_command_line(tmp_path):
    """A bad CLI value names the key and says it came from the command line."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, "method: simcse\n"), ["--per_device_train_batch_size", "abc"])
    assert "command line" in str(err.value) and "'per_device_train_batch_size'" in str(err.value)


def test_cli_unknown_key_is_error(tmp_path):
    """Unknown keys on the command line are rejected like unknown YAML keys, as the command line's options."""
    with pytest.raises(RecipeError, match="command line: unknown option '--learnin_rate'"):
        parse_recipe(write(tmp_path, "method: simcse\n"), ["--learnin_rate", "1e-4"])


def test_cli_malformed_argument(tmp_path):
    """A positional word where `--key` is expected is an error."""
    with pytest.raises(RecipeError, match="expected --key value"):
        parse_recipe(write(tmp_path, "method: simcse\n"), ["learning_rate", "1e-4"])


def test_missing_method_lists_known_methods(tmp_path):
    """A recipe without `method` is an error that lists the registered methods."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, "learning_rate: 1.0e-4\n"))
    message = str(err.value)
    assert "'method'" in message
    for name in METHODS:
        assert name in message


def test_unknown_method_lists_known_methods(tmp_path):
    """An unknown method name is an error naming it and listing the registered methods."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, "method: simcsf\n"))
    message = str(err.value)
    assert "simcsf" in message
    for name in METHODS:
        assert name in message


def test_method_from_cli(tmp_path):
    """The method can also come from the command line."""
    recipe = parse_recipe(write(tmp_path, "learning_rate: 1.0e-4\n"), ["--method", "simcse_sup"])
    assert recipe.method == "simcse_sup" and isinstance(recipe.training, SupervisedSimCSEConfig)


@pytest.mark.parametrize("text, what", [("- a\n- b\n", "list"), ("just a string\n", "str")])
def test_non_mapping_yaml(tmp_path, text, what):
    """A YAML document that is not a mapping is a clear error naming the file and what it got."""
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as err:
        parse_recipe(path)
    assert str(path) in str(err.value) and "mapping" in str(err.value) and what in str(err.value)


def test_nested_mapping_rejected(tmp_path):
    """Recipes are flat: a key holding a mapping is an error naming that key."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, "method: simcse\ntraining:\n  learning_rate: 1.0e-4\n"))
    assert "'training'" in str(err.value) and "flat" in str(err.value)


def test_invalid_yaml(tmp_path):
    """Broken YAML is a RecipeError naming the file, not a raw yaml exception."""
    path = write(tmp_path, "method: simcse\nlearning_rate: [1, 2\n")
    with pytest.raises(RecipeError, match="not valid YAML") as err:
        parse_recipe(path)
    assert str(path) in str(err.value)


def test_nonexistent_recipe_file(tmp_path):
    """A recipe path that does not exist is an error naming the file."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError) as err:
        parse_recipe(missing)
    assert str(missing) in str(err.value)


def test_config_validation_becomes_recipe_error(tmp_path):
    """A value the config itself rejects (temperature 0) surfaces as a RecipeError naming the file."""
    path = write(tmp_path, "method: simcse\ntemperature: 0\n")
    with pytest.raises(RecipeError, match="temperature") as err:
        parse_recipe(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("argv, expected", [(["--view_layers", "6"], [6]), (["--view_layers", "4,5,6"], [4, 5, 6]),
                                            (["--view_layers", "[0, 6]"], [0, 6])])
def test_list_key_accepts_one_value_a_comma_list_or_yaml_list(tmp_path, argv, expected):
    """A list-typed key takes a single value as a one-element list, as well as 'a,b' and '[a, b]'."""
    recipe = parse_recipe(write(tmp_path, "method: self_guided\n"), argv)
    assert recipe.training.view_layers == expected


def test_list_key_rejects_wrong_item_type(tmp_path):
    with pytest.raises(RecipeError, match="'view_layers'"):
        parse_recipe(write(tmp_path, "method: self_guided\n"), ["--view_layers", "top"])


# ------------------------------------------------------------------------------------------ HfArgumentParser
@pytest.mark.parametrize("method, key, value, choices", [
    ("simcse", "pooling", "meen", "cls, cls_before_pooler, mean, max, first_last_avg, last2_avg, prompt"),
    ("simcse", "sts_mode", "avg", "all, mean, wmean"),
    ("simcse", "unlabeled_sts", "sts", "stsb, all, all-scored"),
    ("simcse", "margin_type", "adaptive", "constant, dynamic"),
    ("simcse", "eval_strategy", "sometimes", "no, steps, epoch"),
    ("self_guided", "objective", "sgopt", "sg, opt1, opt2, sg-opt"),
    ("self_guided", "view_pooling", "min", "max, mean"),
    ("consert", "supervised_mode", "semi", "unsup, sup, joint, sup-unsup, joint-unsup"),
    ("consert", "augmentation1", "cutout", "none, shuffle, token_cutoff, feature_cutoff, dropout"),
    ("clear", "augment_level", "char", "word, token"),
])
def test_literal_choices_refused_by_the_parser(tmp_path, method, key, value, choices):
    """A value outside a key's Literal (or enum) choices is refused by the parser, naming the key, the choices and
    where the value came from."""
    with pytest.raises(RecipeError) as err:
        parse_recipe(write(tmp_path, f"method: {method}\n{key}: {value}\n"))
    assert f"{tmp_path / 'recipe.yaml'}: key '{key}' must be one of {choices}; got '{value}'" in str(err.value)
    with pytest.raises(RecipeError, match=f"command line: key '{key}' must be one of"):
        parse_recipe(write(tmp_path, f"method: {method}\n"), [f"--{key}", value])


def test_choices_come_from_the_literal_types():
    """The parser is transformers' HfArgumentParser, and its choices are the Literal types' (one definition)."""
    from transformers import HfArgumentParser

    from hf_sentcl.configs.choices import POOLING_MODES
    from hf_sentcl.configs.validation import literal_choices
    from hf_sentcl.recipe.parser import RecipeArgumentParser

    parser = RecipeArgumentParser("self_guided")
    assert isinstance(parser, HfArgumentParser)
    assert tuple(parser.actions["pooling"].choices) == POOLING_MODES
    assert tuple(parser.actions["objective"].choices) == literal_choices(METHODS["self_guided"].config_class)[
        "objective"]


def test_every_unlabeled_sts_corpus_is_accepted(tmp_path):
    """The recipe key's choices are exactly the corpora the STS reader builds (a Literal once lacked 'all-scored')."""
    from hf_sentcl.configs.validation import literal_choices
    from hf_sentcl.evaluation.sts import UNLABELED_STS

    assert tuple(literal_choices(DataArguments)["unlabeled_sts"]) == UNLABELED_STS
    for corpus in UNLABELED_STS:
        recipe = parse_recipe(write(tmp_path, "method: consert\n"), ["--unlabeled_sts", corpus])
        assert recipe.data.unlabeled_sts == corpus


def test_configs_built_in_python_check_their_choices(tmp_path):
    """The same Literal choices hold for a config built without the parser."""
    with pytest.raises(ValueError, match="pooling must be one of .*got 'meen'"):
        ModelArguments(pooling="meen")
    with pytest.raises(ValueError, match="sts_mode must be one of"):
        DataArguments(sts_mode="average")
    with pytest.raises(ValueError, match="margin_type must be one of"):
        SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, margin_type="adaptive")


def test_non_finite_value_names_key_and_source(tmp_path):
    """`.nan`/`.inf` in YAML, `nan` on the command line: refused for any float key, naming where it came from."""
    with pytest.raises(RecipeError, match="command line: key 'weight_decay' is nan; give a finite number"):
        parse_recipe(write(tmp_path, "method: simcse\n"), ["--weight_decay", "nan"])
    with pytest.raises(RecipeError, match=r"recipe.yaml: key 'hard_negative_weight' is inf"):
        parse_recipe(write(tmp_path, "method: simcse_sup\nhard_negative_weight: .inf\n"))


def test_boolean_words(tmp_path):
    """HfArgumentParser's string_to_bool: yes/no, y/n, t/f, 1/0 besides true/false."""
    recipe = parse_recipe(write(tmp_path, "method: simcse\nbf16: yes\nhead_at_inference: 'no'\n"), ["--eval_bf16", "1"])
    assert recipe.training.bf16 is True and recipe.model.head_at_inference is False and recipe.data.eval_bf16 is True


def test_mapping_and_empty_list_keys(tmp_path):
    """Values argparse cannot carry as text pass through to keys whose type takes them."""
    recipe = parse_recipe(write(tmp_path, "method: simcse\npeft: {r: 4}\neval_tasks: []\n"))
    assert recipe.model.peft["r"] == 4 and recipe.data.eval_tasks == []


# ------------------------------------------------------------------------------------------ --help
def help_text(argv, capsys) -> tuple[int, str]:
    from hf_sentcl.cli.train import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_recipe_help_lists_every_key_with_type_default_and_help(repo_root, capsys):
    """`RECIPE --help`: every key of the method's dataclasses, with its type, default and help; the recipe's own
    values are shown too."""
    import dataclasses
    import re

    code, text = help_text([str(repo_root / "recipes" / "quickstart.yaml"), "--help"], capsys)
    assert code == 0
    text = re.sub(r"\s+", " ", text)  # argparse wraps the help column
    for cls in (ModelArguments, DataArguments, SimCSEConfig):
        for f in dataclasses.fields(cls):
            if f.init:
                assert f"--{f.name} " in text, f.name
    from hf_sentcl.configs.contrastive import TEMPERATURE_HELP

    assert f"--temperature float {TEMPERATURE_HELP} (default: 0.05) [recipe: 0.05]" in text
    pooling = "--pooling {cls,cls_before_pooler,mean,max,first_last_avg,last2_avg,prompt}"
    assert f"{pooling} Pooling of the token states" in text
    assert "--tokenizer_name str | None" in text and "--eval_tasks list[str]" in text
    assert "(default: 3e-05) [recipe: 3e-05]" in text  # learning_rate
    assert "--save_strategy {no,steps,epoch,best}" in text
    assert "--no_bf16" not in text  # HfArgumentParser's --no_ twins are hidden: recipes write `key: false`


def test_method_help_without_recipe(capsys):
    code, text = help_text(["--method", "self_guided", "--help"], capsys)
    assert code == 0
    assert "Method 'self_guided' (SelfGuidedConfig)" in text
    assert "--objective {sg,opt1,opt2,sg-opt}" in text and "--view_layers list[int] | None" in text
    assert "--hard_negative_weight" not in text  # simcse_sup's key


def test_help_without_method_lists_methods(capsys):
    code, text = help_text(["--help"], capsys)
    assert code == 0 and "usage:" in text
    for name in METHODS:
        assert name in text


def test_help_for_unknown_method_is_an_error(capsys):
    code, text = help_text(["--method", "simcsf", "--help"], capsys)
    assert code == 2 and "unknown method 'simcsf'" in text and "Traceback" not in text


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_shipped_recipes_state_the_global_batch(recipe, monkeypatch, tmp_path):
    """The papers' batch is a global batch: every shipped recipe sets global_train_batch_size (not a per-device
    batch that 8 processes would multiply by 8), so one process trains on all of it and N processes on 1/N each;
    ConSERT's first-stage supervised_batch_size is global too (tests/recipe/test_consert_recipes.py)."""
    from hf_sentcl.configs.arguments import per_device_batch_size

    monkeypatch.setenv("HF_SENTCL_DATA", str(tmp_path / "senteval"))
    parsed = parse_recipe(recipe)
    assert "per_device_train_batch_size" not in parsed.explicit_keys
    global_batch = parsed.training.global_train_batch_size
    assert global_batch is not None and parsed.training.per_device_train_batch_size == global_batch
    assert per_device_batch_size(global_batch, 8 if global_batch % 8 == 0 else 2) * (
        8 if global_batch % 8 == 0 else 2) == global_batch


def test_accelerator_config_mapping_reaches_the_trainer_and_uneven_batches_are_refused(tmp_path):
    """docs/scaling.md refuses `accelerator_config: {even_batches: false}` with several processes: a recipe can say
    it (the parser used to reject every mapping but peft's as "recipes are flat"), and the check names it."""
    from types import SimpleNamespace

    from hf_sentcl.recipe.parallelism import process_group_problems

    recipe = parse_recipe(write(tmp_path, "method: simcse\naccelerator_config: {even_batches: false}\n"))
    assert recipe.training.accelerator_config.even_batches is False
    two = SimpleNamespace(training=SimpleNamespace(world_size=2, accelerator_config=recipe.training.accelerator_config),
                          data=SimpleNamespace(eval_tasks=[]))
    assert "even_batches" in process_group_problems(two)[0]
    recipe = parse_recipe(write(tmp_path, "method: simcse\n"), ["--accelerator_config", "{even_batches: true}"])
    assert recipe.training.accelerator_config.even_batches is True
    with pytest.raises(RecipeError, match="key 'max_steps' expects"):  # a mapping for a key that takes none
        parse_recipe(write(tmp_path, "method: simcse\nmax_steps: {a: 1}\n"))
