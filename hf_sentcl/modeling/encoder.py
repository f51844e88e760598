"""`SentenceEncoder`: any `AutoModel` backbone plus pooling and an optional head, with a fast `encode`."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

from hf_sentcl.common.hardware import mixed_eval_dtype
from hf_sentcl.configs.choices import Pooling, pooling_mode
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.backbone_forward import run_backbone
from hf_sentcl.modeling.config import SentenceEncoderConfig
from hf_sentcl.modeling.heads import MLPHead
from hf_sentcl.modeling.pooling import pool
from hf_sentcl.modeling.prompt import check_mask_token, check_template, mask_states, tokenize_with_template
from hf_sentcl.modeling.st_files import sentence_transformers_max_seq_length, sentence_transformers_pooling

MAX_DEFAULT_SEQ_LENGTH = 512

#: set while a trainer evaluates the model it trains (`evaluating_in_training`)
_IN_TRAINING = contextvars.ContextVar("hf_sentcl_evaluating_in_training", default=False)


@contextlib.contextmanager
def evaluating_in_training() -> Iterator[None]:
    """Encode under `torch.no_grad` instead of `torch.inference_mode` inside the block: weights that ZeRO-3 or FSDP
    gather for the evaluation would otherwise become inference tensors that the next training step cannot use."""
    token = _IN_TRAINING.set(True)
    try:
        yield
    finally:
        _IN_TRAINING.reset(token)


@dataclass
class SentenceEmbeddingOutput(ModelOutput):
    """What `SentenceEncoder.forward` returns: pooled embeddings and, when asked for, every hidden state."""

    embeddings: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


def check_tokenizer_matches(tokenizer: PreTrainedTokenizerBase, backbone_config, where: str = "") -> None:
    """Fail early when a tokenizer can produce ids the backbone's embedding table does not have."""
    vocab_size = getattr(backbone_config, "vocab_size", None)
    if vocab_size is None:
        return
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"Tokenizer{where} has {len(tokenizer)} tokens but the model's embedding table has {vocab_size}: "
            "they do not belong together. Use the tokenizer saved with the model (leave tokenizer_name empty) "
            "or resize the embeddings after adding tokens."
        )
    model_pad = getattr(backbone_config, "pad_token_id", None)
    if model_pad is not None and tokenizer.pad_token_id is not None and tokenizer.pad_token_id != model_pad:
        raise ValueError(
            f"Tokenizer{where} pads with id {tokenizer.pad_token_id} but the model expects pad_token_id={model_pad}: "
            "the tokenizer belongs to a different model. Use the tokenizer saved with the model."
        )


class SentenceEncoder(PreTrainedModel):
    """A sentence encoder around an `AutoModel` backbone.

    `forward` returns pooled sentence embeddings (through the head while training, or always when
    `config.head_at_inference`). `encode` is the inference entry point used by evaluation: it deduplicates,
    sorts by length and batches under `torch.inference_mode`, optionally in bf16.
    """

    config_class = SentenceEncoderConfig
    base_model_prefix = "sentence_encoder"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True

    def __init__(self, config: SentenceEncoderConfig, backbone: PreTrainedModel | None = None):
        super().__init__(config)
        self.backbone = backbone if backbone is not None else AutoModel.from_config(config.backbone_config)
        self.head = MLPHead(config.hidden_size) if config.head == "mlp" else None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.post_init()
        if config.peft:  # LoRA adapters on the backbone (hf_sentcl.modeling.peft); the base weights are frozen
            from hf_sentcl.modeling.peft import wrap_backbone

            self.backbone = wrap_backbone(self.backbone, config.peft)
        self._no_split_modules = self.layer_unit_classes()

    def get_input_embeddings(self) -> nn.Module:
        """The backbone's token-embedding table (accelerate's FSDP preparation gives it a shard unit of its own)."""
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.backbone.set_input_embeddings(value)

    def layer_unit_classes(self) -> set[str]:
        """The backbone's `_no_split_modules` (FSDP's per-layer shard units, e.g. BertLayer) without the classes that
        hold the token-embedding table (BertEmbeddings): accelerate shards that table as a unit of its own after the
        layer units, so a unit around it too would shard the table twice."""
        names = set(self._no_split_modules or ())
        embedding = self.backbone.get_input_embeddings()
        holders = {type(m).__name__ for m in self.modules() if any(c is embedding for c in m.modules())}
        return names - holders

    def _init_weights(self, module: nn.Module) -> None:
        if self.head is not None and module is self.head.dense:
            std = getattr(self.config.backbone_config, "initializer_range", 0.02)
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(self.backbone, PreTrainedModel):
            self.backbone._init_weights(module)

    # ---------------------------------------------------------------- construction and persistence
    @classmethod
    def from_backbone(
        cls,
        name_or_path: str,
        *,
        pooling: str = "cls",
        pooling_layer: int = -1,
        head: str = "none",
        head_at_inference: bool = False,
        inference_pooling: str | None = None,
        max_seq_length: int | None = None,
        tokenizer_name: str | None = None,
        peft: dict | None = None,
        unpadded: bool = True,
        **load_kwargs,
    ) -> SentenceEncoder:
        """Wrap a pretrained backbone (local path, Hub id or the embedded alias) with the given pooling and head
        (and LoRA adapters when `peft` holds their settings)."""
        path = resolve_model_name(name_or_path)
        backbone = AutoModel.from_pretrained(path, **load_kwargs)
        config = SentenceEncoderConfig(
            backbone_config=backbone.config.to_dict(),
            pooling=pooling,
            pooling_layer=pooling_layer,
            head=head,
            head_at_inference=head_at_inference,
            inference_pooling=inference_pooling,
            max_seq_length=max_seq_length,
            peft=peft,
            unpadded=unpadded,
        )
        model = cls(config, backbone=backbone)
        model.attach_tokenizer(AutoTokenizer.from_pretrained(resolve_model_name(tokenizer_name or name_or_path)))
        return model

    @classmethod
    def load(cls, name_or_path: str, **overrides) -> SentenceEncoder:
        """Load a saved `SentenceEncoder`, or wrap a plain backbone; `overrides` (pooling, head, ...) apply to both.
        A plain backbone from a sentence-transformers folder (an hf_sentcl export, all-MiniLM-L6-v2) is pooled and
        truncated as that folder says unless `overrides` say otherwise (`hf_sentcl.modeling.st_files`)."""
        path = resolve_model_name(name_or_path)
        model_type = getattr(AutoConfig.from_pretrained(path), "model_type", None)
        if model_type != SentenceEncoderConfig.model_type:
            saved = {
                "pooling": sentence_transformers_pooling(path),
                "max_seq_length": sentence_transformers_max_seq_length(path),
            }
            return cls.from_backbone(name_or_path, **{k: v for k, v in saved.items() if v is not None} | overrides)
        model = cls.from_pretrained(path)
        for key, value in overrides.items():
            if key == "head" and value != model.config.head:
                raise ValueError(f"Cannot change the head of a saved encoder ('{model.config.head}' -> '{value}').")
            setattr(model.config, key, value)
        if overrides:
            SentenceEncoderConfig(**model.config.to_dict())  # re-validate the changed pooling
        return model

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs) -> SentenceEncoder:
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model.attach_tokenizer(AutoTokenizer.from_pretrained(pretrained_model_name_or_path))
        return model

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        super().save_pretrained(save_directory, *args, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory)

    def attach_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Attach the tokenizer `encode` uses, after checking that it fits the backbone's vocabulary. Its special
        token ids go into the config too, as transformers' Trainer expects (else it aligns them with a warning)."""
        check_tokenizer_matches(tokenizer, self.config.backbone_config)
        self.tokenizer = tokenizer
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if getattr(tokenizer, name, None) is not None:
                setattr(self.config, name, getattr(tokenizer, name))

    def use_prompt(self, template: str) -> None:
        """Embed with `prompt` pooling from now on: the last-layer state at the [MASK] of `template` (one `[X]`, one
        `[MASK]`), in training, in `encode` and in the saved config; ValueError for a bad template or a tokenizer
        without a mask token."""
        check_template(template)
        if self.tokenizer is None:
            raise RuntimeError("Attach the tokenizer before setting a prompt template (attach_tokenizer).")
        self.config.prompt_mask_token_id = check_mask_token(self.tokenizer)
        self.config.prompt_template = template
        self.config.pooling = Pooling.PROMPT.value
        self.config.inference_pooling = None

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids of `sentences` as the encoder reads them: cut to `max_seq_length`, and written into the prompt
        template when it pools with one (the sentence is cut, never the template)."""
        if self.config.active_pooling(training=False) == Pooling.PROMPT:
            return tokenize_with_template(self.tokenizer, sentences, self.config.prompt_template, self.max_seq_length)
        return self.tokenizer(
            list(sentences), truncation=True, max_length=self.max_seq_length, return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]

    @property
    def max_seq_length(self) -> int:
        if self.config.max_seq_length:
            return self.config.max_seq_length
        positions = getattr(self.config.backbone_config, "max_position_embeddings", 10**6)
        # RoBERTa-style embeddings number positions from padding_idx + 1, so that many rows are never usable.
        padding_idx = getattr(getattr(self.backbone, "embeddings", None), "padding_idx", None)
        if isinstance(padding_idx, int):
            positions -= padding_idx + 1
        limits = [MAX_DEFAULT_SEQ_LENGTH, positions]
        if self.tokenizer is not None:
            limits.append(self.tokenizer.model_max_length)
        return min(limits)

    # ---------------------------------------------------------------- weights training never reaches
    def transformer_layers(self) -> nn.ModuleList | None:
        """The backbone's stack of transformer layers (the ModuleList with num_hidden_layers entries), or None."""
        count = getattr(self.config.backbone_config, "num_hidden_layers", None)
        return next(
            (m for m in self.backbone.modules() if isinstance(m, nn.ModuleList) and len(m) == count), None
        )

    def unreached_modules(self) -> dict[str, nn.Module]:
        """Modules the training forward never uses, so they never get a gradient: the layers above `pooling_layer`
        (when the training pooling reads one layer), and the head with `cls_before_pooler` (which skips it)."""
        unreached: dict[str, nn.Module] = {}
        pooling = self.config.active_pooling(training=True)
        if self.head is not None and pooling == Pooling.CLS_BEFORE_POOLER:
            unreached["head"] = self.head
        layers = self.transformer_layers()
        # one state read (not a layer average): the layers above it are unused
        if layers is not None and pooling_mode(pooling).averaged_state is None:
            read = self.config.pooling_layer % (len(layers) + 1)
            unreached.update({f"layer {i}": layers[i] for i in range(read, len(layers))})
        return unreached

    def freeze_unreached(self) -> list[str]:
        """Freeze `unreached_modules` (they would not train anyway: no gradient, so AdamW skips them); DDP without
        its unused-parameter search needs every trainable weight to get a gradient every step. Returns their names."""
        unreached = self.unreached_modules()
        for module in unreached.values():
            module.requires_grad_(False)
        return list(unreached)

    # ---------------------------------------------------------------- forward
    def head_active(self, pooling: str) -> bool:
        return self.head is not None and pooling != Pooling.CLS_BEFORE_POOLER and (
            self.training or self.config.head_at_inference
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> SentenceEmbeddingOutput:
        """Embed a batch. `output_hidden_states=True` also returns every layer (embedding output first).

        The backbone runs unpadded (token-wise work on real tokens only, `hf_sentcl.modeling.unpadded`) when
        `config.unpadded` and the backbone allows it; hidden states come back padded either way."""
        if attention_mask is None:
            reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        pooling = self.config.active_pooling(self.training)
        want_all = output_hidden_states or self.config.needs_all_hidden_states(pooling)
        outputs = run_backbone(
            self.backbone, self.config.unpadded, input_ids=input_ids, attention_mask=attention_mask,
            token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds,
            output_hidden_states=want_all,
            # [CLS] pooling of the last layer reads one position: the last layer need not compute the others
            first_token_only=not want_all and pooling_mode(pooling).token_pooling == "cls",
        )
        hidden_states = outputs.hidden_states if want_all else (outputs.last_hidden_state,)
        layer = self.config.pooling_layer if want_all else -1
        if pooling == Pooling.PROMPT:  # the [MASK] state (the ids carry the template: `tokenize`)
            embeddings = mask_states(hidden_states[layer], input_ids, self.config.prompt_mask_token_id,
                                     check=not self.training)
        else:
            embeddings = pool(hidden_states, attention_mask, pooling, layer)
        if self.head_active(pooling):
            embeddings = self.head(embeddings)
        return SentenceEmbeddingOutput(embeddings=embeddings, hidden_states=outputs.hidden_states if want_all else None)

    # ---------------------------------------------------------------- inference
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        normalize: bool = False,
        bf16: bool = False,
        convert_to_numpy: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray | torch.Tensor:
        """Embed `sentences`, returning one row per input sentence in input order (float32).

        Each distinct sentence is encoded once; sentences are sorted by token length so that each batch pads
        little. `bf16=True` runs the backbone under mixed precision: bf16 autocast, or fp16 on a GPU without native
        bf16 (`hf_sentcl.common.hardware.mixed_eval_dtype`; results differ from fp32 by rounding only).
        `show_progress_bar`: None (default) draws one for long jobs when stderr is a terminal.
        """
        if isinstance(sentences, str):
            raise TypeError("encode() takes a list of sentences; wrap a single sentence in a list.")
        if len(sentences) == 0:
            out = torch.zeros(0, self.config.hidden_size)
        else:
            out = self.map_batches(
                sentences, lambda batch: self(**batch).embeddings, batch_size, bf16, show_progress_bar
            )
        if normalize:
            out = torch.nn.functional.normalize(out, dim=-1)
        return out.numpy() if convert_to_numpy else out

    def map_batches(
        self,
        sentences: Sequence[str],
        fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
        batch_size: int = 128,
        bf16: bool = False,
        show_progress_bar: bool | None = None,
    ) -> torch.Tensor:
        """Run `fn` on padded batches of the distinct `sentences`; return its float32 rows on the CPU in input order.

        The inference loop behind `encode`, for callers that want more than the pooled vector from one forward
        pass (e.g. every layer pooled every way). The sentences are tokenised in one call, sorted by token length
        (longest first, so padding is minimal and a memory problem shows up on the first batch) and batched;
        `fn` gets `input_ids`/`attention_mask` on the model's device and returns a (batch, ...) tensor. It runs
        in eval mode under `torch.inference_mode` (`torch.no_grad` in `evaluating_in_training`), with bf16 autocast when
        `bf16` and the device supports it.
        """
        if self.tokenizer is None:
            raise RuntimeError("This encoder has no tokenizer attached; call attach_tokenizer(tokenizer) first.")
        unique = list(dict.fromkeys(sentences))
        if not unique:
            raise ValueError("map_batches() needs at least one sentence.")
        tokenized = self.tokenize(unique)
        order = sorted(range(len(unique)), key=lambda i: len(tokenized[i]), reverse=True)
        out: torch.Tensor | None = None
        was_training = self.training
        self.eval()
        device = self.device
        dtype = mixed_eval_dtype(device)  # bf16 where native, fp16 on a GPU without it (not emulated bf16)
        # Auto (None): a bar for long jobs, and only on a terminal (tqdm's disable=None), so that logs and CI output
        # get no redrawn lines, and evaluation inside training no bar nested under Trainer's.
        if show_progress_bar is None:
            disable = None if len(unique) >= 4 * batch_size else True
        else:
            disable = not show_progress_bar
        try:
            no_grad = torch.no_grad() if _IN_TRAINING.get() else torch.inference_mode()
            with no_grad, torch.autocast(device.type, dtype=dtype, enabled=bf16):
                for start in tqdm(range(0, len(order), batch_size), desc="Encoding", disable=disable, leave=False):
                    index = order[start : start + batch_size]
                    batch = self.tokenizer.pad({"input_ids": [tokenized[i] for i in index]}, return_tensors="pt")
                    rows = fn({k: v.to(device, non_blocking=True) for k, v in batch.items()}).float().cpu()
                    if out is None:
                        out = torch.empty(len(unique), *rows.shape[1:], dtype=torch.float32)
                    out[index] = rows
        finally:
            self.train(was_training)
        if len(unique) == len(sentences):  # already distinct (what the evaluators pass): rows are in input order
            return out
        position = {sentence: i for i, sentence in enumerate(unique)}
        return out[[position[s] for s in sentences]]


def load_encoder(
    name_or_path: str | Path, pooling: str | None = None, pooling_layer: int | None = None
) -> SentenceEncoder:
    """The encoder a command line embeds with: a saved `SentenceEncoder` (run, checkpoint or export folder), or a
    plain backbone (folder, Hub id or the embedded alias) wrapped around it. `pooling` / `pooling_layer` override the
    saved ones when given, and a `pooling` asked for is the one used at inference: it replaces a saved
    `inference_pooling`, so what the user names is what is computed."""
    overrides: dict[str, Any] = {
        key: value for key, value in (("pooling", pooling), ("pooling_layer", pooling_layer)) if value is not None
    }
    if pooling is not None:
        overrides["inference_pooling"] = None
    return SentenceEncoder.load(str(name_or_path), **overrides)
