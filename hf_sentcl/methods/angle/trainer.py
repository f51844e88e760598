"""AnglE's trainer: the scored pairs' two sentences through the encoder, the angle objective on their embeddings."""

from __future__ import annotations

import torch

from hf_sentcl.losses.false_negatives import paired_texts_mask
from hf_sentcl.methods.angle.loss import angle_objective
from hf_sentcl.trainers.base import ContrastiveTrainer


class AnglETrainer(ContrastiveTrainer):
    """AnglE (Li and Li 2023) on (sent0, sent1, score) pairs: the weighted cosine (CoSENT), in-batch and angle
    terms of `angle_objective`, with the gold scores gathered across processes like the embeddings."""

    dropout_copies = 1
    loss_uses_labels = True

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        exclude = None if groups is None else self.record_masked(paired_texts_mask(*groups, guide=self.guide_rule))
        return angle_objective(views[0], views[1], labels, exclude=exclude, **self.args.angle_loss_kwargs())
