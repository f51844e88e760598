"""The ConSERT trainer in its unsup / sup / joint modes: one forward with augmented blocks, the FGV adversarial
step, the cached step, saving, resuming, and the settings it refuses."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import assert_same, batch_of, changed_keys, gradients, random_sentences, snapshot, step
from safetensors import safe_open
from torch import nn

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.data.nli import LabelledViewCollator
from hf_sentcl.losses import pair_classification_loss
from hf_sentcl.methods.consert.config import ConSERTConfig
from hf_sentcl.methods.consert.trainer import (
    CLASSIFIER_FILE,
    CLASSIFIER_NAME,
    ConSERTTrainer,
)
from hf_sentcl.trainers.cached import split_batch


# ------------------------------------------------------------------------------------------ the trainer
def make_args(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=1e-3, num_train_epochs=1,
        eval_strategy="no", load_best_model_at_end=False, save_strategy="no", report_to="none", use_cpu=True,
        logging_steps=1, seed=0, disable_tqdm=True, warmup_steps=0,
    )
    settings.update(overrides)
    if settings.get("supervised_mode", "unsup") != "unsup":
        settings.setdefault("nli_source", "senteval")
    return ConSERTConfig(**settings)


def unsup_data(encoder, n=16):
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(n, seed=3)}), encoder.tokenizer, ("text",), 32)
    return dataset, ViewCollator(encoder.tokenizer)


def nli_data(encoder, n=16):
    sentences = random_sentences(2 * n, seed=4)
    raw = Dataset.from_dict({"premise": sentences[:n], "hypothesis": sentences[n:], "label": [i % 3 for i in range(n)]})
    dataset = tokenize_views(raw, encoder.tokenizer, ("premise", "hypothesis"), 32).add_column("labels", raw["label"])
    return dataset, LabelledViewCollator(encoder.tokenizer, num_views=2)


def make_trainer(backbone_dir, tmp_path, n=16, inference_pooling=None, **overrides):
    encoder = SentenceEncoder.from_backbone(
        str(backbone_dir), pooling="mean", head="none", inference_pooling=inference_pooling
    )
    args = make_args(tmp_path, **overrides)
    dataset, collator = (unsup_data if args.supervised_mode == "unsup" else nli_data)(encoder, n)
    trainer = ConSERTTrainer(model=encoder, args=args, train_dataset=dataset, data_collator=collator)
    return encoder, trainer


@pytest.mark.slow
@pytest.mark.parametrize(
    "backbone,pair",
    [("bert", ("shuffle", "feature_cutoff")), ("roberta", ("shuffle", "feature_cutoff")),
     ("bert", ("token_cutoff", "dropout")), ("bert", ("none", "none"))],
)
def test_unsup_training_loss_falls_and_weights_change(request, tmp_path, backbone, pair):
    """Repeated epochs over 8 sentences: the NT-Xent falls and the backbone changes; no classifier exists."""
    encoder, trainer = make_trainer(request.getfixturevalue(f"tiny_{backbone}_dir"), tmp_path, n=8,
                                    num_train_epochs=6, augmentation1=pair[0], augmentation2=pair[1])
    before = snapshot(encoder)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]
    assert any(k.startswith("backbone.encoder.layer.1.") for k in changed_keys(before, encoder))
    assert trainer.classifier is None and not hasattr(encoder, CLASSIFIER_NAME)


def test_unsup_step_is_one_forward_with_two_augmented_blocks(tiny_bert_dir, tmp_path):
    """embed_views stacks T1 and T2 copies of the batch into ONE backbone forward: (2, batch, d)."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, augmentation1="token_cutoff", augmentation2="none",
                                    token_cutoff_rate=0.5)
    forwards = []
    encoder.backbone.register_forward_hook(
        lambda module, args, kwargs, output: forwards.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    views = trainer.embed_views(encoder.train(), batch)
    assert views.shape == (2, 4, 32) and len(forwards) == 1 and forwards[0][0] == 8
    encoder.eval()
    with torch.no_grad():
        clean = encoder(input_ids=batch["input_ids"][:, 0], attention_mask=batch["attention_mask"][:, 0]).embeddings
    torch.testing.assert_close(views[1], clean)  # T2 = none
    assert not torch.allclose(views[0], clean)


@pytest.mark.slow
@pytest.mark.parametrize("adversarial", [False, True])
def test_joint_training_loss_falls_and_weights_change(tiny_bert_dir, tmp_path, adversarial):
    """joint: L_ce + alpha * L_con, both logged; the loss falls; backbone and classifier change."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, n=8, num_train_epochs=6, supervised_mode="joint",
                                    adversarial=adversarial, adversarial_epsilon=2.0)
    before = snapshot(encoder)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[-1]["loss"] < logs[0]["loss"]
    for entry in logs:
        assert entry["loss"] == pytest.approx(entry["ce_loss"] + 0.15 * entry["contrastive_loss"], rel=1e-3)
    changed = changed_keys(before, encoder)
    assert any(k.startswith("backbone.encoder.layer.1.") for k in changed)
    assert {f"{CLASSIFIER_NAME}.weight", f"{CLASSIFIER_NAME}.bias"} <= changed


@pytest.mark.slow
def test_sup_mode_is_cross_entropy_only(tiny_bert_dir, tmp_path):
    """sup: one clean block; the training loss is the pair cross-entropy of the classifier."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="sup")
    assert trainer.supervised_blocks() == (["none"], 0, 0)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
    loss = trainer.compute_loss(encoder, batch)
    with torch.no_grad():
        r1 = encoder(input_ids=batch["input_ids"][:, 0], attention_mask=batch["attention_mask"][:, 0]).embeddings
        r2 = encoder(input_ids=batch["input_ids"][:, 1], attention_mask=batch["attention_mask"][:, 1]).embeddings
    expected, _ = pair_classification_loss(r1, r2, batch["labels"], trainer.classifier.weight, trainer.classifier.bias)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "a,b,adversarial,expected",
    [("none", "none", False, (["none"], 0, 0)), ("shuffle", "none", False, (["none", "shuffle"], 1, 0)),
     ("shuffle", "feature_cutoff", False, (["none", "shuffle", "feature_cutoff"], 1, 2)),
     ("none", "none", True, (["none", "none"], 0, 1)),
     ("dropout", "dropout", False, (["none", "dropout", "dropout"], 1, 2))],
)
def test_joint_blocks_reuse_the_clean_pass(tiny_bert_dir, tmp_path, a, b, adversarial, expected):
    """A 'none' view is the clean cross-entropy block itself, unless it carries the adversarial perturbation."""
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="joint", augmentation1=a, augmentation2=b,
                              adversarial=adversarial)
    assert trainer.supervised_blocks() == expected


@pytest.mark.parametrize(
    "mode,adversarial,passes", [("unsup", False, 2), ("sup", False, 1), ("joint", False, 3), ("joint", True, 4)]
)
def test_flop_estimate_counts_the_encoder_passes_of_the_mode(tiny_bert_dir, tmp_path, mode, adversarial, passes):
    """Trainer's FLOP estimate is 6 x tokens x non-embedding parameters per encoder pass of the step."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode=mode, augmentation1="shuffle",
                                    augmentation2="feature_cutoff", adversarial=adversarial)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    per_token = 6 * encoder.num_parameters(exclude_embeddings=True)
    assert trainer.floating_point_ops(batch) == batch["input_ids"].numel() * passes * per_token


@pytest.mark.slow
def test_adversarial_perturbation_ascends_the_supervised_loss(tiny_bert_dir, tmp_path):
    """FGV: zero outside the perturbed block and on padding, norm epsilon per sentence, and adding it to the clean
    embeddings raises L_ce (it follows the loss gradient)."""
    torch.manual_seed(11)
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="joint", adversarial=True,
                                    adversarial_epsilon=0.5)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
    names, _, block = trainer.supervised_blocks()
    perturbation = trainer.adversarial_perturbation(encoder.train(), batch, batch["labels"], names, block)
    _, mask = trainer.flat_texts(batch)
    texts = mask.shape[0]
    assert perturbation.shape[0] == len(names) * texts and (perturbation[: block * texts] == 0).all()
    r = perturbation[block * texts : (block + 1) * texts]
    assert torch.allclose(r.flatten(1).norm(dim=1), torch.full((texts,), 0.5))
    assert (r[~mask.bool()] == 0).all()

    def ce_with(extra):
        with torch.no_grad():
            clean = trainer.encode_blocks(encoder, batch, ["none"], extra)[0]
        return trainer.classify(clean[:6], clean[6:], batch["labels"])[0].item()

    assert ce_with(r) > ce_with(None) > ce_with(-r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,adversarial", [("unsup", False), ("sup", False), ("joint", False), ("joint", True)]
)
def test_cached_step_equals_the_plain_step(tiny_bert_dir, tmp_path, mode, adversarial):
    """mini_batch_size (the cached step) changes nothing: with deterministic views (none + none, the encoder's
    dropout off) its loss and every gradient (classifier included) equal the plain step's on the whole batch."""
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, n=8, supervised_mode=mode, adversarial=adversarial,
                              augmentation1="none", augmentation2="none")
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    assert_same(step(trainer, inputs, None), step(trainer, inputs, 3))


@pytest.mark.slow
def test_cached_step_replays_the_augmentations(tiny_bert_dir, tmp_path):
    """Random views (shuffle + feature cutoff) in joint training: the cached step equals one autograd pass over the
    same mini-batches drawn from the same seed (NT-Xent of the whole batch + the size-weighted cross-entropies)."""
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, n=8, supervised_mode="joint")
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    model = trainer.model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    outputs = [trainer.forward_views(model, chunk) for chunk in split_batch(inputs, 3)]
    loss, _ = trainer.batch_loss(model, torch.cat([o.views for o in outputs], dim=1), inputs)
    loss = loss + sum(o.local_loss * len(o.views[0]) / 8 for o in outputs)
    loss.backward()
    assert_same((loss.detach(), gradients(model)), step(trainer, inputs, 3))


@pytest.mark.slow
def test_encoder_dropout_is_switched_off_unless_asked(tiny_bert_dir, tmp_path):
    """Every nn.Dropout of the backbone gets p = 0 (two training-mode forwards agree); the config keeps its values."""
    encoder, _ = make_trainer(tiny_bert_dir, tmp_path)
    assert all(m.p == 0 for m in encoder.backbone.modules() if isinstance(m, nn.Dropout))
    assert encoder.config.backbone_config.hidden_dropout_prob == 0.1
    batch = batch_of(encoder)
    encoder.train()
    torch.testing.assert_close(encoder(**batch).embeddings, encoder(**batch).embeddings, rtol=0, atol=0)
    kept, _ = make_trainer(tiny_bert_dir, tmp_path, encoder_dropout=True)
    assert all(m.p == 0.1 for m in kept.backbone.modules() if isinstance(m, nn.Dropout))


@pytest.mark.slow
def test_saved_encoder_has_no_classifier_and_evaluates_with_last2_avg(tiny_bert_dir, tmp_path):
    """The classifier stays out of the saved model (its own file keeps it for resuming); the encoder reloads with
    mean pooling for training and last2_avg for evaluation, and embeds as the mean of the last two layers."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="joint", max_steps=2,
                                    inference_pooling="last2_avg")
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == {f"backbone.{k}" for k in encoder.backbone.state_dict()}
    with safe_open(str(out / CLASSIFIER_FILE), "pt") as f:
        assert set(f.keys()) == {"weight", "bias"}

    reloaded = SentenceEncoder.from_pretrained(str(out))
    assert (reloaded.config.pooling, reloaded.config.inference_pooling) == ("mean", "last2_avg")
    assert not hasattr(reloaded, CLASSIFIER_NAME)
    sentences = random_sentences(4, seed=12)
    batch = reloaded.tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = reloaded.backbone(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = (((states[-1] + states[-2]) / 2) * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(reloaded.encode(sentences), expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_resume_restores_the_classifier(tiny_bert_dir, tmp_path):
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="sup", max_steps=2, save_strategy="steps",
                              save_steps=2)
    trainer.train()
    trained = snapshot(trainer.classifier)
    _, fresh = make_trainer(tiny_bert_dir, tmp_path, supervised_mode="sup")
    assert not torch.equal(fresh.classifier.weight, trained["weight"])
    fresh._load_from_checkpoint(str(tmp_path / "out" / "checkpoint-2"))
    assert all(torch.equal(v, trained[k]) for k, v in fresh.classifier.state_dict().items())


def test_trainer_refuses_a_head_and_chained_modes(tiny_bert_dir, tmp_path):
    dataset = Dataset.from_dict({"view0": [[2, 5, 3]] * 4})
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="mlp")
    with pytest.raises(ValueError, match="head: none"):
        ConSERTTrainer(model=encoder, args=make_args(tmp_path), train_dataset=dataset)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="none")
    with pytest.raises(ValueError, match="hf_sentcl.run"):
        ConSERTTrainer(model=encoder, args=make_args(tmp_path, supervised_mode="joint-unsup"), train_dataset=dataset)
