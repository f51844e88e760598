"""SimCSE trainers (Gao et al. 2021), with the optional IFM/BYOP margin perturbation of their InfoNCE."""

from __future__ import annotations

import torch

from hf_sentcl.losses import margin_info_nce
from hf_sentcl.losses.false_negatives import info_nce_mask
from hf_sentcl.trainers.base import ContrastiveTrainer


class SimCSETrainer(ContrastiveTrainer):
    """Unsupervised SimCSE: every sentence twice in one forward pass, dropout makes the positive pair."""

    dropout_copies = 2

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        exclude = (
            None if groups is None else self.record_masked(info_nce_mask(groups[0], groups[0], guide=self.guide_rule))
        )
        # perturbation unset -> exactly info_nce
        loss = margin_info_nce(
            views[0], views[1], self.args.temperature, exclude=exclude, **self.args.margin_loss_kwargs()
        )
        return loss, {}


class SupervisedSimCSETrainer(ContrastiveTrainer):
    """Supervised SimCSE: (anchor, entailment[, contradiction]) views, contradictions as hard negatives."""

    dropout_copies = 1

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        hard = views[2] if views.shape[0] > 2 else None
        exclude = None
        if groups is not None:  # anchors, positives[, hard negatives]
            exclude = self.record_masked(info_nce_mask(*groups, guide=self.guide_rule))
        loss = margin_info_nce(
            views[0], views[1], self.args.temperature, hard_negatives=hard,
            hard_negative_weight=self.args.hard_negative_weight, exclude=exclude, **self.args.margin_loss_kwargs(),
        )
        return loss, {}
