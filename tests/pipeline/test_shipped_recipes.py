"""Every shipped recipe that the launch matrix does not launch, run as its user runs it on one process:

    python -m hf_sentcl.run recipes/RECIPE.yaml --model_name_or_path TINY --train_file ... --max_steps 2 ...

Only the model (a tiny BERT, or a tiny RoBERTa for the RoBERTa recipes), the data and the step counts are
overridden, so every other key keeps the recipe's value: its method and objective, pooling and head, augmentations,
margins, LoRA settings, sequence length, data-loader workers, precision `auto`, the "before" evaluation and the best
checkpoint reloaded at the end. The recipe parser's tests check that each recipe parses; these check that it runs to
an export. The entry point's `main` runs in the test process (a subprocess per recipe would cost ~12 s of imports).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import build_tiny_bert, build_tiny_roberta, random_sentences, write_full_senteval, write_snli
from launching import RECIPES, results_of
from test_launch_matrix import METHODS, check_export_reloads

from hf_sentcl.cli.train import main

pytestmark = pytest.mark.slow

#: the recipes the launch matrix runs under every launcher config
LAUNCHED = {recipe for recipe, _ in METHODS.values()}
SHIPPED = sorted(path.name for path in RECIPES.glob("*.yaml"))
STEPS = ("--max_steps", "2", "--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Tiny BERT and RoBERTa with 512 positions (recipes truncate at up to 128 tokens), one-sentence text, a
    SimCSE triplet CSV, SNLI in SentEval's layout (train, dev and test: the MiniLM ConSERT recipes train on dev and
    test) and a SentEval layout whose STS-B the self-guided and ConSERT recipes train on."""
    root = tmp_path_factory.mktemp("shipped-recipes")
    text = root / "train.txt"
    text.write_text("\n".join(random_sentences(128, seed=5)) + "\n")
    rows = random_sentences(3 * 64, seed=6)
    triplets = root / "triplets.csv"
    triplets.write_text("sent0,sent1,hard_neg\n" + "".join(
        f"{a},{b},{c}\n" for a, b, c in zip(rows[:64], rows[64:128], rows[128:])))
    for split, seed in (("train", 7), ("dev", 8), ("test", 9)):
        write_snli(root / "nli", split, n=96, seed=seed)
    return {"bert": build_tiny_bert(root / "tiny-bert", max_position_embeddings=512),
            "roberta": build_tiny_roberta(root / "tiny-roberta", max_position_embeddings=514),
            "text": text, "triplets": triplets, "nli": root / "nli",
            "sts": write_full_senteval(root / "senteval", pairs_per_subset=8)}


def overrides(recipe: dict, data: dict[str, Path]) -> list[str]:
    """The model, data and step overrides for a parsed recipe file: the data kinds it names, pointed here."""
    model = data["roberta" if "roberta" in str(recipe["model_name_or_path"]) else "bert"]
    where = ["--model_name_or_path", str(model), "--sts_data_dir", str(data["sts"]), *STEPS]
    if isinstance(recipe.get("train_file"), list):  # several datasets: each entry pointed here, its columns kept
        where += ["--train_file", yaml.safe_dump([local_entry(entry, data) for entry in recipe["train_file"]],
                                                 default_flow_style=True).strip()]
    elif "train_file" in recipe:
        where += ["--train_file", str(local_file(recipe["train_file"], data))]
    if "nli_source" in recipe:
        where += ["--nli_source", str(data["nli"])]
    return where


def local_file(path: str, data: dict[str, Path]) -> Path:
    """The local stand-in of a recipe's training file: the triplets for a CSV, the sentences for a text file."""
    return data["triplets" if str(path).endswith(".csv") else "text"]


def local_entry(entry: str | dict, data: dict[str, Path]) -> str | dict:
    """A `train_file` list entry pointed at its local stand-in, with its other keys (the column mapping) kept."""
    if isinstance(entry, dict):
        return {**entry, "path": str(local_file(entry["path"], data))}
    return str(local_file(entry, data))


def test_the_glob_finds_the_launched_and_the_other_recipes():
    """Neither list is empty, and every recipe the matrix launches is shipped (so none is left out by a typo)."""
    assert LAUNCHED <= set(SHIPPED) and set(SHIPPED) - LAUNCHED


@pytest.mark.parametrize("name", [name for name in SHIPPED if name not in LAUNCHED], ids=lambda n: n[:-5])
def test_shipped_recipe_runs_to_its_export_on_one_process(name, data, tmp_path):
    recipe = yaml.safe_load((RECIPES / name).read_text())
    output = tmp_path / "out"
    assert main([str(RECIPES / name), "--output_dir", str(output), *overrides(recipe, data)]) == 0
    results = results_of(output)
    assert results["method"] == recipe["method"]
    assert (results["train"]["global_step"], results["train"]["steps_run"]) == (2, 2)
    assert [e["step"] for e in results["train"]["dev_curve"]] == [2]
    assert {"before", "after"} <= set(results["sts"])
    assert (output / "run_complete.json").is_file() and (output / "export" / "README.md").is_file()
    assert results["export"] == {"path": str(output / "export")}  # results.json says where the export went
    check_export_reloads(output)
    if isinstance(recipe.get("train_file"), list):  # the loss of each dataset drawn is logged beside the loss
        logged = {key for entry in results["train"]["loss_curve"] for key in entry if key.startswith("loss_")}
        local = [local_entry(entry, data) for entry in recipe["train_file"]]
        named = {f"loss_{Path(entry['path'] if isinstance(entry, dict) else entry).stem}" for entry in local}
        assert logged and logged <= named, (logged, named)
