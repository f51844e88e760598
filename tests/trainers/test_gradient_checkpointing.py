"""`gradient_checkpointing: true` (TrainingArguments' alias of activation_checkpointing) for every method: the Trainer
switches it on through SentenceEncoder, which reaches the backbone's layers; the gradients are those without it
(dropout on: the recompute replays the masks), fewer activations are kept, and SG-OPT's frozen copy is neither
checkpointed nor run with autograd. Works with LoRA and with the cached step."""

import pytest
import torch
from datasets import Dataset
from helpers import random_sentences
from transformers.modeling_layers import GradientCheckpointingLayer

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.methods.self_guided.config import SelfGuidedConfig
from hf_sentcl.methods.self_guided.trainer import SelfGuidedTrainer
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer, SupervisedSimCSETrainer
from hf_sentcl.recipe.parser import parse_recipe

METHODS = {
    "simcse": (SimCSEConfig, SimCSETrainer, ("text",), dict(head="mlp"), {}),
    "simcse_sup": (SupervisedSimCSEConfig, SupervisedSimCSETrainer, ("sent0", "sent1"), dict(head="mlp"), {}),
    "sg-opt": (SelfGuidedConfig, SelfGuidedTrainer, ("text",), dict(head="none"), dict(projection_size=16)),
}


def make_trainer(model_dir, tmp_path, method, peft=None, **overrides):
    config_class, trainer_class, columns, encoder_kwargs, method_kwargs = METHODS[method]
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(model_dir), pooling="cls", peft=peft, **encoder_kwargs)
    sentences = random_sentences(8 * len(columns), seed=4)
    data = {c: sentences[i * 8 : (i + 1) * 8] for i, c in enumerate(columns)}
    dataset = tokenize_views(Dataset.from_dict(data), encoder.tokenizer, columns, 32)
    args = config_class(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=1e-3, eval_strategy="no",
        load_best_model_at_end=False, save_strategy="no", use_cpu=True, logging_steps=1, disable_tqdm=True,
        report_to="none", seed=0, temperature=0.1, **method_kwargs, **overrides,
    )
    trainer = trainer_class(model=encoder, args=args, train_dataset=dataset,
                            data_collator=ViewCollator(encoder.tokenizer, num_views=len(columns)))
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def checkpointed_layers(module) -> list[bool]:
    return [layer.gradient_checkpointing for layer in module.modules() if isinstance(layer, GradientCheckpointingLayer)]


def loss_and_gradients(trainer, inputs, seed=3):
    """compute_loss + backward with dropout on, counting the bytes autograd saves for backward on the way."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    saved = []
    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize("method", list(METHODS))
def test_same_gradients_fewer_activations(tiny_bert_dir, tmp_path, method):
    trainer = make_trainer(tiny_bert_dir, tmp_path, method)
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    plain_loss, plain, plain_bytes = loss_and_gradients(trainer, inputs)
    trainer.model.activation_checkpointing_enable()  # what Trainer.train does for gradient_checkpointing: true
    assert all(checkpointed_layers(trainer.model.backbone))
    loss, grads, saved_bytes = loss_and_gradients(trainer, inputs)
    assert loss == plain_loss
    assert grads.keys() == plain.keys() and len(grads) > 10
    assert max((grads[k] - plain[k]).abs().max().item() for k in grads) < 1e-6
    assert saved_bytes < 0.6 * plain_bytes, (saved_bytes, plain_bytes)


@pytest.mark.slow
def test_trainer_switches_it_on_from_the_recipe_key(tiny_bert_dir, tmp_path, repo_root):
    """`gradient_checkpointing: true` reaches every backbone layer when training starts, and a run with it logs the
    same losses as one without (same seed, dropout on)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\noutput_dir: {tmp_path}\n"
                      "gradient_checkpointing: true\n")
    assert parse_recipe(recipe).training.activation_checkpointing is True
    histories = []
    for checkpointing in (False, True):
        trainer = make_trainer(tiny_bert_dir, tmp_path, "simcse", max_steps=3, gradient_checkpointing=checkpointing)
        trainer.train()
        assert all(checkpointed_layers(trainer.model.backbone)) is checkpointing
        histories.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert histories[0] == pytest.approx(histories[1], rel=1e-5)


@pytest.mark.slow
def test_self_guided_frozen_copy_needs_none(tiny_bert_dir, tmp_path):
    """SG-OPT with checkpointing: BERT_T's layers are checkpointed; BERT_F (a separate module) is not, stays in
    eval mode and runs only without autograd, so it keeps no activations either way."""
    trainer = make_trainer(tiny_bert_dir, tmp_path, "sg-opt", max_steps=2, gradient_checkpointing=True)
    calls = []
    trainer.frozen_backbone.register_forward_hook(
        lambda module, args, output: calls.append((torch.is_grad_enabled(), module.training)))
    trainer.train()
    assert all(checkpointed_layers(trainer.model.backbone))
    assert not any(checkpointed_layers(trainer.frozen_backbone))
    assert calls == [(False, False)] * 2


@pytest.mark.slow
def test_with_lora_and_with_the_cached_step(tiny_bert_dir, tmp_path):
    """LoRA (frozen base, frozen embeddings) and the cached step both keep their gradients under checkpointing."""
    trainer = make_trainer(tiny_bert_dir, tmp_path, "sg-opt", peft={"r": 2})
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    _, plain, _ = loss_and_gradients(trainer, inputs)
    trainer.model.activation_checkpointing_enable()
    _, grads, _ = loss_and_gradients(trainer, inputs)
    assert any("lora_B" in k for k in grads) and grads.keys() == plain.keys()
    assert max((grads[k] - plain[k]).abs().max().item() for k in grads) < 1e-6

    results = []
    for checkpointing in (False, True):  # the cached step, dropout on, without and with checkpointing
        if checkpointing:
            trainer.model.activation_checkpointing_enable()
        else:
            trainer.model.activation_checkpointing_disable()
        trainer.args.mini_batch_size = 3
        trainer.model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        loss = trainer.training_step(trainer.model, inputs)
        results.append((loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.allclose(loss_a, loss_b, atol=1e-6) and grads_a.keys() == grads_b.keys()
    assert max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a) < 1e-5
