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
- `sup-unsup` / `joint-unsup` are two runs of this trainer, chained by `consert_stages` (see `hf_sentcl.run`).

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

import dataclasses
from pathlib import Path

import torch
from torch import nn

from hf_sentcl.augment.embedding import AugmentationRates, EmbeddingAugmenter, fgv_perturbation
from hf_sentcl.common.layout import RUN_COMPLETE_JSON, export_dir
from hf_sentcl.configs.consert import CHAINED_MODES, STAGE_KEYS
from hf_sentcl.data.corpus import text_sources
from hf_sentcl.data.nli import NLI_LABELS, NLITrainData, resolve_nli_source
from hf_sentcl.losses import nt_xent, pair_classification_loss
from hf_sentcl.losses.false_negatives import nt_xent_mask
from hf_sentcl.registry import get_method
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


# ---------------------------------------------------------------------- recipe plumbing (see the registry)
#: the recipe keys of the plug-ins that act on an in-batch contrastive loss (`matryoshka_dims`, `false_negatives`,
#: the IFM/BYOP margin), switched off (their defaults) in a chained mode's `sup` stage: see `plugins_for_stage`
IN_BATCH_PLUGIN_KEYS = (
    "matryoshka_dims", "matryoshka_weights", "false_negatives", "guide_model", "guide_margin", "guide_margin_strategy",
    "perturbation", "margin", "margin_type", "detach_margin", "multi_task",
)


def plugins_for_stage(args, mode: str) -> dict:
    """The plug-in keys to override in a chained mode's stage that runs `mode`: {} (the recipe's values) unless the
    stage is `sup`, which gets every plug-in off.

    Why: ConSERT's `sup` stage is a sentence-pair classifier (section 3.3, Eq. 2: cross-entropy of W(r1, r2,
    |r1 - r2|) + b on the NLI labels, as SBERT-NLI), with no in-batch loss. Matryoshka prefixes, the masking of
    duplicate in-batch negatives and the IFM/BYOP logit margin all act on the in-batch NT-Xent, so in that stage
    they would have nothing to act on (a recipe in plain `sup` mode with one of them is refused for that reason).
    In sup-unsup they belong to stage 2, the unsupervised NT-Xent on the target text, which also writes the final
    encoder: so the Matryoshka prefixes the recipe asks for are those of the encoder it exports. In joint-unsup
    both stages have the NT-Xent (joint: L_ce + alpha * L_con), and both keep the recipe's plug-ins: duplicate
    premises are common in NLI (one premise, three hypotheses), which is what `false_negatives: mask` is for."""
    if mode != "sup":
        return {}
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.name in IN_BATCH_PLUGIN_KEYS}
    return {key: defaults[key] for key in IN_BATCH_PLUGIN_KEYS if key in defaults}


def first_stage_batch(args) -> dict:
    """The first stage's batch override: supervised_batch_size is global, like global_train_batch_size, and split
    over the processes (ValueError when it cannot be split evenly)."""
    if not args.supervised_batch_size:
        return {}
    processes = max(args.world_size, 1)
    if args.supervised_batch_size % processes:
        raise ValueError(
            f"supervised_batch_size={args.supervised_batch_size} (the first stage's global batch) cannot be split "
            f"evenly over {processes} processes; use a multiple of {processes}."
        )
    return {"global_train_batch_size": args.supervised_batch_size}


def consert_stages(recipe) -> list:
    """The recipe's training stages. sup-unsup / joint-unsup: stage 1 (sup / joint on the NLI pairs) writes to
    <output_dir>/stage-1; stage 2 (unsup on the unlabeled text) starts from stage 1's exported encoder and writes
    the final results to output_dir. Other modes: the recipe itself. The in-batch plug-ins (`matryoshka_dims`,
    `false_negatives`, the IFM/BYOP margin) go to the stages with an in-batch loss (`plugins_for_stage`): both stages
    of joint-unsup, stage 2 only of sup-unsup.

    `resume_from_checkpoint` resumes the stage whose output folder holds the checkpoint: one under
    <output_dir>/stage-1 resumes stage 1 (then stage 2 runs), any other resumes stage 2 alone from stage 1's export;
    so does one of a finished stage 1 (`run_complete.json`: `auto` when stage 2 stopped before its first checkpoint).
    """
    args = recipe.training
    sources = text_sources(recipe.data)
    if args.supervised_mode in ("sup", "joint") and sources:
        raise ValueError(
            f"supervised_mode '{args.supervised_mode}' trains on nli_source only; {sources} would be unused "
            "(use sup-unsup / joint-unsup to continue on unlabeled text, or remove it)."
        )
    if args.supervised_mode not in CHAINED_MODES:
        return [recipe]
    first_mode, second_mode = CHAINED_MODES[args.supervised_mode]
    stage_dir = Path(args.output_dir) / get_method("consert").stage_dirname
    no_stage_keys = dict.fromkeys(STAGE_KEYS)
    resume = args.resume_from_checkpoint
    resume_first = bool(resume) and Path(resume).resolve().is_relative_to(stage_dir.resolve())
    first = dataclasses.replace(
        args, supervised_mode=first_mode, output_dir=str(stage_dir), push_to_hub=False,
        resume_from_checkpoint=resume if resume_first else None,
        learning_rate=args.supervised_learning_rate or args.learning_rate,
        num_train_epochs=args.supervised_num_train_epochs or args.num_train_epochs, **first_stage_batch(args),
        **no_stage_keys, **plugins_for_stage(args, first_mode),
    )
    second = dataclasses.replace(
        args, supervised_mode=second_mode, nli_source=None, nli_splits=None, nli_config=None, adversarial=False,
        resume_from_checkpoint=None if resume_first else resume, **no_stage_keys,
    )
    stage_one_export = export_dir(stage_dir)
    second_model = dataclasses.replace(recipe.model, model_name_or_path=str(stage_one_export), tokenizer_name=None)
    # the few-shot subset (train_subset_size) limits the unlabeled text of stage 2, not the NLI pairs (Figure 6)
    first_data = dataclasses.replace(recipe.data, train_subset_size=None)
    stages = [
        dataclasses.replace(recipe, data=first_data, training=first),
        dataclasses.replace(recipe, model=second_model, training=second),
    ]
    if resume and not resume_first:  # stage 2 is resumed: stage 1 is done
        if not stage_one_export.is_dir():
            raise ValueError(
                f"resume_from_checkpoint '{resume}' resumes stage 2, which starts from stage 1's export "
                f"'{stage_one_export}', but that folder does not exist (point it at a stage-1 checkpoint instead)."
            )
        return stages[1:]
    # `auto`: stage 1 finished, stage 2 had no checkpoint
    if resume_first and (stage_dir / RUN_COMPLETE_JSON).is_file():
        return stages[1:]
    return stages


def consert_train_data(recipe) -> NLITrainData | None:
    """The NLI pairs of a sup / joint stage; None for unsup (the plain-text loader reads the unlabeled text)."""
    args, data = recipe.training, recipe.data
    if args.supervised_mode == "unsup":
        return None
    source = resolve_nli_source(args.nli_source, args.nli_splits, data.sts_data_dir, args.nli_config)
    return NLITrainData(source, **NLITrainData.of(data))
