"""Self-guided contrastive learning (SG / SG-OPT, Kim et al. 2021): the losses against independent loop
computations, and the trainer on the tiny BERT (frozen copy, frozen layer 0, regularizer, saving)."""

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import loss_with_fixed_draws, random_sentences
from safetensors import safe_open
from torch import nn
from transformers import EarlyStoppingCallback

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.losses import info_nce, parameter_distance
from hf_sentcl.methods.self_guided.config import SelfGuidedConfig
from hf_sentcl.methods.self_guided.loss import sg_loss, sg_opt1_loss, sg_opt2_loss, sg_opt_loss
from hf_sentcl.methods.self_guided.trainer import (
    HEAD_FILE,
    HEAD_NAME,
    SelfGuidedTrainer,
    pool_views,
    resolve_view_layers,
)
from hf_sentcl.recipe.parser import parse_recipe


# ------------------------------------------------------------------------------------------ loop references
def cos(u, v) -> float:
    return float(np.dot(u, v) / (math.sqrt(np.dot(u, u)) * math.sqrt(np.dot(v, v))))


def neg_log_softmax(positive: float, negatives: list[float]) -> float:
    """-log(exp(positive) / (exp(positive) + sum exp(negatives))), with the max subtracted by hand."""
    top = max([positive, *negatives])
    return -(positive - top) + math.log(math.exp(positive - top) + sum(math.exp(n - top) for n in negatives))


def ref_sg(c, h, t) -> float:
    """L_base: X = [c_1..c_b, h_1..h_b]; for each x_m, positive its partner, negatives every x_n, n != m, partner."""
    x = np.concatenate([np.asarray(c, np.float64), np.asarray(h, np.float64)])
    b = len(c)
    total = 0.0
    for m in range(2 * b):
        partner = m + b if m < b else m - b
        negatives = [cos(x[m], x[n]) / t for n in range(2 * b) if n not in (m, partner)]
        total += neg_log_softmax(cos(x[m], x[partner]) / t, negatives)
    return total / (2 * b)


def ref_opt1(c, h, t) -> float:
    c, h = np.asarray(c, np.float64), np.asarray(h, np.float64)
    b = len(c)
    total = 0.0
    for i in range(b):
        negatives = [cos(c[i], c[j]) / t for j in range(b) if j != i]
        negatives += [cos(c[i], h[j]) / t for j in range(b) if j != i]
        total += neg_log_softmax(cos(c[i], h[i]) / t, negatives)
    return total / b


def ref_opt2(c, h, t) -> float:
    c, h = np.asarray(c, np.float64), np.asarray(h, np.float64)
    b = len(c)
    return sum(
        neg_log_softmax(cos(c[i], h[i]) / t, [cos(c[i], h[j]) / t for j in range(b) if j != i]) for i in range(b)
    ) / b


def ref_opt(c, h, t, negatives_from="other_sentences_all_layers") -> float:
    """L_opt as written in the paper (default), or two wrong readings used to show the test can tell them apart:
    'also_own_views' (other views of sentence i as negatives) and 'same_layer_only' (only layer k of others)."""
    c, h = np.asarray(c, np.float64), np.asarray(h, np.float64)
    b, views, _ = h.shape
    total = 0.0
    for i in range(b):
        for k in range(views):
            negatives = [cos(c[i], h[m, n]) / t for m in range(b) if m != i for n in range(views)]
            if negatives_from == "also_own_views":
                negatives += [cos(c[i], h[i, n]) / t for n in range(views) if n != k]
            elif negatives_from == "same_layer_only":
                negatives = [cos(c[i], h[m, k]) / t for m in range(b) if m != i]
            total += neg_log_softmax(cos(c[i], h[i, k]) / t, negatives)
    return total / (b * views)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ losses
@pytest.mark.parametrize("temperature", [0.01, 0.1, 1.0])
def test_sg_loss_matches_loops(temperature):
    """L_base equals the NT-Xent loop over the 2b vectors {c} U {h}, averaged over 2b terms."""
    c, h = randn(6, 5, seed=1), randn(6, 5, seed=2)
    assert sg_loss(c, h, temperature).item() == pytest.approx(ref_sg(c, h, temperature), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("temperature", [0.01, 0.1, 1.0])
def test_sg_opt_loss_matches_loops(temperature):
    """L_opt equals the loop over every (sentence i, view k) with the b(l+1) terms averaged."""
    c, h = randn(5, 6, seed=3), randn(5, 4, 6, seed=4)
    loss = sg_opt_loss(c, h, temperature)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(ref_opt(c, h, temperature), rel=1e-5, abs=1e-6)


def test_sg_opt_loss_negatives_are_all_layers_of_other_sentences_only():
    """Own views of other layers are not negatives, and every layer of other sentences is: the loss equals the
    paper's reading and differs clearly from the two wrong ones on the same inputs."""
    c, h = randn(4, 3, seed=5), randn(4, 3, 3, seed=6)
    loss = sg_opt_loss(c, h, 0.1).item()
    assert loss == pytest.approx(ref_opt(c, h, 0.1), rel=1e-5)
    assert abs(loss - ref_opt(c, h, 0.1, "also_own_views")) > 1e-2
    assert abs(loss - ref_opt(c, h, 0.1, "same_layer_only")) > 1e-2


def test_sg_opt_loss_with_one_view_is_opt2():
    """With a single view per sentence L_opt reduces to L_opt2 (= InfoNCE of c against h)."""
    c, h = randn(6, 4, seed=8), randn(6, 4, seed=9)
    assert sg_opt_loss(c, h.unsqueeze(1), 0.05).item() == pytest.approx(sg_opt2_loss(c, h, 0.05).item(), rel=1e-6)
    assert sg_opt2_loss(c, h, 0.05).item() == pytest.approx(info_nce(c, h, 0.05).item(), rel=1e-6)


@pytest.mark.parametrize("temperature", [0.01, 0.5])
def test_opt1_and_opt2_match_loops(temperature):
    """The section 3.2 ablation steps: L_opt1 (anchors c only, negatives c_j and h_j) and L_opt2 (negatives h_j)."""
    c, h = randn(5, 7, seed=10), randn(5, 7, seed=11)
    assert sg_opt1_loss(c, h, temperature).item() == pytest.approx(ref_opt1(c, h, temperature), rel=1e-5, abs=1e-6)
    assert sg_opt2_loss(c, h, temperature).item() == pytest.approx(ref_opt2(c, h, temperature), rel=1e-5, abs=1e-6)


def test_losses_run_in_fp32_under_bf16_autocast():
    """Under CPU bf16 autocast the losses still compute similarities in fp32 (same values as without autocast)."""
    c, h, hs = randn(8, 16, seed=12), randn(8, 16, seed=13), randn(8, 3, 16, seed=14)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = [sg_loss(c, h, 0.01), sg_opt1_loss(c, h, 0.01), sg_opt_loss(c, hs, 0.01)]
    assert all(v.dtype == torch.float32 for v in values)
    expected = [sg_loss(c, h, 0.01), sg_opt1_loss(c, h, 0.01), sg_opt_loss(c, hs, 0.01)]
    for value, reference in zip(values, expected):
        assert value.item() == pytest.approx(reference.item(), rel=1e-6)


def test_loss_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(b, views, d\)"):
        sg_opt_loss(randn(4, 3), randn(4, 3), 0.1)
    with pytest.raises(ValueError, match=r"\(b, d\)"):
        sg_loss(randn(4, 3), randn(4, 2, 3), 0.1)


def test_parameter_distance_matches_loops():
    """sum over shared parameters of ||a - b||^2; zero for a clone; gradient into the tuned module only;
    frozen (requires_grad=False) parameters are skipped unless trainable_only=False."""
    torch.manual_seed(0)
    tuned, frozen = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    expected = sum(
        float(((a.detach().double() - b.detach().double()) ** 2).sum())
        for a, b in zip(tuned.parameters(), frozen.parameters())
    )
    distance = parameter_distance(tuned, frozen)
    assert distance.item() == pytest.approx(expected, rel=1e-6)
    distance.backward()
    assert tuned[0].weight.grad is not None and frozen[0].weight.grad is None
    np.testing.assert_allclose(
        tuned[0].weight.grad.numpy(), 2 * (tuned[0].weight - frozen[0].weight).detach().numpy(), rtol=1e-6
    )
    assert parameter_distance(frozen, frozen).item() == 0.0

    tuned[0].requires_grad_(False)
    without_first = sum(
        float(((a.detach() - b.detach()) ** 2).sum()) for a, b in zip(tuned[1].parameters(), frozen[1].parameters())
    )
    assert parameter_distance(tuned, frozen).item() == pytest.approx(without_first, rel=1e-6)
    assert parameter_distance(tuned, frozen, trainable_only=False).item() == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------------------ view pooling
def test_pool_views_ignores_padding_and_picks_layers():
    """Max and mean views use real tokens only; the layer list picks hidden states (0 = embeddings)."""
    states = [randn(2, 4, 3, seed=20 + k) for k in range(3)]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    states[2][1, 2:] = 100.0  # padding positions that must never win
    views = pool_views(states, mask, [0, 2], "max")
    assert views.shape == (2, 2, 3)
    torch.testing.assert_close(views[1, 1], states[2][1, :2].max(dim=0).values)
    torch.testing.assert_close(views[0, 0], states[0][0].max(dim=0).values)
    mean = pool_views(states, mask, [2], "mean")
    torch.testing.assert_close(mean[1, 0], states[2][1, :2].mean(dim=0))


def test_resolve_view_layers():
    assert resolve_view_layers(None, 2) == [0, 1, 2]
    assert resolve_view_layers([-1, 1], 2) == [2, 1]
    with pytest.raises(ValueError, match="view_layers"):
        resolve_view_layers([3], 2)
    with pytest.raises(ValueError, match="same hidden state"):
        resolve_view_layers([2, -1], 2)


# ------------------------------------------------------------------------------------------ the trainer
def make_args(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=1e-3, num_train_epochs=1,
        eval_strategy="no", load_best_model_at_end=False, save_strategy="no", report_to="none", use_cpu=True,
        logging_steps=1, seed=0, disable_tqdm=True, warmup_steps=0, temperature=0.1, projection_size=32,
    )
    settings.update(overrides)
    return SelfGuidedConfig(**settings)


def make_trainer(tiny_bert_dir, tmp_path, n=16, eval_dataset=None, **overrides):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="none")
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(n, seed=3)}), encoder.tokenizer, ("text",), 32)
    trainer = SelfGuidedTrainer(
        model=encoder, args=make_args(tmp_path, **overrides), train_dataset=dataset, eval_dataset=eval_dataset,
        data_collator=ViewCollator(encoder.tokenizer),
    )
    return encoder, trainer


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_setup_frozen_copy_embeddings_head_and_regularizer_at_step_0(tiny_bert_dir, tmp_path):
    """BERT_F: a clone outside the model, no gradients, eval mode; BERT_T's layer 0 frozen; the head is a
    training-only submodule; the regularizer is exactly zero before the first step."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path)
    frozen = trainer.frozen_backbone
    assert frozen is not encoder.backbone and not frozen.training
    assert not any(p.requires_grad for p in frozen.parameters())
    model_params = {id(p) for p in encoder.parameters()}
    assert not any(id(p) in model_params for p in frozen.parameters())
    assert not any(p.requires_grad for p in encoder.backbone.embeddings.parameters())
    assert all(p.requires_grad for n, p in encoder.backbone.named_parameters()
               if not n.startswith(("embeddings.", "pooler.")))  # the unused pooler: frozen by ContrastiveTrainer
    assert isinstance(getattr(encoder, HEAD_NAME), nn.Module)
    assert parameter_distance(encoder.backbone, frozen).item() == 0.0
    assert parameter_distance(encoder.backbone, frozen, trainable_only=False).item() == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sg-opt", "sg", "opt1", "opt2"])
def test_training_steps(tiny_bert_dir, tmp_path, objective):
    """A few steps on the same batch: the contrastive loss under fixed draws falls, BERT_T's transformer layers and
    the head change, its embedding layer and the frozen copy stay bit-identical, BERT_F runs once per step without
    autograd, and the logged regularizer is 0 at step 1 and positive afterwards."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, n=8, num_train_epochs=10, objective=objective)
    frozen_before, tuned_before = snapshot(trainer.frozen_backbone), snapshot(encoder)
    loss_before = loss_with_fixed_draws(trainer, encoder, "contrastive_loss")
    calls = []
    trainer.frozen_backbone.register_forward_hook(
        lambda module, args, kwargs, output: calls.append((torch.is_grad_enabled(), len(output.hidden_states))),
        with_kwargs=True,
    )
    trainer.train()

    assert calls == [(False, 3)] * trainer.state.global_step  # one no-grad forward, all 3 hidden states
    assert all(torch.equal(v, frozen_before[k]) for k, v in trainer.frozen_backbone.state_dict().items())
    after = encoder.state_dict()
    changed = {k for k, v in after.items() if not torch.equal(v, tuned_before[k])}
    assert not any(k.startswith("backbone.embeddings.") for k in changed)
    assert any(k.startswith("backbone.encoder.layer.1.") for k in changed)
    assert any(k.startswith(f"{HEAD_NAME}.") for k in changed)

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["param_distance"] == 0.0 and logs[-1]["param_distance"] > 0
    assert logs[-1]["loss"] == pytest.approx(logs[-1]["contrastive_loss"] + 0.1 * logs[-1]["param_distance"], rel=1e-3)
    assert loss_with_fixed_draws(trainer, encoder, "contrastive_loss") < loss_before


def test_frozen_views_do_not_depend_on_padding(tiny_bert_dir, tmp_path):
    """A sentence's views are the same alone and padded in a batch with a longer sentence (real tokens only)."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path)
    tokenizer = encoder.tokenizer
    short, long = "the cat runs", "the big red dog plays with a blue ball in the park"
    batch = tokenizer([short, long], padding=True, return_tensors="pt")
    alone = tokenizer([short], return_tensors="pt")
    for pooling in ("max", "mean"):
        trainer.args.view_pooling = pooling
        together = trainer.frozen_views(batch["input_ids"], batch["attention_mask"])
        single = trainer.frozen_views(alone["input_ids"], alone["attention_mask"])
        assert together.shape == (2, 3, encoder.config.hidden_size)
        torch.testing.assert_close(together[0], single[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_frozen_copy_and_head_follow_the_training_precision(tiny_bert_dir, tmp_path, bf16):
    """With `bf16: true` BERT_F's forward and the projection head run under the same bf16 autocast as BERT_T in a
    training step (they are outside the model's wrapped forward, so they would otherwise run in fp32); the pooled
    views stay fp32 and match an fp32 forward to bf16 rounding."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, bf16=bf16)
    dtypes = []
    record = lambda module, args, output: dtypes.append(output.dtype)  # noqa: E731
    trainer.frozen_backbone.encoder.layer[0].output.dense.register_forward_hook(record)
    trainer.projection_head.layers[2].register_forward_hook(record)
    batch = encoder.tokenizer(["the cat runs", "a dog plays in the park"], padding=True, return_tensors="pt")
    with trainer.compute_loss_context_manager():  # what Trainer.training_step and the cached step run the loss in
        views = trainer.frozen_views(batch["input_ids"], batch["attention_mask"])
        projected = trainer.project(views)
    expected = torch.bfloat16 if bf16 else torch.float32
    assert dtypes == [expected, expected] and projected.dtype == expected and views.dtype == torch.float32
    with torch.no_grad():
        states = trainer.frozen_backbone(**batch, output_hidden_states=True).hidden_states
    reference = pool_views(states, batch["attention_mask"], trainer.view_layers, trainer.args.view_pooling)
    tolerance = dict(atol=5e-2, rtol=2e-2) if bf16 else dict(atol=0, rtol=0)
    torch.testing.assert_close(views, reference, **tolerance)


@pytest.mark.parametrize("frozen_dropout", [False, True])
def test_frozen_dropout_noises_views_only_while_training(tiny_bert_dir, tmp_path, frozen_dropout):
    """By default BERT_F's views are deterministic; with `frozen_dropout` (the authors' code) they carry dropout
    while BERT_T trains, and are deterministic again in evaluation. The weights stay frozen either way."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, frozen_dropout=frozen_dropout)
    batch = encoder.tokenizer(["the cat runs", "a dog plays in the park"], padding=True, return_tensors="pt")
    frozen_before = snapshot(trainer.frozen_backbone)
    encoder.train()
    first = trainer.frozen_views(batch["input_ids"], batch["attention_mask"])
    second = trainer.frozen_views(batch["input_ids"], batch["attention_mask"])
    assert torch.equal(first, second) != frozen_dropout
    encoder.eval()
    assert torch.equal(*(trainer.frozen_views(batch["input_ids"], batch["attention_mask"]) for _ in range(2)))
    assert not trainer.frozen_backbone.training
    assert all(torch.equal(v, frozen_before[k]) for k, v in trainer.frozen_backbone.state_dict().items())


@pytest.mark.slow
def test_saved_encoder_is_last_layer_cls_without_head_or_frozen_copy(tiny_bert_dir, tmp_path):
    """The saved model holds BERT_T only (no projection head, no frozen copy); it reloads with [CLS] pooling and
    embeds like the trained backbone's last-layer [CLS]. The head sits in its own file for resuming."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=2)
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert keys == {f"backbone.{k}" for k in encoder.backbone.state_dict()}
    assert (out / HEAD_FILE).is_file()

    reloaded = SentenceEncoder.from_pretrained(str(out))
    assert reloaded.config.pooling == "cls" and reloaded.config.head == "none" and reloaded.head is None
    assert not hasattr(reloaded, HEAD_NAME)
    sentences = random_sentences(4, seed=9)
    batch = reloaded.tokenizer(sentences, padding=True, return_tensors="pt")
    encoder.eval()
    with torch.no_grad():
        expected = encoder.backbone(**batch).last_hidden_state[:, 0]  # the trained BERT_T's last-layer [CLS]
    np.testing.assert_allclose(reloaded.encode(sentences), expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_resume_restores_projection_head(tiny_bert_dir, tmp_path):
    """A checkpoint carries the head in its own file and resuming loads it back into the head."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    trained_head = snapshot(trainer.projection_head)
    _, fresh = make_trainer(tiny_bert_dir, tmp_path)
    assert not torch.equal(fresh.projection_head.layers[0].weight, trained_head["layers.0.weight"])
    fresh._load_from_checkpoint(str(checkpoint))
    assert all(torch.equal(v, trained_head[k]) for k, v in fresh.projection_head.state_dict().items())


def test_head_mlp_and_wrong_pooling_are_rejected(tiny_bert_dir, tmp_path):
    """The encoder's own MLP head must be off, and c must be last-layer [CLS]: clear errors naming the key."""
    dataset = Dataset.from_dict({"view0": [[2, 5, 3]] * 4})
    for kwargs, key in ((dict(pooling="cls", head="mlp"), "head: none"), (dict(pooling="mean", head="none"), "pooling"),
                        (dict(pooling="cls", head="none", pooling_layer=1), "pooling_layer")):
        encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), **kwargs)
        with pytest.raises(ValueError, match=key):
            SelfGuidedTrainer(model=encoder, args=make_args(tmp_path), train_dataset=dataset,
                              data_collator=ViewCollator(encoder.tokenizer))


def test_config_validation_and_early_stopping(tiny_bert_dir, tmp_path):
    """Bad knob values fail at construction; early_stopping_patience attaches EarlyStoppingCallback."""
    for bad in (dict(objective="simclr"), dict(view_pooling="cls"), dict(view_layers=[]), dict(temperature=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_args(tmp_path, **bad)
    with pytest.raises(ValueError, match="early_stopping_patience"):
        make_args(tmp_path, early_stopping_patience=3)  # eval_strategy "no"
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, eval_dataset=Dataset.from_dict({"x": [0]}),
                              early_stopping_patience=3, eval_strategy="steps",
                              eval_steps=5, save_strategy="steps", save_steps=5, load_best_model_at_end=True)
    callbacks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EarlyStoppingCallback)]
    assert len(callbacks) == 1 and callbacks[0].early_stopping_patience == 3
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, projection_head=False, view_layers=[1, 2])
    assert trainer.projection_head is None and trainer.view_layers == [1, 2]
    assert not hasattr(trainer.model, HEAD_NAME) or getattr(trainer.model, HEAD_NAME) is None


@pytest.mark.parametrize("name", ["sg_opt_bert", "sg_bert", "sg_opt_roberta", "sg_opt_minilm"])
def test_recipes_carry_the_paper_settings(repo_root, monkeypatch, name):
    """Table 8: tau 0.01, lambda 0.1, batch 16, lr 5e-5, AdamW betas (0.9, 0.9), 1 epoch, eval every 50 steps,
    early-stopping patience 10; unlabeled STS-B sentences; raw [CLS], no encoder head."""
    monkeypatch.setenv("HF_SENTCL_DATA", "/data/senteval")
    recipe = parse_recipe(repo_root / "recipes" / f"{name}.yaml")
    args = recipe.training
    assert recipe.method == "self_guided" and recipe.data.unlabeled_sts == "stsb"
    assert recipe.model.pooling == "cls" and recipe.model.head == "none"
    assert args.objective == ("sg" if name == "sg_bert" else "sg-opt")
    assert (args.temperature, args.regularizer_weight, args.per_device_train_batch_size) == (0.01, 0.1, 16)
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2, args.num_train_epochs) == (5e-5, 0.9, 0.9, 1.0)
    assert (args.eval_steps, args.early_stopping_patience, args.view_pooling) == (50, 10, "max")


def test_parameter_distance_gradcheck_and_keeps_no_differences():
    """The regularizer's custom backward passes gradcheck in float64 and keeps only the parameters themselves
    (no per-parameter difference tensors) for backward."""
    from hf_sentcl.losses.parameter_distance import _SquaredDistance

    tuned = [randn(3, 4, seed=30).double().requires_grad_(), randn(2, seed=31).double().requires_grad_()]
    frozen = [randn(3, 4, seed=32).double(), randn(2, seed=33).double()]
    assert torch.autograd.gradcheck(lambda a, b: _SquaredDistance.apply(2, a, b, *frozen), tuple(tuned))

    module, reference = nn.Linear(3, 2), nn.Linear(3, 2).requires_grad_(False)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        parameter_distance(module, reference)
    params = {p.data_ptr() for p in (*module.parameters(), *reference.parameters())}
    assert len(saved) == 4 and all(t.data_ptr() in params for t in saved)


def test_frozen_copy_follows_a_half_precision_engine(tiny_bert_dir, tmp_path):
    """Multi-process finding 10: DeepSpeed's bf16 engine holds BERT_T in bf16 without autocast; BERT_F follows its
    dtype, so the regularizer is 0 at step 0 (an fp32 BERT_F against bf16 BERT_T is not)."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path)
    encoder.to(torch.bfloat16)  # what the engine does to the model it wraps
    batch = encoder.tokenizer(["a man plays", "the dog runs in the park"], padding=True, return_tensors="pt")
    views = trainer.frozen_views(batch["input_ids"], batch["attention_mask"])
    assert views.shape[0] == 2
    assert {p.dtype for p in trainer.frozen_backbone.parameters()} == {torch.bfloat16}
    assert parameter_distance(encoder.backbone, trainer.frozen_backbone).item() == 0.0
