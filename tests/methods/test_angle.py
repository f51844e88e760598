"""AnglE as a method: the trainer's loss is `angle_objective` of the batch's embeddings and its gold scores, the
cached step and the false-negative mask apply to it, it trains from a scored CSV and from `sts_train`, and bad
scored data is refused before the model loads, naming the line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from helpers import assert_same, build_tiny_bert, random_sentences, step, write_yaml_recipe
from safetensors.torch import load_file

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import LabelledViewCollator, tokenize_views
from hf_sentcl.losses.false_negatives import paired_texts_mask, text_groups
from hf_sentcl.methods.angle.config import AnglEConfig
from hf_sentcl.methods.angle.data import STSTrainPairs
from hf_sentcl.methods.angle.loss import angle_objective
from hf_sentcl.methods.angle.trainer import AnglETrainer
from hf_sentcl.recipe.checks import checked
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

BATCH = 8
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
WEIGHTS = dict(cosine_weight=0.5, ibn_weight=1.0, angle_weight=0.3)  # every term on, so each one is checked


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("bert"))


def make_trainer(model_dir, tmp_path, dropout=False, first=None, **overrides) -> AnglETrainer:
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(model_dir), pooling="mean", head="none",
                                            **({} if dropout else NO_DROPOUT))
    sentences = random_sentences(2 * BATCH, seed=5)
    pairs = {"sent0": first or sentences[:BATCH], "sent1": sentences[BATCH:],
             "labels": [float(i % 5) for i in range(BATCH)]}  # ties, and scores below 1 (in-batch negatives)
    dataset = tokenize_views(Dataset.from_dict(pairs), encoder.tokenizer, ("sent0", "sent1"), 32)
    dataset = dataset.add_column("labels", pairs["labels"])
    args = AnglEConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, learning_rate=1e-3,
                       eval_strategy="no", save_strategy="no", use_cpu=True, report_to="none", disable_tqdm=True,
                       **{**WEIGHTS, **overrides})
    trainer = AnglETrainer(model=encoder, args=args, train_dataset=dataset,
                           data_collator=LabelledViewCollator(encoder.tokenizer, 2, label_dtype=torch.float32))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; a bare training_step needs it
    return trainer


def batch_of(trainer):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(BATCH)])


def embeddings(encoder, inputs):
    return [encoder(input_ids=inputs["input_ids"][:, v], attention_mask=inputs["attention_mask"][:, v]).embeddings
            for v in range(2)]


def test_the_trainer_loss_is_the_angle_objective_of_the_batch_scores(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    inputs = batch_of(trainer)
    assert inputs["labels"].dtype == torch.float32 and inputs["labels"].tolist() == [i % 5 for i in range(BATCH)]
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    a, b = embeddings(trainer.model, inputs)
    expected, terms = angle_objective(a, b, inputs["labels"], **trainer.args.angle_loss_kwargs())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    shuffled, _ = angle_objective(a, b, inputs["labels"].flip(0), **trainer.args.angle_loss_kwargs())
    assert (shuffled - expected).abs() > 1e-3  # the scores matter: a trainer that lost them would differ


def test_the_cached_step_equals_the_plain_step(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    inputs = batch_of(trainer)
    # gradients reach ~20 here (the in-batch term at tau 0.05): float32 sums in another order differ by ~1e-5
    assert_same(step(trainer, inputs, None), step(trainer, inputs, 3), atol=1e-4)


def test_false_negative_mask_takes_repeated_texts_out_of_the_in_batch_term(model_dir, tmp_path):
    repeated = random_sentences(BATCH, seed=5)
    repeated[3] = repeated[1]
    trainer = make_trainer(model_dir, tmp_path, first=repeated, false_negatives="mask")
    inputs = batch_of(trainer)
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    a, b = embeddings(trainer.model, inputs)
    ids, mask = (inputs[key].transpose(0, 1).reshape(2 * BATCH, -1) for key in ("input_ids", "attention_mask"))
    exclude = paired_texts_mask(*text_groups(ids, mask).view(2, BATCH))
    # a1 = a3: each is the other's false negative; the other's partner is a positive of their shared text (b3 for
    # a1, b1 for a3); and b1's target a1 is a3's text, b3's target a3 is a1's
    b1, b3 = BATCH + 1, BATCH + 3
    assert exclude.nonzero().tolist() == [[1, 3], [1, b3], [3, 1], [3, b1], [b1, 3], [b3, 1]]
    expected, _ = angle_objective(a, b, inputs["labels"], exclude=exclude, **trainer.args.angle_loss_kwargs())
    unmasked, _ = angle_objective(a, b, inputs["labels"], **trainer.args.angle_loss_kwargs())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert (unmasked - expected).abs() > 1e-4


def scored_csv(path, rows=64, bad_line=None):
    sentences = random_sentences(2 * rows, seed=9)
    lines = ["sent0,sent1,score"] + [f"{sentences[i]},{sentences[rows + i]},{i % 6}" for i in range(rows)]
    if bad_line is not None:
        lines[bad_line - 1] = lines[bad_line - 1].rsplit(",", 1)[0] + ",very similar"
    path.write_text("\n".join(lines) + "\n")
    return path


def angle_recipe(tmp_path, model_dir, senteval_dir, **values):
    return write_yaml_recipe(tmp_path, **{
        "method": "angle", "model_name_or_path": str(model_dir), "sts_data_dir": str(senteval_dir),
        "output_dir": str(tmp_path / "out"),
        "global_train_batch_size": 8, "max_seq_length": 16, "max_steps": 8, "logging_steps": 1,
        "learning_rate": 1e-3, "use_cpu": True, "eval_before_training": False, "eval_tasks": ["sts"],
        "save_steps": 8, "eval_steps": 8, "seed": 0, **WEIGHTS, **values})


@pytest.mark.slow
def test_angle_trains_on_a_scored_csv(tmp_path, model_dir, senteval_dir):
    recipe = angle_recipe(tmp_path, model_dir, senteval_dir, train_file=str(scored_csv(tmp_path / "pairs.csv")))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(recipe)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    curve = results["train"]["loss_curve"]
    assert results["train"]["global_step"] == 8 and curve[-1]["loss"] < curve[0]["loss"]
    logged = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["log_history"][0]
    assert {"cosine", "in_batch", "angle"} <= set(logged)  # each term logged, unweighted
    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not before[k.removeprefix("backbone.")].equal(v) for k, v in after.items()
               if k.removeprefix("backbone.") in before)


def test_sts_train_reads_the_split_with_its_gold_scores(real_data_dir, model_dir):
    from transformers import AutoTokenizer

    data = STSTrainPairs("stsb", str(real_data_dir), max_seq_length=32)
    data.check()
    dataset, views, collator = data.build(AutoTokenizer.from_pretrained(str(model_dir)))
    assert (len(dataset), views) == (5749, 2)
    first = (real_data_dir / "STS" / "STSBenchmark" / "sts-train.csv").read_text().splitlines()[0].split("\t")
    assert dataset[0]["labels"] == pytest.approx(float(first[4]))
    batch = collator([dataset[i] for i in range(4)])
    assert batch["labels"].dtype == torch.float32 and batch["input_ids"].shape[:2] == (4, 2)


def check_recipe(recipe):
    return checked(parse_recipe(str(recipe), ()))


def test_a_score_that_is_not_a_number_is_refused_naming_its_line(tmp_path, model_dir, senteval_dir):
    bad = scored_csv(tmp_path / "pairs.csv", bad_line=5)
    with pytest.raises(RecipeError, match=r"column 'score' must hold a number in every row; line 5 has "
                                          r"'very similar'"):
        check_recipe(angle_recipe(tmp_path, model_dir, senteval_dir, train_file=str(bad)))


def test_a_file_without_scores_is_refused_naming_the_column(tmp_path, model_dir, senteval_dir):
    plain = tmp_path / "pairs.csv"
    plain.write_text("sent0,sent1\n" + "".join(f"a{i} b,c d{i}\n" for i in range(16)))
    with pytest.raises(RecipeError, match="has no column 'score'"):
        check_recipe(angle_recipe(tmp_path, model_dir, senteval_dir, train_file=str(plain)))


def test_sts_train_beside_a_train_file_is_refused(tmp_path, model_dir, senteval_dir):
    recipe = angle_recipe(tmp_path, model_dir, senteval_dir, sts_train="stsb",
                          train_file=str(scored_csv(tmp_path / "pairs.csv")))
    with pytest.raises(RecipeError, match=r"trains on its 'sts_train' here; \['train_file'\] would be unused"):
        check_recipe(recipe)


@pytest.mark.parametrize("key, value, message", [
    ("angle_weight", -1, "angle_weight must be a finite number"),
    ("ibn_tau", 0, "ibn_tau must be a finite number"),
])
def test_bad_weights_and_temperatures_are_refused(tmp_path, key, value, message):
    with pytest.raises(ValueError, match=message):
        AnglEConfig(output_dir=str(tmp_path), **{key: value})


def test_all_weights_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match="all 0: nothing would train"):
        AnglEConfig(output_dir=str(tmp_path), cosine_weight=0, ibn_weight=0, angle_weight=0)
