"""ConSERT (Yan et al. 2021): the embedding-level augmentations on tiny BERT and RoBERTa, the supervised loss against
a hand computation, the trainer in its unsup / sup / joint modes, saving, and the chained two-stage recipes."""

import dataclasses
import json
import math
import types

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors import safe_open
from torch import nn

import hf_sentcl.pipeline.train as run_module
from hf_sentcl import SentenceEncoder
from hf_sentcl.augment.embedding import (
    AugmentationRates,
    EmbeddingAugmenter,
    fgv_perturbation,
    random_subset,
    shuffled_order,
)
from hf_sentcl.configs import ConSERTConfig
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.data.nli import LabelledViewCollator
from hf_sentcl.losses import pair_classification_loss
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.cli.train import main
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.trainers.cached import split_batch
from hf_sentcl.trainers.consert import (
    CLASSIFIER_FILE,
    CLASSIFIER_NAME,
    ConSERTTrainer,
    consert_stages,
    disable_dropout,
)

from helpers import random_sentences
from test_cached import assert_same, gradients, step
from test_nli import write_snli

SENTENCES = [
    "the big red dog plays with a blue ball in the park and the cat runs",
    "a man sings",
    "the happy girl eats food with a kid on the street",
]


def tiny_encoder(backbone_dir, **kwargs) -> SentenceEncoder:
    encoder = SentenceEncoder.from_backbone(str(backbone_dir), pooling="mean", head="none", **kwargs)
    disable_dropout(encoder.backbone)  # the encoder's own dropout off, as in ConSERT: outputs are deterministic
    return encoder.train()


def batch_of(encoder, sentences=SENTENCES):
    return encoder.tokenizer(sentences, padding=True, return_tensors="pt")


def embedding_run(encoder, augmenter, batch, names):
    """The embedding output and the position ids the position embedding saw, under a plan for `names`."""
    seen = []
    handle = encoder.backbone.embeddings.position_embeddings.register_forward_hook(
        lambda module, args, output: seen.append(args[0].detach().clone())
    )
    try:
        copies = len(names)
        with augmenter.augment(names, batch["attention_mask"].repeat(copies, 1)) as plan:
            encoder(input_ids=batch["input_ids"].repeat(copies, 1), attention_mask=plan.attention_mask)
    finally:
        handle.remove()
    return plan.embedding_output, seen[0], plan


def reference_output(encoder, batch, position_ids=None):
    """The embedding module's own output, without any plan (optionally with explicit position ids)."""
    extra = {} if position_ids is None else {"position_ids": position_ids}
    return encoder.backbone.embeddings(input_ids=batch["input_ids"], **extra)


def augment_once(backbone_dir, names, seed, **rates):
    """A tiny encoder's embedding output under `names` (one block per name), next to its unaugmented output."""
    torch.manual_seed(seed)
    encoder = tiny_encoder(backbone_dir)
    augmenter = EmbeddingAugmenter(encoder.backbone, AugmentationRates(**rates))
    batch = batch_of(encoder)
    output, positions, plan = embedding_run(encoder, augmenter, batch, names)
    return types.SimpleNamespace(
        encoder=encoder, augmenter=augmenter, batch=batch, reference=reference_output(encoder, batch),
        output=output, positions=positions, plan=plan, real=batch["attention_mask"].sum(dim=1).tolist(),
    )


# ------------------------------------------------------------------------------------------ augmentations
def test_shuffle_permutes_the_position_ids_of_real_tokens_only(tiny_backbone_dir):
    """Real tokens get a permutation of their own position ids (BERT 0.., RoBERTa padding_idx+1..); padding keeps
    its ids; token ids keep their order; the output is the embedding module's output for those position ids."""
    run = augment_once(tiny_backbone_dir, ["shuffle"], seed=0)
    _, default_ids, _ = embedding_run(run.encoder, run.augmenter, run.batch, ["none"])
    default_ids, shuffled = default_ids.expand(len(SENTENCES), -1), run.positions
    mask = run.batch["attention_mask"].bool()
    for row in range(len(SENTENCES)):
        real = mask[row]
        assert sorted(shuffled[row, real].tolist()) == sorted(default_ids[row, real].tolist())
        assert torch.equal(shuffled[row, ~real], default_ids[row, ~real])
    assert not torch.equal(shuffled[0], default_ids[0])  # the long sentence is really shuffled
    embeddings = run.encoder.backbone.embeddings
    if getattr(embeddings, "padding_idx", None) is not None:  # RoBERTa numbering
        assert shuffled[mask].min() == embeddings.padding_idx + 1
    torch.testing.assert_close(run.output, reference_output(run.encoder, run.batch, shuffled), rtol=0, atol=0)


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_token_cutoff_zeroes_floor_rate_of_real_token_rows(tiny_backbone_dir, rate):
    run = augment_once(tiny_backbone_dir, ["token_cutoff"], seed=1, token_cutoff=rate)
    zero_rows = (run.output == 0).all(dim=-1)
    for row, n in enumerate(run.real):
        assert zero_rows[row, :n].sum().item() == math.floor(n * rate)
        assert not zero_rows[row, n:].any()  # padding untouched
        kept = ~zero_rows[row]
        assert torch.equal(run.output[row, kept], run.reference[row, kept])
    assert torch.equal(run.plan.attention_mask, run.batch["attention_mask"])  # ConSERT: attention unchanged


def test_token_cutoff_can_mask_attention(tiny_backbone_dir):
    """token_cutoff_masks_attention: the cut tokens also leave the attention mask the model (and pooling) gets."""
    run = augment_once(tiny_backbone_dir, ["token_cutoff"], seed=2, token_cutoff=0.3, token_cutoff_masks_attention=True)
    cut = (run.output == 0).all(dim=-1) & run.batch["attention_mask"].bool()
    assert cut.any()
    assert torch.equal(run.plan.attention_mask, run.batch["attention_mask"].masked_fill(cut, 0))


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_feature_cutoff_zeroes_floor_rate_of_dimensions_on_real_tokens(tiny_backbone_dir, rate):
    run = augment_once(tiny_backbone_dir, ["feature_cutoff"], seed=3, feature_cutoff=rate)
    output, reference = run.output, run.reference
    for row, n in enumerate(run.real):
        zero_columns = (output[row, :n] == 0).all(dim=0)
        assert zero_columns.sum().item() == math.floor(output.shape[-1] * rate)
        assert torch.equal(output[row, :n, ~zero_columns], reference[row, :n, ~zero_columns])
        assert torch.equal(output[row, n:], reference[row, n:])  # padding untouched


def test_dropout_zeroes_floor_rate_of_real_elements_without_rescaling(tiny_backbone_dir):
    run = augment_once(tiny_backbone_dir, ["dropout"], seed=4, dropout=0.2)
    output, reference = run.output, run.reference
    assert (reference != 0).all()
    for row, n in enumerate(run.real):
        dropped = output[row, :n] == 0
        assert dropped.sum().item() == math.floor(n * output.shape[-1] * 0.2)
        assert not dropped.all(dim=-1).all() and not dropped.all(dim=0).any()  # elements, not rows or columns
        assert torch.equal(output[row, :n][~dropped], reference[row, :n][~dropped])  # no 1/(1-p) rescaling
        assert torch.equal(output[row, n:], reference[row, n:])


def test_each_block_gets_its_own_augmentation(tiny_backbone_dir):
    """Rows are split into equal blocks, one augmentation per block, in one forward pass."""
    run = augment_once(tiny_backbone_dir, ["none", "token_cutoff", "shuffle"], seed=5, token_cutoff=0.4)
    b = len(SENTENCES)
    assert torch.equal(run.output[:b], run.reference)
    assert (run.output[b : 2 * b] == 0).all(dim=-1).any()
    block0 = reference_output(run.encoder, run.batch, run.positions[:b])
    assert torch.equal(block0, run.reference)  # block 0 kept the default positions
    assert not torch.equal(run.positions[2 * b], run.positions[0])


def test_augmentations_are_inactive_in_eval_mode(tiny_backbone_dir):
    """In eval mode (evaluation, encode) an active plan changes nothing: same embeddings, same sentence vectors."""
    torch.manual_seed(6)
    encoder = tiny_encoder(tiny_backbone_dir).eval()
    rates = AugmentationRates(token_cutoff=0.5, feature_cutoff=0.5, dropout=0.5)
    augmenter = EmbeddingAugmenter(encoder.backbone, rates)
    batch = batch_of(encoder)
    with torch.no_grad():
        plain = encoder(**batch).embeddings
        for names in (["shuffle"], ["token_cutoff"], ["feature_cutoff"], ["dropout"]):
            with augmenter.augment(names, batch["attention_mask"]) as plan:
                augmented = encoder(**batch).embeddings
            assert plan.embedding_output is None
            assert torch.equal(augmented, plain), names
    encoder.train()
    with torch.no_grad(), augmenter.augment(["token_cutoff"], batch["attention_mask"]):
        assert not torch.equal(encoder(**batch).embeddings, plain)


def test_random_subset_is_exact_and_uniform():
    """floor(rate * candidates) per row, only among candidates, every candidate equally likely."""
    torch.manual_seed(7)
    candidates = torch.tensor([[True] * 10 + [False] * 6, [True] * 3 + [False] * 13])
    counts = torch.zeros(16)
    for _ in range(2000):
        chosen = random_subset(candidates, 0.35)
        assert chosen.sum(dim=1).tolist() == [3, 1]
        assert not (chosen & ~candidates).any()
        counts += chosen[0].float()
    frequency = counts[:10] / 2000
    assert torch.allclose(frequency, torch.full((10,), 0.3), atol=0.05)


def test_shuffled_order_keeps_padding_on_either_side():
    torch.manual_seed(8)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    order = shuffled_order(mask)
    for row in range(2):
        real = mask[row].bool()
        assert sorted(order[row, real].tolist()) == torch.nonzero(real).flatten().tolist()
        assert torch.equal(order[row, ~real], torch.nonzero(~real).flatten())


def test_plan_must_match_the_batch(tiny_bert_dir):
    encoder = tiny_encoder(tiny_bert_dir)
    augmenter = EmbeddingAugmenter(encoder.backbone)
    batch = batch_of(encoder)
    with pytest.raises(ValueError, match="equal augmentation blocks"):
        with augmenter.augment(["none", "shuffle"], batch["attention_mask"][:1]):
            pass
    with pytest.raises(RuntimeError, match="augmentation plan"):
        with augmenter.augment(["dropout"], batch["attention_mask"][:2]):
            encoder(**batch)
    with pytest.raises(ValueError, match="augmentation must be one of"):
        with augmenter.augment(["cutout"], batch["attention_mask"]):
            pass


def test_shuffle_needs_absolute_position_embeddings():
    embeddings = nn.Linear(2, 2)  # an embedding module without position_embeddings
    backbone = types.SimpleNamespace(embeddings=embeddings, config=types.SimpleNamespace(hidden_size=2))
    augmenter = EmbeddingAugmenter(backbone)
    with pytest.raises(ValueError, match="position_embeddings"):
        with augmenter.augment(["shuffle"], torch.ones(1, 3, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="no `embeddings` module"):
        EmbeddingAugmenter(types.SimpleNamespace(config=None))


def test_fgv_perturbation_has_norm_epsilon_per_sentence():
    """epsilon * g / ||g||: per-sentence L2 norm epsilon over real tokens, parallel to g, zero on padding."""
    gradient = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    r = fgv_perturbation(gradient, mask, 0.5)
    assert (r[0, 3] == 0).all() and (r[1, 2:] == 0).all()
    for row in range(2):
        real = mask[row].bool()
        assert r[row, real].norm().item() == pytest.approx(0.5, rel=1e-6)
        ratio = r[row, real] / gradient[row, real]
        assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio)) and ratio.flatten()[0] > 0


# ------------------------------------------------------------------------------------------ supervised loss
def test_pair_classification_loss_matches_hand_computation():
    """L_ce = -log softmax(W [r1, r2, |r1 - r2|] + b)[y], mean over pairs, in float64 loops; fp32 under autocast."""
    g = torch.Generator().manual_seed(10)
    r1, r2 = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    weight, bias = torch.randn(3, 12, generator=g), torch.randn(3, generator=g)
    labels = torch.tensor([0, 2, 1, 1, 0])
    expected = 0.0
    for i in range(5):
        a, b = [float(v) for v in r1[i]], [float(v) for v in r2[i]]
        features = a + b + [abs(x - y) for x, y in zip(a, b)]
        logits = [sum(float(weight[c, j]) * features[j] for j in range(12)) + float(bias[c]) for c in range(3)]
        top = max(logits)
        expected += -(logits[labels[i]] - top) + math.log(sum(math.exp(v - top) for v in logits))
    expected /= 5
    loss, logits = pair_classification_loss(r1, r2, labels, weight, bias)
    assert logits.shape == (5, 3)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast, _ = pair_classification_loss(r1, r2, labels, weight, bias)
    assert under_autocast.dtype == torch.float32 and under_autocast.item() == pytest.approx(expected, rel=1e-5)


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


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed_keys(before, module):
    return {k for k, v in module.state_dict().items() if k in before and not torch.equal(v, before[k])}


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


@pytest.mark.parametrize(
    "overrides,key",
    [(dict(augmentation1="cutout"), "augmentation1"), (dict(augmentation2="adversarial"), "augmentation2"),
     (dict(token_cutoff_rate=1.0), "token_cutoff_rate"), (dict(dropout_rate=-0.1), "dropout_rate"),
     (dict(temperature=0), "temperature"), (dict(supervised_mode="semi"), "supervised_mode"),
     (dict(adversarial=True), "adversarial"), (dict(supervised_mode="sup", adversarial=True), "adversarial"),
     (dict(nli_source="senteval"), "nli_source"), (dict(supervised_mode="joint", nli_source=None), "nli_source"),
     (dict(supervised_learning_rate=1e-5), "supervised_learning_rate"), (dict(alpha=-1), "alpha"),
     (dict(supervised_batch_size=16), "supervised_batch_size"),
     (dict(supervised_mode="sup-unsup", nli_source="senteval", supervised_batch_size=0), "supervised_batch_size"),
     (dict(supervised_mode="sup", nli_source="senteval", perturbation="p+", margin=0.1), "perturbation"),
     (dict(supervised_mode="joint", adversarial=True, adversarial_epsilon=0), "adversarial_epsilon")],
)
def test_config_errors_name_the_key(tmp_path, overrides, key):
    settings = dict(output_dir=str(tmp_path), use_cpu=True)
    settings.update(overrides)
    with pytest.raises(ValueError, match=key):
        ConSERTConfig(**settings)


# ------------------------------------------------------------------------------------------ recipes and stages
def write_recipe(tmp_path, name="recipe.yaml", **values):
    path = tmp_path / name
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, list):
            value = "[" + ", ".join(map(str, value)) + "]"
        lines.append(f"{key}: {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stages_of_chained_modes(tmp_path):
    """joint-unsup: stage 1 joint on NLI into <output_dir>/stage-1 with the supervised_* settings and no push;
    stage 2 unsup on the unlabeled text from stage 1's export into output_dir; a checkpoint to resume picks the
    stage by its folder. Single modes: one stage."""
    recipe = parse_recipe(write_recipe(
        tmp_path, method="consert", supervised_mode="joint-unsup", nli_source="senteval", unlabeled_sts="all",
        output_dir=str(tmp_path / "out"), learning_rate=5e-7, supervised_learning_rate=2e-5,
        supervised_num_train_epochs=2, adversarial=True, head="none", pooling="mean", supervised_batch_size=16,
        per_device_train_batch_size=96, train_subset_size=100,
    ))
    first, second = consert_stages(recipe)
    assert first.training.supervised_mode == "joint" and second.training.supervised_mode == "unsup"
    assert first.training.output_dir == str(tmp_path / "out" / "stage-1")
    assert (first.training.learning_rate, first.training.num_train_epochs) == (2e-5, 2.0)
    assert (first.training.per_device_train_batch_size, second.training.per_device_train_batch_size) == (16, 96)
    # the few-shot subset limits stage 2's unlabeled text, not stage 1's NLI pairs
    assert (first.data.train_subset_size, second.data.train_subset_size) == (None, 100)
    assert first.training.adversarial and not first.training.push_to_hub
    assert first.model.model_name_or_path == recipe.model.model_name_or_path
    assert second.model.model_name_or_path == str(tmp_path / "out" / "stage-1" / "export")
    assert second.training.output_dir == str(tmp_path / "out")
    assert (second.training.learning_rate, second.training.num_train_epochs) == (5e-7, 1.0)
    assert second.training.nli_source is None and not second.training.adversarial
    assert second.data.unlabeled_sts == "all"

    assert first.training.resume_from_checkpoint is None and second.training.resume_from_checkpoint is None

    def resuming(checkpoint):
        training = dataclasses.replace(recipe.training, resume_from_checkpoint=checkpoint)
        return dataclasses.replace(recipe, training=training)

    stage_one_checkpoint = str(tmp_path / "out" / "stage-1" / "checkpoint-4")
    first, second = consert_stages(resuming(stage_one_checkpoint))
    assert first.training.resume_from_checkpoint == stage_one_checkpoint
    assert second.training.resume_from_checkpoint is None
    resumed_second = resuming(str(tmp_path / "out" / "checkpoint-8"))
    with pytest.raises(ValueError, match="stage-1/export"):
        consert_stages(resumed_second)
    (tmp_path / "out" / "stage-1" / "export").mkdir(parents=True)
    (only,) = consert_stages(resumed_second)
    assert only.training.supervised_mode == "unsup" and only.training.resume_from_checkpoint.endswith("checkpoint-8")

    single = parse_recipe(write_recipe(tmp_path, method="consert", unlabeled_sts="all", output_dir="x"))
    assert consert_stages(single) == [single]
    unused = parse_recipe(write_recipe(tmp_path, method="consert", supervised_mode="joint", nli_source="senteval",
                                       unlabeled_sts="all", output_dir="x"))
    with pytest.raises(ValueError, match="unlabeled_sts"):
        consert_stages(unused)


def test_validation_names_the_missing_nli_file(tmp_path, senteval_dir, tiny_bert_dir, capsys):
    """Before any model loads: a joint recipe whose SNLI split is missing exits 2 naming the file."""
    recipe = write_recipe(tmp_path, method="consert", supervised_mode="joint", nli_source="senteval",
                          sts_data_dir=str(senteval_dir), model_name_or_path=str(tiny_bert_dir), head="none",
                          output_dir=str(tmp_path / "out"))
    assert main([str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "SNLI/s1.train" in err and "nli_splits" in err
    unsup_without_text = write_recipe(tmp_path, method="consert", sts_data_dir=str(senteval_dir), head="none",
                                      model_name_or_path=str(tiny_bert_dir), output_dir=str(tmp_path / "out"))
    with pytest.raises(RecipeError, match="unlabeled_sts"):
        validate_recipe(parse_recipe(unsup_without_text))


@pytest.mark.slow
def test_chained_run_continues_from_the_first_stages_weights(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    """joint-unsup through `run`: stage 2's encoder starts from exactly stage 1's final weights, stage 1 really
    trained, stage 2 trained further; stage 1's results sit in output_dir/stage-1, the final ones in output_dir."""
    snli = tmp_path / "SNLI"
    write_snli(snli, "dev", n=12, seed=20)
    built = []
    original_build = run_module.build_encoder

    def recording_build(recipe):
        encoder = original_build(recipe)
        built.append((encoder, snapshot(encoder.backbone)))
        return encoder

    monkeypatch.setattr(run_module, "build_encoder", recording_build)
    out = tmp_path / "out"
    recipe = parse_recipe(write_recipe(
        tmp_path, method="consert", supervised_mode="joint-unsup", nli_source=str(snli), nli_splits=["dev"],
        unlabeled_sts="all", sts_data_dir=str(senteval_dir), model_name_or_path=str(tiny_bert_dir), pooling="mean",
        head="none", inference_pooling="last2_avg", output_dir=str(out), per_device_train_batch_size=4,
        max_train_samples=12, max_seq_length=16, learning_rate="1e-3", supervised_learning_rate="1e-3",
        eval_strategy='"no"', save_strategy='"no"', load_best_model_at_end=False, eval_before_training=False,
        use_cpu=True, seed=0, warmup_steps=0,
    ))
    results = run(recipe)

    (first, first_start), (second, second_start) = built
    assert all(torch.equal(v, second_start[k]) for k, v in first.backbone.state_dict().items())
    assert changed_keys(first_start, first.backbone)  # stage 1 trained
    assert changed_keys(second_start, second.backbone)  # stage 2 trained further
    assert second.config.inference_pooling == "last2_avg"

    stage_one = json.loads((out / "stage-1" / "results.json").read_text())
    assert stage_one["train"]["global_step"] == 3 and set(stage_one["sts"]) == {"after"}
    final = json.loads((out / "results.json").read_text())  # run() returns the last stage's results
    assert final["model_name_or_path"] == results["model_name_or_path"] == str(out / "stage-1" / "export")
    assert final["train"]["global_step"] == results["train"]["global_step"] == 3
    assert SentenceEncoder.from_pretrained(out).config.inference_pooling == "last2_avg"


@pytest.mark.parametrize(
    "name", ["consert_bert", "consert_bert_joint", "consert_bert_joint_unsup", "consert_bert_sup_unsup", "consert_minilm",
             "consert_minilm_joint"]
)
def test_recipes_carry_the_paper_settings(repo_root, monkeypatch, name):
    """Section 4.1: mean pooling in training, no head, tau 0.1, alpha 0.15, batch 96, max_len 64, 10% warm-up,
    STS-B dev every 200 steps (MiniLM: 25), encoder dropout off; BERT recipes evaluate with last2_avg."""
    monkeypatch.setenv("HF_SENTCL_DATA", "/data/senteval")
    recipe = parse_recipe(repo_root / "recipes" / f"{name}.yaml")
    args = recipe.training
    assert recipe.method == "consert" and recipe.model.pooling == "mean" and recipe.model.head == "none"
    assert (args.temperature, args.alpha, args.per_device_train_batch_size) == (0.1, 0.15, 96)
    assert (recipe.data.max_seq_length, args.warmup_steps, args.encoder_dropout) == (64, 0.1, False)
    joint = name in ("consert_bert_joint", "consert_minilm_joint")
    # the joint recipes take the authors' joint script's clean + token cutoff 0.1 (the paper gives none)
    assert (args.token_cutoff_rate, args.feature_cutoff_rate, args.dropout_rate) == (0.1 if joint else 0.15, 0.2, 0.2)
    assert args.load_best_model_at_end and args.metric_for_best_model == "stsb_spearman"
    if name.startswith("consert_bert"):
        assert recipe.model.model_name_or_path == "bert-base-uncased"
        assert recipe.model.inference_pooling == "last2_avg" and args.eval_steps == 200
    if name == "consert_bert":
        assert (args.supervised_mode, args.learning_rate) == ("unsup", 5e-7)
        assert (args.augmentation1, args.augmentation2) == ("shuffle", "feature_cutoff")
        assert recipe.data.unlabeled_sts == "all"
    if joint:
        assert args.supervised_mode == "joint" and recipe.data.unlabeled_sts is None and args.nli_source
        assert (args.augmentation1, args.augmentation2) == ("none", "token_cutoff")
    if name == "consert_bert_sup_unsup":  # stage 1: SBERT's settings (batch 16, lr 2e-5, 1 epoch)
        first, second = consert_stages(recipe)
        assert (first.training.supervised_mode, second.training.supervised_mode) == ("sup", "unsup")
        assert first.training.per_device_train_batch_size == 16 and first.training.learning_rate == 2e-5
        assert first.training.num_train_epochs == 1
        assert second.training.per_device_train_batch_size == 96 and second.training.learning_rate == 5e-7
    if name == "consert_bert_joint_unsup":
        assert args.supervised_mode == "joint-unsup" and recipe.data.unlabeled_sts == "all"
        assert args.learning_rate == 5e-7 and args.supervised_learning_rate is not None


def test_card_names_the_nli_pairs_of_a_joint_run(repo_root, senteval_dir, monkeypatch):
    """results.json / the model card name the NLI source of a sup/joint stage, not the (unset) unlabeled text."""
    from hf_sentcl.recipe.metadata import training_data_summary

    monkeypatch.setenv("HF_SENTCL_DATA", str(senteval_dir))
    joint = parse_recipe(repo_root / "recipes" / "consert_minilm_joint.yaml")
    summary = training_data_summary(joint, 10, ("premise", "hypothesis"))
    assert summary["source"] == "nli_source"
    assert summary["name"].startswith("senteval '") and str(senteval_dir) in summary["name"]
    unsup = parse_recipe(repo_root / "recipes" / "consert_minilm.yaml")
    assert training_data_summary(unsup, 10, ("text",))["source"] == "unlabeled_sts"


# ------------------------------------------------------------------------------------------ unlabeled STS corpus
def test_unlabeled_sts_counts_every_input_row(senteval_dir):
    """'all' takes both sentences of every STS12-16 input row, scored or not, plus every STS-B and SICK split;
    'all-scored' leaves out the rows without a gold score (the fixture blanks some)."""
    from hf_sentcl.evaluation.sts import (
        STS_TASKS, load_sts_task, read_lines, unlabeled_sts_sentences, unlabeled_sts_texts,
    )

    rows = 0
    scored = 0
    for task in STS_TASKS[:5]:
        folder = senteval_dir / "STS" / f"{task}-en-test"
        for subset, pairs in load_sts_task(senteval_dir, task).items():
            rows += len(read_lines(folder / f"STS.input.{subset}.txt"))
            scored += len(pairs)
    splits = sum(len(p) for t in STS_TASKS[5:] for s in ("train", "dev", "test") for p in load_sts_task(
        senteval_dir, t, s).values())
    assert rows > scored
    assert len(unlabeled_sts_texts(senteval_dir, "all")) == 2 * (rows + splits)
    assert len(unlabeled_sts_texts(senteval_dir, "all-scored")) == 2 * (scored + splits)
    everything = unlabeled_sts_sentences(senteval_dir, "all")
    assert len(everything) == len(set(everything)) > len(unlabeled_sts_sentences(senteval_dir, "all-scored"))


def test_unlabeled_sts_is_the_papers_89192_texts(real_data_dir):
    """ConSERT's Table 1: 89,192 unlabeled texts (48,699 distinct); the scored rows alone give 30,840 distinct."""
    from hf_sentcl.evaluation.sts import unlabeled_sts_sentences, unlabeled_sts_texts

    texts = unlabeled_sts_texts(real_data_dir, "all")
    assert len(texts) == 89192 and len(set(texts)) == 48699
    assert len(unlabeled_sts_sentences(real_data_dir, "all")) == 48699
    assert len(unlabeled_sts_sentences(real_data_dir, "all-scored")) == 30840
    assert len(unlabeled_sts_texts(real_data_dir, "stsb")) == 2 * 8628
