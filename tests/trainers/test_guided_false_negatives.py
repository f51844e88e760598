"""`false_negatives: guide` through every method's real trainer: the mask the loss receives equals the rule applied
by hand to the guide's embeddings of the batch's texts (decoded and embedded independently, through the guide's
own `encode`), in each method's candidate layout; training with it moves the weights. A guide with another
vocabulary re-tokenises the texts. The rule itself, on hand-made cosines, is tested in
tests/losses/test_guide_margin_rule.py."""

from __future__ import annotations

import json

import pytest
import torch

from hf_sentcl.modeling.encoder import SentenceEncoder
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from tests.helpers import build_tiny_bert, build_trainer, recipe_values
from tests.trainers.test_plugins import METHODS, repeated_files  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # each test trains a tiny model for a few steps

#: each method's loss layout: "info_nce" (rows = first text view, candidates = the other text views, target i) or
#: "nt_xent" (rows and candidates = every text view twice, target = the other copy); SG-OPT contrasts sentences
LAYOUTS = {
    "simcse": "info_nce", "simcse_sup": "info_nce", "ifm": "info_nce", "cached": "info_nce", "sg-opt": "info_nce",
    "sg": "nt_xent", "consert_joint_fgv": "nt_xent", "clear": "nt_xent", "byop": "nt_xent", "clear_cached": "nt_xent",
}
#: (margin, strategy) per method, both strategies exercised. Two views of one sentence score 1 with the guide, so
#: there the margin decides what is dropped (the guide's cosines between different sentences run from about 0.4 to
#: 0.96, median 0.73); supervised positives score like other sentences.
MARGINS = {name: (0.25, "absolute") if i % 2 else (0.25, "relative") for i, name in enumerate(METHODS)}
MARGINS["simcse_sup"] = (0.05, "relative")


@pytest.fixture(scope="module")
def guide_dir(tmp_path_factory):
    """Another tiny BERT (other weights, same vocabulary) as the guide, mean-pooled as its sentence-transformers
    pooling file says, with weights drawn wide enough that its cosines spread."""
    folder = build_tiny_bert(tmp_path_factory.mktemp("guide"), seed=7, initializer_range=0.5)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return folder


def batch_texts(trainer, batch) -> list[list[str]]:
    """The texts of each text view of the batch, decoded from the token ids the method names them by (CLEAR: the
    sentence before augmentation)."""
    ids = batch["source_ids"][:, None] if "source_ids" in batch else batch["input_ids"]
    tokenizer = trainer.processing_class
    return [tokenizer.batch_decode(ids[:, v], skip_special_tokens=True) for v in range(ids.shape[1])]


def hand_mask(embeddings: torch.Tensor, layout: str, views: int, margin: float, strategy: str):
    """(mask, near): the rule on guide embeddings (views * batch, d), cell by cell, and the cells whose score lies
    within 1e-4 of the threshold (float noise may decide those)."""
    batch = embeddings.shape[0] // views
    if layout == "info_nce":
        rows, candidates = embeddings[:batch], embeddings[batch:] if views > 1 else embeddings
        targets = list(range(batch))
    else:
        rows = candidates = torch.cat([embeddings, embeddings])
        n = len(embeddings)
        targets = [(i + n) % (2 * n) for i in range(2 * n)]
    mask = torch.zeros(len(rows), len(candidates), dtype=torch.bool)
    near = torch.zeros_like(mask)
    for i in range(len(rows)):
        positive = float(rows[i] @ candidates[targets[i]])
        threshold = positive - margin if strategy == "absolute" else positive - abs(positive) * margin
        for j in range(len(candidates)):
            score = float(rows[i] @ candidates[j])
            mask[i, j] = j != targets[i] and score > threshold
            near[i, j] = j != targets[i] and abs(score - threshold) < 1e-4
    return mask, near


@pytest.mark.parametrize("name", list(METHODS))
def test_the_guided_mask_is_the_rule_on_the_guides_embeddings_and_training_moves(
    tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files, guide_dir  # noqa: F811
):
    margin, strategy = MARGINS[name]
    settings = {"fp16": False, "max_steps": 3, "learning_rate": 1e-3, **METHODS[name]}
    trainer = build_trainer(tmp_path, name, tiny_bert_dir, senteval_dir, repeated_files, false_negatives="guide",
                            guide_model=str(guide_dir), guide_margin=margin, guide_margin_strategy=strategy,
                            **settings)
    assert trainer.guide.same_vocabulary and trainer.guide.encoder.config.pooling == "mean"
    captured = []
    record = trainer.record_masked
    trainer.record_masked = lambda exclude: captured.append(exclude) or record(exclude)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    with trainer.compute_loss_context_manager():
        trainer.compute_loss(trainer.model, batch)

    texts = batch_texts(trainer, batch)
    guide = SentenceEncoder.load(str(guide_dir))  # a fresh copy, embedding the decoded strings
    embeddings = torch.from_numpy(guide.encode([t for view in texts for t in view], normalize=True))
    expected, near = hand_mask(embeddings, LAYOUTS[name], len(texts), margin, strategy)
    got = captured[0]
    assert got.shape == expected.shape
    assert 0 < int(expected.sum()) < expected.numel() - len(expected)  # the comparison can fail either way
    assert torch.equal(got & ~near, expected & ~near)

    trainer.record_masked = record
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    trainer.train()
    moved = max((dict(trainer.model.named_parameters())[k].detach() - v).abs().max().item() for k, v in before.items())
    assert moved > 1e-4
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logs)
    assert sum(entry["masked_pairs"] for entry in logs) > 0


def test_a_guide_with_another_vocabulary_retokenises_the_texts(
    tmp_path, tiny_bert_dir, tiny_roberta_dir, senteval_dir, repeated_files  # noqa: F811
):
    trainer = build_trainer(tmp_path, "simcse_sup", tiny_bert_dir, senteval_dir, repeated_files, fp16=False,
                            false_negatives="guide", guide_model=str(tiny_roberta_dir), **METHODS["simcse_sup"])
    assert not trainer.guide.same_vocabulary
    batch = next(iter(trainer.get_train_dataloader()))
    identities = trainer.candidate_identities(batch)  # (3 text views, batch, guide dim)
    texts = batch_texts(trainer, batch)
    guide = SentenceEncoder.load(str(tiny_roberta_dir))
    for view, strings in enumerate(texts):
        expected = torch.from_numpy(guide.encode(strings, normalize=True))
        torch.testing.assert_close(identities[view], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"false_negatives": "guide"}, "false_negatives: 'guide' needs guide_model"),
        ({"guide_model": "embedded:all-MiniLM-L6-v2"}, "guide_model 'embedded:all-MiniLM-L6-v2' is set but"),
        ({"false_negatives": "guide", "guide_model": "/nowhere/guide"}, "guide_model '/nowhere/guide'"),
        ({"false_negatives": "guide", "guide_model": "embedded:all-MiniLM-L6-v2", "guide_margin_strategy": "ratio"},
         "guide_margin_strategy"),
        ({"false_negatives": "guide", "guide_model": "embedded:all-MiniLM-L6-v2", "guide_margin": float("nan")},
         "key 'guide_margin' is nan"),
    ],
)
def test_bad_guide_settings_are_refused_before_any_model_loads(
    tmp_path, tiny_bert_dir, senteval_dir, repeated_files, overrides, message  # noqa: F811
):
    values = recipe_values("simcse_sup", tiny_bert_dir, senteval_dir, tmp_path / "run", repeated_files, fp16=False,
                           **overrides)
    with pytest.raises((RecipeError, ValueError), match=message):
        validate_recipe(parse_recipe(None, (), **values))
