"""`ContrastiveTrainer`: the shared machinery of every in-batch contrastive method.

A method subclass sets how many dropout copies of each text view go through the encoder and implements
`contrastive_loss(views)` on the (num_views, batch, dim) embeddings; everything else (one forward pass for all
views, cross-process gathering, metric logging, STS-B dev evaluation, the cached large-batch step) lives here.

The training step is built from three hooks, so that the plain step and the cached step (`mini_batch_size`,
`hf_sentcl.trainers.cached`) compute the same thing:

- `embed_views(model, inputs)` / `forward_views(model, inputs)`: the encoder's forward over the examples of
  `inputs` (the whole local batch, or one mini-batch of it). `embed_views` returns the (views, batch, dim)
  embeddings; `forward_views` wraps them in a `ViewsOutput` and may add a per-example `local_loss` computed from the
  same forward (CLEAR's masked-LM loss, ConSERT's NLI cross-entropy: terms that couple no two examples). All
  randomness in it must come from torch's global generators (CPU and the inputs' device): the cached step replays
  them to get the same dropout masks and augmentations.
- `batch_loss(model, views, inputs)`: the loss of the whole local batch from its embeddings: gathered across
  processes, the method's `contrastive_loss`, its gradient scaled for the world size, plus terms that need the
  whole batch or no data at all (SG's frozen-copy views, projection head and parameter-distance regularizer). It
  may use trained modules outside the encoder's forward; it runs once per step in both steps.
- `contrastive_loss(views)`: the method's in-batch loss on the gathered embeddings.

`compute_loss` = `forward_views` on the whole batch + `batch_loss` + `local_loss`. A method that overrides
`compute_loss` instead cannot use `mini_batch_size` (the trainer refuses it) until it moves its loss into these
hooks and sets `supports_cached_step = True`.

Distributed training: modules applied outside `model(...)` (heads attached to the encoder, regularizers on its
weights) work under DDP because `ddp_find_unused_parameters` is off by default (DDP's unused-parameter search
would mark them unused at forward time and then fail when their gradient arrives). In exchange every trainable
parameter must get a gradient every step: the trainer freezes the backbone's pooler, which no pooling reads; a
method with weights it uses only on some steps must freeze them or set `ddp_find_unused_parameters: true`.
Under FSDP or DeepSpeed ZeRO-3 weights used outside the forward are sharded: such methods refuse those configs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from transformers import Trainer

from hf_sentcl.common.distributed import (
    gather_padded,
    gather_with_grad,
    mean_over_processes,
    world_size,
)
from hf_sentcl.common.preemption import current_watch
from hf_sentcl.configs.validation import check_matryoshka
from hf_sentcl.evaluation.alignment import sts_alignment_uniformity
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.losses.false_negatives import GuideMargin, text_groups
from hf_sentcl.losses.matryoshka import LossFn, matryoshka_loss
from hf_sentcl.modeling.compiled import compile_layers
from hf_sentcl.modeling.encoder import evaluating_in_training
from hf_sentcl.modeling.fast_dropout import use_fast_dropout
from hf_sentcl.modeling.health import NonFiniteLossFlag
from hf_sentcl.trainers.cached import cached_training_step
from hf_sentcl.trainers.callbacks import OnTrainBegin, PreemptionCallback, StepsRunCallback, TrainingCostCallback
from hf_sentcl.trainers.direct import direct_use
from hf_sentcl.trainers.durable import DurableCheckpoints, MasterWeightsSave
from hf_sentcl.trainers.guide import Guide
from hf_sentcl.trainers.length_buckets import forward_in_length_buckets
from hf_sentcl.trainers.mixing import MixedSources
from hf_sentcl.trainers.streaming import StreamingData


def scale_gradient(loss: torch.Tensor, factor: float) -> torch.Tensor:
    """Return a tensor equal to `loss` whose gradient is `factor` times larger (logged values stay unscaled)."""
    if factor == 1:
        return loss
    return loss * factor - loss.detach() * (factor - 1)


def stack_views(t: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """(batch, views, length) -> (copies * views * batch, length), view-major (every first view first), the
    `copies` repeats one after another: the rows of one forward pass over every view of a batch."""
    batch, views, length = t.shape
    flat = t.transpose(0, 1).reshape(views * batch, length)
    return flat.repeat(copies, 1) if copies > 1 else flat


def freeze_backbone_pooler(encoder: nn.Module) -> None:
    """Freeze the backbone's own pooler (BERT's dense + tanh on [CLS]) if it has one. No pooling mode reads it, so it
    never gets a gradient, and DDP without its unused-parameter search needs every trained weight to get one."""
    pooler = getattr(getattr(encoder, "backbone", None), "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)
    if callable(freeze_unreached := getattr(encoder, "freeze_unreached", None)):
        freeze_unreached()  # layers above pooling_layer, a head that cls_before_pooler skips


def enable_cpu_fp16(accelerator, args) -> bool:
    """Make `fp16: true` on a CPU run fp16 autocast with a gradient scaler, as on a GPU. accelerate silently drops
    fp16 on a CPU (no autocast, no scaler: the run trains in fp32 while its results say fp16); torch >= 2.3 has
    both for the CPU. Returns whether it changed anything. Must run before `Trainer.train` prepares the optimizer
    (which takes the scaler)."""
    if not args.fp16 or accelerator.device.type != "cpu" or accelerator.scaler is not None:
        return False
    if accelerator.state.mixed_precision != "fp16" or accelerator.state.deepspeed_plugin is not None:
        return False
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")
    return True


@contextmanager
def without_forward_autocast(model: nn.Module) -> Iterator[None]:
    """Run `model` with its own forward inside the block: accelerate's mixed-precision wrapper of `model.forward`
    (autocast in the training precision) is taken off and put back afterwards (training reaches it again)."""
    original = getattr(model, "_original_forward", None)
    wrapped = model.__dict__.get("forward")
    if original is None or wrapped is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


@dataclass
class ViewsOutput:
    """What one forward of the encoder over some examples gives a training step (see the module docstring).

    Attributes:
        views: (num_views, examples, dim) embeddings, with autograd when the step wants gradients.
        local_loss: optional per-example term from the same forward, already weighted by its coefficient; it is
            added to the loss unchanged, and with `mini_batch_size` the mini-batches' values are combined as a mean
            weighted by `local_weight`.
        local_weight: what `local_loss` is a mean over (e.g. the number of masked tokens of a masked-LM loss);
            None = the number of examples.
        components: named values to log with the loss (combined over mini-batches with the same weights).
    """

    views: torch.Tensor
    local_loss: torch.Tensor | None = None
    local_weight: float | torch.Tensor | None = None
    components: dict[str, torch.Tensor] = field(default_factory=dict)


class ContrastiveTrainer(StreamingData, MixedSources, DurableCheckpoints, MasterWeightsSave, Trainer):
    """Base trainer: stack all views into one forward pass, gather across processes, call the method's loss.

    Args (beyond `Trainer`'s):
        dev_evaluator: an `STSEvaluator` on STS-B dev; `evaluate()` reports `eval_stsb_spearman` from it.
    """

    #: how many times each text view is repeated in the forward pass (2 for dropout-noise positives)
    dropout_copies: int = 1
    #: the smallest global batch the loss makes sense for
    min_global_batch_size: int = 2
    #: whether `mini_batch_size` may be used; None = only if the method keeps `compute_loss` as it is here
    supports_cached_step: bool | None = None
    #: whether `contrastive_loss` takes the batch's `labels` (a method's `score_column`), gathered like the views
    loss_uses_labels: bool = False

    def __init__(
        self, model=None, *args, dev_evaluator: STSEvaluator | None = None, eval_bf16: bool | None = None,
        guide: Guide | None = None, max_seq_length: int | None = None, **kwargs,
    ):
        """`Trainer`'s arguments; used directly, `model` may be a model id and `train_dataset` a raw `Dataset` of the
        method's text columns, tokenised to `max_seq_length` tokens (`hf_sentcl.trainers.direct`)."""
        model = direct_use(type(self), model, kwargs, max_seq_length)
        super().__init__(model, *args, **kwargs)
        # dev evaluation precision: as the final evaluation's (None: mixed when training is mixed)
        self.eval_bf16 = bool(self.args.bf16 or self.args.fp16) if eval_bf16 is None else eval_bf16
        freeze_backbone_pooler(self.model)
        if self.args.fast_dropout:
            use_fast_dropout(self.model)
        if self.args.compile_layers:
            compile_layers(self.model)
        self.dev_evaluator = dev_evaluator
        self.loss_is_scaled_for_ga = False
        self._metrics: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.cost = TrainingCostCallback()
        self._flos_per_token: int | None = None
        self.add_callback(self.cost)
        self.steps_run = StepsRunCallback()
        self.add_callback(self.steps_run)
        self.add_callback(OnTrainBegin(self.start_masters_at_full_precision))
        self.preemption = PreemptionCallback(current_watch())
        self.add_callback(self.preemption)
        self.nonfinite_loss = NonFiniteLossFlag()
        enable_cpu_fp16(self.accelerator, self.args)
        self.check_global_batch(self.args)
        if world_size() != max(self.args.world_size, 1):
            raise ValueError(
                f"{world_size()} processes share a process group but the Trainer runs on {self.args.world_size}: "
                "each process would train alone on the whole data while the gathered negatives repeat across "
                "processes. Launch with accelerate launch / torchrun and let TrainingArguments set up the devices "
                "(on a CPU-only machine: use_cpu: true)."
            )
        self.check_cached_step(self.args)
        self.check_length_buckets(self.args)
        self.check_plugins(self.args, self.model.config)
        check_matryoshka(self.args.matryoshka_dims, self.args.matryoshka_weights, self.model.config.hidden_size)
        self.guide, self.guide_rule = self.load_guide(guide)

    def load_guide(self, guide: Guide | None) -> tuple[Guide | None, GuideMargin | None]:
        """With `false_negatives: guide`: the guide encoder (the one given, else `guide_model` loaded on the training
        device) and its margin rule; (None, None) otherwise."""
        args = self.args
        if args.false_negatives != "guide":
            return None, None
        if guide is None:
            tokenizer = self.processing_class or self.model.tokenizer
            guide = Guide.load(args.guide_model, tokenizer, args.device)
        return guide, GuideMargin(args.guide_margin, args.guide_margin_strategy)

    @classmethod
    def check_global_batch(cls, args) -> int:
        """The global batch of `args` (per-device batch x processes), or ValueError naming the key when it is below
        `min_global_batch_size`. Called by `validate_recipe` too, before anything is loaded."""
        global_batch = args.per_device_train_batch_size * max(args.world_size, 1)
        if global_batch < cls.min_global_batch_size:
            raise ValueError(
                f"key 'per_device_train_batch_size' is {args.per_device_train_batch_size} on {args.world_size} "
                f"process(es): a global batch of {global_batch}; in-batch negatives need at least "
                f"{cls.min_global_batch_size}. Raise per_device_train_batch_size."
            )
        return global_batch

    @classmethod
    def check_cached_step(cls, args) -> None:
        """With `mini_batch_size` set, check that this method's loss goes through the hooks the cached step splits
        and that accelerate (not DeepSpeed's engine) drives backward; raises ValueError naming the key. Called by
        `validate_recipe` too, before anything is loaded."""
        if not getattr(args, "mini_batch_size", None):
            return
        supported = cls.supports_cached_step
        if supported is None:
            supported = cls.compute_loss is ContrastiveTrainer.compute_loss
        if not supported:
            raise ValueError(
                f"mini_batch_size: {cls.__name__} computes its loss in its own compute_loss, so the cached step "
                "cannot split it; remove 'mini_batch_size' (or move the loss into forward_views/batch_loss, see "
                "hf_sentcl.trainers.base)."
            )
        if getattr(args, "deepspeed_plugin", None) is not None:
            raise ValueError(
                "mini_batch_size is not supported under DeepSpeed (its engine owns backward and gradient "
                "accumulation); use a DDP or FSDP accelerate config, or remove 'mini_batch_size'."
            )

    @classmethod
    def check_plugins(cls, args, model_settings) -> None:
        """Refuse `matryoshka_dims` / `false_negatives: mask` where this method cannot honour them, with the reason;
        `model_settings` is the recipe's model section or the encoder's config (head, head_at_inference, pooling).
        Called by `validate_recipe` too, before anything is loaded."""
        if getattr(args, "matryoshka_dims", None) and (reason := cls.matryoshka_refusal(args, model_settings)):
            raise ValueError(f"matryoshka_dims: {reason}")

    @classmethod
    def matryoshka_refusal(cls, args, model_settings) -> str | None:
        """Why this method cannot train Matryoshka prefixes, or None. The prefixes must be those of the saved
        encoder's embedding, so the loss has to compare that embedding and not a training-only head's output."""
        head_skipped = getattr(model_settings, "pooling", None) == "cls_before_pooler"
        head_dropped = not head_skipped and not getattr(model_settings, "head_at_inference", False)
        if getattr(model_settings, "head", "none") != "none" and head_dropped:
            return (
                "the loss compares the MLP head's outputs, which the saved encoder drops (head_at_inference: "
                "false), so the prefixes of the saved embedding would never be trained; set 'head: none' or "
                "'head_at_inference: true'."
            )
        return None

    @classmethod
    def check_length_buckets(cls, args) -> None:
        """`length_buckets` splits the forward of `embed_views`; a method that encodes its views another way (its
        own `embed_views`/`forward_views`) would ignore it, so it is refused. Called by `validate_recipe` too."""
        if (getattr(args, "length_buckets", None) or 1) > 1 and (
            cls.embed_views is not ContrastiveTrainer.embed_views
            or cls.forward_views is not ContrastiveTrainer.forward_views
        ):
            raise ValueError(
                f"length_buckets: {cls.__name__} encodes its views in its own way, which length buckets do not "
                "split; remove 'length_buckets' from the recipe."
            )

    @property
    def examples_per_step(self) -> int:
        """Training examples per optimizer step over all processes."""
        args = self.args
        return args.per_device_train_batch_size * max(args.world_size, 1) * args.gradient_accumulation_steps

    def training_cost(self) -> dict:
        """Throughput of the training steps alone (no evaluation or saving) and peak memory (`TrainingCostCallback`;
        one example is one training sentence (SimCSE) or one pair/triplet (supervised)), and the step this `train()`
        started from and the steps it ran (`StepsRunCallback`)."""
        return {**self.cost.summary(self.examples_per_step), **self.steps_run.summary()}

    def floating_point_ops(self, inputs: dict[str, torch.Tensor]) -> int:
        """Trainer's estimate (6 x tokens x non-embedding parameters) counting every dropout copy of the views.
        The parameter count is taken once: `Trainer` recounts it on every step, Python time in the hot loop."""
        ids = inputs.get("input_ids")
        if ids is None:
            return 0
        if self._flos_per_token is None:
            count = getattr(self.accelerator.unwrap_model(self.model), "num_parameters", None)
            self._flos_per_token = 6 * count(exclude_embeddings=True) if count else 0
        return ids.numel() * self.dropout_copies * self._flos_per_token

    # ------------------------------------------------------------------ the training step
    def embed_views(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode every view of the batch in ONE forward pass (or in `length_buckets` length-sorted sub-batches);
        returns (copies * views, batch, dim)."""
        batch, views = inputs["input_ids"].shape[:2]
        copies = self.dropout_copies
        input_ids, attention_mask = (stack_views(inputs[k], copies) for k in ("input_ids", "attention_mask"))
        buckets = getattr(self.args, "length_buckets", None)
        if buckets and buckets > 1:  # optional: length-sorted sub-batches, less padding (see length_buckets.py)
            with self.accelerator.autocast():  # one autocast region: weights are cast once for all sub-batches
                embeddings = forward_in_length_buckets(model, input_ids, attention_mask, buckets)
        else:
            embeddings = model(input_ids=input_ids, attention_mask=attention_mask).embeddings
        return embeddings.view(copies * views, batch, -1)

    def forward_views(self, model, inputs: dict[str, torch.Tensor]) -> ViewsOutput:
        """One forward over the examples of `inputs`: `embed_views`, and no per-example term. Override to add a
        `local_loss` computed from the same forward (see `ViewsOutput`)."""
        return ViewsOutput(self.embed_views(model, inputs))

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss from the gathered (num_views, global_batch, dim) embeddings, plus named components to log. `groups`
        (`candidate_identities`) names each text view for the false-negative mask (`false_negatives: mask|guide`);
        pass `guide=self.guide_rule` to the mask functions with it. A method with `loss_uses_labels` also gets
        `labels=`, the (global_batch,) labels of the gathered examples."""
        raise NotImplementedError(f"{type(self).__name__} must implement contrastive_loss(views, groups).")

    def identity_tokens(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The token ids, (batch, text views, length), and attention mask that name each text view's text for
        `false_negatives: mask|guide`. CLEAR names a sentence by its text before augmentation."""
        return inputs["input_ids"], inputs["attention_mask"]

    def candidate_identities(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """What names each text view for the false-negative mask, over every process's batch in the order of the
        gathered embeddings, text views first: (text views, global batch) integers equal exactly where two texts have
        the same token ids (`false_negatives: mask`), or (text views, global batch, guide dim) unit-length guide
        embeddings (`false_negatives: guide`); None with `keep`."""
        mode = self.args.false_negatives
        if mode == "keep":
            return None
        ids, mask = self.identity_tokens(inputs)
        rows, views, length = ids.shape
        if mode == "guide":
            embedded = self.guide.embed(ids.reshape(rows * views, length), mask.reshape(rows * views, length))
            # equal shapes on every process: a plain all-gather, no host read of lengths (the guide has no gradient)
            return gather_with_grad(embedded.view(rows, views, -1), dim=0).transpose(0, 1)
        tokens = gather_padded(torch.where(mask.bool(), ids + 1, 0))  # 0 = padding, whatever its id and side
        flat = tokens.reshape(-1, tokens.shape[-1])
        return text_groups(flat, flat > 0).view(-1, views).T

    def record_masked(self, exclude: torch.Tensor | None) -> torch.Tensor | None:
        """Log how many (row, candidate) pairs `exclude` takes out of the loss (`masked_pairs`), and return it."""
        if exclude is not None:
            self.record_metrics({"masked_pairs": exclude.sum().float()})
        return exclude

    def embedding_loss(
        self, loss_fn: LossFn, vectors: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`loss_fn(vectors)`, or with `matryoshka_dims` the weighted sum of it over those leading prefixes of the
        vectors (`hf_sentcl.losses.matryoshka`)."""
        dims = self.args.matryoshka_dims
        if not dims:
            return loss_fn(vectors)
        return matryoshka_loss(loss_fn, vectors, dims, self.args.matryoshka_weights)

    def batch_loss(self, model, views: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The loss of the whole local batch from its (num_views, batch, dim) embeddings, ready for backward, and the
        outputs `compute_loss` returns. Runs once per step, in the plain and in the cached step."""
        gathered = gather_with_grad(views, dim=1)
        groups = self.candidate_identities(inputs)
        labeled = {"labels": gather_with_grad(inputs["labels"])} if self.loss_uses_labels else {}
        loss, components = self.embedding_loss(
            lambda vectors: self.contrastive_loss(vectors, groups, **labeled), gathered
        )
        self.record_metrics(components)
        # Every process computes the full loss but back-propagates through its own slice only; DDP then
        # averages over processes, so the gradient is scaled back up by the world size.
        return scale_gradient(loss, world_size()), {"embeddings": gathered}

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """The training's mixed precision around the whole loss computation (Trainer's `compute_loss_context_manager`
        enters it), not only around the model's forward, which is all that accelerate wraps: modules the loss hooks
        run outside that forward (SG's frozen copy and projection head, CLEAR's heads) compute in it too. The
        losses compute their similarities and cross-entropies in fp32 on their own."""
        return self.accelerator.autocast()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        output = self.forward_views(model, inputs)
        loss, outputs = self.batch_loss(model, output.views, inputs)
        if output.local_loss is not None:
            loss = loss + output.local_loss
        if output.components:
            self.record_metrics(output.components)
        return (loss, outputs) if return_outputs else loss

    def uses_cached_step(self, inputs: dict[str, torch.Tensor]) -> bool:
        """Whether this batch is larger than `mini_batch_size` (smaller batches take the plain step: same result)."""
        size = getattr(self.args, "mini_batch_size", None)
        return bool(size) and len(inputs["input_ids"]) > size

    def training_step(self, model, inputs, num_items_in_batch=None):
        """`Trainer.training_step`, or the cached step (`hf_sentcl.trainers.cached`) when `mini_batch_size` splits
        the batch. A batch of a mixed run (several datasets) logs its loss under its dataset's name too."""
        source = self.batch_source(inputs)
        if self.uses_cached_step(inputs):
            loss = cached_training_step(self, model, inputs)
        else:
            loss = super().training_step(model, inputs, num_items_in_batch)
        # a flag on the device, read at logging/evaluation/save steps (see hf_sentcl.modeling.health)
        self.nonfinite_loss.update(loss, self.state.global_step)
        self.record_source_loss(source, loss)
        return loss

    # ------------------------------------------------------------------ logging of loss components
    def record_metrics(self, components: dict[str, torch.Tensor]) -> None:
        """Keep detached component values; they are averaged and logged with the next loss log (no host sync)."""
        mode = "train" if self.model.training else "eval"
        for name, value in components.items():
            self._metrics[f"{mode}/{name}"].append(value.detach())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metrics:
            for key, values in self._metrics.items():
                if key.startswith("train/"):
                    logs[key.removeprefix("train/")] = mean_over_processes(torch.stack(values).float().mean()).item()
            self._metrics.clear()
        super().log(logs, start_time)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """STS-B dev Spearman x 100 of the current encoder as `{prefix}_stsb_spearman`, plus `extra_dev_metrics`
        (alignment and uniformity for every method) computed from the same single encode pass."""
        if self.dev_evaluator is None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        start = time.time()
        encoder = self.accelerator.unwrap_model(self.model)
        # the precision is eval_bf16's, as in the final evaluation; no inference tensors from gathered weights
        with without_forward_autocast(encoder), evaluating_in_training():
            embeddings = self.dev_evaluator.embed(
                encoder, batch_size=self.args.per_device_eval_batch_size, bf16=self.eval_bf16
            )
        scores = self.dev_evaluator.score(embeddings)
        metrics = {f"{metric_key_prefix}_stsb_spearman": scores["STSBenchmark"]}
        metrics.update(self.extra_dev_metrics(encoder, metric_key_prefix, embeddings))
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def extra_dev_metrics(self, encoder, prefix: str, embeddings: np.ndarray) -> dict[str, float]:
        """More dev metrics from `embeddings` (`dev_evaluator.embed` output). The base reports STS-B dev alignment
        and uniformity (Wang & Isola 2020) as `{prefix}_alignment` / `{prefix}_uniformity`; a method adding
        its own metrics overrides this and merges `super().extra_dev_metrics(...)`."""
        values = sts_alignment_uniformity(self.dev_evaluator, embeddings)
        return {f"{prefix}_{name}": value for name, value in values.items()}
