"""Export a trained `SentenceEncoder` as a plain Hugging Face model that `AutoModel` and `SentenceTransformer` load.

    python -m hf_sentcl.export CHECKPOINT OUT [--results results.json] [--repo-id ORG/NAME] [--overwrite]

The export folder holds:

- the backbone's own `save_pretrained` files (`config.json` with e.g. `architectures: ["BertModel"]`,
  `model.safetensors`) and the tokenizer, so `AutoModel.from_pretrained(OUT)` works without `trust_remote_code`;
- the sentence-transformers files: `modules.json`, `sentence_bert_config.json`,
  `config_sentence_transformers.json`, `N_Pooling/config.json`, plus `N_WeightedLayerPooling/` for layer-averaging
  poolings and `N_Dense/` when a head is used at inference. They are written in the long-standing
  (sentence-transformers 2.x/3.x) format, which every later version still reads, and without importing
  sentence-transformers, so exporting does not need it installed;
- `README.md`, the model card (see `hf_sentcl.model_card`).

How each setting of `SentenceEncoderConfig` is exported (only the eval-mode behaviour matters):

- `pooling_layer` other than the last layer (cls/mean/max): the backbone is truncated to that many layers, so
  hidden state k is its last hidden state and both loaders read it as `last_hidden_state` (0 = embeddings only).
- `first_last_avg` / `last2_avg`: `output_hidden_states: true` is set in `config.json` and a sentence-transformers
  `WeightedLayerPooling` (weights 1 on the two averaged layers, 0 elsewhere) precedes mean pooling.
- a head active at inference (`head_at_inference` with `mlp`, i.e. Linear + tanh): a sentence-transformers `Dense`
  module with `Tanh`. With `cls` pooling on a backbone whose pooler is dense + tanh on the first token (BERT,
  RoBERTa, ...) the head is also folded into that pooler, as SimCSE does, so `AutoModel(...).pooler_output` is the
  embedding. Otherwise plain-transformers users apply the Dense weights themselves (the model card shows how).
- training-only parts (a head not used at inference, frozen copies, projectors kept by trainers) are left out;
  the full training checkpoint stays in the run's `output_dir`.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from hf_sentcl.evaluation.plots import PLOTS_DIRNAME
from hf_sentcl.model_card import load_results, package_version, write_model_card, write_mteb_results
from hf_sentcl.modeling import SentenceEncoder, SentenceEncoderConfig
from hf_sentcl.modeling.heads import MLPHead
from hf_sentcl.modeling.peft import save_adapter
from hf_sentcl.modeling.pooling import masked_max, masked_mean

logger = logging.getLogger("hf_sentcl")

EXPORT_DIRNAME = "export"
MTEB_RESULTS_DIRNAME = "mteb_results"
ST_TYPE_PREFIX = "sentence_transformers.models."
LAYER_AVERAGES = ("first_last_avg", "last2_avg")
PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays an instrument on stage while the audience sings along with every chorus.",
    "The cat sleeps.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
    "Two dogs run through a field.",
)


class ExportError(ValueError):
    """The encoder (or the export folder) cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ExportPlan:
    """What the exported model computes, derived from a `SentenceEncoderConfig` in eval mode.

    Attributes:
        pooling: the encoder's eval-mode pooling (`SentenceEncoderConfig.active_pooling(False)`).
        source_layers: transformer layers of the trained backbone.
        kept_layers: transformer layers of the exported backbone (fewer when `pooling_layer` is not the last one).
        head: `none`, `pooler` (the MLP head folded into the backbone's pooler and a Dense module for
            sentence-transformers) or `dense` (Dense module only).
        hidden_size: embedding dimension.
        max_seq_length: truncation length of `encode`, written to `sentence_bert_config.json`.
    """

    pooling: str
    source_layers: int
    kept_layers: int
    head: str
    hidden_size: int
    max_seq_length: int

    @property
    def truncated(self) -> bool:
        return self.kept_layers != self.source_layers

    @property
    def token_pooling(self) -> str:
        """The sentence-transformers `Pooling` mode over token states (cls, mean or max)."""
        if self.pooling in ("cls", "cls_before_pooler"):
            return "cls"
        return "mean" if self.pooling in LAYER_AVERAGES else self.pooling

    @property
    def layer_weights(self) -> list[float] | None:
        """`WeightedLayerPooling` weights over hidden states 0..L (embeddings first) for the layer averages, else None.

        Weight 1 on the two averaged states and 0 elsewhere gives exactly their mean, as `pool` computes it.
        """
        if self.pooling not in LAYER_AVERAGES:
            return None
        weights = [0.0] * (self.kept_layers + 1)
        weights[1 if self.pooling == "first_last_avg" else -2] += 1.0
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
        return {name: "" if i == 0 else f"{i}_{name}" for i, name in enumerate(names)}

    def describe(self) -> str:
        """One sentence saying how a sentence vector is computed (for the model card)."""
        layer = "the last layer" if not self.truncated else f"hidden state {self.kept_layers}"
        base = {
            "cls": f"the first-token ([CLS]/<s>) state of {layer}",
            "mean": f"the mean of the token states of {layer} over real (non-padding) tokens",
            "max": f"the element-wise max of the token states of {layer} over real tokens",
            "first_last_avg": "the mean over real tokens of the average of the first and the last transformer layer",
            "last2_avg": "the mean over real tokens of the average of the last two transformer layers",
        }[self.token_pooling if self.pooling not in LAYER_AVERAGES else self.pooling]
        if self.head == "pooler":
            base += ", passed through the trained Linear+tanh head (folded into the model's pooler: `pooler_output`)"
        elif self.head == "dense":
            base += ", passed through the trained Linear+tanh head (the `Dense` module)"
        if self.truncated:
            base += (
                f"; the exported backbone keeps {self.kept_layers} of {self.source_layers} layers because only "
                f"hidden state {self.kept_layers} is used"
            )
        return base[0].upper() + base[1:] + "."

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "token_pooling": self.token_pooling, "layer_weights": self.layer_weights}


# ------------------------------------------------------------------------------------------------ planning
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
    config: SentenceEncoderConfig = encoder.config
    pooling = config.active_pooling(training=False)
    layers = config.backbone_config.num_hidden_layers
    head_used = encoder.head is not None and config.head_at_inference and pooling != "cls_before_pooler"
    if head_used and not isinstance(encoder.head, MLPHead):
        raise ExportError(
            f"The encoder keeps a '{config.head}' head ({type(encoder.head).__name__}) at inference; only the 'mlp' "
            "head (Linear + tanh) can be exported to sentence-transformers. Set head_at_inference: false or add "
            "its export to hf_sentcl/export.py."
        )
    kept = layers if pooling in LAYER_AVERAGES else config.pooling_layer % (layers + 1)
    fold = head_used and pooling == "cls" and has_tanh_pooler(encoder.backbone)
    return ExportPlan(
        pooling=pooling,
        source_layers=layers,
        kept_layers=kept,
        head="pooler" if fold else "dense" if head_used else "none",
        hidden_size=config.hidden_size,
        max_seq_length=encoder.max_seq_length,
    )


# ------------------------------------------------------------------------------------------------ writing
def export_backbone(encoder: SentenceEncoder, plan: ExportPlan) -> PreTrainedModel:
    """A standalone copy of the backbone as exported: LoRA merged, layers truncated, head folded into the pooler."""
    backbone = encoder.backbone
    if hasattr(backbone, "merge_and_unload"):  # a peft-wrapped backbone
        backbone = copy.deepcopy(backbone).merge_and_unload()
    config = copy.deepcopy(backbone.config)
    config.num_hidden_layers = plan.kept_layers
    if plan.pooling in LAYER_AVERAGES:
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


def _write_json(path: Path, content: dict | list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) + "\n")


def write_sentence_transformers_files(encoder: SentenceEncoder, plan: ExportPlan, out_dir: Path) -> None:
    """Write modules.json and each module's config (and weights) so that `SentenceTransformer(out_dir)` loads it."""
    dirs = plan.module_dirs
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": ST_TYPE_PREFIX + name}
        for i, (name, path) in enumerate(dirs.items())
    ]
    _write_json(out_dir / "modules.json", modules)
    _write_json(out_dir / "sentence_bert_config.json", {"max_seq_length": plan.max_seq_length, "do_lower_case": False})
    versions = {
        key: value
        for key, value in (
            ("sentence_transformers", package_version("sentence-transformers")),
            ("transformers", package_version("transformers")),
            ("pytorch", torch.__version__),
        )
        if value
    }
    _write_json(
        out_dir / "config_sentence_transformers.json",
        {"__version__": versions, "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )
    if plan.layer_weights is not None:
        folder = out_dir / dirs["WeightedLayerPooling"]
        _write_json(
            folder / "config.json",
            {"word_embedding_dimension": plan.hidden_size, "layer_start": 0, "num_hidden_layers": plan.kept_layers},
        )
        weights = torch.tensor(plan.layer_weights, dtype=torch.float32)
        save_file({"layer_weights": weights}, folder / "model.safetensors")
    _write_json(
        out_dir / dirs["Pooling"] / "config.json",
        {
            "word_embedding_dimension": plan.hidden_size,
            "pooling_mode_cls_token": plan.token_pooling == "cls",
            "pooling_mode_mean_tokens": plan.token_pooling == "mean",
            "pooling_mode_max_tokens": plan.token_pooling == "max",
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        },
    )
    if plan.uses_head:
        folder = out_dir / dirs["Dense"]
        _write_json(
            folder / "config.json",
            {
                "in_features": plan.hidden_size,
                "out_features": plan.hidden_size,
                "bias": True,
                "activation_function": "torch.nn.modules.activation.Tanh",
            },
        )
        dense = encoder.head.dense
        tensors = {"linear.weight": dense.weight, "linear.bias": dense.bias}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, folder / "model.safetensors")


def prepare_export_dir(out_dir: str | Path, overwrite: bool) -> Path:
    """Return `out_dir` ready to be written: created if missing; an earlier export is replaced only with `overwrite`.

    Files of an earlier export are never mixed with the new one (a stale `2_Dense/` would change what
    sentence-transformers computes), and a folder that does not look like an export is never deleted.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"Export path '{out_dir}' exists and is not a directory.")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise ExportError(f"Export folder '{out_dir}' is not empty; pass --overwrite to replace an earlier export.")
        if not (out_dir / "modules.json").is_file():
            raise ExportError(
                f"Refusing to overwrite '{out_dir}': it is not empty and holds no earlier export (no modules.json)."
            )
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def export_encoder(
    encoder: SentenceEncoder, out_dir: str | Path, *, overwrite: bool = False, verify: bool = True
) -> ExportPlan:
    """Write `encoder` to `out_dir` as a plain backbone + tokenizer + sentence-transformers files; return the plan.

    With `verify`, the written folder is reloaded with `AutoModel` (and `SentenceTransformer` when installed) and
    checked against `encoder.encode` on a few probe sentences, so a mismatch fails here and not in users' hands.
    """
    if encoder.tokenizer is None:
        raise ExportError("The encoder has no tokenizer attached; call attach_tokenizer(tokenizer) before exporting.")
    plan = plan_export(encoder)
    out_dir = prepare_export_dir(out_dir, overwrite)
    export_backbone(encoder, plan).save_pretrained(out_dir)
    encoder.tokenizer.save_pretrained(out_dir)
    write_sentence_transformers_files(encoder, plan, out_dir)
    logger.info("Exported the encoder to %s (%s)", out_dir, plan.describe())
    if verify:
        verify_export(encoder, out_dir, plan)
    return plan


# ------------------------------------------------------------------------------------------------ checking
def pool_automodel_outputs(
    outputs, attention_mask: torch.Tensor, plan: ExportPlan, dense: dict[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """The documented pooling of plain `AutoModel` outputs for an export (the model card shows the same code).

    `dense` holds `linear.weight`/`linear.bias` of the `Dense` module; it is needed only when `plan.head == "dense"`.
    """
    if plan.head == "pooler":
        return outputs.pooler_output
    if plan.pooling in LAYER_AVERAGES:
        first = outputs.hidden_states[1] if plan.pooling == "first_last_avg" else outputs.hidden_states[-2]
        embeddings = masked_mean((first + outputs.hidden_states[-1]) / 2, attention_mask)
    elif plan.token_pooling == "cls":
        embeddings = outputs.last_hidden_state[:, 0]
    elif plan.token_pooling == "mean":
        embeddings = masked_mean(outputs.last_hidden_state, attention_mask)
    else:
        embeddings = masked_max(outputs.last_hidden_state, attention_mask)
    if plan.head == "dense":
        if dense is None:
            raise ValueError("This export keeps its head in the Dense module; pass its weights as `dense`.")
        embeddings = torch.tanh(embeddings @ dense["linear.weight"].T + dense["linear.bias"])
    return embeddings


def automodel_encode(path: str | Path, sentences: Sequence[str], plan: ExportPlan, batch_size: int = 32) -> np.ndarray:
    """Embed `sentences` with plain `AutoModel`/`AutoTokenizer` from an export folder and the documented pooling."""
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    dense = load_file(path / plan.module_dirs["Dense"] / "model.safetensors") if plan.head == "dense" else None
    rows = []
    with torch.inference_mode():
        for start in range(0, len(sentences), batch_size):
            batch = tokenizer(
                list(sentences[start : start + batch_size]), padding=True, truncation=True,
                max_length=plan.max_seq_length, return_tensors="pt",
            )
            outputs = model(**batch, output_hidden_states=plan.pooling in LAYER_AVERAGES)
            rows.append(pool_automodel_outputs(outputs, batch["attention_mask"], plan, dense).float())
    return torch.cat(rows).numpy()


def reference_copy(encoder: SentenceEncoder) -> SentenceEncoder:
    """A plain CPU copy of `encoder` built from its config and state dict (trainer-attached modules ignored)."""
    fresh = type(encoder)(copy.deepcopy(encoder.config))
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
    """Max |difference| between `encoder.encode` and each loader of the export; raise `ExportError` above `tolerance`.

    The reference is a fresh CPU `SentenceEncoder` with the encoder's config and weights, so that nothing attached
    to the trained instance (a device, accelerate's mixed-precision forward wrapper) enters the comparison.
    """
    reference = reference_copy(encoder).encode(list(sentences), batch_size=len(sentences))
    differences = {"transformers": max_abs_difference(reference, automodel_encode(out_dir, sentences, plan))}
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        logger.info("sentence-transformers is not installed; the export was checked with transformers only.")
    else:
        model = SentenceTransformer(str(out_dir), device="cpu")
        differences["sentence-transformers"] = max_abs_difference(reference, model.encode(list(sentences)))
    bad = {k: v for k, v in differences.items() if v > tolerance}
    if bad:
        raise ExportError(
            f"The export in '{out_dir}' does not reproduce the encoder: max |difference| {bad} > {tolerance}. "
            f"Plan: {plan.to_dict()}."
        )
    return differences


# ------------------------------------------------------------------------------------------------ end of a run
def copy_plots(run_dir: str | Path, export_dir: str | Path) -> list[Path]:
    """Copy a run's figures (`run_dir/plots/*.png`) to `export_dir/plots/`, where the model card's relative image
    links point, so they show on the Hub too. Returns the copies."""
    pngs = sorted((Path(run_dir) / PLOTS_DIRNAME).glob("*.png"))
    if pngs:
        (Path(export_dir) / PLOTS_DIRNAME).mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(png, Path(export_dir) / PLOTS_DIRNAME / png.name)) for png in pngs]


def export_run(
    encoder: SentenceEncoder,
    results: dict[str, Any],
    output_dir: str | Path,
    repo_id: str | None = None,
) -> tuple[Path, ExportPlan]:
    """Export a run's final encoder to `output_dir/export`, write its model card there from `results` (with the
    run's plots), and the MTEB-protocol STS scores to `output_dir/mteb_results` (mteb results-folder layout).
    Returns (folder, plan)."""
    export_dir = Path(output_dir) / EXPORT_DIRNAME
    plan = export_encoder(encoder, export_dir, overwrite=True)
    copy_plots(output_dir, export_dir)
    write_model_card(export_dir, plan, results, repo_id=repo_id)
    write_mteb_results(Path(output_dir) / MTEB_RESULTS_DIRNAME, results, export_dir, plan, repo_id=repo_id)
    return export_dir, plan


# ------------------------------------------------------------------------------------------------ CLI
def find_results(checkpoint: Path) -> Path | None:
    """The run's results.json beside a checkpoint (the run's output_dir or the parent of a checkpoint-N folder)."""
    for folder in (checkpoint, checkpoint.parent):
        if (folder / "results.json").is_file():
            return folder / "results.json"
    return None


def load_checkpoint(path: str | Path) -> SentenceEncoder:
    """Load a saved `SentenceEncoder`, with a clear error for anything else."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ExportError(f"'{path}' holds no config.json; pass the run's output_dir or a checkpoint-N folder.")
    model_type = getattr(AutoConfig.from_pretrained(path), "model_type", None)
    if model_type != SentenceEncoderConfig.model_type:
        raise ExportError(
            f"'{path}' is a '{model_type}' model, not a saved SentenceEncoder; there is nothing to export "
            "(it already loads with AutoModel)."
        )
    return SentenceEncoder.from_pretrained(str(path)).eval()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_sentcl.export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="A saved SentenceEncoder: a run's output_dir or one of its checkpoint-N.")
    parser.add_argument("out", help="Export folder to write (README.md, config.json, modules.json, ...).")
    parser.add_argument(
        "--results", default=None,
        help="results.json of the run, for the model card's tables (default: the one beside CHECKPOINT).",
    )
    parser.add_argument("--repo-id", default=None, help="Hub id ORG/NAME that the card's usage snippets load.")
    parser.add_argument(
        "--mteb-results", default=None,
        help="Also write the MTEB-protocol STS scores in the mteb results-folder layout under this folder.",
    )
    parser.add_argument(
        "--adapter", default=None,
        help="Also save the LoRA adapter alone to this folder (for a checkpoint trained with a 'peft' section and "
        "saved before the end of the run; the export itself always has the adapters merged).",
    )
    parser.add_argument("--overwrite", action="store_true", help="Replace an earlier export in OUT.")
    parser.add_argument("--no-verify", action="store_true", help="Skip reloading the export to check its embeddings.")
    parser.add_argument(
        "--probe-file", default=None,
        help="Check the export on the sentences of this file (one per line) instead of the built-in probes.",
    )
    parser.add_argument("--probe-count", type=int, default=100, help="How many lines of --probe-file to use.")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="Largest |difference| accepted between the loaders."
    )
    return parser


def read_probe_sentences(path: str | Path, count: int) -> list[str]:
    """The first `count` distinct non-empty lines of `path`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--probe-file '{path}' does not exist.")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = list(dict.fromkeys(lines))[:count]
    if not sentences:
        raise ValueError(f"--probe-file '{path}' holds no sentences.")
    return sentences


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    checkpoint = Path(args.checkpoint)
    try:
        results_path = Path(args.results) if args.results else find_results(checkpoint)
        results = load_results(results_path) if results_path else {}
        encoder = load_checkpoint(checkpoint)
        adapter = save_adapter(encoder, args.adapter) if args.adapter else None
        probes = read_probe_sentences(args.probe_file, args.probe_count) if args.probe_file else PROBE_SENTENCES
        plan = export_encoder(encoder, args.out, overwrite=args.overwrite, verify=False)
        differences = (
            None if args.no_verify else verify_export(encoder, args.out, plan, probes, tolerance=args.tolerance)
        )
        copy_plots(results_path.parent if results_path else checkpoint, args.out)
        card = write_model_card(args.out, plan, results, repo_id=args.repo_id)
        mteb_folder = (
            write_mteb_results(args.mteb_results, results, args.out, plan, repo_id=args.repo_id)
            if args.mteb_results else None
        )
    except (ExportError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Exported to {args.out}: {plan.describe()}")
    if differences is not None:
        checked = ", ".join(f"{loader} {value:.2e}" for loader, value in differences.items())
        print(f"Checked on {len(probes)} sentences, max |difference| from SentenceEncoder.encode: {checked}")
    print(f"Model card: {card}" + ("" if results else " (no results.json found: the card has no result tables)"))
    if mteb_folder:
        print(f"MTEB results: {mteb_folder}")
    if adapter:
        print(f"LoRA adapter: {adapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
