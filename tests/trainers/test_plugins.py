"""The false-negative mask and Matryoshka prefixes through every method's real trainer: training with them works
(finite loss that fell or moved, changed weights, the plug-in's own logged values), and a method that cannot honour
one refuses it before any model loads, with the reason."""

import csv

import pytest
import torch

from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from tests.helpers import build_trainer, random_sentences, recipe_values

pytestmark = pytest.mark.slow  # each test trains a tiny model for a few steps

#: methods with their plug-in-ready settings (Matryoshka needs the loss to see the saved embedding)
METHODS = {
    "simcse": dict(head="none"),
    "simcse_sup": dict(head="none"),
    "sg": dict(projection_head=False),
    "sg-opt": dict(projection_head=False),
    "consert_joint_fgv": dict(),
    "clear": dict(),
    "byop": dict(),
    "ifm": dict(head="none"),
    "cached": dict(head="none"),
    "clear_cached": dict(),
}


@pytest.fixture
def repeated_files(tmp_path):
    """Training files in which every text appears four times, so shuffled batches of 8 hold duplicates."""
    sentences = random_sentences(8, seed=11) * 4
    text = tmp_path / "train.txt"
    text.write_text("\n".join(sentences) + "\n")
    others = random_sentences(16, seed=12)
    triplets = tmp_path / "triplets.csv"
    nli = tmp_path / "nli.csv"
    with triplets.open("w", newline="") as t, nli.open("w", newline="") as n:
        t_writer, n_writer = csv.writer(t), csv.writer(n)
        t_writer.writerow(["sent0", "sent1", "hard_neg"])
        n_writer.writerow(["premise", "hypothesis", "label"])
        for i, sentence in enumerate(sentences):  # each premise with two different hypotheses
            t_writer.writerow([sentence, others[i % 16], others[(i + 5) % 16]])
            n_writer.writerow([sentence, others[i % 16], i % 3])
    return {"text": text, "triplets": triplets, "nli": nli}


def train(tmp_path, name, tiny_bert_dir, senteval_dir, files, **overrides):
    settings = {"fp16": False, "max_steps": 4, "learning_rate": 1e-3, **METHODS[name], **overrides}
    trainer = build_trainer(tmp_path, name, tiny_bert_dir, senteval_dir, files, **settings)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = max((after[k].detach() - v).abs().max().item() for k, v in before.items())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return logs, moved


@pytest.mark.parametrize("name", list(METHODS))
def test_false_negative_mask_trains_every_method(tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files):
    logs, moved = train(tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files, false_negatives="mask")
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logs)
    assert moved > 1e-4
    assert sum(entry["masked_pairs"] for entry in logs) > 0  # the batches held duplicates and they were masked


@pytest.mark.parametrize("name", [n for n in METHODS if not n.startswith("clear")])
def test_matryoshka_trains_every_method_it_applies_to(tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files):
    logs, moved = train(tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files, matryoshka_dims=[32, 16, 8])
    assert moved > 1e-4
    for entry in logs:
        assert {"loss_dim32", "loss_dim16", "loss_dim8"} <= set(entry)
        assert all(entry[f"loss_dim{d}"] > 0 for d in (32, 16, 8))


def refusal(tmp_path, tiny_bert_dir, senteval_dir, files, name, **overrides):
    values = recipe_values(name, tiny_bert_dir, senteval_dir, tmp_path / name, files, fp16=False, **overrides)
    with pytest.raises(RecipeError) as err:
        validate_recipe(parse_recipe(None, (), **values))
    return str(err.value)


@pytest.mark.parametrize(
    "name, overrides, reason",
    [
        ("clear", dict(matryoshka_dims=[32, 16]), "projection head g"),
        ("sg", dict(matryoshka_dims=[32, 16]), "projection_head: false"),
        ("simcse", dict(head="mlp", matryoshka_dims=[32, 16]), "head_at_inference"),
        ("consert_joint_fgv", dict(supervised_mode="sup", adversarial=False, false_negatives="mask"), "no in-batch"),
        ("consert_joint_fgv", dict(supervised_mode="sup", adversarial=False, matryoshka_dims=[32]), "no in-batch"),
    ],
)
def test_a_plugin_a_method_cannot_honour_is_refused_before_work(
    tmp_path, name, overrides, reason, tiny_bert_dir, senteval_dir, train_files
):
    message = refusal(tmp_path, tiny_bert_dir, senteval_dir, train_files, name, **overrides)
    assert reason in message


def test_matryoshka_sizes_beyond_the_embedding_are_refused(tmp_path, tiny_bert_dir, senteval_dir, train_files):
    with pytest.raises(ValueError, match="larger than the embedding"):
        build_trainer(tmp_path, "simcse", tiny_bert_dir, senteval_dir, train_files, head="none", fp16=False,
                      matryoshka_dims=[64, 16])
