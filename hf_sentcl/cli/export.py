"""`hf-sentcl export ENCODER OUT`: export a saved encoder (or a backbone) with its model card."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.evaluation.mteb import INSTALL_HINT, mteb_available, mteb_data_problem, mteb_sts_scores
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.export.bundle import (
    check_results_match,
    export_mteb_results,
    export_with_card,
    find_results,
    load_checkpoint,
)
from hf_sentcl.export.mteb_meta import MODEL_META_MODULE, check_license
from hf_sentcl.export.plan import ExportError
from hf_sentcl.export.results import load_results
from hf_sentcl.export.verify import PROBE_SENTENCES
from hf_sentcl.export.writer import check_export_target
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling import POOLING_MODES
from hf_sentcl.modeling.peft import save_adapter
from hf_sentcl.recipe.run_folder import clear_recorded_failure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sentcl export", description=__doc__.splitlines()[0])
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
        help="A run's results.json or the JSON of `hf-sentcl evaluate --output`, for the card's tables and "
        "model-index (default: the results.json beside ENCODER).",
    )
    parser.add_argument("--repo-id", default=None, help="Hub id ORG/NAME that the card's usage snippets load.")
    parser.add_argument(
        "--mteb-results", default=None,
        help="Also write MTEB result files (results/ORG__NAME/REVISION/*.json, needs mteb) under this folder.",
    )
    parser.add_argument(
        "--license", default=None,
        help="License of the model (a Hub license id, e.g. apache-2.0): the card's metadata, and the ModelMeta in "
        "--mteb-results.",
    )
    parser.add_argument(
        "--language", default=None,
        help="Language(s) of the model for the card's metadata, comma-separated ISO codes (default: the base model "
        "card's, e.g. en for all-MiniLM-L6-v2).",
    )
    parser.add_argument(
        "--training-code-url", default=None,
        help="Public URL of the code that trained the model, for the ModelMeta in --mteb-results (default: none).",
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


def print_mteb_files(folder: Path, root: Path) -> None:
    """Where the MTEB files went, and what still keeps them out of MTEB's results repository (results not pushed
    yet: a run's log shows that note only at DEBUG, here it was asked for)."""
    from hf_sentcl.export.mteb_files import check_mteb_submission, submission_notes

    print(f"MTEB results (checked with mteb's loaders): {folder}")
    print(f"ModelMeta for mteb's model registry (imported with mteb, equal to model_meta.json): "
          f"{root / MODEL_META_MODULE}")
    for note in submission_notes(check_mteb_submission(folder)[0], root):
        print(f"Note: {note}")


def language_option(value: str | None) -> str | list[str] | None:
    """`--language en` or `--language en,de`: one code, or the list of them, for the card's metadata."""
    codes = split_commas(value) if value else []
    return codes[0] if len(codes) == 1 else codes or None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    checkpoint = Path(args.checkpoint)
    try:  # everything that can be checked before the model loads
        results_path = Path(args.results) if args.results else find_results(checkpoint)
        results = load_results(results_path) if results_path else {}
        if args.mteb_results and not mteb_available():
            raise ExportError(f"--mteb-results needs the mteb package: {INSTALL_HINT}.")
        if args.license and mteb_available():  # mteb knows the Hub's license ids
            check_license(args.license)
        check_export_target(args.out, args.overwrite)
        probes = read_probe_sentences(args.probe_file, args.probe_count) if args.probe_file else PROBE_SENTENCES
        score_mteb = (bool(results.get("sts")) or bool(args.mteb_results)) and not results.get("mteb_sts")
        data_dir = resolve_data_dir(args.data_dir) if score_mteb else None
        if score_mteb:  # a file missing or malformed is an error here, before the model loads
            STSEvaluator(data_dir, mode="all", sick_split="all")
        problem = mteb_data_problem(data_dir) if score_mteb else None
        if problem:
            why = f"MTEB-protocol scores are computed on SentEval's own STS data only, and {problem}"
            if args.mteb_results:
                raise ExportError(f"--mteb-results: {why}. Give --data-dir (or HF_SENTCL_DATA) SentEval's data folder.")
            print(f"No model-index in the card: {why}.", file=sys.stderr)
        score_mteb = score_mteb and not problem
        check_results_match(results, args.checkpoint, results_path)
        evaluated = results if results.get("source") == "evaluate" else {}  # pooled as the scores were measured
        pooling = args.pooling or evaluated.get("pooling")
        pooling_layer = args.pooling_layer if args.pooling_layer is not None else evaluated.get("pooling_layer")
        encoder = load_checkpoint(args.checkpoint, pooling, pooling_layer)
        check_results_match(results, args.checkpoint, results_path, encoder)
        adapter = save_adapter(encoder, args.adapter) if args.adapter else None
        if score_mteb:
            print("Scoring the 7 STS tasks with MTEB's protocol for the card's model-index ...", flush=True)
            results.update(mteb_sts_scores(encoder, data_dir, batch_size=args.batch_size).to_results())
        plan, differences = export_with_card(
            encoder, args.out, results, repo_id=args.repo_id, overwrite=args.overwrite, verify=not args.no_verify,
            probes=probes, tolerance=args.tolerance, license_id=args.license, language=language_option(args.language),
            plots_from=results_path.parent if results_path and results.get("source") != "evaluate" else None,
        )
        mteb_folder = (
            export_mteb_results(args.mteb_results, results, args.out, plan, args.repo_id, license_id=args.license,
                                training_code=args.training_code_url) if args.mteb_results else None
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
        print_mteb_files(mteb_folder, Path(args.mteb_results))
    if adapter:
        print(f"LoRA adapter: {adapter}")
    if Path(args.out).resolve().parent == checkpoint.resolve() and clear_recorded_failure(args.out, "export_error"):
        print(f"The run in {checkpoint} is complete now: its export had failed at the end of training.")
    return 0
