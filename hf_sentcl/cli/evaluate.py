"""`hf-sentcl evaluate`: evaluate an encoder on STS, transfer and GLUE suites from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.evaluation.report import write_report
from hf_sentcl.evaluation.sts import STS_MODES, STS_TASKS
from hf_sentcl.evaluation.suites import EVAL_SUITES, EvaluationSuites, check_suites, markdown_report
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS
from hf_sentcl.evaluation.whitening import WHITENING_FITS, WhiteningSpec
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling import POOLING_MODES
from hf_sentcl.modeling.backbone import EMBEDDED_MODEL_ALIAS
from hf_sentcl.modeling.encoder import load_encoder
from hf_sentcl.recipe.run_folder import check_writable


# ------------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sentcl evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help=f"Path, Hub id, or '{EMBEDDED_MODEL_ALIAS}'.")
    parser.add_argument(
        "--pooling", choices=POOLING_MODES, default=None,
        help="Pooling to evaluate with (default: the saved encoder's, else the sentence-transformers folder's "
        "(e.g. mean for all-MiniLM-L6-v2), else 'cls').",
    )
    parser.add_argument("--pooling-layer", type=int, default=None, help="Hidden-state index for cls/mean/max.")
    parser.add_argument(
        "--tasks", default="sts",
        help=f"Comma-separated suites: {', '.join(EVAL_SUITES)} (glue fine-tunes with BERT's GLUE settings on the "
        "data directory's SST-2, MRPC and STS-B; `hf-sentcl glue` sets tasks, seeds and epochs).",
    )
    parser.add_argument("--sts-tasks", default=",".join(STS_TASKS), help="Subset of the 7 STS tasks.")
    parser.add_argument("--sts-mode", choices=STS_MODES, default="all", help="How STS12-16 subsets combine.")
    parser.add_argument(
        "--sick-split", choices=("test", "all"), default="test",
        help="SICK-R pairs: SentEval's test split (papers) or all 9,927 pairs (MTEB's SICK-R).",
    )
    parser.add_argument(
        "--transfer-tasks", default=",".join(TRANSFER_TASKS), help="Subset of the 7 transfer tasks."
    )
    parser.add_argument("--kfold", type=int, default=10, help="Folds of the transfer probes' cross-validation.")
    parser.add_argument(
        "--probe-jobs", type=int, default=1, help="Processes fitting transfer probes in parallel (same results)."
    )
    parser.add_argument(
        "--whitening", action="append", default=None, metavar="FIT[:K]",
        help=f"Also score STS after whitening (Su et al. 2021) fitted on FIT: {' or '.join(WHITENING_FITS)} "
        "(eval: every evaluation sentence, task: each task's own) or a text file, one sentence per line; ':K' keeps "
        "K dimensions. Repeat the flag for several whitenings of the same embeddings.",
    )
    parser.add_argument(
        "--data-dir", default=None,
        help="SentEval-format directory or hf:// archive (default: $HF_SENTCL_DATA, else the Hub archive; "
        "`hf-sentcl data info` shows which).",
    )
    parser.add_argument(
        "--dims", type=parse_dims, default=None,
        help="Comma-separated sizes: also score STS on the first d dimensions of each embedding (default: the sizes "
        "the encoder was trained for with matryoshka_dims, if any).",
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--bf16", action="store_true", help="Encode under bf16 autocast.")
    parser.add_argument(
        "--device", default=None,
        help="cpu, cuda, cuda:1, ... (default: cuda if available). GLUE fine-tunes on the CPU for cpu, else on the "
        "GPUs transformers' Trainer sees (choose them with CUDA_VISIBLE_DEVICES).",
    )
    parser.add_argument("--output", default=None, help="Write results JSON here (and a .md table beside it).")
    return parser


def parse_dims(text: str) -> list[int]:
    """The sizes of `--dims`; refused (exit 2, the option named) unless positive whole numbers."""
    dims = split_commas(text)
    if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise argparse.ArgumentTypeError(f"positive whole sizes separated by commas, e.g. 256,128,64; got '{text}'")
    return [int(d) for d in dims]


def results_json(args: argparse.Namespace, encoder, measured, suites: list[str], whitening) -> dict[str, Any]:
    """What `--output` writes: the settings evaluated and every score, rounded to 4 decimals."""
    results: dict[str, Any] = {
        "model": args.model,
        "pooling": encoder.config.active_pooling(training=False),
        "pooling_layer": encoder.config.pooling_layer,
        "tasks": suites,
        "sts_mode": args.sts_mode,
        "sick_split": args.sick_split,
        "precision": "bf16" if args.bf16 else "fp32",
        # STS scores stay top-level keys, as before transfer tasks existed
        **{k: round(v, 4) for k, v in (measured.sts or {}).items()},
    }
    if measured.sts_whitened is not None:
        results["whitened"] = {
            spec.describe(): {"fit": spec.fit, "dims": spec.dims,
                              **{k: round(v, 4) for k, v in measured.sts_whitened[spec.describe()].items()}}
            for spec in whitening
        }
    if measured.sts_by_dim is not None:  # an encoder trained with matryoshka_dims: every smaller size too
        results["sts_by_dim"] = {
            d: {k: round(v, 4) for k, v in scores.items()} for d, scores in measured.sts_by_dim.items()
        }
    if measured.transfer is not None:
        results["transfer"] = {k: round(v, 4) for k, v in measured.transfer.items()}
        results["transfer_details"] = measured.transfer_details
        results["kfold"] = args.kfold
    if measured.glue is not None:  # per task: the dev scores of each seed's fine-tuning, their mean and spread
        results["glue"] = measured.glue
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    suites = split_commas(args.tasks)
    try:
        check_suites(suites)
        sts_only = [flag for flag, value in (("--whitening", args.whitening), ("--dims", args.dims)) if value]
        if sts_only and "sts" not in suites:
            raise ValueError(f"{' and '.join(sts_only)} score the STS tasks, which --tasks '{args.tasks}' leaves out; "
                             "add sts to --tasks.")
    except ValueError as err:
        print(f"error: --tasks: {err}", file=sys.stderr)
        return 2
    try:
        if args.output:  # before the model loads and encodes, not after the whole evaluation
            check_writable(Path(args.output).parent, "--output")
        whitening = [WhiteningSpec.parse(value) for value in args.whitening or ()]
        evaluation = EvaluationSuites(
            resolve_data_dir(args.data_dir), suites, sts_tasks=split_commas(args.sts_tasks), sts_mode=args.sts_mode,
            sick_split=args.sick_split, transfer_tasks=split_commas(args.transfer_tasks), kfold=args.kfold,
            probe_jobs=args.probe_jobs, whitening=whitening,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    encoder = load_encoder(args.model, args.pooling, args.pooling_layer)
    if args.dims:
        encoder.config.matryoshka_dims = args.dims
    import torch

    encoder.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    measured = evaluation(encoder, batch_size=args.batch_size, bf16=args.bf16)
    pooling = encoder.config.active_pooling(training=False)
    results = results_json(args, encoder, measured, suites, whitening)
    table = markdown_report({f"{args.model} ({pooling})": measured}, args.sts_mode)
    print(table)
    if args.output:
        json_path, md_path = write_report(args.output, results, table)
        print(f"\nWrote {json_path} and {md_path}")
    return 0
