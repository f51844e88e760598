"""The cached (GradCache-style) contrastive step: a large batch of in-batch negatives in the memory of a small one.

Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup". An in-batch loss
couples every example with every other one, so the batch cannot simply be split into gradient-accumulation steps
(that would shrink the negatives). Its gradient can be split, though, at the embeddings:

1. every mini-batch of `mini_batch_size` examples goes through `forward_views` without autograd, and the random
   state before it (CPU and accelerator generators) is kept;
2. the whole-batch loss (`batch_loss`: gathered across processes, with its heads and regularizers) is computed on
   the concatenated embeddings, and its gradient with respect to them;
3. every mini-batch is encoded again from its saved random state (so the same dropout masks and augmentations),
   this time with autograd, and back-propagated with its slice of that gradient. Per-example terms of the
   forward (`ViewsOutput.local_loss`) are back-propagated here, weighted by their share of the batch.

The parameter gradients equal those of one forward/backward over the whole batch drawn with the same random
streams; only one mini-batch's activations are alive at a time. The price is a second forward pass.

With several processes, only the last mini-batch's backward synchronises gradients (the others run under
`no_sync`), and the whole-batch loss is back-propagated together with it, so parameters that it reaches outside
the encoder's forward (SG's projection head and regularizer) are averaged by DDP with everything else.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import get_device_states, set_device_states


@dataclass
class RandomState:
    """The CPU generator and the generators of the accelerators that some tensors live on, to replay a forward."""

    cpu: torch.Tensor
    devices: list[int]
    device_states: list[torch.Tensor]

    @classmethod
    def capture(cls, *tensors: torch.Tensor) -> RandomState:
        devices, states = get_device_states(*tensors)
        return cls(torch.get_rng_state(), devices, states)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.devices:
            set_device_states(self.devices, self.device_states)


def split_batch(inputs: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive slices of `size` examples (the last may be smaller) of every batch-first tensor in `inputs`."""
    batch = len(next(iter(inputs.values())))
    return [{key: value[start : start + size] for key, value in inputs.items()} for start in range(0, batch, size)]


def gradient_accumulation_scale(trainer) -> float:
    """The factor `Trainer.training_step` applies to a loss before backward (1 / accumulation steps, unless the
    loss is already normalised for it)."""
    if trainer.loss_is_scaled_for_ga:
        return 1.0
    steps = getattr(trainer, "current_gradient_accumulation_steps", None) or trainer.args.gradient_accumulation_steps
    return 1.0 / steps


def cached_training_step(trainer, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """One training step of a `ContrastiveTrainer` over `inputs` in mini-batches of `trainer.args.mini_batch_size`;
    returns the detached loss as `Trainer.training_step` does (divided by the accumulation steps)."""
    accelerator = trainer.accelerator
    model.train()
    if callable(getattr(trainer.optimizer, "train", None)):
        trainer.optimizer.train()
    inputs = trainer._prepare_inputs(inputs)
    chunks = split_batch(inputs, trainer.args.mini_batch_size)
    scale = gradient_accumulation_scale(trainer)

    # The forwards run in `compute_loss_context_manager` (the training's autocast), the backwards outside it, as in
    # Trainer.training_step.
    # 1. embeddings of the whole batch (and the mini-batches' local terms), no activations kept
    states, embedded, local = [], [], LocalTerms()
    with torch.no_grad(), trainer.compute_loss_context_manager():
        for chunk in chunks:
            states.append(RandomState.capture(*chunk.values()))
            output = trainer.forward_views(model, chunk)
            embedded.append(output.views)
            local.add(output, len(chunk["input_ids"]))
    cached = torch.cat(embedded, dim=1).detach().requires_grad_()
    del embedded

    # 2. the whole-batch loss and its gradient with respect to the embeddings
    with trainer.compute_loss_context_manager():
        loss, _ = trainer.batch_loss(model, cached, inputs)
    (embedding_grad,) = torch.autograd.grad(loss * scale, cached, retain_graph=True)
    after = RandomState.capture(*inputs.values())
    grads = embedding_grad.split([len(chunk["input_ids"]) for chunk in chunks], dim=1)

    # 3. replay each mini-batch from its random state and back-propagate its slice of the gradient
    def replay(index: int, whole_batch_loss: torch.Tensor | None = None) -> None:
        states[index].restore()
        with trainer.compute_loss_context_manager():
            output = trainer.forward_views(model, chunks[index])
        surrogate = (output.views * grads[index]).sum()
        if output.local_loss is not None:
            surrogate = surrogate + output.local_loss * (local.share(index) * scale)
        if whole_batch_loss is not None:
            surrogate = surrogate + whole_batch_loss * scale
        accelerator.backward(surrogate)

    with accelerator.no_sync(model) if len(chunks) > 1 else nullcontext():
        for index in range(len(chunks) - 1):
            replay(index)
    # The last backward synchronises; the whole-batch loss rides along so that parameters it reaches outside
    # the encoder's forward (heads, regularizers) get their gradient inside a synchronised backward.
    replay(len(chunks) - 1, loss)
    after.restore()

    local.record(trainer)
    return (loss.detach() + local.total()) * scale


class LocalTerms:
    """The per-example terms (`ViewsOutput.local_loss`) of the mini-batches from the no-grad pass: the whole-batch
    term is their mean weighted by `ViewsOutput.local_weight` (default: each mini-batch's number of examples)."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor | None] = []
        self.weights: list[float | torch.Tensor] = []
        self.components: list[dict[str, torch.Tensor]] = []

    def add(self, output, examples: int) -> None:
        self.values.append(None if output.local_loss is None else output.local_loss.detach())
        # a tensor weight (e.g. a count of masked tokens) stays on its device: no host read in the step
        self.weights.append(examples if output.local_weight is None else output.local_weight)
        self.components.append(output.components)

    def share(self, index: int) -> float:
        """Mini-batch `index`'s weight over the weight of the whole batch (0 when the whole batch weighs 0)."""
        total = sum(self.weights)
        if isinstance(total, torch.Tensor):
            return self.weights[index] / total.clamp_min(1e-12)
        return self.weights[index] / total if total else 0.0

    def total(self) -> torch.Tensor | float:
        return sum((value * self.share(i) for i, value in enumerate(self.values) if value is not None), 0.0)

    def record(self, trainer) -> None:
        """Log the components once per step, as the plain step does, combined with the same weights."""
        if self.components and self.components[0]:
            trainer.record_metrics({
                name: sum(parts[name].detach() * self.share(i) for i, parts in enumerate(self.components))
                for name in self.components[0]
            })
