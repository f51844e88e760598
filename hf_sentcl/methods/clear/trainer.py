"""CLEAR (Wu et al. 2020, sections 3-4): L_total = L_MLM + L_CL.

- L_MLM: BERT's masked-LM loss on the ORIGINAL sentence (15% of its tokens, 80/10/10), through the backbone's own
  masked-LM head (`AutoModelForMaskedLM`'s head, loaded from the checkpoint, or initialised when the checkpoint
  has none, e.g. the bare BertModel all-MiniLM-L6-v2; the log says which). Its decoder stays tied to the
  backbone's word embeddings, as in BERT/RoBERTa.
- L_CL: NT-Xent over the 2N projected [CLS] vectors z = g([CLS]) of two augmented views of each sentence
  (`hf_sentcl.losses.nt_xent`, so the IFM/BYOP margin plug-in applies), g a nonlinear projection head; summed over
  the 2N views as Eq. 2 writes it (`cl_reduction: sum`, so against the token-averaged L_MLM it weighs 2N times its
  mean; N the global batch) or averaged (`cl_reduction: mean`).

Augmentation happens in the data pipeline (`CLEARCollator` in this folder's `collator.py`, seeded per example, view
and epoch); [DEL] is added to the tokenizer and the embeddings are resized when the augmentation deletes.

One forward pass per step: the masked original and both views of every sentence are stacked into one batch of
3N sequences. This is exactly equivalent to separate passes: a transformer encodes each sequence independently
(attention is masked per sequence, LayerNorm is per token, there is no batch statistic), padding to the common
length is masked out of attention (and positions are numbered per sequence, for RoBERTa from its own padding), and
the two losses' gradients add up the same way. The MLM head then reads the last hidden states of the N originals
(only at the masked positions), the projection head the [CLS] vectors of the 2N views. In the base class's terms,
that forward is `forward_views` (the MLM loss is its per-example `local_loss`) and the NT-Xent `contrastive_loss`,
so the cached large-batch step (`mini_batch_size`) applies to CLEAR too.

Both heads are training-only: they live in a `clear_heads` submodule of the encoder (`attach_training_head`), so
the optimizer, device placement and DDP treat them as any weight, but the saved encoder is the plain backbone;
`clear_heads.safetensors` beside each checkpoint keeps them for `resume_from_checkpoint`, without the MLM decoder
weight, which is the word-embedding matrix saved with the encoder.

`from_scratch: true` replaces the backbone by a freshly initialised one of the same architecture (sizes from the
scratch_* keys) before training: the paper pre-trains from scratch.
"""

from __future__ import annotations

import copy
import logging
import math

import torch
import torch.nn.functional as F
from datasets import Dataset
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM, PreTrainedModel, TrainerCallback

from hf_sentcl.losses import nt_xent
from hf_sentcl.losses.false_negatives import nt_xent_mask
from hf_sentcl.methods.clear.collator import CLEARCollator, with_example_index
from hf_sentcl.trainers.base import ContrastiveTrainer, ViewsOutput, stack_views
from hf_sentcl.trainers.heads import (
    TrainingHeadsMixin,
    attach_training_head,
    check_raw_cls_encoder,
    refuse_sharded_weights,
)

logger = logging.getLogger("hf_sentcl")

HEADS_NAME = "clear_heads"
HEADS_FILE = "clear_heads.safetensors"


def reinitialise_backbone(encoder: nn.Module, sizes: dict[str, int]) -> None:
    """Replace the encoder's backbone by a freshly initialised one: same architecture, `sizes` overridden."""
    config = copy.deepcopy(encoder.backbone.config)
    for key, value in sizes.items():
        setattr(config, key, value)
    heads = getattr(config, "num_attention_heads", None)
    if heads and config.hidden_size % heads:
        raise ValueError(
            f"from_scratch: hidden size {config.hidden_size} is not a multiple of {heads} attention heads; "
            "change scratch_hidden_size or scratch_num_attention_heads."
        )
    encoder.backbone = AutoModel.from_config(config)
    encoder.config.backbone_config = copy.deepcopy(config)
    logger.info("CLEAR from scratch: a freshly initialised %s (%s).", type(encoder.backbone).__name__,
                ", ".join(f"{k}={getattr(config, k)}" for k in ("hidden_size", "num_hidden_layers",
                                                                  "num_attention_heads", "intermediate_size")))


def masked_lm_head(
    backbone: PreTrainedModel, checkpoint: str | None, vocab_size: int
) -> tuple[nn.Module, list[str]]:
    """The masked-LM head of `backbone`'s architecture, with the checkpoint's weights where it has them, its
    decoder tied to `backbone`'s word embeddings, and `backbone` and head resized to `vocab_size` tokens.
    Returns the head and the head keys that were initialised.

    The head is taken from `AutoModelForMaskedLM` (loaded from `checkpoint`, or built from the config when None)
    whose base model is then replaced by `backbone`, so transformers' own resizing and tying apply to both;
    architectures whose head is not one module are refused.
    """
    if checkpoint:
        mlm, info = AutoModelForMaskedLM.from_pretrained(checkpoint, output_loading_info=True)
    else:
        mlm, info = AutoModelForMaskedLM.from_config(backbone.config), None
    prefix = mlm.base_model_prefix
    names = [name for name, _ in mlm.named_children() if name != prefix]
    if len(names) != 1:
        raise ValueError(
            f"method clear: {type(mlm).__name__} has no single masked-LM head module (found {names}); CLEAR supports "
            "backbones whose masked-LM model is base model + one head (BERT, RoBERTa, MPNet, ...)."
        )
    initialised = [k for k in info["missing_keys"] if k.startswith(f"{names[0]}.")] if info else ["all"]
    mlm.to(device=backbone.device, dtype=backbone.dtype)
    setattr(mlm, prefix, backbone)
    if backbone.get_input_embeddings().num_embeddings != vocab_size:
        mlm.resize_token_embeddings(vocab_size)  # the backbone's embeddings, the decoder and its bias; re-tied
    else:
        mlm.tie_weights()  # the decoder now shares `backbone`'s word embeddings (when the config ties them)
    return getattr(mlm, names[0]), sorted(initialised)


def record_vocabulary(encoder: nn.Module) -> None:
    """Write the backbone's (possibly resized) embedding count into both configs, so the encoder reloads."""
    size = encoder.backbone.get_input_embeddings().num_embeddings
    encoder.backbone.config.vocab_size = size
    encoder.config.backbone_config.vocab_size = size


def projection_head(hidden_size: int, width: int | None, out: int) -> nn.Sequential:
    """g: Linear(d, width) - ReLU - Linear(width, out), SimCLR's nonlinear projection head."""
    width = width or hidden_size
    return nn.Sequential(nn.Linear(hidden_size, width), nn.ReLU(), nn.Linear(width, out))


def masked_lm_loss(
    head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean cross-entropy of the head's vocabulary logits at the masked positions (labels != -100), in fp32.

    `positions` (batch, K): the collator's indices of each row's masked tokens, padded with positions whose label
    is -100; the head runs on those K per row only. Gathering at known indices needs no host read, unlike a
    boolean-mask select (whose size the GPU must report first). None = every position (same loss, more head
    work). Zero (with a graph) when nothing is masked."""
    if positions is None:
        positions = torch.arange(labels.shape[1], device=labels.device).expand(labels.shape[0], -1)
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    targets = labels.gather(1, positions).flatten()
    logits = head(picked.flatten(0, 1))
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        total = F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
    return total / (targets != -100).sum().clamp_min(1)


def attach_training_heads(encoder: nn.Module, args) -> nn.ModuleDict:
    """Build g (and the MLM head when `args.mlm_weight` > 0), resize the embeddings to the tokenizer (which may
    have gained [DEL]), and register both heads as the encoder's training-only `clear_heads` submodule."""
    tokenizer = encoder.tokenizer
    heads = nn.ModuleDict({"projection": projection_head(encoder.config.hidden_size, args.projection_size,
                                                         args.projection_dim)})
    if args.mlm_weight > 0:
        checkpoint = None if args.from_scratch else encoder.backbone.name_or_path
        heads["mlm"], initialised = masked_lm_head(encoder.backbone, checkpoint, len(tokenizer))
        if initialised:
            logger.warning("CLEAR: %s has no masked-LM head weights (%s); the MLM head is freshly initialised.",
                           checkpoint or "the fresh backbone", ", ".join(initialised))
    elif encoder.backbone.get_input_embeddings().num_embeddings != len(tokenizer):
        encoder.backbone.resize_token_embeddings(len(tokenizer))
    record_vocabulary(encoder)
    encoder.attach_tokenizer(tokenizer)  # re-checks the tokenizer against the (resized) vocabulary
    return attach_training_head(encoder, HEADS_NAME, heads)


class CollatorEpoch(TrainerCallback):
    """Tells the collator the epoch at its start (before the epoch's data-loader workers are created)."""

    def __init__(self, collator: CLEARCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.epoch = math.floor((state.epoch or 0.0) + 1e-9)


class CLEARTrainer(TrainingHeadsMixin, ContrastiveTrainer):
    """CLEAR: masked-LM loss on the original sentence plus NT-Xent between two augmented views.

    Recipe keys: `CLEARConfig` (`python -m hf_sentcl.run --method clear --help` lists them). The data collator is
    built here from them (`CLEARCollator.from_args`; a generic one passed in is replaced); `train_dataset` gets an
    `example_index` column that seeds the views.
    """

    #: the MLM loss is a per-example term of `forward_views`, so `mini_batch_size` (the cached step) applies
    supports_cached_step = True

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, **kwargs):
        check_raw_cls_encoder(model.config, "clear", "projection_size/projection_dim")
        if args.from_scratch:
            reinitialise_backbone(model, args.scratch_sizes())
        if not isinstance(data_collator, CLEARCollator):
            data_collator = CLEARCollator.from_args(  # keeps the recipe's pad_to_multiple_of (run.py's ViewCollator)
                model.tokenizer, args, max_length=model.max_seq_length,
                pad_to_multiple_of=getattr(data_collator, "pad_to_multiple_of", None),
            )
        heads = attach_training_heads(model, args)
        if isinstance(train_dataset, Dataset):
            train_dataset = with_example_index(train_dataset)
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset, **kwargs)
        refuse_sharded_weights(self, "clear")
        self.heads = self.keep_training_head(heads, HEADS_FILE)
        self.add_callback(CollatorEpoch(data_collator))

    # ------------------------------------------------------------------ the training step
    def forward_views(self, model, inputs: dict[str, torch.Tensor]) -> ViewsOutput:
        """ONE forward of [masked original,] view 1, view 2 of every sentence: the views' projected [CLS] vectors
        z = g([CLS]) (2, batch, projection_dim), and the weighted MLM loss of the originals as the per-example term
        (a mean over the masked tokens)."""
        batch, views = inputs["input_ids"].shape[:2]
        mlm = "mlm_labels" in inputs
        outputs = model(
            input_ids=stack_views(inputs["input_ids"]), attention_mask=stack_views(inputs["attention_mask"]),
            output_hidden_states=mlm,
        )
        # g is applied before the views are gathered across processes, so each process back-propagates it through
        # its own examples only (as the encoder), which the world-size gradient scale of batch_loss assumes.
        z = self.heads["projection"](outputs.embeddings.view(views, batch, -1)[-2:])
        if not mlm:
            return ViewsOutput(z)
        labels = inputs["mlm_labels"]
        loss = masked_lm_loss(self.heads["mlm"], outputs.hidden_states[-1][:batch], labels, inputs.get("mlm_positions"))
        return ViewsOutput(
            z, local_loss=self.args.mlm_weight * loss, local_weight=(labels != -100).sum(),
            components={"mlm_loss": loss},
        )

    @classmethod
    def matryoshka_refusal(cls, args, model_settings) -> str | None:
        return (
            "CLEAR's NT-Xent compares the projection head g's outputs (projection_dim), which the saved encoder "
            "drops, so no prefix of the saved [CLS] embedding would be trained; remove 'matryoshka_dims'."
        )

    def identity_tokens(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """A sentence is named by its text before augmentation (the collator's `source_ids`): two augmented views of
        one repeated sentence are the same sentence, whatever the augmentations drew."""
        return inputs["source_ids"][:, None], inputs["source_mask"][:, None]

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """NT-Xent over the 2N gathered projections (with the IFM/BYOP margin when `perturbation` is set), summed
        over the 2N views (Eq. 2) or averaged, as `cl_reduction` says."""
        exclude = None if groups is None else self.record_masked(nt_xent_mask(groups[0], self.guide_rule))
        loss = nt_xent(
            views[0], views[1], self.args.temperature, reduction=self.args.cl_reduction, exclude=exclude,
            **self.args.margin_loss_kwargs(),
        )
        return loss, {"contrastive_loss": loss}
