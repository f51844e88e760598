"""`ExportPlan`: what an exported encoder computes, derived from a `SentenceEncoderConfig` in eval mode.

It lives beside the model (not in `hf_sentcl.export`) because both the export and the model card read it.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from torch import nn

from hf_sentcl.configs.choices import Pooling
from hf_sentcl.export.base_model import backbone_source, base_pipeline, export_pipeline
from hf_sentcl.modeling.encoder import SentenceEncoder
from hf_sentcl.modeling.heads import MLPHead
from hf_sentcl.modeling.st_files import sentence_transformers_max_seq_length


class ExportError(ValueError):
    """The encoder (or the export folder) cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ExportPlan:
    """What the exported model computes.

    Attributes:
        pooling: the encoder's eval-mode pooling (`SentenceEncoderConfig.active_pooling(False)`).
        source_layers: transformer layers of the trained backbone.
        kept_layers: transformer layers of the exported backbone (fewer when `pooling_layer` is not the last one).
        head: `none`, `pooler` (the MLP head folded into the backbone's pooler and a Dense module for
            sentence-transformers) or `dense` (Dense module only).
        hidden_size: embedding dimension.
        max_seq_length: truncation length of the export (sentence-transformers 6 saves it as the tokenizer's
            `model_max_length`; mteb's `max_tokens`): see `export_max_seq_length`.
        normalize: the export ends in a sentence-transformers `Normalize` module (unit-length vectors), because the
            base model's pipeline has one after pooling (`hf_sentcl.export.base_model.export_pipeline`).
        base_notes: sentences for the model card on where the export's pipeline differs from the base model's (a
            base module it cannot keep, another pooling); empty when it is a drop-in replacement.
        prompt_template: with `prompt` pooling, the template sentences are written into (the vector is the [MASK]
            state): sentence-transformers has no module for that, so such an export has no sentence-transformers
            files (`sentence_transformers` is False) and its card shows the transformers code alone.
    """

    pooling: str
    source_layers: int
    kept_layers: int
    head: str
    hidden_size: int
    max_seq_length: int
    normalize: bool = False
    base_notes: tuple[str, ...] = ()
    prompt_template: str | None = None

    @property
    def sentence_transformers(self) -> bool:
        """Whether sentence-transformers can reproduce the vectors (not at a template's [MASK]: no such module)."""
        return self.prompt_template is None

    @property
    def mode(self) -> Pooling:
        return Pooling(self.pooling)

    @property
    def truncated(self) -> bool:
        return self.kept_layers != self.source_layers

    @property
    def token_pooling(self) -> str:
        """The sentence-transformers `Pooling` mode over token states (cls, mean or max)."""
        return self.mode.token_pooling

    @property
    def layer_weights(self) -> list[float] | None:
        """`WeightedLayerPooling` weights over hidden states 0..L (embeddings first) for the layer averages, else None.

        Weight 1 on the two averaged states and 0 elsewhere gives exactly their mean, as `pool` computes it.
        """
        if self.mode.averaged_state is None:
            return None
        weights = [0.0] * (self.kept_layers + 1)
        weights[self.mode.averaged_state] += 1.0
        weights[-1] += 1.0
        return weights

    @property
    def uses_head(self) -> bool:
        return self.head != "none"

    @property
    def module_dirs(self) -> dict[str, str]:
        """Folders of the sentence-transformers modules: {'Transformer': '', 'Pooling': '1_Pooling', ...}."""
        names = ["Transformer"]
        if self.layer_weights is not None:
            names.append("WeightedLayerPooling")
        names.append("Pooling")
        if self.uses_head:
            names.append("Dense")
        if self.normalize:
            names.append("Normalize")
        return {name: "" if i == 0 else f"{i}_{name}" for i, name in enumerate(names)}

    def describe(self) -> str:
        """One sentence saying how a sentence vector is computed (for the model card)."""
        layer = "the last layer" if not self.truncated else f"hidden state {self.kept_layers}"
        averaged = {1: "the first and the last transformer layer", -2: "the last two transformer layers"}
        if self.prompt_template is not None:
            base = (f"the state of {layer} at the [MASK] token of the sentence written into the template "
                    f"`{self.prompt_template}` ([X]: the sentence, [MASK]: the tokenizer's mask token)")
        elif self.mode.averaged_state is not None:
            base = f"the mean over real tokens of the average of {averaged[self.mode.averaged_state]}"
        else:
            base = {
                "cls": f"the first-token ([CLS]/<s>) state of {layer}",
                "mean": f"the mean of the token states of {layer} over real (non-padding) tokens",
                "max": f"the element-wise max of the token states of {layer} over real tokens",
            }[self.token_pooling]
        if self.head == "pooler":
            base += ", passed through the trained Linear+tanh head (folded into the model's pooler: `pooler_output`)"
        elif self.head == "dense":
            base += ", passed through the trained Linear+tanh head (the `Dense` module)"
        if self.normalize:
            base += ", scaled to unit length (the `Normalize` module)"
        if self.truncated:
            base += (
                f"; the exported backbone keeps {self.kept_layers} of {self.source_layers} layers because only "
                f"hidden state {self.kept_layers} is used"
            )
        return base[0].upper() + base[1:] + "."

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "token_pooling": self.token_pooling, "layer_weights": self.layer_weights}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportPlan:
        """The plan stored by `to_dict` (derived keys are ignored; keys an older export did not store take their
        defaults, which describe what it wrote: e.g. no `Normalize`). KeyError naming a missing required key."""
        values = {}
        for field in fields(cls):
            if field.name in data:
                values[field.name] = tuple(data[field.name]) if field.name == "base_notes" else data[field.name]
            elif field.default is MISSING:
                raise KeyError(f"the stored export plan has no '{field.name}'; export the encoder again.")
        return cls(**values)


def has_tanh_pooler(backbone: nn.Module) -> bool:
    """Whether `backbone.pooler` is BERT's shape: dense (d x d) + tanh on the first token's state."""
    pooler = getattr(backbone, "pooler", None)
    dense = getattr(pooler, "dense", None)
    return (
        isinstance(dense, nn.Linear)
        and dense.in_features == dense.out_features
        and isinstance(getattr(pooler, "activation", None), nn.Tanh)
    )


def plan_export(encoder: SentenceEncoder) -> ExportPlan:
    """Decide how `encoder` (its eval-mode config) is represented in the export; `ExportError` if it cannot be."""
    config = encoder.config
    pooling = Pooling(config.active_pooling(training=False))
    layers = config.backbone_config.num_hidden_layers
    head_used = encoder.head is not None and config.head_at_inference and pooling is not Pooling.CLS_BEFORE_POOLER
    if head_used and not isinstance(encoder.head, MLPHead):
        raise ExportError(
            f"The encoder keeps a '{config.head}' head ({type(encoder.head).__name__}) at inference; only the 'mlp' "
            "head (Linear + tanh) can be exported to sentence-transformers. Set head_at_inference: false or add "
            "its export to hf_sentcl/export.py."
        )
    if pooling is Pooling.PROMPT and head_used:
        raise ExportError("An encoder with prompt pooling and a head at inference cannot be exported: set "
                          "head_at_inference: false.")
    kept = layers if pooling.averaged_state is not None else config.pooling_layer % (layers + 1)
    fold = head_used and pooling is Pooling.CLS and has_tanh_pooler(encoder.backbone)
    base = base_pipeline(backbone_source(config.backbone_config))
    same_states = not head_used and kept == layers and pooling.averaged_state is None
    normalize, notes = export_pipeline(base, pooling.value, pooling.token_pooling, same_states)
    prompt = config.prompt_template if pooling is Pooling.PROMPT else None
    normalize = normalize and prompt is None  # no sentence-transformers pipeline to end in Normalize
    return ExportPlan(
        pooling=pooling.value,
        source_layers=layers,
        kept_layers=kept,
        head="pooler" if fold else "dense" if head_used else "none",
        hidden_size=config.hidden_size,
        max_seq_length=export_max_seq_length(encoder),
        normalize=normalize,
        base_notes=notes,
        prompt_template=prompt,
    )


def export_max_seq_length(encoder: SentenceEncoder) -> int:
    """The truncation length of the export (sentence-transformers' `max_seq_length`, mteb's `max_tokens`).

    1. The encoder's own `max_seq_length` setting, when it has one.
    2. Else the base model's, when the base is a sentence-transformers model that sets one: in the
       `max_seq_length` of its `sentence_bert_config.json` (sentence-transformers 2-5; e.g. 256 for
       all-MiniLM-L6-v2, whose tokenizer says 512), or as its tokenizer's `model_max_length` (sentence-transformers
       6, and this toolkit's own exports), which (3) reads anyway. Fine-tuning keeps the length the base model is
       used at. The base is the folder or Hub id the backbone was loaded from (`_name_or_path` of its config, which
       a saved encoder keeps); a Hub file is read from the local cache or downloaded, one that cannot be had counts
       as absent.
    3. Else the encoder's default (`SentenceEncoder.max_seq_length`: the tokenizer's and the position embeddings'
       limit, at most 512).
    Never more than (3). The training length (a recipe's `max_seq_length`, e.g. SimCSE's 32) is not used: it bounds
    the training sentences, not what the model handles (positions past it keep their pretrained embeddings), and
    cutting inputs to it would truncate MTEB's longer texts; the card states it beside the data."""
    if encoder.config.max_seq_length:
        return encoder.config.max_seq_length
    default = encoder.max_seq_length
    base = getattr(encoder.config.backbone_config, "_name_or_path", None)
    limit = sentence_transformers_max_seq_length(base) if base else None
    return min(limit, default) if limit else default
