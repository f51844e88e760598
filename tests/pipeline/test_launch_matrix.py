"""The launch matrix: the users' own command lines, every shipped launcher config with the shipped paper recipes.

    accelerate launch --config_file recipes/accelerate_configs/CONFIG -m hf_sentcl.run recipes/RECIPE.yaml \\
        --model_name_or_path TINY --train_file ... --max_steps 4 --eval_steps 2 --save_steps 2

Only the model, the data and the step counts are overridden (2 processes: the configs ask for 8 GPUs), so each cell
runs with the recipe's defaults: the "before" evaluation, the best checkpoint reloaded at the end, `precision: auto`
(bf16 on a CPU with AVX512-BF16/AMX under multi_cpu.yaml; the DeepSpeed and FSDP configs' own bf16 everywhere), and
one cell per config with `gradient_accumulation_steps: 2`. `fsdp.yaml` runs the way a CPU allows it
(`trainer_fsdp_cpu.py`: the gloo group taken for a GPU group). A cell that a config cannot run asserts the refusal
before any work, naming what to use instead.

Each running cell checks that the run finished with those defaults, that its export reloads in `AutoModel` and
`SentenceTransformer` with the saved encoder's vectors, and under DeepSpeed that the export carries the fp32 master
weights (DeepSpeed's own fp32 consolidation of the checkpoint it ended on). The fp32 cells (`--mixed_precision no
--precision fp32 --dropout 0`) compare the final weights with a 1-process run at the same global batch.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
from helpers import build_tiny_bert, random_sentences, write_full_senteval, write_snli
from launching import export_weights, failure, launch, max_difference, results_of
from safetensors.torch import load_file

from hf_sentcl.common.hardware import resolve_precision

pytestmark = pytest.mark.slow

#: method -> (shipped recipe, the data it is pointed at)
METHODS = {
    "simcse": ("simcse_bert.yaml", "text"),
    "simcse_sup": ("simcse_sup_bert.yaml", "triplets"),
    "sg_opt": ("sg_opt_bert.yaml", "sts"),  # unlabeled_sts: stsb, from the data directory
    "consert_joint": ("consert_bert_joint.yaml", "nli"),
    "consert_sup_unsup": ("consert_bert_sup_unsup.yaml", "nli"),  # + unlabeled_sts: all
    "clear": ("clear_bert.yaml", "text"),
    "byop": ("byop_bert.yaml", "text"),
    "angle": ("angle_bert.yaml", "sts"),  # sts_train: stsb, from the data directory (scores gathered with the views)
    "esimcse": ("esimcse_bert.yaml", "text"),
    "promptbert": ("promptbert_bert.yaml", "text"),
}
CONFIGS = ("multi_cpu.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml", "fsdp.yaml")
STRATEGY = {"multi_cpu.yaml": "DDP", "deepspeed_zero2.yaml": "DeepSpeed ZeRO-2",
            "deepspeed_zero3.yaml": "DeepSpeed ZeRO-3", "fsdp.yaml": "FSDP2"}
SHARDED = ("deepspeed_zero3.yaml", "fsdp.yaml")
#: the cells a sharded config refuses, and the words the refusal must hold
REFUSED = {
    "sg_opt": "method self_guided cannot run under",
    "clear": "method clear cannot run under",
    "consert_joint": "method consert with supervised_mode 'joint' cannot run under",
    "consert_sup_unsup": "method consert with supervised_mode 'sup-unsup' cannot run under",
    "esimcse": "method esimcse cannot run under",
}
#: one cell per config accumulates gradients over 2 micro-batches (gathered negatives per micro-batch)
ACCUMULATING = {("multi_cpu.yaml", "simcse_sup"), ("deepspeed_zero2.yaml", "byop"),
                ("deepspeed_zero3.yaml", "simcse"), ("fsdp.yaml", "simcse_sup")}
STEPS = ("--max_steps", "4", "--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1")
PROBES = random_sentences(12, seed=21, max_words=14)


#: the refused cells launched here, one per sharded config (CI time: a refusal launch costs ~15 s of process start);
#: the recipe check refuses every refused cell's shipped recipe under both sharded configs in the fast
#: tests/recipe/test_parallelism.py::test_shipped_recipes_the_matrix_refuses_are_refused_by_the_recipe_check
LAUNCHED_REFUSALS = {("deepspeed_zero3.yaml", "consert_sup_unsup"), ("fsdp.yaml", "clear")}


def refused_cells() -> set[tuple[str, str]]:
    return {(config, method) for config in SHARDED for method in REFUSED}


def cells(kind: str) -> list[tuple[str, str]]:
    """The cells that run, or (`refused`) the refused cells launched here."""
    every = [(config, method) for config in CONFIGS for method in METHODS]
    if kind == "refused":
        return [cell for cell in every if cell in refused_cells() and cell in LAUNCHED_REFUSALS]
    return [cell for cell in every if cell not in refused_cells()]


def cell_id(cell: tuple[str, str]) -> str:
    return f"{cell[0].removesuffix('.yaml')}-{cell[1]}"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """One tiny model and one data set for the whole matrix: text, triplets, NLI pairs in SNLI's layout, a SentEval
    layout. The model has BERT's 512 positions (sg_opt_bert.yaml truncates at 128 tokens). Each training set is a
    whole number of the recipes' global batches (SimCSE 64, SG-OPT 16 on STS-B's 48 sentences, ConSERT 96): a last,
    partial batch is filled up to the global batch on several processes (accelerate's even_batches), so 1 and 2
    processes would train on different last batches (docs/scaling.md)."""
    root = tmp_path_factory.mktemp("matrix-data")
    model = build_tiny_bert(root / "tiny-bert", max_position_embeddings=512)
    text = root / "train.txt"
    text.write_text("\n".join(random_sentences(256, seed=5)) + "\n")
    rows = random_sentences(3 * 128, seed=6)
    triplets = root / "triplets.csv"
    triplets.write_text("sent0,sent1,hard_neg\n" + "".join(
        f"{a},{b},{c}\n" for a, b, c in zip(rows[:128], rows[128:256], rows[256:])))
    write_snli(root / "nli", "train", n=192, seed=7)
    senteval = write_full_senteval(root / "senteval", pairs_per_subset=8)  # STS-B: 3 splits x 8 pairs x 2
    return {"text": text, "triplets": triplets, "nli": root / "nli", "model": model, "sts": senteval}


def data_overrides(method: str, data: dict[str, Path]) -> list[str]:
    kind = METHODS[method][1]
    where = ["--model_name_or_path", str(data["model"]), "--sts_data_dir", str(data["sts"])]
    if kind in ("text", "triplets"):
        where += ["--train_file", str(data[kind])]
    elif kind == "nli":
        where += ["--nli_source", str(data["nli"])]
    return where


def run_cell(config: str | None, method: str, output: Path, data, *extra: str, launcher: tuple[str, ...] = ()):
    """The user's launch line for `method`'s shipped recipe under `config` (None: `python -m hf_sentcl.run`)."""
    recipe = METHODS[method][0]
    return launch(config, recipe, output, *data_overrides(method, data), *STEPS, *extra, launcher=launcher)


# ------------------------------------------------------------------------------------------------ checks
def check_finished_with_defaults(output: Path, result, config: str, accumulating: bool) -> dict:
    """The run ended with the recipe's defaults: before/after evaluation, best checkpoint reloaded, precision auto."""
    assert result.returncode == 0, failure(result)
    results = results_of(output)
    parallelism, train = results["parallelism"], results["train"]
    expected = resolve_precision("auto", "cpu") if config == "multi_cpu.yaml" else "bf16"  # the config's own
    assert (parallelism["processes"], parallelism["strategy"], parallelism["precision"]) == (
        2, STRATEGY[config], expected)
    assert (train["global_step"], train["steps_run"]) == (4, 4)
    assert [e["step"] for e in train["dev_curve"]] == [2, 4] and train["best_step"] in (2, 4)
    assert {"before", "after"} <= set(results["sts"])
    assert results["recipe_settings"].get("gradient_accumulation_steps", 1) == (2 if accumulating else 1)
    assert f"Parallelism: 2 processes, {STRATEGY[config]}" in result.stdout
    card = (output / "export" / "README.md").read_text()
    assert re.search(rf"2 processes, {re.escape(STRATEGY[config])} .* global batch \d+ \(\d+ per process\)", card)
    return results


def check_export_reloads(output: Path) -> None:
    """The export in AutoModel (with the documented pooling) and SentenceTransformer gives the saved encoder's
    vectors; a prompt-pooling export (PromptBERT) has no sentence-transformers files to load."""
    from sentence_transformers import SentenceTransformer

    from hf_sentcl.export.plan import plan_export
    from hf_sentcl.export.verify import automodel_encode
    from hf_sentcl.modeling import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(output, dtype=torch.float32).eval()
    reference = encoder.encode(PROBES)
    plan = plan_export(encoder)
    loaded = {"AutoModel": automodel_encode(output / "export", PROBES, plan)}
    if plan.sentence_transformers:
        loaded["SentenceTransformer"] = SentenceTransformer(str(output / "export"), device="cpu").encode(PROBES)
    else:
        assert not (output / "export" / "modules.json").exists()
    for loader, vectors in loaded.items():
        difference = abs(vectors - reference).max()
        assert difference <= 1e-5, (loader, difference)


def check_fp32_master_weights(output: Path, best_step: int, initial: dict[str, torch.Tensor]) -> None:
    """After DeepSpeed the saved encoder, and so its export, carries the fp32 master weights: equal (1e-6) to
    DeepSpeed's own consolidation of the checkpoint the run ended on (the best one), not their bf16 copies. Frozen
    weights (no master: the pooler) keep their values from before training, which DeepSpeed's consolidation holds only
    rounded to bf16; and training started from the fp32 weights, not from their bf16 rounding."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    consolidated = get_fp32_state_dict_from_zero_checkpoint(output / f"checkpoint-{best_step}")
    saved = load_file(output / "model.safetensors")
    assert set(saved) <= set(consolidated)  # training heads (ConSERT's classifier) are saved apart
    frozen = {k for k in saved if consolidated[k].dtype == torch.bfloat16}  # DeepSpeed's frozen fragments
    trained = set(saved) - frozen
    assert trained and max_difference(saved, consolidated, trained) <= 1e-6
    start = {f"backbone.{k}": v for k, v in initial.items()}
    assert frozen and max_difference(saved, start, frozen) == 0
    assert max_difference({k: saved[k].bfloat16() for k in frozen}, consolidated, frozen) == 0
    # not bf16 copies, nor a start from bf16: the trained weights are not all bf16-representable
    assert max_difference(saved, {k: saved[k].bfloat16() for k in trained}, trained) > 1e-6
    exported = export_weights(output)  # the backbone's weights under their AutoModel names
    backbone = {k for k in exported if f"backbone.{k}" in trained}
    assert backbone and max_difference(exported, {k: saved[f"backbone.{k}"] for k in backbone}, backbone) == 0


# ------------------------------------------------------------------------------------------------ the cells
@pytest.mark.parametrize("cell", cells("runs"), ids=cell_id)
def test_cell_runs_with_the_recipe_defaults(cell, data, tmp_path):
    config, method = cell
    accumulating = cell in ACCUMULATING
    result = run_cell(config, method, tmp_path / "out", data,
                      *(("--gradient_accumulation_steps", "2") if accumulating else ()))
    results = check_finished_with_defaults(tmp_path / "out", result, config, accumulating)
    check_export_reloads(tmp_path / "out")
    if config.startswith("deepspeed"):
        initial = {k: v for k, v in load_file(Path(data["model"]) / "model.safetensors").items()}
        check_fp32_master_weights(tmp_path / "out", results["train"]["best_step"], initial)
    if method == "consert_sup_unsup":  # supervised_batch_size (16) is global: split over the processes
        stage_one = results_of(tmp_path / "out" / "stage-1")["parallelism"]
        assert (stage_one["global_train_batch_size"], stage_one["per_device_train_batch_size"]) == (16, 8)


@pytest.mark.parametrize("cell", cells("refused"), ids=cell_id)
def test_cell_is_refused_before_work_naming_what_to_use(cell, data, tmp_path):
    config, method = cell
    result = run_cell(config, method, tmp_path / "out", data)
    assert result.returncode != 0 and "exitcode  : 2" in result.stderr, failure(result)
    assert REFUSED[method] in result.stderr and "deepspeed_zero2.yaml" in result.stderr
    assert not re.search(r'File ".*hf_sentcl/', result.stderr)  # no traceback of the run's (the launcher has its own)
    assert not (tmp_path / "out").exists()  # refused before the run folder was made


# ------------------------------------------------------------------------------------------------ fp32 cells
#: fp32 with dropout 0: 1 and 2 processes at the same global batch must end with the same weights (max |dW| <= 1e-5)
#: while training moved them >= 1e-3. Beyond the launcher's `--mixed_precision no`, `--precision fp32` and `--dropout
#: 0`, the comparison needs what keeps rounding differences below 1e-5:
#: - every batch the same shape on 1 and 2 processes: the padded path (the unpadded one packs each process's real
#:   tokens; its equality with the padded path is tests/modeling/test_unpadded.py's job), padded to 32 tokens, longer
#:   than any sentence here (with each process padding to its own longest, a 1-process run padded to 16 and to 64
#:   already differs by 6.5e-6);
#: - Adam's epsilon at 1e-3 with a learning rate of 2e-3 over 8 steps: Adam turns a gradient element that is pure
#:   rounding noise (the sum over every token that token_type_embeddings gets, added up in another order on 2
#:   processes) into a step of up to the learning rate, of random sign; epsilon damps elements far below it. Measured
#:   on ZeRO-3, supervised SimCSE (the least moved encoder): max |dW| 1.1e-5 with lr 1e-3 and epsilon 1e-4 over 4
#:   steps, 4.0e-6 (moved 1.2e-3) with these;
#: - one checkpoint, at the end, so that the best checkpoint is the last on both sides.
FP32 = ("--precision", "fp32", "--dropout", "0", "--learning_rate", "2e-3", "--adam_epsilon", "1e-3",
        "--pad_to_multiple_of", "32", "--unpadded", "false", "--max_steps", "8", "--eval_steps", "8",
        "--save_steps", "8")
#: (CI time: one cell per config; ConSERT's 2-process equality is checked under ZeRO-2, supervised SimCSE's under the
#: other three, AnglE's (its scores gathered with the views) under DDP, SG-OPT's and the BYOP margin's under DDP in
#: test_scaling.py's plug-in runs)
FP32_CELLS = [("multi_cpu.yaml", "simcse_sup"), ("deepspeed_zero2.yaml", "consert_joint"),
              ("deepspeed_zero3.yaml", "simcse_sup"), ("fsdp.yaml", "simcse_sup"), ("multi_cpu.yaml", "angle")]
#: what else the fp32 cells change: ConSERT's token cutoff, randomness drawn by each process for its own rows (so
#: other draws on 1 and 2 processes), is switched off; AnglE's 8 STS-B train pairs are one whole global batch (with
#: the recipe's 32, 2 processes would fill the partial batch up to 16 with repeats: accelerate's even_batches)
PLAIN_VIEWS = {"consert_joint": ("--augmentation1", "none", "--augmentation2", "none"),
               "angle": ("--global_train_batch_size", "8")}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data):
    """The 1-process fp32 run of a method (same global batch, dropout 0), trained once for every config."""

    @functools.cache
    def run(method: str) -> dict[str, torch.Tensor]:
        output = tmp_path_factory.mktemp(f"one-process-{method}") / "out"
        result = run_cell(None, method, output, data, *FP32, *PLAIN_VIEWS.get(method, ()))
        assert result.returncode == 0, failure(result)
        assert results_of(output)["parallelism"]["precision"] == "fp32"
        return export_weights(output)

    return run


@pytest.mark.parametrize("cell", FP32_CELLS, ids=cell_id)
def test_fp32_cell_matches_one_process(cell, data, one_process, tmp_path):
    config, method = cell
    result = run_cell(config, method, tmp_path / "out", data, *FP32, *PLAIN_VIEWS.get(method, ()),
                      launcher=("--mixed_precision", "no"))
    assert result.returncode == 0, failure(result)
    results = results_of(tmp_path / "out")
    assert (results["parallelism"]["processes"], results["parallelism"]["precision"]) == (2, "fp32")
    trained = export_weights(tmp_path / "out")
    initial = load_file(Path(data["model"]) / "model.safetensors")
    encoder = [k for k in trained if k in initial and not k.startswith("pooler.")]  # a kept head is exported there
    single, moved = max_difference(trained, one_process(method)), max_difference(trained, initial, encoder)
    print(f"\n{cell_id(cell)}: 1-process max |dW| {single:.3g}; moved {moved:.3g}")
    assert single <= 1e-5
    assert moved >= 1e-3


def test_matrix_covers_every_config_and_method():
    """Every cell runs or is refused (one refusal per sharded config launched), and each config has a cell with
    gradient accumulation."""
    assert len(cells("runs")) + len(refused_cells()) == len(CONFIGS) * len(METHODS)
    assert set(cells("refused")) == LAUNCHED_REFUSALS <= refused_cells()
    assert {config for config, _ in LAUNCHED_REFUSALS} == set(SHARDED)
    assert {config for config, _ in ACCUMULATING} == set(CONFIGS) and set(ACCUMULATING) <= set(cells("runs"))
    assert {config for config, _ in FP32_CELLS} == set(CONFIGS)
