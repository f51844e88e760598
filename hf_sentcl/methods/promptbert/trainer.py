"""PromptBERT's trainer (Jiang et al. 2022, unsupervised): two templates of the same sentence as the positive pair.

Each step, for the batch's sentences x_i (tokenised as usual by the collator, [CLS] x [SEP]):
1. each sentence is written into `template` and into `second_template` (`hf_sentcl.modeling.prompt.wrap_ids`: its
   own tokens between the template's prefix and suffix) and both go through the encoder in ONE forward, dropout on;
   the encoder's `prompt` pooling returns the last-layer state at each row's [MASK]: h_i and h_i';
2. with `template_denoising`, each template also runs alone, one row per sentence, with the sentence left out but
   the position ids it has around that sentence (suffix positions shifted by the sentence's length n_i,
   `template_only`), in ONE forward: t_i, t_i'; the views are h_i - t_i and h_i' - t_i' (the authors' code computes
   the template-only states in training mode with gradients, `mask_embedding_sentence_delta`; so does this);
3. SimCSE's InfoNCE over the (gathered) batch: row i's positive is view 2 of sentence i, the other sentences' view 2
   its negatives, with the IFM/BYOP margin and the false-negative mask of the base trainer.

The trainer sets the encoder to `prompt` pooling with `template` (`SentenceEncoder.use_prompt`), so evaluation during
and after training, `encode` and the saved encoder embed with the template; they use the plain [MASK] state (no
denoising), as the authors' evaluation of their unsupervised models does.

Plug-ins: the false-negative mask and guide, Matryoshka prefixes, the margin `perturbation`, the cached step
(`mini_batch_size`: the replay re-runs both forwards with the same dropout draws), the unpadded forward (the
template-only forward passes position ids, so it takes the padded route), DDP gathering and LoRA work; length
buckets are refused by the base check (this trainer encodes its views itself), and so is a head (see
`check_plugins`).
"""

from __future__ import annotations

import torch
from torch import nn

from hf_sentcl.losses import margin_info_nce
from hf_sentcl.losses.false_negatives import info_nce_mask
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.prompt import TemplateTokens, check_mask_token, position_offset, template_only, wrap_ids
from hf_sentcl.trainers.base import ContrastiveTrainer
from hf_sentcl.trainers.direct import direct_use


def frame_ids(tokenizer) -> list[int]:
    """The ids stripped from the collator's rows before templating: [CLS]/[SEP], <s>/</s>, padding."""
    names = ("cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id", "pad_token_id")
    return sorted({getattr(tokenizer, name) for name in names if isinstance(getattr(tokenizer, name, None), int)})


def pad_right(tensors: list[torch.Tensor], value: int) -> torch.Tensor:
    """(rows, L_k) tensors stacked into one (sum rows, max L_k), right-padded with `value`."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


class PromptBERTTrainer(ContrastiveTrainer):
    """Unsupervised PromptBERT on one text column. Recipe keys: `PromptBERTConfig`."""

    #: two encodings of every sentence per step, one per template (for the FLOP estimate)
    dropout_copies = 2

    @classmethod
    def check_plugins(cls, args, model_settings) -> None:
        """Refuse, before any weights load, what PromptBERT cannot honour: a pooling other than `prompt` (the vector is
        the [MASK] state, in training and at inference), a head (denoising subtracts [MASK] states, which a head inside
        the encoder's forward would have transformed first), and a recipe's tokenizer without a mask token."""
        pooling = getattr(model_settings, "pooling", "prompt")
        if pooling != "prompt":
            raise ValueError(
                f"pooling: method promptbert embeds with the [MASK] state of its template; set 'pooling: prompt' "
                f"(got '{pooling}')."
            )
        if getattr(model_settings, "inference_pooling", None) not in (None, "prompt"):
            raise ValueError(
                "inference_pooling: method promptbert evaluates and saves the [MASK] state it trains; remove the key."
            )
        if getattr(model_settings, "head", "none") != "none":
            raise ValueError(
                "head: method promptbert trains the plain [MASK] state; template denoising subtracts the template's "
                "own [MASK] state, which the encoder's head would already have transformed; set 'head: none'."
            )
        name = getattr(model_settings, "tokenizer_name", None) or getattr(model_settings, "model_name_or_path", None)
        if name:  # a recipe's model section: its tokenizer is read, no weights
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(resolve_model_name(name))
            except OSError:  # not here (a Hub id offline): the backbone check says so, the trainer checks it again
                tokenizer = None
            if tokenizer is not None:
                check_mask_token(tokenizer, f" of '{name}'")
        super().check_plugins(args, model_settings)

    def __init__(self, model=None, args=None, **kwargs):
        model = direct_use(type(self), model, kwargs, kwargs.get("max_seq_length"))  # a model id, raw text
        model.use_prompt(args.template)  # before the base checks: they read the encoder's pooling
        super().__init__(model=model, args=args, **kwargs)
        tokenizer = self.processing_class or self.model.tokenizer
        self.templates = tuple(TemplateTokens.of(tokenizer, t) for t in (args.template, args.second_template))
        self.frame_ids = torch.tensor(frame_ids(tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.offset = position_offset(self.accelerator.unwrap_model(self.model).backbone)

    def embed_views(self, model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(2, batch, dim): the [MASK] states of every sentence in the first and in the second template, each minus
        its template-only state with `template_denoising`."""
        ids, mask = inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0]
        wrapped = [wrap_ids(ids, mask, parts, self.frame_ids, self.pad_id) for parts in self.templates]
        views = model(
            input_ids=pad_right([w[0] for w in wrapped], self.pad_id),
            attention_mask=pad_right([w[1] for w in wrapped], 0),
        ).embeddings
        if self.args.template_denoising:
            views = views - self.template_states(model, [w[2] for w in wrapped])
        return views.view(2, len(ids), -1)

    def template_states(self, model, lengths: list[torch.Tensor]) -> torch.Tensor:
        """(2 * batch, dim): the [MASK] state of each template alone at the position ids it has around a sentence of
        each row's length, in ONE forward (rows in the order of `embed_views`' views)."""
        rows = [template_only(parts, n, self.offset) for parts, n in zip(self.templates, lengths)]
        ids = pad_right([r[0] for r in rows], self.pad_id)
        attention = pad_right([torch.ones_like(r[0]) for r in rows], 0)
        positions = pad_right([r[1] for r in rows], self.offset)
        return model(input_ids=ids, attention_mask=attention, position_ids=positions).embeddings

    def contrastive_loss(
        self, views: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """InfoNCE of the first template's views against the second's (with the margin and false-negative mask)."""
        exclude = None
        if groups is not None:  # one text per example: the same sentence on both sides
            exclude = self.record_masked(info_nce_mask(groups[0], groups[0], guide=self.guide_rule))
        kwargs = self.args.margin_loss_kwargs()
        return margin_info_nce(views[0], views[1], self.args.temperature, exclude=exclude, **kwargs), {}
