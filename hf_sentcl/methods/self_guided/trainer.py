"""Self-guided contrastive learning, SG and SG-OPT (Kim et al. 2021, section 3).

The encoder being trained is BERT_T; its last-layer [CLS] vector c_i is the sentence embedding. At construction
the trainer clones the backbone into BERT_F (no gradients, eval mode unless `frozen_dropout`, kept outside the
model so it is neither optimised nor saved) and freezes BERT_T's embedding layer (layer 0). Each step:

1. c = BERT_T's last-layer [CLS] for the batch (one forward, with gradient);
2. one `torch.no_grad` forward of BERT_F gives every hidden state; pooling p (max or mean over real tokens) of each
   chosen layer k gives the views h_{i,k};
3. SG and the ablations sample one view per sentence uniformly (sigma); SG-OPT keeps them all;
4. both go through the projection head f, then the objective's loss (`loss.py` of this folder);
5. loss = contrastive + lambda * sum ||theta_T - theta_F||^2.

Where the projection head lives: f is registered as a submodule (`self_guided_head`) of the encoder, so the
optimizer, gradient clipping, device placement, mixed precision and DDP gradient averaging all treat it like any
other trained weight, with no override of optimizer creation. Its keys are added to the encoder's
`_keys_to_ignore_on_save`, so `save_pretrained` (checkpoints and the final encoder) leaves it out and loading the
best checkpoint does not warn about it; checkpoints carry it in a separate `self_guided_head.safetensors` so that
`resume_from_checkpoint` restores it (`hf_sentcl.trainers.heads.TrainingHeadsMixin`).

Scale: with LoRA (`peft:`) BERT_F is the base model without adapters and the regularizer is the squared norm of
the merged LoRA deltas (`hf_sentcl.modeling.peft.weight_distance`). The loss lives in `batch_loss`, so the cached
step (`mini_batch_size`) splits BERT_T's forward; BERT_F's no-grad forward runs in mini-batches too. The head
and the regularizer use the encoder's weights outside its forward: fine for DDP (ContrastiveTrainer runs it
without the unused-parameter search), refused under FSDP / DeepSpeed ZeRO-3, which shard those weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import EarlyStoppingCallback

from hf_sentcl.common.distributed import gather_with_grad, world_size
from hf_sentcl.losses.false_negatives import false_negative_mask, info_nce_mask, nt_xent_mask
from hf_sentcl.methods.self_guided.loss import sg_loss, sg_opt1_loss, sg_opt2_loss, sg_opt_loss
from hf_sentcl.modeling.backbone_forward import run_backbone
from hf_sentcl.modeling.heads import ProjectionHead
from hf_sentcl.modeling.peft import frozen_base_copy, is_peft_model, weight_distance
from hf_sentcl.modeling.pooling import masked_max, masked_mean
from hf_sentcl.trainers.base import ContrastiveTrainer, scale_gradient
from hf_sentcl.trainers.heads import TrainingHeadsMixin, check_raw_cls_encoder, refuse_sharded_weights

HEAD_NAME = "self_guided_head"
HEAD_FILE = "self_guided_head.safetensors"
OBJECTIVES = {"sg": sg_loss, "opt1": sg_opt1_loss, "opt2": sg_opt2_loss, "sg-opt": sg_opt_loss}
#: each objective's false-negative mask from the sentences' text groups (b,) or guide embeddings (b, d) and the guide
#: rule, in its candidate layout
OBJECTIVE_MASKS = {
    "sg": nt_xent_mask,  # [c; h] x [c; h]
    "opt1": lambda g, guide: false_negative_mask(  # [h, c]
        g, g, torch.cat([g, g]), torch.arange(len(g), device=g.device), guide
    ),
    "opt2": lambda g, guide: info_nce_mask(g, g, guide=guide),
    "sg-opt": lambda g, guide: info_nce_mask(g, g, guide=guide),  # sentences m, every view of each
}
VIEW_POOLERS = {"max": masked_max, "mean": masked_mean}


def check_encoder_for_self_guided(config) -> None:
    """The sentence vector c must be the raw last-layer [CLS] of the tuned encoder, as in the paper."""
    num_layers = config.backbone_config.num_hidden_layers
    check_raw_cls_encoder(config, "self_guided", "projection_head/projection_size")
    if config.pooling_layer not in (-1, num_layers):
        raise ValueError(
            f"method self_guided: 'pooling_layer' must be the last layer (-1), got {config.pooling_layer}."
        )
    if config.inference_pooling not in (None, "cls", "cls_before_pooler"):
        raise ValueError(
            f"method self_guided: 'inference_pooling' must be empty or cls, got '{config.inference_pooling}'."
        )


def resolve_view_layers(layers: Sequence[int] | None, num_layers: int) -> list[int]:
    """Hidden-state indices (0 = embedding output .. num_layers) that give views; None means all of them."""
    count = num_layers + 1
    if layers is None:
        return list(range(count))
    bad = [k for k in layers if not -count <= k < count]
    if bad:
        raise ValueError(
            f"view_layers {bad} out of range for a backbone with {num_layers} layers (use 0..{num_layers}, or "
            "negative indices from the end)."
        )
    resolved = [k % count for k in layers]
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"view_layers {list(layers)} name the same hidden state twice.")
    return resolved


def pool_views(
    hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, layers: Sequence[int], mode: str
) -> torch.Tensor:
    """Views h_{i,k} = p(H_{i,k}): pool the real tokens of each chosen hidden state (in fp32, also for bf16 hidden
    states); returns (b, len(layers), d)."""
    pool = VIEW_POOLERS[mode]
    return torch.stack([pool(hidden_states[k].float(), attention_mask) for k in layers], dim=1)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A clone of `module` that never trains: no parameter requires gradient, and it starts in eval mode (only
    `frozen_dropout` switches its dropout on, per step). A LoRA-wrapped module is cloned with its adapters merged,
    i.e. as the plain model it computes."""
    clone = frozen_base_copy(module)
    clone.requires_grad_(False)
    return clone.eval()  # not a submodule of the trained model, so Trainer's model.train() never reaches it


def freeze_embedding_layer(backbone: nn.Module) -> None:
    """Freeze layer 0 (the embedding module) of a BERT-like backbone."""
    embeddings = getattr(backbone, "embeddings", None)
    if not isinstance(embeddings, nn.Module):
        raise ValueError(
            f"method self_guided freezes the embedding layer, but {type(backbone).__name__} has no `embeddings` "
            "module (BERT, RoBERTa, MiniLM, ELECTRA, MPNet ... have one)."
        )
    embeddings.requires_grad_(False)


class SelfGuidedTrainer(TrainingHeadsMixin, ContrastiveTrainer):
    """SG / SG-OPT: pull BERT_T's [CLS] towards pooled hidden layers of a frozen clone BERT_F.

    Recipe keys: `SelfGuidedConfig` (`python -m hf_sentcl.run --method self_guided --help` lists them).
    """

    dropout_copies = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        encoder = self.model
        check_encoder_for_self_guided(encoder.config)
        self._check_parallelism()
        self.view_layers = resolve_view_layers(self.args.view_layers, encoder.config.backbone_config.num_hidden_layers)
        self.frozen_backbone = frozen_copy(encoder.backbone)  # BERT_F: a clone of the untouched backbone
        freeze_embedding_layer(encoder.backbone)  # layer 0 of BERT_T
        self.projection_head = self._attach_projection_head(encoder) if self.args.projection_head else None
        if is_peft_model(encoder.backbone) and weight_distance(encoder.backbone, self.frozen_backbone).item() != 0:
            raise ValueError(
                "method self_guided with peft: the LoRA adapters must start at zero (B = 0, peft's default "
                "init_lora_weights: true) so that BERT_F is the untouched model; remove peft.init_lora_weights."
            )
        if self.args.early_stopping_patience is not None:
            self.add_callback(EarlyStoppingCallback(early_stopping_patience=self.args.early_stopping_patience))

    def _check_parallelism(self) -> None:
        refuse_sharded_weights(self, "self_guided")

    def _attach_projection_head(self, encoder: nn.Module) -> ProjectionHead:
        init_std = getattr(encoder.config.backbone_config, "initializer_range", None)
        head = ProjectionHead(encoder.config.hidden_size, self.args.projection_size, init_std=init_std)
        return self.add_training_head(HEAD_NAME, head, HEAD_FILE)

    # ------------------------------------------------------------------ the training step
    @torch.no_grad()
    def frozen_views(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All views h_{i,k} from ONE autograd-free forward of BERT_F: (b, len(view_layers), d), fp32 (in a training
        step the forward runs under the training's autocast, see `ContrastiveTrainer.autocast_smart_context_manager`).
        With `mini_batch_size` it runs in mini-batches of that size (in eval mode, the same result)."""
        frozen = self.frozen_backbone
        tuned = next(self.accelerator.unwrap_model(self.model).backbone.parameters())
        first = next(frozen.parameters())
        if first.device != input_ids.device or first.dtype != tuned.dtype:
            # DeepSpeed's bf16/fp16 engines hold BERT_T in that dtype (no autocast): BERT_F follows, so that the
            # regularizer is 0 at step 0 and both encoders run in one precision
            frozen.to(device=input_ids.device, dtype=tuned.dtype)
        if self.args.frozen_dropout:  # otherwise BERT_F stays in the eval mode it was built in
            frozen.train(self.model.training)
        size = self.args.mini_batch_size or len(input_ids)
        unpadded = self.accelerator.unwrap_model(self.model).config.unpadded  # BERT_F runs as BERT_T does
        views = []
        for start in range(0, len(input_ids), size):
            ids, mask = input_ids[start : start + size], attention_mask[start : start + size]
            outputs = run_backbone(frozen, unpadded, input_ids=ids, attention_mask=mask, output_hidden_states=True)
            views.append(pool_views(outputs.hidden_states, mask, self.view_layers, self.args.view_pooling))
        return torch.cat(views)

    def project(self, vectors: torch.Tensor) -> torch.Tensor:
        """f(vectors), in the head's dtype: the pooled views are fp32, and DeepSpeed's bf16/fp16 engines hold the head
        (attached to the model) in 16 bits without autocast to cast its input (under autocast this changes nothing)."""
        if self.projection_head is None:
            return vectors
        return self.projection_head(vectors.to(next(self.projection_head.parameters()).dtype))

    @classmethod
    def matryoshka_refusal(cls, args, model_settings) -> str | None:
        if args.projection_head:
            return (
                "SG's losses compare the projection head's outputs (projection_size wide), which the saved encoder "
                "drops, so no prefix of the saved [CLS] embedding would be trained; set 'projection_head: false' "
                "(Table 5's ablation) to train Matryoshka prefixes."
            )
        return super().matryoshka_refusal(args, model_settings)

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective on the gathered, projected vectors stacked as (b, 1 + h views, d): c first, then h."""
        c, h = views[:, 0], views[:, 1:]
        if groups is not None:
            exclude = self.record_masked(OBJECTIVE_MASKS[self.args.objective](groups[0], self.guide_rule))
        else:
            exclude = None
        h = h if self.args.objective == "sg-opt" else h[:, 0]
        return OBJECTIVES[self.args.objective](c, h, self.args.temperature, exclude), {}

    def batch_loss(self, model, views: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """Steps 2-5 of the module docstring on BERT_T's embedded batch (`embed_views` output)."""
        c = views[0]  # (b, d): BERT_T's last-layer [CLS]
        h = self.frozen_views(inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0])
        if self.args.objective != "sg-opt":  # sampler sigma: one uniformly chosen layer per sentence
            choice = torch.randint(h.shape[1], (h.shape[0],), device=h.device)
            h = h[torch.arange(h.shape[0], device=h.device), choice][:, None]
        c_projected = gather_with_grad(self.project(c), dim=0)
        h_projected = gather_with_grad(self.project(h), dim=0)
        groups = self.candidate_identities(inputs)
        vectors = torch.cat([c_projected[:, None], h_projected], dim=1)
        contrastive, parts = self.embedding_loss(lambda v: self.contrastive_loss(v, groups), vectors)
        self.record_metrics(parts)

        backbone = self.accelerator.unwrap_model(model).backbone
        weight = self.args.regularizer_weight
        with torch.set_grad_enabled(weight > 0 and torch.is_grad_enabled()):
            distance = weight_distance(backbone, self.frozen_backbone)
        # The contrastive term is gathered (gradient rescaled by the world size, see the base class); the
        # regularizer is computed in full on every process, so DDP's averaging leaves it as it is.
        loss = scale_gradient(contrastive, world_size()) + weight * distance
        self.record_metrics({"contrastive_loss": contrastive, "param_distance": distance})
        return loss, {"embeddings": c_projected}
