"""`hf-sentcl evaluate`: evaluate an encoder on STS, transfer and GLUE suites from the command line, or with mteb's own
evaluation of any MTEB task or benchmark (`--mteb`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.layout import EXPORT_DIRNAME
from hf_sentcl.common.logs import setup_logging, watched
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS, STS_MODES
from hf_sentcl.evaluation.mteb import INSTALL_HINT, mteb_available
from hf_sentcl.evaluation.report import write_json, write_report
from hf_sentcl.evaluation.sts import STS_TASK_ALIASES, STS_TASKS, canonical_sts_tasks
from hf_sentcl.evaluation.suites import EVAL_SUITES, EvaluationSuites, check_suites, markdown_report
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS
from hf_sentcl.evaluation.whitening import WHITENING_FITS, WhiteningSpec
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling import POOLING_MODES
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
        "--tasks", default=None,
        help=f"Comma-separated suites: {', '.join(EVAL_SUITES)} (default: sts; glue fine-tunes with BERT's GLUE "
        "settings on the data directory's SST-2, MRPC and STS-B; `hf-sentcl glue` sets tasks, seeds and epochs).",
    )
    add_mteb_option(parser)
    parser.add_argument(
        "--sts-tasks", default=",".join(STS_TASKS),
        help=f"Subset of the 7 STS tasks (any case; also {', '.join(STS_TASK_ALIASES)}).",
    )
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


def add_mteb_option(parser: argparse.ArgumentParser) -> None:
    """`--mteb`: mteb's own evaluation instead of hf_sentcl's suites."""
    parser.add_argument(
        "--mteb", default=None, metavar="TASKS_OR_BENCHMARK",
        help="Instead of the suites: mteb's own evaluation (any task type) of comma-separated MTEB task names or one "
        "benchmark name, e.g. STS12,SciFact or 'MTEB(eng, v2)'. Writes mteb's result files into mteb_results/ beside "
        "--output (else in the run folder) and a summary JSON to --output. Needs the mteb package.",
    )


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
    if args.mteb is not None:
        return mteb_main(args)
    suites = split_commas(args.tasks or "sts")
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
            resolve_data_dir(args.data_dir), suites, sts_tasks=canonical_sts_tasks(split_commas(args.sts_tasks)),
            sts_mode=args.sts_mode, sick_split=args.sick_split, transfer_tasks=split_commas(args.transfer_tasks),
            kfold=args.kfold, probe_jobs=args.probe_jobs, whitening=whitening,
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


# ------------------------------------------------------------------------------------------------ --mteb
def check_mteb_options(args: argparse.Namespace) -> None:
    """ValueError for options of the SentEval suites given with --mteb, which runs none of them."""
    given = [flag for flag, value in (("--tasks", args.tasks), ("--whitening", args.whitening), ("--dims", args.dims))
             if value]
    if given:
        raise ValueError(f"{' and '.join(given)} set hf_sentcl's own suites, which --mteb does not run; run them in a "
                         "second `hf-sentcl evaluate` without --mteb.")
    if not mteb_available():
        raise ValueError(f"mteb is not installed: {INSTALL_HINT}.")


def mteb_main(args: argparse.Namespace) -> int:
    """`--mteb`: everything that can be refused is checked before the model loads (options, task and benchmark
    names, where the files go, the data when offline: exit 2); then mteb evaluates task after task, one line each,
    its result files land in mteb_results/ and the summary in --output."""
    from hf_sentcl.evaluation import mteb_run

    logging.getLogger("mteb").setLevel(logging.WARNING)  # a line per phase of every task: the task lines suffice
    try:
        check_mteb_options(args)
        tasks, benchmark = mteb_run.resolve_tasks(args.mteb)
        root, name = mteb_run.results_root(args.model, args.output)
        check_writable(root.parent, "--mteb results")  # mteb_results/ itself only once results come
        if args.output:
            check_writable(Path(args.output).parent, "--output")
        mteb_run.check_offline_data(tasks)
    except ValueError as err:
        print(f"error: --mteb: {err}", file=sys.stderr)
        return 2
    encoder = load_encoder(args.model, args.pooling, args.pooling_layer)
    import torch

    encoder.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = mteb_run.model_meta(root, name, encoder)
    model = mteb_run.MtebEncoder(encoder, meta, batch_size=args.batch_size, bf16=args.bf16, bars=watched())
    try:
        scores = mteb_run.evaluate_tasks(model, tasks, root, bars=watched())
        folder = mteb_run.check_results_load(root, meta, list(scores))
        check_export_submission(root, folder)
    except ValueError as err:
        print(f"error: --mteb: {err}", file=sys.stderr)
        return 1
    print(f"\nmteb's result files for {meta.name} at revision {meta.revision}: {folder}")
    summary = mteb_run.mteb_summary(scores, meta, folder, model=args.model, benchmark=benchmark,
                                    pooling=encoder.config.active_pooling(training=False))
    if args.output:
        print(f"Wrote {write_json(args.output, summary)}")
    card_with_mteb_scores(args.model, summary)
    return 0


def card_with_mteb_scores(model: str, summary: dict) -> None:
    """When `model` is a run (or its export) whose export has a card, render that card again with mteb's own
    scores in their own section, so a push publishes them saying where they came from."""
    from hf_sentcl.evaluation.mteb_run import run_folder_of
    from hf_sentcl.export.card import add_mteb_evaluation
    from hf_sentcl.export.results import CARD_INPUTS

    run = run_folder_of(model)
    export = run / EXPORT_DIRNAME if run is not None else None
    if export is not None and (export / CARD_INPUTS).is_file():
        print(f"The export's card lists mteb's scores now: {add_mteb_evaluation(export, summary)}")


def check_export_submission(root: Path, folder: Path) -> None:
    """When `root` holds an export's leaderboard submission (its model_meta.py), check it again as `export` does,
    so that mteb's files joining it leave it whole for `push` (ValueError naming the file that no longer fits)."""
    from hf_sentcl.export.mteb_meta import MODEL_META_MODULE

    if (root / MODEL_META_MODULE).is_file():
        from hf_sentcl.export.mteb_files import check_mteb_submission

        check_mteb_submission(folder)
