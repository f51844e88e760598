"""fp16 mixed precision, run on the CPU (torch has fp16 autocast and `GradScaler("cpu")` there): every method trains
a few steps with a gradient scaler, with finite losses and its similarities and cross-entropies in fp32; a step
whose gradient overflows is skipped by the scaler without touching the weights; ConSERT's FGV gradient is taken
from the scaled loss, so it does not underflow through the fp16 layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import METHOD_SETTINGS, DtypeProbe, build_trainer

from hf_sentcl.methods.simcse.trainer import SimCSETrainer


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHOD_SETTINGS))
def test_every_method_trains_under_fp16_with_a_scaler(name, tmp_path, tiny_bert_dir, senteval_dir, train_files,
                                                      monkeypatch):
    """A few fp16 steps: the scaler is the CPU one, the encoder's matmuls run in fp16, every cross-entropy (the
    similarity logits included) gets fp32 logits, and every logged loss is finite."""
    trainer = build_trainer(tmp_path, name, tiny_bert_dir, senteval_dir, train_files)
    assert isinstance(trainer.accelerator.scaler, torch.amp.GradScaler) and trainer.accelerator.native_amp
    probe = DtypeProbe(monkeypatch, trainer)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"fp16 {name}: losses {[round(x, 4) for x in losses]}")
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert torch.float16 in probe.linear, "the encoder did not run under fp16 autocast"
    assert probe.logits and set(probe.logits) == {torch.float32}, probe.logits
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.slow
def test_an_overflowing_step_is_skipped_by_the_scaler(tmp_path, tiny_bert_dir, senteval_dir, train_files,
                                                      monkeypatch):
    """A loss whose scaled gradient overflows: the scaler skips both steps (weights untouched, scale halved twice),
    training finishes without an error and the logged loss stays finite."""
    original = SimCSETrainer.contrastive_loss

    def huge(self, views, *rest):  # rest: the text groups of the false-negative mask
        loss, components = original(self, views, *rest)
        return loss / loss.detach() * 1e38, components  # 1e38 whatever the loss: finite in fp32, inf times the scale

    monkeypatch.setattr(SimCSETrainer, "contrastive_loss", huge)
    trainer = build_trainer(tmp_path, "simcse", tiny_bert_dir, senteval_dir, train_files, max_steps=2)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.accelerator.scaler.get_scale() == 65536.0 / 4
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


def fgv(trainer, batch, scaler, autocast: bool) -> torch.Tensor:
    """ConSERT's FGV perturbation of one batch with the given scaler (None: unscaled), under fp16 autocast or not."""
    trainer.accelerator.scaler = scaler
    names, _, view2 = trainer.supervised_blocks()
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        return trainer.adversarial_perturbation(trainer.model, batch, batch["labels"], names, view2)


def test_fgv_gradient_is_taken_from_the_scaled_loss(tmp_path, tiny_bert_dir, senteval_dir, train_files):
    """With a small classifier the NLI loss's gradient w.r.t. the embeddings is tiny: through fp16 layers it
    underflows to zero unscaled (no perturbation at all), while from the scaled loss it has the fp32 direction."""
    trainer = build_trainer(tmp_path, "consert_joint_fgv", tiny_bert_dir, senteval_dir, train_files)
    with torch.no_grad():
        trainer.classifier.weight.mul_(1e-6)
    trainer.model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    reference = fgv(trainer, batch, None, autocast=False)
    unscaled = fgv(trainer, batch, None, autocast=True)
    scaled = fgv(trainer, batch, torch.amp.GradScaler("cpu"), autocast=True)
    assert reference.abs().sum() > 0
    assert unscaled.abs().sum() == 0, "the unscaled fp16 gradient should underflow (the case the fix is for)"
    cosine = F.cosine_similarity(scaled.float().flatten(), reference.float().flatten(), dim=0)
    assert cosine > 0.9, cosine  # measured 0.95: fp16 forward, gradients near fp16's subnormal range
    assert torch.allclose(scaled.float().norm(), reference.float().norm(), rtol=0.05)
