"""Export an encoder as a plain Hugging Face model that `AutoModel` and `SentenceTransformer` load.

    python -m hf_sentcl.export ENCODER OUT [--results FILE] [--mteb-results DIR] [--repo-id ORG/NAME] [--overwrite]

ENCODER is a saved `SentenceEncoder` (a run's output_dir or a checkpoint-N folder) or any backbone (a path, a Hub
id or `embedded:all-MiniLM-L6-v2`) with `--pooling`. The export folder holds:

- the backbone's own `save_pretrained` files (`config.json` with e.g. `architectures: ["BertModel"]`,
  `model.safetensors`) and the tokenizer, so `AutoModel.from_pretrained(OUT)` works without `trust_remote_code`;
- the sentence-transformers modules (`Transformer`, `Pooling`, and `WeightedLayerPooling` for layer averages,
  `Dense` for a head used at inference), built as sentence-transformers modules and written by its own `save`;
- `README.md`, the model card (`hf_sentcl.model_card`), from a run's results.json or `hf_sentcl.evaluate`'s JSON.

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

import argparse
import contextlib
import copy
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedModel

from hf_sentcl.defaults import resolve_data_dir, resolve_model_name
from hf_sentcl.evaluation.mteb import (
    INSTALL_HINT, MtebScores, mteb_available, mteb_sts_scores, write_mteb_results,
)
from hf_sentcl.evaluation.plots import PLOTS_DIRNAME
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.model_card import hub_model_id, load_results, mteb_training_tasks, write_model_card
from hf_sentcl.modeling import POOLING_MODES, SentenceEncoder, SentenceEncoderConfig
from hf_sentcl.modeling.export_plan import ExportError, ExportPlan, plan_export
from hf_sentcl.modeling.peft import save_adapter
from hf_sentcl.modeling.pooling import pool
from hf_sentcl.health import is_collapsed, nonfinite_tensors

logger = logging.getLogger("hf_sentcl")

EXPORT_DIRNAME = "export"
MTEB_RESULTS_DIRNAME = "mteb_results"
PROBE_SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays an instrument on stage while the audience sings along with every chorus.",
    "The cat sleeps.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
    "Two dogs run through a field.",
)
__all__ = ["ExportError", "ExportPlan", "export_encoder", "export_run", "plan_export", "verify_export"]


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
    backbone and tokenizer), in `plan.module_dirs` order."""
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer, WeightedLayerPooling

    modules = [Transformer(str(backbone_dir), max_seq_length=plan.max_seq_length)]
    if plan.layer_weights is not None:
        weights = torch.nn.Parameter(torch.tensor(plan.layer_weights, dtype=torch.float32))
        modules.append(WeightedLayerPooling(plan.hidden_size, plan.kept_layers, layer_start=0, layer_weights=weights))
    modules.append(Pooling(plan.hidden_size, pooling_mode=plan.token_pooling))
    if plan.uses_head:
        weight, bias = (p.detach().float().cpu().clone() for p in (encoder.head.dense.weight, encoder.head.dense.bias))
        modules.append(Dense(plan.hidden_size, plan.hidden_size, activation_function=torch.nn.Tanh(),
                             init_weight=weight, init_bias=bias))
    return modules


def write_export(encoder: SentenceEncoder, folder: str | Path) -> ExportPlan:
    """Write `encoder` into the empty or missing `folder` with sentence-transformers' own `save`; return the plan."""
    from sentence_transformers import SentenceTransformer

    if encoder.tokenizer is None:
        raise ExportError("The encoder has no tokenizer attached; call attach_tokenizer(tokenizer) before exporting.")
    plan = plan_export(encoder)
    check_weights(encoder)
    folder = Path(folder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.backbone-") as backbone_dir:
        export_backbone(encoder, plan).save_pretrained(backbone_dir)
        encoder.tokenizer.save_pretrained(backbone_dir)
        model = SentenceTransformer(
            modules=sentence_transformer_modules(encoder, plan, Path(backbone_dir)), device="cpu",
            similarity_fn_name="cosine",
        )
        model.save(str(folder), create_model_card=False)
    logger.info("Exported the encoder to %s (%s)", folder, plan.describe())
    return plan


def check_export_target(out_dir: str | Path, overwrite: bool) -> Path:
    """Check that `out_dir` may receive an export (missing, empty, or an earlier export with `overwrite`)."""
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
    vector, by the criterion a run applies to its final model: `hf_sentcl.health`)."""
    if not np.isfinite(embeddings).all():
        raise ExportError(f"{where} returns non-finite embeddings (NaN or infinity); nothing was exported.")
    if is_collapsed(embeddings):
        raise ExportError(
            f"{where} gives every probe sentence the same vector (a collapsed model); nothing was exported."
        )


def automodel_encode(path: str | Path, sentences: Sequence[str], plan: ExportPlan, batch_size: int = 32) -> np.ndarray:
    """Embed `sentences` with plain `AutoModel`/`AutoTokenizer` from an export folder, pooled by `pool` as the
    encoder pools (the head as the plan stores it)."""
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
            batch = tokenizer(
                list(sentences[start : start + batch_size]), padding=True, truncation=True,
                max_length=plan.max_seq_length, return_tensors="pt",
            )
            outputs = model(**batch, output_hidden_states=all_states)
            if plan.head == "pooler":
                embeddings = outputs.pooler_output
            else:
                states = outputs.hidden_states if all_states else (outputs.last_hidden_state,)
                embeddings = pool(states, batch["attention_mask"], plan.mode)
            if dense is not None:
                embeddings = torch.tanh(embeddings @ dense["linear.weight"].T + dense["linear.bias"])
            rows.append(embeddings.float())
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
    """Max |difference| between `encoder.encode` and each loader of the export; `ExportError` above `tolerance`,
    for non-finite or collapsed embeddings.

    The reference is a fresh CPU `SentenceEncoder` with the encoder's config and weights, so that nothing attached
    to the trained instance (a device, accelerate's mixed-precision forward wrapper) enters the comparison.
    """
    from sentence_transformers import SentenceTransformer

    reference = reference_copy(encoder).encode(list(sentences), batch_size=len(sentences))
    check_embeddings(reference, "The encoder")
    loaded = {
        "transformers": automodel_encode(out_dir, sentences, plan),
        "sentence-transformers": SentenceTransformer(str(out_dir), device="cpu").encode(
            list(sentences), show_progress_bar=False
        ),
    }
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


# ------------------------------------------------------------------------------------------------ card and MTEB
def copy_plots(run_dir: str | Path, export_dir: str | Path) -> list[Path]:
    """Copy a run's figures (`run_dir/plots/*.png`) to `export_dir/plots/`, where the model card's relative image
    links point, so they show on the Hub too. Returns the copies."""
    pngs = sorted((Path(run_dir) / PLOTS_DIRNAME).glob("*.png"))
    if pngs:
        (Path(export_dir) / PLOTS_DIRNAME).mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(png, Path(export_dir) / PLOTS_DIRNAME / png.name)) for png in pngs]


def export_name(out_dir: str | Path, repo_id: str | None) -> str:
    """The model's name: `repo_id`, else `hf_sentcl/<folder>` (a run's output_dir for `output_dir/export`)."""
    out_dir = Path(out_dir).resolve()
    return repo_id or f"hf_sentcl/{out_dir.parent.name if out_dir.name == EXPORT_DIRNAME else out_dir.name}"


def export_mteb_results(
    root: str | Path, results: dict[str, Any], export_dir: str | Path, plan: ExportPlan, repo_id: str | None
) -> Path | None:
    """Write the results' MTEB-protocol scores as MTEB result files under `root`; None when there are none."""
    scores = MtebScores.from_results(results)
    if scores is None:
        return None
    return write_mteb_results(
        root, scores, name=export_name(export_dir, repo_id), export_dir=export_dir, max_tokens=plan.max_seq_length,
        embed_dim=plan.hidden_size, adapted_from=hub_model_id(results.get("model_name_or_path")),
        training_tasks=mteb_training_tasks(results),
    )


def export_with_card(
    encoder: SentenceEncoder,
    out_dir: str | Path,
    results: dict[str, Any],
    *,
    repo_id: str | None = None,
    plots_from: str | Path | None = None,
    overwrite: bool = False,
    verify: bool = True,
    probes: Sequence[str] = PROBE_SENTENCES,
    tolerance: float = 1e-4,
) -> tuple[ExportPlan, dict[str, float] | None]:
    """Export `encoder` to `out_dir` with its model card (and `plots_from/plots/*.png`), all built and checked
    beside `out_dir` before it is moved in. Returns the plan and the loaders' differences (None unverified)."""
    out_dir = Path(out_dir)
    with staged_export(out_dir, overwrite) as stage:
        plan = write_export(encoder, stage)
        differences = verify_export(encoder, stage, plan, probes, tolerance) if verify else None
        if plots_from is not None:
            copy_plots(plots_from, stage)
        write_model_card(stage, plan, results, repo_id=repo_id, local_id=str(out_dir.resolve()))
    return plan, differences


def export_run(
    encoder: SentenceEncoder,
    results: dict[str, Any],
    output_dir: str | Path,
    repo_id: str | None = None,
) -> tuple[Path, ExportPlan]:
    """Export a run's final encoder to `output_dir/export` with its model card (from `results`) and plots, and its
    MTEB-protocol STS scores as MTEB result files under `output_dir/mteb_results` (when mteb is installed).
    Returns (folder, plan)."""
    export_dir = Path(output_dir) / EXPORT_DIRNAME
    plan, _ = export_with_card(encoder, export_dir, results, repo_id=repo_id, plots_from=output_dir, overwrite=True)
    if results.get("mteb_sts"):
        if mteb_available():
            export_mteb_results(Path(output_dir) / MTEB_RESULTS_DIRNAME, results, export_dir, plan, repo_id)
        else:
            logger.info("MTEB result files were not written: mteb is not installed (%s).", INSTALL_HINT)
    return export_dir, plan


# ------------------------------------------------------------------------------------------------ CLI
def find_results(checkpoint: Path) -> Path | None:
    """The run's results.json beside a checkpoint (the run's output_dir or the parent of a checkpoint-N folder)."""
    for folder in (checkpoint, checkpoint.parent):
        if (folder / "results.json").is_file():
            return folder / "results.json"
    return None


def load_checkpoint(name: str, pooling: str | None = None, pooling_layer: int | None = None) -> SentenceEncoder:
    """Load a saved `SentenceEncoder`, or wrap a plain backbone with `pooling`; a clear error for anything else."""
    path = resolve_model_name(name)
    if Path(path).exists() and not (Path(path) / "config.json").is_file():
        raise ExportError(f"'{name}' holds no config.json; pass a run's output_dir, a checkpoint-N or a model folder.")
    model_type = getattr(AutoConfig.from_pretrained(path), "model_type", None)
    overrides = {k: v for k, v in (("pooling", pooling), ("pooling_layer", pooling_layer)) if v is not None}
    if model_type != SentenceEncoderConfig.model_type and pooling is None:
        raise ExportError(
            f"'{name}' is a plain '{model_type}' model, not a saved SentenceEncoder: say how it pools with --pooling "
            f"({', '.join(POOLING_MODES)})."
        )
    if pooling is not None:
        overrides["inference_pooling"] = None  # the pooling asked for is the one exported
    return SentenceEncoder.load(name, **overrides).eval()


def _same_model(a: str, b: str) -> bool:
    a, b = resolve_model_name(a), resolve_model_name(b)
    if Path(a).exists() and Path(b).exists():
        return Path(a).resolve() == Path(b).resolve()
    return a == b


def check_results_match(
    results: dict[str, Any], name: str, path: Path, encoder: SentenceEncoder | None = None
) -> None:
    """ExportError when `hf_sentcl.evaluate` results were measured on another model than `name` or (once it is
    loaded) with another pooling than `encoder`'s."""
    if results.get("source") != "evaluate":
        return
    if not _same_model(results["model_name_or_path"], name):
        raise ExportError(
            f"Results file '{path}' was measured on '{results['model_name_or_path']}', not on '{name}'; evaluate "
            "this encoder and pass that file with --results."
        )
    if encoder is None:
        return
    pooling = encoder.config.active_pooling(training=False)
    if results.get("pooling") not in (None, pooling):
        raise ExportError(
            f"Results file '{path}' was measured with pooling '{results['pooling']}' but the export pools with "
            f"'{pooling}'; pass --pooling {results['pooling']} or evaluate with --pooling {pooling}."
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_sentcl.export", description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", metavar="ENCODER",
        help="A saved SentenceEncoder (a run's output_dir or checkpoint-N), or a backbone (path, Hub id or "
        "'embedded:all-MiniLM-L6-v2') with --pooling.",
    )
    parser.add_argument("out", help="Export folder to write (README.md, config.json, modules.json, ...).")
    parser.add_argument("--pooling", choices=POOLING_MODES, default=None,
                        help="Pooling of the export (default: the saved encoder's, or the one in --results).")
    parser.add_argument("--pooling-layer", type=int, default=None, help="Hidden-state index for cls/mean/max.")
    parser.add_argument(
        "--results", default=None,
        help="A run's results.json or the JSON of `hf_sentcl.evaluate --output`, for the card's tables and "
        "model-index (default: the results.json beside ENCODER).",
    )
    parser.add_argument("--repo-id", default=None, help="Hub id ORG/NAME that the card's usage snippets load.")
    parser.add_argument(
        "--mteb-results", default=None,
        help="Also write MTEB result files (results/ORG__NAME/REVISION/*.json, needs mteb) under this folder.",
    )
    parser.add_argument("--data-dir", default=None,
                        help="SentEval data for the MTEB-protocol scores when the results lack them.")
    parser.add_argument("--batch-size", type=int, default=128, help="Batch size of the MTEB-protocol scoring.")
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
    try:  # everything that can be checked before the model loads
        results_path = Path(args.results) if args.results else find_results(checkpoint)
        results = load_results(results_path) if results_path else {}
        if args.mteb_results and not mteb_available():
            raise ExportError(f"--mteb-results needs the mteb package: {INSTALL_HINT}.")
        check_export_target(args.out, args.overwrite)
        probes = read_probe_sentences(args.probe_file, args.probe_count) if args.probe_file else PROBE_SENTENCES
        score_mteb = (bool(results.get("sts")) or bool(args.mteb_results)) and not results.get("mteb_sts")
        data_dir = resolve_data_dir(args.data_dir) if score_mteb else None
        if score_mteb:
            STSEvaluator(data_dir, mode="all", sick_split="all")  # reads (and so checks) every STS file now
        check_results_match(results, args.checkpoint, results_path)
        pooling = args.pooling or (results.get("pooling") if results.get("source") == "evaluate" else None)
        encoder = load_checkpoint(args.checkpoint, pooling, args.pooling_layer)
        check_results_match(results, args.checkpoint, results_path, encoder)
        adapter = save_adapter(encoder, args.adapter) if args.adapter else None
        if score_mteb:
            print("Scoring the 7 STS tasks with MTEB's protocol for the card's model-index ...", flush=True)
            results.update(mteb_sts_scores(encoder, data_dir, batch_size=args.batch_size).to_results())
        plan, differences = export_with_card(
            encoder, args.out, results, repo_id=args.repo_id, overwrite=args.overwrite, verify=not args.no_verify,
            probes=probes, tolerance=args.tolerance,
            plots_from=results_path.parent if results_path and results.get("source") != "evaluate" else None,
        )
        mteb_folder = (
            export_mteb_results(args.mteb_results, results, args.out, plan, args.repo_id) if args.mteb_results else None
        )
    except (ExportError, FileNotFoundError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Exported to {args.out}: {plan.describe()}")
    if differences is not None:
        checked = ", ".join(f"{loader} {value:.2e}" for loader, value in differences.items())
        print(f"Checked on {len(probes)} sentences, max |difference| from SentenceEncoder.encode: {checked}")
    print(f"Model card: {Path(args.out) / 'README.md'}" + ("" if results else " (no results file: no result tables)"))
    if mteb_folder:
        print(f"MTEB results (checked with mteb's loaders): {mteb_folder}")
    if adapter:
        print(f"LoRA adapter: {adapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
