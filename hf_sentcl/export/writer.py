"""Export an encoder as a plain Hugging Face model that `AutoModel` and `SentenceTransformer` load.

    hf-sentcl export ENCODER OUT [--results FILE] [--mteb-results DIR] [--repo-id ORG/NAME] [--overwrite]

ENCODER is a saved `SentenceEncoder` (a run's output_dir or a checkpoint-N folder) or any backbone (a path, a Hub
id or `embedded:all-MiniLM-L6-v2`) with `--pooling`. The export folder holds:

- the backbone's own `save_pretrained` files (`config.json` with e.g. `architectures: ["BertModel"]`,
  `model.safetensors`) and the tokenizer, so `AutoModel.from_pretrained(OUT)` works without `trust_remote_code`;
- with `prompt` pooling (the [MASK] state of a template, PromptBERT) nothing more: sentence-transformers has no
  module for it, so its files are left out (with a warning) rather than written to give other vectors silently;
- otherwise the sentence-transformers modules (`Transformer`, `Pooling`, and `WeightedLayerPooling` for layer averages,
  `Dense` for a head used at inference, `Normalize` when the base model's pipeline has one after pooling, as
  all-MiniLM-L6-v2's does), built as sentence-transformers modules and written by its own `save`;
- `README.md`, the model card (`hf_sentcl.export.card`), from a run's results.json or `hf-sentcl evaluate`'s JSON.

How each setting of `SentenceEncoderConfig` is exported (only the eval-mode behaviour matters):

- `pooling_layer` other than the last layer (cls/mean/max): the backbone is truncated to that many layers, so
  hidden state k is its last hidden state and both loaders read it as `last_hidden_state` (0 = embeddings only).
- `first_last_avg` / `last2_avg`: `output_hidden_states: true` is set in `config.json` and a `WeightedLayerPooling`
  (weights 1 on the two averaged layers, 0 elsewhere) precedes mean pooling.
- a head active at inference (`head_at_inference` with `mlp`, i.e. Linear + tanh): a `Dense` module with `Tanh`.
  With `cls` pooling on a backbone whose pooler is dense + tanh on the first token (BERT, RoBERTa, ...) the head
  is also folded into that pooler, as SimCSE does, so `AutoModel(...).pooler_output` is the embedding.
- training-only parts (a head not used at inference, frozen copies, projectors kept by trainers) are left out.

The export is built in a temporary folder beside OUT, checked (both loaders reproduce `SentenceEncoder.encode`
on probe sentences, with finite, non-collapsed embeddings), and only then moved to OUT; an earlier export in OUT
is replaced (with `--overwrite`) only after the new one passed, so a failure leaves it untouched.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from hf_sentcl.export.plan import ExportError, ExportPlan, plan_export
from hf_sentcl.export.results import CARD_INPUTS
from hf_sentcl.export.verify import PROBE_SENTENCES, check_weights, verify_export
from hf_sentcl.modeling import SentenceEncoder

logger = logging.getLogger("hf_sentcl")


# ------------------------------------------------------------------------------------------------ writing
def export_backbone(encoder: SentenceEncoder, plan: ExportPlan) -> PreTrainedModel:
    """A standalone copy of the backbone as exported: LoRA merged, layers truncated, head folded into the pooler."""
    backbone = encoder.backbone
    if hasattr(backbone, "merge_and_unload"):  # a peft-wrapped backbone
        backbone = copy.deepcopy(backbone).merge_and_unload()
    config = copy.deepcopy(backbone.config)
    config.num_hidden_layers = plan.kept_layers
    if plan.layer_weights is not None:
        config.output_hidden_states = True  # sentence-transformers' WeightedLayerPooling reads every layer
    dtype = next(backbone.parameters()).dtype
    exported = type(backbone)(config).to(dtype)
    missing, _unused = exported.load_state_dict(backbone.state_dict(), strict=False)
    if missing:
        raise ExportError(f"Export of {type(backbone).__name__} lost weights {missing[:5]}; it cannot be truncated.")
    if plan.head == "pooler":
        with torch.no_grad():
            exported.pooler.dense.weight.copy_(encoder.head.dense.weight)
            exported.pooler.dense.bias.copy_(encoder.head.dense.bias)
    return exported.eval()


def sentence_transformer_modules(encoder: SentenceEncoder, plan: ExportPlan, backbone_dir: Path) -> list:
    """The sentence-transformers modules of the plan, the Transformer loaded from `backbone_dir` (the exported
    backbone and tokenizer), in `plan.module_dirs` order; `Normalize` last when the plan keeps the base's."""
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
        WeightedLayerPooling,
    )

    modules = [Transformer(str(backbone_dir), max_seq_length=plan.max_seq_length)]
    if plan.layer_weights is not None:
        weights = torch.nn.Parameter(torch.tensor(plan.layer_weights, dtype=torch.float32))
        modules.append(WeightedLayerPooling(plan.hidden_size, plan.kept_layers, layer_start=0, layer_weights=weights))
    modules.append(Pooling(plan.hidden_size, pooling_mode=plan.token_pooling))
    if plan.uses_head:
        weight, bias = (p.detach().float().cpu().clone() for p in (encoder.head.dense.weight, encoder.head.dense.bias))
        modules.append(Dense(plan.hidden_size, plan.hidden_size, activation_function=torch.nn.Tanh(),
                             init_weight=weight, init_bias=bias))
    if plan.normalize:
        modules.append(Normalize())
    return modules


def write_export(encoder: SentenceEncoder, folder: str | Path) -> ExportPlan:
    """Write `encoder` into the empty or missing `folder` with sentence-transformers' own `save`; return the plan."""
    from sentence_transformers import SentenceTransformer

    if encoder.tokenizer is None:
        raise ExportError("The encoder has no tokenizer attached; call attach_tokenizer(tokenizer) before exporting.")
    plan = plan_export(encoder)
    check_weights(encoder)
    folder = Path(folder)
    if not plan.sentence_transformers:  # the backbone and tokenizer alone: no module would give the same vectors
        folder.mkdir(parents=True, exist_ok=True)
        export_backbone(encoder, plan).save_pretrained(folder)
        encoder.tokenizer.save_pretrained(folder)
        logger.warning(
            "Export without sentence-transformers files: the encoder's vector is the [MASK] state of the prompt "
            "template %r, which no sentence-transformers module computes (plain pooling would give other vectors "
            "silently). Load it with transformers.AutoModel and embed as its model card shows.", plan.prompt_template,
        )
        return plan
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.backbone-") as backbone_dir:
        export_backbone(encoder, plan).save_pretrained(backbone_dir)
        encoder.tokenizer.save_pretrained(backbone_dir)
        model = SentenceTransformer(
            modules=sentence_transformer_modules(encoder, plan, Path(backbone_dir)), device="cpu",
            similarity_fn_name="cosine",
        )
        model.save(str(folder), create_model_card=False)
    logger.debug("Export written to %s (%s)", folder, plan.describe())  # a staging folder: callers name the final one
    return plan


def check_export_target(out_dir: str | Path, overwrite: bool) -> Path:
    """Check that `out_dir` may receive an export (missing, empty, or an earlier export with `overwrite`)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"Export path '{out_dir}' exists and is not a directory.")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise ExportError(f"Export folder '{out_dir}' is not empty; pass --overwrite to replace an earlier export.")
        if not any((out_dir / name).is_file() for name in ("modules.json", CARD_INPUTS)):
            raise ExportError(
                f"Refusing to overwrite '{out_dir}': it is not empty and holds no earlier export (no modules.json)."
            )
    return out_dir


@contextlib.contextmanager
def staged_export(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `out_dir` to build an export in; on success it replaces `out_dir`.

    An earlier export in `out_dir` (only with `overwrite`) is removed only after the new one is complete, so an
    error inside the block leaves it untouched, and no partial folder is ever left at `out_dir`.
    """
    out_dir = check_export_target(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
    try:
        yield stage
        old = None
        if out_dir.exists():
            old = stage.with_name(stage.name.replace(".partial-", ".old-"))
            out_dir.rename(old)
        stage.rename(out_dir)
        if old is not None:
            shutil.rmtree(old)
    finally:
        if stage.exists():
            shutil.rmtree(stage)


def export_encoder(
    encoder: SentenceEncoder,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    verify: bool = True,
    probes: Sequence[str] = PROBE_SENTENCES,
    tolerance: float = 1e-4,
) -> ExportPlan:
    """Write `encoder` to `out_dir` (built beside it, checked, then moved in); return the plan.

    With `verify`, the built folder is reloaded with `AutoModel` and `SentenceTransformer` and checked against
    `encoder.encode` on the probe sentences, so a mismatch fails here and not in users' hands.
    """
    with staged_export(out_dir, overwrite) as stage:
        plan = write_export(encoder, stage)
        if verify:
            verify_export(encoder, stage, plan, probes, tolerance)
    return plan
