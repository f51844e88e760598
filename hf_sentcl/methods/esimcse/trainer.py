"""ESimCSE's trainer (Wu et al. 2022): word-repetition positives and a queue of momentum-encoder negatives.

Each step:
1. the batch's sentences x_i and their word-repeated copies x_i+ (`augment.word_repetition`, drawn on the token ids
   from torch's generator) go through the encoder in ONE forward, dropout on: h_i and h_i+ (`embed_views`);
2. the loss (`loss.queue_info_nce`, gathered across processes by the base class) has row i's positive h_i+, the
   batch's other h_j+ and the queue's valid entries as negatives;
3. after the loss, the momentum encoder embeds the ORIGINAL sentences x_i without gradient and with dropout off (the
   authors' code: `input_ids[:, 0]` under `model.eval()`), the embeddings of every process are gathered, and they
   enter the queue, the oldest entries leaving it (`MomentumQueue.enqueue`): every process holds the same queue;
4. after every optimizer step (not every micro-batch), a callback updates the momentum encoder:
   theta_m <- momentum * theta_m + (1 - momentum) * theta_e, over every weight of the encoder, head included.

The momentum encoder is a copy of the whole encoder taken before training (backbone and head), and it embeds with
the training pooling and head (the space the loss compares), only without dropout. It and the queue (a buffer, with
its fill level) form the `esimcse_momentum` submodule of the encoder (`hf_sentcl.trainers.heads`): its weights do
not require gradients, so the optimizer never sees them; `save_pretrained` leaves it out of the encoder; every
checkpoint carries it in `esimcse_momentum.safetensors`, and `resume_from_checkpoint` loads it back, so a resumed
run continues with the same momentum weights and queue. It is used outside the encoder's forward, so FSDP and
ZeRO-3 are refused (the registry's `sharded_weights_problem`).

The cached step (`mini_batch_size`): the repetition is drawn inside `embed_views`, so the replay repeats the same
tokens; the momentum encoder runs in `batch_loss` (once per step, in mini-batches of that size, no random draws).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import TrainerCallback

from hf_sentcl.common.distributed import gather_with_grad
from hf_sentcl.losses.false_negatives import info_nce_mask
from hf_sentcl.methods.esimcse.augment import word_repetition
from hf_sentcl.methods.esimcse.loss import queue_info_nce
from hf_sentcl.trainers.base import ContrastiveTrainer
from hf_sentcl.trainers.direct import direct_use
from hf_sentcl.trainers.heads import TrainingHeadsMixin, attach_training_head, refuse_sharded_weights

MOMENTUM_NAME = "esimcse_momentum"
MOMENTUM_FILE = "esimcse_momentum.safetensors"


def position_limit(encoder: nn.Module) -> int | None:
    """The longest sequence the backbone's position embeddings take (RoBERTa-style models lose padding_idx + 1 of
    them), or None when it has no such limit: the repeated view never grows beyond it."""
    positions = getattr(encoder.config.backbone_config, "max_position_embeddings", None)
    if positions is None:
        return None
    padding_idx = getattr(getattr(encoder.backbone, "embeddings", None), "padding_idx", None)
    return positions - (padding_idx + 1 if isinstance(padding_idx, int) else 0)


def special_token_ids(tokenizer) -> set[int]:
    """The ids never repeated: [CLS]/[SEP] (<s>/</s>), bos/eos and padding, as the tokenizer names them."""
    names = ("cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id", "pad_token_id")
    return {value for name in names if isinstance(value := getattr(tokenizer, name, None), int)}


def detached_copy(encoder: nn.Module) -> nn.Module:
    """A copy of `encoder` (weights and buffers, not its tokenizer) whose weights require no gradient."""
    tokenizer = getattr(encoder, "tokenizer", None)
    encoder.tokenizer = None
    try:
        clone = copy.deepcopy(encoder)
    finally:
        encoder.tokenizer = tokenizer
    return clone.requires_grad_(False)


class MomentumQueue(nn.Module):
    """The momentum encoder and the FIFO queue of its embeddings (a buffer, oldest entry first, with the number of
    entries filled so far), saved and restored together as one training head."""

    def __init__(self, encoder: nn.Module, size: int, dim: int):
        super().__init__()
        self.encoder = detached_copy(encoder)
        self.register_buffer("queue", torch.zeros(size, dim))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Embeddings (rows, dim), fp32, without gradient: every submodule in eval mode (no dropout), the encoder
        itself flagged as training, so that it pools with the training pooling and applies the training head."""
        encoder = self.encoder
        encoder.eval()
        encoder.training = True  # only the top module: SentenceEncoder.forward reads it for pooling and head
        size = chunk or len(input_ids)
        parts = [
            encoder(input_ids=input_ids[start : start + size], attention_mask=attention_mask[start : start + size])
            .embeddings for start in range(0, len(input_ids), size)
        ]
        return torch.cat(parts).float()

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Append `keys` (rows, dim) at the end of the queue and drop as many of the oldest entries."""
        size = len(self.queue)
        if size == 0:
            return
        keys = keys.detach()[-size:].to(self.queue.dtype)
        self.queue.copy_(torch.cat([self.queue[len(keys):], keys]))
        self.filled.add_(len(keys)).clamp_(max=size)

    def valid(self) -> torch.Tensor:
        """(size,) bool: the entries filled so far (the last `filled` rows), without a host read."""
        size = len(self.queue)
        return torch.arange(size, device=self.queue.device) >= size - self.filled


class MomentumUpdate(TrainerCallback):
    """theta_m <- momentum * theta_m + (1 - momentum) * theta_e after every optimizer step (on_step_end runs once per
    optimizer step, after gradient accumulation, and before that step's checkpoint is written)."""

    def __init__(self, trainer: ESimCSETrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.update_momentum()


class ESimCSETrainer(TrainingHeadsMixin, ContrastiveTrainer):
    """ESimCSE on one text column: the sentence and its word-repeated copy, with momentum-queue negatives.

    Recipe keys: `ESimCSEConfig` (`python -m hf_sentcl.run --method esimcse --help` lists them).
    """

    #: two encodings of every sentence per step, the original and the repeated one (for the FLOP estimate)
    dropout_copies = 2

    def __init__(self, model=None, args=None, **kwargs):
        model = direct_use(type(self), model, kwargs, kwargs.get("max_seq_length"))  # a model id, raw text
        if getattr(model.config, "peft", None):
            raise ValueError(
                "method esimcse does not train LoRA adapters ('peft'): its momentum encoder is an exponential "
                "moving average of the encoder's weights, which adapters merged into a frozen base do not give; "
                "remove the 'peft' section."
            )
        if isinstance(getattr(model, MOMENTUM_NAME, None), nn.Module):  # an encoder an earlier trainer trained
            delattr(model, MOMENTUM_NAME)
        momentum = None
        if args.queue_size > 0:
            momentum = MomentumQueue(model, args.queue_size, model.config.hidden_size)
            attach_training_head(model, MOMENTUM_NAME, momentum)
            online = {n: p for n, p in model.named_parameters() if not n.startswith(f"{MOMENTUM_NAME}.")}
            self._momentum_pairs = [(p, online[n]) for n, p in momentum.encoder.named_parameters()]
        super().__init__(model=model, args=args, **kwargs)
        refuse_sharded_weights(self, "esimcse")
        self.momentum = momentum
        if momentum is not None:
            self.keep_training_head(momentum, MOMENTUM_FILE)
            self.add_callback(MomentumUpdate(self))
        tokenizer = self.processing_class or self.model.tokenizer
        self.special_ids = special_token_ids(tokenizer)
        self._special_ids_tensor: torch.Tensor | None = None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_repeated_length = position_limit(self.model)

    def floating_point_ops(self, inputs: dict[str, torch.Tensor]) -> int:
        """Trainer's estimate: 6 x tokens x the encoder's non-embedding parameters for each of the two views, plus the
        momentum encoder's forward (2 x tokens x its parameters); its copy is not counted as trained weights."""
        ids = inputs.get("input_ids")
        if ids is None:
            return 0
        if self._flos_per_token is None:
            total = self.accelerator.unwrap_model(self.model).num_parameters(exclude_embeddings=True)
            momentum = 0 if self.momentum is None else self.momentum.encoder.num_parameters(exclude_embeddings=True)
            self._flos_per_token = self.dropout_copies * 6 * (total - momentum) + 2 * momentum
        return ids.numel() * self._flos_per_token

    # ------------------------------------------------------------------ momentum encoder
    @torch.no_grad()
    def update_momentum(self) -> None:
        """One exponential-moving-average step of every momentum weight towards the encoder's current weight."""
        if self.momentum is None:
            return
        targets, sources = zip(*self._momentum_pairs)
        torch._foreach_lerp_(list(targets), list(sources), 1.0 - self.args.momentum)

    def queue_negatives(self, dim: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The queue's first `dim` dimensions (Matryoshka prefixes) and which entries are filled; (None, None)
        without a queue."""
        if self.momentum is None:
            return None, None
        return self.momentum.queue[:, :dim], self.momentum.valid()

    # ------------------------------------------------------------------ the training step
    def embed_views(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """ONE forward of every sentence and its word-repeated copy: (2, batch, dim), originals first."""
        ids, mask = inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0]
        if self._special_ids_tensor is None or self._special_ids_tensor.device != ids.device:
            self._special_ids_tensor = torch.tensor(sorted(self.special_ids), dtype=ids.dtype, device=ids.device)
        repeated, repeated_mask = word_repetition(
            ids, mask, self.args.dup_rate, self._special_ids_tensor, self.pad_id, self.max_repeated_length
        )
        width = max(ids.shape[1], repeated.shape[1])
        right = lambda t, value: nn.functional.pad(t, (0, width - t.shape[1]), value=value)  # noqa: E731
        embeddings = model(
            input_ids=torch.cat([right(ids, self.pad_id), right(repeated, self.pad_id)]),
            attention_mask=torch.cat([right(mask, 0), right(repeated_mask, 0)]),
        ).embeddings
        return embeddings.view(2, len(ids), -1)

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Row i: the sentence h_i; columns: the repeated sentences h_j+, then the queue (loss.queue_info_nce). The
        false-negative mask covers the batch's columns; the queue keeps no texts, so its entries stay negatives."""
        exclude = (
            None if groups is None else self.record_masked(info_nce_mask(groups[0], groups[0], guide=self.guide_rule))
        )
        queue, valid = self.queue_negatives(views.shape[-1])
        loss = queue_info_nce(
            views[0], views[1], self.args.temperature, queue, valid, exclude, **self.args.margin_loss_kwargs()
        )
        return loss, {}

    def batch_loss(self, model, views: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The base loss against the queue as it stands, then (training only) the momentum encoder's embeddings of
        the original sentences, gathered over the processes, into the queue."""
        loss, outputs = super().batch_loss(model, views, inputs)
        if self.momentum is not None and self.model.training:
            keys = self.momentum.encode(
                inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0], self.args.mini_batch_size
            )
            self.momentum.enqueue(gather_with_grad(keys))
        return loss, outputs
