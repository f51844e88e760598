"""Self-guided contrastive learning, SG and SG-OPT (Kim et al. 2021, section 3).

The encoder being trained is BERT_T; its last-layer [CLS] vector c_i is the sentence embedding. At construction
the trainer clones the backbone into BERT_F (no gradients, eval mode, kept outside the model so it is neither
optimised nor saved) and freezes BERT_T's embedding layer (layer 0). Each step:

1. c = BERT_T's last-layer [CLS] for the batch (one forward, with gradient);
2. one `torch.no_grad` forward of BERT_F gives every hidden state; pooling p (max or mean over real tokens) of each
   chosen layer k gives the views h_{i,k};
3. SG and the ablations sample one view per sentence uniformly (sigma); SG-OPT keeps them all;
4. both go through the projection head f, then the objective's loss (`hf_sentcl.losses.self_guided`);
5. loss = contrastive + lambda * sum ||theta_T - theta_F||^2.

Where the projection head lives: f is registered as a submodule (`self_guided_head`) of the encoder, so the
optimizer, gradient clipping, device placement, mixed precision and DDP gradient averaging all treat it like any
other trained weight, with no override of optimizer creation. Its keys are added to the encoder's
`_keys_to_ignore_on_save`, so `save_pretrained` (checkpoints and the final encoder) leaves it out and loading the
best checkpoint does not warn about it; `_save` writes it to a separate `self_guided_head.safetensors` so that
`resume_from_checkpoint` restores it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import EarlyStoppingCallback

from hf_sentcl.distributed import gather_with_grad, world_size
from hf_sentcl.losses import parameter_distance, sg_loss, sg_opt1_loss, sg_opt2_loss, sg_opt_loss
from hf_sentcl.modeling.heads import ProjectionHead
from hf_sentcl.modeling.pooling import masked_max, masked_mean
from hf_sentcl.trainers.base import ContrastiveTrainer, scale_gradient

HEAD_NAME = "self_guided_head"
HEAD_FILE = "self_guided_head.safetensors"
OBJECTIVES = {"sg": sg_loss, "opt1": sg_opt1_loss, "opt2": sg_opt2_loss, "sg-opt": sg_opt_loss}
VIEW_POOLERS = {"max": masked_max, "mean": masked_mean}


def check_encoder_for_self_guided(config) -> None:
    """The sentence vector c must be the raw last-layer [CLS] of the tuned encoder, as in the paper."""
    num_layers = config.backbone_config.num_hidden_layers
    if config.head != "none":
        raise ValueError(
            f"method self_guided: set 'head: none' in the recipe (got head: {config.head}). The sentence vector is "
            "the raw last-layer [CLS]; the training-only projection head f is set by projection_head/projection_size."
        )
    if config.pooling not in ("cls", "cls_before_pooler"):
        raise ValueError(f"method self_guided: 'pooling' must be cls or cls_before_pooler, got '{config.pooling}'.")
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
    """Views h_{i,k} = p(H_{i,k}): pool the real tokens of each chosen hidden state; returns (b, len(layers), d)."""
    pool = VIEW_POOLERS[mode]
    return torch.stack([pool(hidden_states[k], attention_mask) for k in layers], dim=1)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A clone of `module` that never trains: no parameter requires gradient and it stays in eval mode."""
    clone = copy.deepcopy(module)
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


class SelfGuidedTrainer(ContrastiveTrainer):
    """SG / SG-OPT: pull BERT_T's [CLS] towards pooled hidden layers of a frozen clone BERT_F.

    Recipe knobs: `objective` (sg, opt1, opt2, sg-opt), `temperature`, `regularizer_weight` (lambda),
    `view_pooling`, `view_layers`, `projection_head`, `projection_size`, `early_stopping_patience`.
    """

    dropout_copies = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        encoder = self.model
        check_encoder_for_self_guided(encoder.config)
        self.view_layers = resolve_view_layers(self.args.view_layers, encoder.config.backbone_config.num_hidden_layers)
        self.frozen_backbone = frozen_copy(encoder.backbone)  # BERT_F: a clone of the untouched backbone
        freeze_embedding_layer(encoder.backbone)  # layer 0 of BERT_T
        self.projection_head = self._attach_projection_head(encoder) if self.args.projection_head else None
        if self.args.early_stopping_patience is not None:
            self.add_callback(EarlyStoppingCallback(early_stopping_patience=self.args.early_stopping_patience))

    def _attach_projection_head(self, encoder: nn.Module) -> ProjectionHead:
        init_std = getattr(encoder.config.backbone_config, "initializer_range", None)
        head = ProjectionHead(encoder.config.hidden_size, self.args.projection_size, init_std=init_std)
        head.to(device=encoder.device, dtype=encoder.dtype)
        encoder.add_module(HEAD_NAME, head)
        ignored = {f"{HEAD_NAME}.{key}" for key in head.state_dict()}
        encoder._keys_to_ignore_on_save = set(encoder._keys_to_ignore_on_save or ()) | ignored
        return head

    # ------------------------------------------------------------------ the training step
    @torch.no_grad()
    def frozen_views(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All views h_{i,k} from ONE autograd-free forward of BERT_F: (b, len(view_layers), d)."""
        frozen = self.frozen_backbone
        if next(frozen.parameters()).device != input_ids.device:
            frozen.to(input_ids.device)
        outputs = frozen(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True
        )
        return pool_views(outputs.hidden_states, attention_mask, self.view_layers, self.args.view_pooling)

    def project(self, vectors: torch.Tensor) -> torch.Tensor:
        return vectors if self.projection_head is None else self.projection_head(vectors)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        c = self.embed_views(model, inputs)[0]  # (b, d): BERT_T's last-layer [CLS]
        views = self.frozen_views(inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0])
        if self.args.objective != "sg-opt":  # sampler sigma: one uniformly chosen layer per sentence
            choice = torch.randint(views.shape[1], (views.shape[0],), device=views.device)
            views = views[torch.arange(views.shape[0], device=views.device), choice]
        c_projected = gather_with_grad(self.project(c), dim=0)
        h_projected = gather_with_grad(self.project(views), dim=0)
        contrastive = OBJECTIVES[self.args.objective](c_projected, h_projected, self.args.temperature)

        backbone = self.accelerator.unwrap_model(model).backbone
        weight = self.args.regularizer_weight
        with torch.set_grad_enabled(weight > 0 and torch.is_grad_enabled()):
            distance = parameter_distance(backbone, self.frozen_backbone)
        # The contrastive term is gathered (gradient rescaled by the world size, see the base class); the
        # regularizer is computed in full on every process, so DDP's averaging leaves it as it is.
        loss = scale_gradient(contrastive, world_size()) + weight * distance
        self.record_metrics({"contrastive_loss": contrastive, "param_distance": distance})
        return (loss, {"embeddings": c_projected}) if return_outputs else loss

    # ------------------------------------------------------------------ the head's own file (for resuming)
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        if self.projection_head is not None and self.args.should_save:
            path = os.path.join(output_dir or self.args.output_dir, HEAD_FILE)
            save_file({k: v.detach().cpu().contiguous() for k, v in self.projection_head.state_dict().items()}, path)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, HEAD_FILE)
        if self.projection_head is not None and os.path.isfile(path):
            device = str(next(self.projection_head.parameters()).device)
            self.projection_head.load_state_dict(load_file(path, device=device))
