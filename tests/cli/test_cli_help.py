"""The command line's own words: `--version`, each command's `--help` (named as it was called, answered without
loading torch where the help needs no config class), and unknown keys reported where they were written."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hf_sentcl
from hf_sentcl.cli import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`hf-sentcl ARGV` in this process: (exit status, stdout, stderr)."""
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def modules_loaded_by(argv: list[str], *, entry: str = "from hf_sentcl.cli import main; main({argv!r})") -> set[str]:
    """The modules among torch, transformers and hf_sentcl.pipeline.train that a fresh process running `hf-sentcl
    ARGV` has imported (the answer is printed; the help itself is discarded)."""
    script = ("import contextlib, io, sys\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              f"    {entry.format(argv=argv)}\n"
              "print(sorted({'torch', 'transformers', 'hf_sentcl.pipeline.train'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(eval(done.stdout.strip().splitlines()[-1]))  # noqa: S307 - a list of names printed above


# ------------------------------------------------------------------------------------------------ --version
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version(flag, capsys):
    status, out, err = run_cli([flag], capsys)
    assert (status, out, err) == (0, f"hf-sentcl {hf_sentcl.__version__}\n", "")


def test_version_is_the_installed_distributions():
    """`hf_sentcl.__version__` (what --version prints) is the version pip installed from pyproject.toml."""
    assert hf_sentcl.__version__ == importlib.metadata.version("hf-sentcl")


def test_version_and_plain_help_start_without_torch():
    assert modules_loaded_by(["--version"]) == set()
    assert modules_loaded_by(["--help"]) == set()


# ------------------------------------------------------------------------------------------------ train --help
def test_train_help_is_named_as_called(capsys):
    """`hf-sentcl train --help` shows `hf-sentcl train RECIPE ...`; `python -m hf_sentcl.run --help` (train's
    `main` called without a program name) keeps its own; `python -m hf_sentcl train` says so."""
    from hf_sentcl.cli import train

    status, out, _ = run_cli(["train", "--help"], capsys)
    assert status == 0 and out.startswith("usage: hf-sentcl train RECIPE.yaml [--key value ...]")
    assert "python -m hf_sentcl.run" not in out and "simcse" in out
    status, out, _ = run_cli(["train", "--method", "simcse", "--help"], capsys)
    assert status == 0 and out.startswith("usage: hf-sentcl train RECIPE.yaml") and "--temperature" in out
    assert train.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m hf_sentcl.run RECIPE.yaml")
    assert train.main(["--method", "simcse", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m hf_sentcl.run RECIPE.yaml")
    assert main(["train", "--help"], prog="python -m hf_sentcl") == 0
    assert capsys.readouterr().out.startswith("usage: python -m hf_sentcl train RECIPE.yaml")


def test_train_without_arguments_shows_the_usage(capsys):
    status, out, _ = run_cli(["train"], capsys)
    assert status == 2 and out.startswith("usage: hf-sentcl train RECIPE.yaml") and "self_guided" in out


def test_train_help_starts_without_torch():
    """The usage and the method list need no config class: no torch, no pipeline. A method's keys do (its config
    subclasses TrainingArguments), but not the training pipeline."""
    assert modules_loaded_by(["train", "--help"]) == {"transformers"}  # HfArgumentParser only
    assert "hf_sentcl.pipeline.train" not in modules_loaded_by(["train", "--method", "simcse", "--help"])


def test_unknown_method_help_is_an_error(capsys):
    status, _, err = run_cli(["train", "--method", "simcsf", "--help"], capsys)
    assert status == 2 and "unknown method 'simcsf'" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------ sweep --help
def test_sweep_help_documents_both_sweeps(capsys):
    """What the sweeps do, every option the argument splitters take, what they write, and examples; the usage
    lines are the ones its errors print (hf_sentcl.pipeline.sweep)."""
    from hf_sentcl.pipeline import sweep

    status, out, _ = run_cli(["sweep", "--help"], capsys)
    assert status == 0
    for option in ("RECIPE.yaml", "--seeds", "--subset-sizes", "--full-results", "--key value", "-h, --help"):
        assert re.search(rf"^  {re.escape(option)}\b", out, re.MULTILINE), option  # an entry of its own
    for written in ("seed-<N>", "seeds.json", "seeds.md", "size-<N>/seed-<S>", "fewshot.json", "fewshot.png"):
        assert written in out, written
    for usage in (sweep.USAGE, sweep.FEWSHOT_USAGE):
        assert usage.removeprefix("usage: ") in " ".join(out.split()), usage
    assert "examples:" in out and "hf-sentcl sweep recipes/" in out
    assert re.search(r"--seed\b", out) and "--train_subset_size" in out  # the overrides the sweep refuses


def test_sweep_help_anywhere_in_the_arguments(capsys):
    """`hf-sentcl sweep RECIPE --seeds 1,2 --help` shows the help instead of starting (or refusing) the sweep."""
    status, out, err = run_cli(["sweep", "recipes/quickstart.yaml", "--seeds", "1,2", "--help"], capsys)
    assert status == 0 and "--subset-sizes" in out and err == ""


def test_sweep_without_arguments_shows_the_usage(capsys):
    status, out, _ = run_cli(["sweep"], capsys)
    assert status == 2 and "hf-sentcl sweep RECIPE.yaml --seeds" in out and "--help" in out


def test_sweep_help_starts_without_torch():
    assert modules_loaded_by(["sweep", "--help"]) == set()


# ------------------------------------------------------------------------------------------------ unknown keys
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def test_a_command_line_typo_is_reported_as_the_command_lines(tmp_path, capsys):
    recipe = write(tmp_path, "method: simcse\nlearning_rate: 3.0e-5\n")
    status, _, err = run_cli(["train", str(recipe), "--learnig_rate", "1e-4"], capsys)
    assert status == 2
    assert err.startswith("error: command line: unknown option '--learnig_rate' (did you mean '--learning_rate'?)")
    assert str(recipe) not in err


def test_a_recipe_typo_is_reported_as_the_files(tmp_path, capsys):
    recipe = write(tmp_path, "method: simcse\nlearnig_rate: 3.0e-5\n")
    status, _, err = run_cli(["train", str(recipe), "--temprature", "0.1"], capsys)
    assert status == 2
    assert f"error: {recipe}: unknown key 'learnig_rate' (did you mean 'learning_rate'?)" in err
    assert "command line: unknown option '--temprature' (did you mean '--temperature'?)" in err


def test_another_methods_key_names_that_method(tmp_path, capsys):
    """`--objective sg-opt` on a SimCSE recipe: `objective` is self_guided's key (not a typo of SimCSE's
    `project`), and the message says which method takes it and how to choose it."""
    recipe = write(tmp_path, "method: simcse\n")
    status, _, err = run_cli(["train", str(recipe), "--objective", "sg-opt"], capsys)
    assert status == 2 and "did you mean" not in err
    assert re.search(r"command line: unknown option '--objective' \(a key of method 'self_guided'\) for method "
                     r"'simcse'\. .*--method self_guided", err), err
    status, _, err = run_cli(["train", str(write(tmp_path, "method: simcse\nhard_negative_weight: 1.0\n"))], capsys)
    assert "unknown key 'hard_negative_weight' (a key of method 'simcse_sup') for method 'simcse'" in err
