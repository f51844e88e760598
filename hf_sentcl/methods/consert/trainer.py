"""ConSERT (Yan et al. 2021, sections 3-4): contrastive learning with embedding-level augmentations.

Each step stacks every copy of every sentence into ONE forward pass; `EmbeddingAugmenter` hooks give row block k
its augmentation (see `hf_sentcl.augment.embedding`):

- `unsup`: blocks [T1(x), T2(x)] -> r, r' (mean pooling) -> NT-Xent over the 2N views (`hf_sentcl.losses.nt_xent`,
  with the optional IFM/BYOP margin).
- `sup`: the NLI pairs without augmentation -> cross-entropy of a linear classifier on (r1, r2, |r1 - r2|).
- `joint`: blocks [clean, T1, T2] of all premises and hypotheses -> L_ce on the clean block + alpha * NT-Xent over
  the 2N texts (premises and hypotheses alike). A block whose augmentation is `none` is the clean block itself.
  With `adversarial`, T2's block also gets the FGV perturbation: a probe pass of the clean sentences through the
  unwrapped encoder gives the gradient of L_ce w.r.t. the embedding output (`torch.autograd.grad`, so no parameter
  gradient and no DDP hook is involved), scaled to norm epsilon per sentence.
- `sup-unsup` / `joint-unsup` are two runs of this trainer, chained by `stages.consert_stages` and the pipeline.

The step follows the base class's hooks: `forward_views` is the stacked forward (L_ce, which couples no two
examples, is its `local_loss`), `batch_loss` / `contrastive_loss` the NT-Xent on the gathered views, so
`mini_batch_size` (the cached large-batch step) works in every mode. All randomness (augmentations) comes from
torch's global generators, which the cached step replays.

The encoder's own dropout is switched off (every `nn.Dropout` of the backbone gets p = 0; the saved config keeps
its values) unless `encoder_dropout`. The NLI classifier is a training-only head (`hf_sentcl.trainers.heads`):
registered on the encoder as `consert_classifier` while training, left out of checkpoints and the final encoder,
and written beside each checkpoint as `consert_classifier.safetensors` for `resume_from_checkpoint`.
"""

from __future__ import annotations

import torch
from torch import nn

from hf_sentcl.augment.embedding import AugmentationRates, EmbeddingAugmenter, fgv_perturbation
from hf_sentcl.data.nli import NLI_LABELS
from hf_sentcl.losses import nt_xent, pair_classification_loss
from hf_sentcl.losses.false_negatives import nt_xent_mask
from hf_sentcl.methods.consert.config import CHAINED_MODES
from hf_sentcl.trainers.base import ContrastiveTrainer, ViewsOutput, stack_views
from hf_sentcl.trainers.heads import TrainingHeadsMixin

CLASSIFIER_NAME = "consert_classifier"
CLASSIFIER_FILE = "consert_classifier.safetensors"
NLI_CLASSES = len(NLI_LABELS)


def disable_dropout(module: nn.Module) -> int:
    """Set p = 0 on every `nn.Dropout` inside `module` (BERT's attention reads its probability from one too);
    returns how many there were."""
    layers = [m for m in module.modules() if isinstance(m, nn.Dropout)]
    for layer in layers:
        layer.p = 0.0
    return len(layers)


def finite_direction(gradient: torch.Tensor) -> torch.Tensor:
    """`gradient` (texts, L, d) in fp32 with the rows that hold a NaN/inf (an overflowed scaled gradient) zeroed;
    sync-free."""
    g = gradient.float()
    finite = torch.isfinite(g).flatten(1).all(dim=1).view(-1, 1, 1)
    return torch.where(finite, g, torch.zeros_like(g))


class ConSERTTrainer(TrainingHeadsMixin, ContrastiveTrainer):
    """ConSERT in one stage (`supervised_mode` unsup, sup or joint); chained modes run through `consert_stages`.

    Recipe keys: `ConSERTConfig` (`python -m hf_sentcl.run --method consert --help` lists them).
    """

    @property
    def dropout_copies(self) -> int:
        """Encoder passes over every text per step, for Trainer's FLOP estimate: the T1 and T2 copies (unsup), or
        the supervised blocks, plus the adversarial gradient pass when there is one."""
        if self.mode == "unsup":
            return 2
        return len(self.supervised_blocks()[0]) + int(self.args.adversarial)

    @classmethod
    def check_plugins(cls, args, model_settings) -> None:
        """Supervised mode trains the NLI classifier alone: no in-batch loss for the plug-ins to act on."""
        if getattr(args, "supervised_mode", None) == "sup":
            plugins = {"false_negatives": args.false_negatives != "keep", "matryoshka_dims": args.matryoshka_dims}
            for key, on in plugins.items():
                if on:
                    raise ValueError(
                        f"{key}: supervised_mode 'sup' trains ConSERT's NLI classifier only, with no in-batch "
                        "contrastive loss to apply it to; use 'joint' or 'sup-unsup', or remove the key."
                    )
        super().check_plugins(args, model_settings)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        if config.supervised_mode in CHAINED_MODES:
            raise ValueError(
                f"supervised_mode '{config.supervised_mode}' chains two trainings: run the recipe with "
                "`python -m hf_sentcl.run` (or train each stage, see consert_stages)."
            )
        self.mode = config.supervised_mode
        encoder = self.model
        if encoder.config.head != "none":
            raise ValueError(
                f"method consert: set 'head: none' in the recipe (got head: {encoder.config.head}); ConSERT has no "
                "projection head (the default 'mlp' is SimCSE's)."
            )
        if not config.encoder_dropout:
            disable_dropout(encoder.backbone)
        rates = AugmentationRates(
            config.token_cutoff_rate, config.feature_cutoff_rate, config.dropout_rate,
            config.token_cutoff_masks_attention,
        )
        self.augmenter = EmbeddingAugmenter(encoder.backbone, rates)
        self.classifier: nn.Linear | None = None
        if self.mode != "unsup":
            classifier = nn.Linear(3 * encoder.config.hidden_size, NLI_CLASSES)
            self.classifier = self.add_training_head(CLASSIFIER_NAME, classifier, CLASSIFIER_FILE)

    # ------------------------------------------------------------------ forward passes
    @staticmethod
    def flat_texts(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, views, L) inputs -> (views * batch, L) ids and mask, view-major (all first sentences first)."""
        return stack_views(inputs["input_ids"]), stack_views(inputs["attention_mask"])

    def encode_blocks(
        self, model, inputs: dict[str, torch.Tensor], names: list[str], perturbation: torch.Tensor | None = None
    ) -> torch.Tensor:
        """ONE forward pass of every text under each augmentation in `names`: (len(names), texts, dim)."""
        ids, mask = self.flat_texts(inputs)
        copies = len(names)
        with self.augmenter.augment(names, mask.repeat(copies, 1), perturbation) as plan:
            embeddings = model(input_ids=ids.repeat(copies, 1), attention_mask=plan.attention_mask).embeddings
        return embeddings.view(copies, ids.shape[0], -1)

    def embed_views(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Unsupervised views: (2 * text views, batch, dim), T1 copies first, then T2 copies."""
        batch, views = inputs["input_ids"].shape[:2]
        blocks = self.encode_blocks(model, inputs, [self.args.augmentation1, self.args.augmentation2])
        return blocks.view(2 * views, batch, -1)

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """NT-Xent between the first half of the views (T1 of every text) and the second (T2); alpha-weighted in
        joint training."""
        half = views.shape[0] // 2
        exclude = None if groups is None else self.record_masked(nt_xent_mask(groups.flatten(0, 1), self.guide_rule))
        loss = nt_xent(
            views[:half].flatten(0, 1), views[half:].flatten(0, 1), self.args.temperature, exclude=exclude,
            **self.args.margin_loss_kwargs(),
        )
        if self.mode == "joint":
            return self.args.alpha * loss, {"contrastive_loss": loss}
        return loss, {}

    # ------------------------------------------------------------------ supervised stages
    def supervised_blocks(self) -> tuple[list[str], int, int]:
        """Augmentation of each block of a supervised step, and which blocks are the two contrastive views.
        Block 0 is the clean pass of the cross-entropy; a `none` view reuses it unless it gets the adversarial
        perturbation."""
        names = ["none"]
        if self.mode == "sup":
            return names, 0, 0
        view_blocks = []
        for name, perturbed in ((self.args.augmentation1, False), (self.args.augmentation2, self.args.adversarial)):
            if name == "none" and not perturbed:
                view_blocks.append(0)
            else:
                names.append(name)
                view_blocks.append(len(names) - 1)
        return names, view_blocks[0], view_blocks[1]

    def classify(self, r1: torch.Tensor, r2: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pair_classification_loss(r1, r2, labels, self.classifier.weight, self.classifier.bias)

    def adversarial_perturbation(
        self, model, inputs: dict[str, torch.Tensor], labels: torch.Tensor, names: list[str], block: int
    ) -> torch.Tensor:
        """FGV perturbation of every text for block `block` of the stacked pass (zeros elsewhere)."""
        encoder = self.accelerator.unwrap_model(model)
        ids, mask = self.flat_texts(inputs)
        # with gradients even inside the cached step's no-grad pass; the plan keeps the embedding output
        with torch.enable_grad(), self.augmenter.augment(["none"], mask) as plan:
            clean = encoder(input_ids=ids, attention_mask=mask).embeddings
            batch, texts = labels.shape[0], ids.shape[0]
            loss, _ = self.classify(clean[:batch], clean[batch:], labels)
            (gradient,) = torch.autograd.grad(self.scale_for_fp16(loss), plan.embedding_output)
        perturbation = gradient.new_zeros(len(names) * texts, *gradient.shape[1:])
        perturbation[block * texts : (block + 1) * texts] = fgv_perturbation(
            finite_direction(gradient), mask, self.args.adversarial_epsilon
        )
        return perturbation

    def scale_for_fp16(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 gradient scaler's scale (unchanged without one). The FGV gradient flows back
        through fp16 layers like the training gradient, so unscaled it underflows to zero where the training step's
        does not. Only its direction is used (`fgv_perturbation` normalises it to norm epsilon), so it needs no
        unscaling; a step whose scaled gradient overflows gives a zero perturbation (`finite_direction`), and the
        scaler skips that step anyway when the training gradient overflows too."""
        scaler = self.accelerator.scaler
        return loss if scaler is None else scaler.scale(loss)

    def forward_views(self, model, inputs: dict[str, torch.Tensor]) -> ViewsOutput:
        """unsup: the (2, batch, dim) T1 / T2 views. sup / joint: ONE stacked pass of the clean premises and
        hypotheses, whose NLI cross-entropy is the per-example `local_loss`, and (joint) of their T1 and T2 views,
        returned as (4, batch, dim): T1 premises, T1 hypotheses, T2 premises, T2 hypotheses."""
        if self.mode == "unsup":
            return ViewsOutput(self.embed_views(model, inputs))
        labels = inputs.get("labels")
        if labels is None or inputs["input_ids"].shape[1] != 2:
            raise ValueError(
                f"supervised_mode '{self.mode}' needs labelled sentence pairs (nli_source); got a batch of "
                f"{inputs['input_ids'].shape[1]} text view(s) {'without' if labels is None else 'with'} labels."
            )
        names, view1, view2 = self.supervised_blocks()
        perturbation = None
        if self.args.adversarial and self.model.training:
            perturbation = self.adversarial_perturbation(model, inputs, labels, names, view2)
        blocks = self.encode_blocks(model, inputs, names, perturbation)
        batch = labels.shape[0]
        ce, logits = self.classify(blocks[0, :batch], blocks[0, batch:], labels)
        components = {"ce_loss": ce, "nli_accuracy": (logits.argmax(dim=-1) == labels).float().mean()}
        views = blocks[0] if self.mode == "sup" else torch.cat([blocks[view1], blocks[view2]])
        return ViewsOutput(views.view(-1, batch, views.shape[-1]), local_loss=ce, components=components)

    def batch_loss(self, model, views: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        if self.mode == "sup":  # the cross-entropy (the local loss) is all; zero, but a function of the views
            return (views * 0).sum(), {"embeddings": views}
        return super().batch_loss(model, views, inputs)
