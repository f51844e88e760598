"""Evaluate an encoder on STS from the command line.

    python -m hf_sentcl.evaluate --model PATH_OR_HUB_ID --pooling mean --tasks sts --output results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sentcl.defaults import EMBEDDED_MODEL_ALIAS, resolve_data_dir
from hf_sentcl.evaluation.report import sts_markdown_table
from hf_sentcl.evaluation.sts import STS_MODES, STS_TASKS, STSEvaluator
from hf_sentcl.modeling import POOLING_MODES, SentenceEncoder

KNOWN_SUITES = ("sts",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hf_sentcl.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help=f"Path, Hub id, or '{EMBEDDED_MODEL_ALIAS}'.")
    parser.add_argument(
        "--pooling", choices=POOLING_MODES, default=None,
        help="Pooling to evaluate with (default: the saved encoder's, or 'cls' for a plain backbone).",
    )
    parser.add_argument("--pooling-layer", type=int, default=None, help="Hidden-state index for cls/mean/max.")
    parser.add_argument("--tasks", default="sts", help="Comma-separated suites: sts.")
    parser.add_argument("--sts-tasks", default=",".join(STS_TASKS), help="Subset of the 7 STS tasks.")
    parser.add_argument("--sts-mode", choices=STS_MODES, default="all", help="How STS12-16 subsets combine.")
    parser.add_argument(
        "--sick-split", choices=("test", "all"), default="test",
        help="SICK-R pairs: SentEval's test split (papers) or all 9,927 pairs (MTEB's SICK-R).",
    )
    parser.add_argument("--data-dir", default=None, help="SentEval-format directory (default: $HF_SENTCL_DATA).")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--bf16", action="store_true", help="Encode under bf16 autocast.")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    parser.add_argument("--output", default=None, help="Write results JSON here (and a .md table beside it).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    suites = [s.strip() for s in args.tasks.split(",") if s.strip()]
    unknown = [s for s in suites if s not in KNOWN_SUITES]
    if unknown:
        print(f"error: --tasks: unknown suite(s) {unknown}; known: {', '.join(KNOWN_SUITES)}.", file=sys.stderr)
        return 2
    try:
        data_dir = resolve_data_dir(args.data_dir)
        evaluator = STSEvaluator(
            data_dir, tasks=tuple(t for t in args.sts_tasks.split(",") if t), mode=args.sts_mode,
            sick_split=args.sick_split,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    overrides = {k: v for k, v in (("pooling", args.pooling), ("pooling_layer", args.pooling_layer)) if v is not None}
    if args.pooling is not None:  # the pooling asked for is the one evaluated, whatever the encoder saved for eval
        overrides["inference_pooling"] = None
    encoder = SentenceEncoder.load(args.model, **overrides)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    encoder.to(device)
    scores = evaluator(encoder, batch_size=args.batch_size, bf16=args.bf16)
    pooling = encoder.config.active_pooling(training=False)
    results = {
        "model": args.model,
        "pooling": pooling,
        "pooling_layer": encoder.config.pooling_layer,
        "sts_mode": args.sts_mode,
        "sick_split": args.sick_split,
        "precision": "bf16" if args.bf16 else "fp32",
        **{k: round(v, 4) for k, v in scores.items()},
    }
    table = sts_markdown_table({f"{args.model} ({pooling})": scores}, args.sts_mode)
    print(table)
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
        output.with_suffix(".md").write_text(table + "\n")
        print(f"\nWrote {output} and {output.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
