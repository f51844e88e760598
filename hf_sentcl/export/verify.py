"""Checking an export before it replaces anything: both loaders reproduce `SentenceEncoder.encode`."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hf_sentcl.export.plan import ExportError, ExportPlan
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.health import is_collapsed, nonfinite_tensors
from hf_sentcl.modeling.pooling import pool
from hf_sentcl.modeling.prompt import mask_states, tokenize_with_template

logger = logging.getLogger("hf_sentcl")


PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays an instrument on stage while the audience sings along with every chorus.",
    "The cat sleeps.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
    "Two dogs run through a field.",
)


# ------------------------------------------------------------------------------------------------ checking
def check_weights(encoder: SentenceEncoder) -> None:
    """ExportError when a weight of the encoder is NaN or infinite (a diverged training must not be published)."""
    bad = nonfinite_tensors(encoder)
    if bad:
        raise ExportError(
            f"The encoder has non-finite weights ({len(bad)} tensors, e.g. {bad[:3]}); training diverged. Nothing "
            "was exported. Lower the learning rate or check the temperature, then train again."
        )


def check_embeddings(embeddings: np.ndarray, where: str) -> None:
    """ExportError when the probe embeddings are non-finite, or collapsed (every sentence gets nearly the same
    vector, by the criterion a run applies to its final model: `hf_sentcl.modeling.health`)."""
    if not np.isfinite(embeddings).all():
        raise ExportError(f"{where} returns non-finite embeddings (NaN or infinity); nothing was exported.")
    if is_collapsed(embeddings):
        raise ExportError(
            f"{where} gives every probe sentence the same vector (a collapsed model); nothing was exported."
        )


def automodel_encode(path: str | Path, sentences: Sequence[str], plan: ExportPlan, batch_size: int = 32) -> np.ndarray:
    """Embed `sentences` with plain `AutoModel`/`AutoTokenizer` from an export folder, pooled by `pool` as the
    encoder pools (the head as the plan stores it), scaled to unit length when the plan ends in `Normalize`."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    dense = load_file(path / plan.module_dirs["Dense"] / "model.safetensors") if plan.head == "dense" else None
    all_states = plan.layer_weights is not None
    rows = []
    with torch.inference_mode():
        for start in range(0, len(sentences), batch_size):
            batch = plain_batch(tokenizer, list(sentences[start : start + batch_size]), plan)
            outputs = model(**batch, output_hidden_states=all_states)
            if plan.prompt_template is not None:
                embeddings = mask_states(outputs.last_hidden_state, batch["input_ids"], tokenizer.mask_token_id)
            elif plan.head == "pooler":
                embeddings = outputs.pooler_output
            else:
                states = outputs.hidden_states if all_states else (outputs.last_hidden_state,)
                embeddings = pool(states, batch["attention_mask"], plan.mode)
            if dense is not None:
                embeddings = torch.tanh(embeddings @ dense["linear.weight"].T + dense["linear.bias"])
            if plan.normalize:
                embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
            rows.append(embeddings.float())
    return torch.cat(rows).numpy()


def plain_batch(tokenizer, sentences: list[str], plan: ExportPlan) -> dict[str, torch.Tensor]:
    """The padded batch a user's code gives the exported model: the sentences written into the plan's prompt
    template when it has one (`hf_sentcl.modeling.prompt`), else tokenised as they are."""
    if plan.prompt_template is None:
        return tokenizer(sentences, padding=True, truncation=True, max_length=plan.max_seq_length, return_tensors="pt")
    ids = tokenize_with_template(tokenizer, sentences, plan.prompt_template, plan.max_seq_length)
    return tokenizer.pad({"input_ids": ids}, return_tensors="pt")


def reference_copy(encoder: SentenceEncoder, max_seq_length: int | None = None) -> SentenceEncoder:
    """A plain CPU copy of `encoder` built from its config and state dict (trainer-attached modules ignored),
    truncating at `max_seq_length` when given (the export's: `export_max_seq_length`)."""
    config = copy.deepcopy(encoder.config)
    if max_seq_length is not None:
        config.max_seq_length = max_seq_length
    fresh = type(encoder)(config)
    missing, _unused = fresh.load_state_dict(encoder.state_dict(), strict=False)
    if missing:
        raise ExportError(f"Could not copy the encoder for verification; missing weights {missing[:5]}.")
    fresh.attach_tokenizer(encoder.tokenizer)
    return fresh.eval()


def max_abs_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def verify_export(
    encoder: SentenceEncoder,
    out_dir: str | Path,
    plan: ExportPlan,
    sentences: Sequence[str] = PROBE_SENTENCES,
    tolerance: float = 1e-4,
) -> dict[str, float]:
    """Max |difference| between `encoder.encode` and each loader of the export; `ExportError` above `tolerance`,
    for non-finite or collapsed embeddings.

    The reference is a fresh CPU `SentenceEncoder` with the encoder's config and weights, so that nothing attached
    to the trained instance (a device, accelerate's mixed-precision forward wrapper) enters the comparison; it
    truncates at the export's `max_seq_length` (which may be the base model's, shorter than the encoder's default).
    When the export ends in `Normalize` (kept from the base model's pipeline) the reference is `encode(...,
    normalize=True)`: the same vectors scaled to unit length, with the same cosines.
    """
    from sentence_transformers import SentenceTransformer

    reference = reference_copy(encoder, plan.max_seq_length).encode(
        list(sentences), batch_size=len(sentences), normalize=plan.normalize
    )
    check_embeddings(reference, "The encoder")
    loaded = {"transformers": automodel_encode(out_dir, sentences, plan)}
    if plan.sentence_transformers:  # else the export has no sentence-transformers files (`write_export`)
        loaded["sentence-transformers"] = SentenceTransformer(str(out_dir), device="cpu").encode(
            list(sentences), show_progress_bar=False
        )
    differences = {}
    for loader, embeddings in loaded.items():
        check_embeddings(embeddings, f"The export loaded with {loader}")
        differences[loader] = max_abs_difference(reference, embeddings)
    bad = {k: v for k, v in differences.items() if not v <= tolerance}
    if bad:
        raise ExportError(
            f"The export in '{out_dir}' does not reproduce the encoder: max |difference| {bad} > {tolerance}. "
            f"Plan: {plan.to_dict()}."
        )
    return differences
