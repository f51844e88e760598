"""The training step makes no host read: on a GPU every `.item()`, `.tolist()`, `bool(tensor)`, `float(tensor)` or
device-to-host copy waits for the queued kernels, so one per micro-step stalls the GPU. Here one training step of
every method runs with those reads patched to raise (the CPU has no queue, so the patch is the detector); the
finite-loss check reads its device flag at logging steps instead (`hf_sentcl.modeling.health.NonFiniteLossFlag`).

Exceptions: `length_buckets` (opt-in): its sub-batch widths are shapes, which the host must know; reads made
by transformers itself (`ALLOWED_CALLERS`: its SDPA mask builder asks `padding_mask.all()` once per forward to
skip the mask when nothing is padded), which this package does not control; and `fast_dropout`'s seed for each
mask (read from torch's CPU generator), which runs on the CPU only: on a GPU it is native dropout, and this test
runs the GPU's route on the CPU.
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from helpers import METHOD_SETTINGS, build_trainer

from hf_sentcl.methods.simcse.trainer import SimCSETrainer
from hf_sentcl.modeling.health import TrainingFailure

#: Tensor methods that read a value on the host (or copy to it)
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")

#: source files (path endings) whose own host reads are not this package's
ALLOWED_CALLERS = ("transformers/masking_utils.py", "hf_sentcl/modeling/fast_dropout.py")


class HostRead(AssertionError):
    """A tensor value was read on the host inside the training step."""


@contextlib.contextmanager
def forbid_host_reads():
    """Patch `HOST_READS` on torch.Tensor, boolean-mask indexing, nonzero and masked_select to raise `HostRead`
    inside the block (the last three: their output size needs the device's answer first)."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    tensor_nonzero, tensor_masked_select = torch.Tensor.nonzero, torch.Tensor.masked_select

    def refuse(name):
        def method(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename.endswith(ALLOWED_CALLERS):
                return originals[name](self, *args, **kwargs)
            raise HostRead(f"Tensor.{name}() in the training step (a host sync on a GPU)")
        return method

    original_getitem, nonzero, masked_select = torch.Tensor.__getitem__, torch.nonzero, torch.masked_select

    def refuse_mask_select(self, index):  # a boolean-mask select must read the mask's count before it can allocate
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() > 0 for p in parts):
            raise HostRead("boolean-mask indexing in the training step (a host sync on a GPU)")
        return original_getitem(self, index)

    def data_dependent(name):
        def function(*args, **kwargs):
            raise HostRead(f"{name} in the training step (its output size is data-dependent: a host sync on a GPU)")
        return function

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        torch.Tensor.__getitem__ = refuse_mask_select
        torch.nonzero = torch.Tensor.nonzero = data_dependent("nonzero")
        torch.masked_select = torch.Tensor.masked_select = data_dependent("masked_select")
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        torch.Tensor.__getitem__, torch.nonzero, torch.masked_select = original_getitem, nonzero, masked_select
        torch.Tensor.nonzero, torch.Tensor.masked_select = tensor_nonzero, tensor_masked_select


def guard_training_step(trainer) -> list[int]:
    """Run the trainer's `training_step` under `forbid_host_reads`; returns a list that counts the guarded steps."""
    steps = []
    original = trainer.training_step

    def guarded(*args, **kwargs):
        with forbid_host_reads():
            loss = original(*args, **kwargs)
        steps.append(1)
        return loss

    trainer.training_step = guarded
    return steps


def test_forbid_host_reads_catches_each_read():
    t = torch.ones(2)
    with forbid_host_reads():
        for read in (lambda: t.sum().item(), t.tolist, lambda: bool(t.all()), lambda: float(t.sum()),
                     lambda: int(t.sum()), t.cpu, t.numpy, lambda: t[t > 0], t.nonzero,
                     lambda: torch.masked_select(t, t > 0)):
            with pytest.raises(HostRead):
                read()
        assert t[torch.tensor([0])].shape == (1,)  # integer indices need no read
    assert t.sum().item() == 2.0 and t[t > 0].shape == (2,)


@pytest.fixture(autouse=True)
def gpu_route(monkeypatch):
    """The encoder route a GPU takes without a varlen kernel: the padded SDPA path. The CPU's unpadded route packs
    the real tokens, whose count it reads on the host (free on a CPU, where it is the default)."""
    import hf_sentcl.modeling.routes as routes

    choose = routes.choose_route
    monkeypatch.setattr(routes, "choose_route", lambda reason, device, attention: choose(reason, "cuda", attention))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(METHOD_SETTINGS))
def test_the_training_step_makes_no_host_read(name, precision, tmp_path, tiny_bert_dir, senteval_dir, train_files):
    """Two optimizer steps of every method, fp32 and fp16 (with its scaler): no host read in `training_step`."""
    trainer = build_trainer(tmp_path, name, tiny_bert_dir, senteval_dir, train_files, fp16=precision == "fp16",
                            max_steps=2, logging_steps=2)
    steps = guard_training_step(trainer)
    trainer.train()
    assert len(steps) == 2


@pytest.mark.slow
def test_a_nan_loss_still_stops_before_a_checkpoint(tmp_path, tiny_bert_dir, senteval_dir, train_files, monkeypatch):
    """The finite-loss check reads its flag at the save step: a NaN at step 1 with logging every 10 steps and a save
    at step 2 stops training there, naming step 1, and no checkpoint is written."""
    original = SimCSETrainer.contrastive_loss

    def nan_loss(self, views, *rest):  # rest: the text groups of the false-negative mask
        loss, components = original(self, views, *rest)
        return loss * float("nan"), components

    monkeypatch.setattr(SimCSETrainer, "contrastive_loss", nan_loss)
    trainer = build_trainer(tmp_path, "simcse", tiny_bert_dir, senteval_dir, train_files, fp16=False, max_steps=3,
                            logging_steps=10, save_strategy="steps", save_steps=2)
    steps = guard_training_step(trainer)
    with pytest.raises(TrainingFailure, match="training loss is nan at step 1"):
        trainer.train()
    assert len(steps) == 2
    assert not list((tmp_path / "simcse").glob("checkpoint-*"))


def test_dev_evaluation_in_training_encodes_without_inference_mode(tmp_path, tiny_bert_dir, senteval_dir,
                                                                    train_files):
    """Finding 5 of the multi-process issue: the dev evaluation inside training runs under no_grad, not
    inference_mode (weights ZeRO-3/FSDP gather for it would become inference tensors); a standalone encode keeps
    inference_mode."""
    trainer = build_trainer(tmp_path, "simcse", tiny_bert_dir, senteval_dir, train_files, fp16=False)
    modes = []
    embeddings = trainer.model.backbone.get_input_embeddings()
    embeddings.register_forward_hook(lambda *_: modes.append((torch.is_inference_mode_enabled(),
                                                              torch.is_grad_enabled())))
    trainer.evaluate()
    assert modes and set(modes) == {(False, False)}
    modes.clear()
    trainer.model.encode(["a man plays a guitar", "a dog runs"])
    assert set(modes) == {(True, False)}
