"""`hf-sentcl glue`: GLUE fine-tuning of an encoder's backbone from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sentcl.common.argv import parse_ints, split_commas
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.evaluation.glue import (
    GLUE_SOURCES,
    GLUE_TASKS,
    SENTEVAL_GLUE_TASKS,
    GlueEvaluator,
    GlueSettings,
    glue_markdown_table,
)
from hf_sentcl.evaluation.report import write_report
from hf_sentcl.recipe.run_folder import check_writable


# ------------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sentcl glue", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Saved encoder, plain backbone, Hub id or the embedded alias.")
    parser.add_argument(
        "--tasks", default=",".join(SENTEVAL_GLUE_TASKS),
        help=f"Comma-separated: {', '.join(GLUE_TASKS)} (default: {','.join(SENTEVAL_GLUE_TASKS)}, the offline ones).",
    )
    parser.add_argument("--source", choices=GLUE_SOURCES, default="senteval",
                        help="senteval: the data directory's SST-2/MRPC/STS-B (offline); hub: nyu-mll/glue (online).")
    parser.add_argument("--seeds", default="1", help="Comma-separated fine-tuning seeds (mean ± std over them).")
    parser.add_argument("--epochs", type=float, default=3.0, help="Fine-tuning epochs per task and seed (default 3).")
    parser.add_argument("--learning-rate", type=float, default=2e-5,
                        help="AdamW learning rate, 10%% warm-up then linear decay (default 2e-5).")
    parser.add_argument("--batch-size", type=int, default=32, help="Fine-tuning batch size (default 32).")
    parser.add_argument("--max-seq-length", type=int, default=128,
                        help="Tokens per sentence or sentence pair (default 128).")
    parser.add_argument("--max-train-samples", type=int, default=None, help="Fine-tune on the first N train examples.")
    parser.add_argument(
        "--data-dir", default=None,
        help="SentEval-format directory or hf:// archive (default: $HF_SENTCL_DATA, else the Hub archive; "
        "`hf-sentcl data info` shows which).",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available).")
    parser.add_argument("--output", default=None, help="Write results JSON here (and a .md table beside it).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        settings = GlueSettings(
            tasks=tuple(split_commas(args.tasks)), source=args.source, seeds=tuple(parse_ints(args.seeds, "--seeds")),
            epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size,
            max_seq_length=args.max_seq_length, max_train_samples=args.max_train_samples,
        )
        evaluator = GlueEvaluator(args.data_dir, settings)
        if args.output:  # before hours of fine-tuning, not after
            check_writable(Path(args.output).parent, "--output")
    except (FileNotFoundError, ValueError) as err:  # RecipeError of check_writable included
        print(f"error: {err}", file=sys.stderr)
        return 2
    from hf_sentcl.modeling import SentenceEncoder

    results = evaluator(SentenceEncoder.load(args.model), device=args.device)
    table = glue_markdown_table({args.model: results})
    print(table)
    if args.output:
        payload = {"model": args.model, "source": args.source, "settings": {
            k: v for k, v in vars(settings).items() if k != "extra"}, "tasks": results}
        json_path, md_path = write_report(args.output, payload, table, default=list)
        print(f"\nWrote {json_path} and {md_path}")
    return 0
