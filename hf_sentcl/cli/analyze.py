"""`hf-sentcl analyze layers`: the layer x pooling study of an encoder from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sentcl.common import exits
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.evaluation.layers import run_layer_study
from hf_sentcl.recipe.parser import RecipeError
from hf_sentcl.recipe.run_folder import check_writable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sentcl analyze", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    layers = commands.add_parser(
        "layers", help="Score every hidden state with cls/mean/max pooling on STS-B; write a CSV and a heatmap."
    )
    layers.add_argument("--model", required=True, help=f"Path, Hub id, or '{EMBEDDED_MODEL_ALIAS}'.")
    layers.add_argument("--split", choices=("dev", "test"), default="dev", help="STS-B split to score on.")
    layers.add_argument(
        "--data-dir", default=None,
        help="SentEval-format directory or hf:// archive (default: $HF_SENTCL_DATA, else the Hub archive; "
        "`hf-sentcl data info` shows which).",
    )
    layers.add_argument("--output-dir", default="layer_study", help="Where layers_<split>.csv/.png go.")
    layers.add_argument("--batch-size", type=int, default=128)
    layers.add_argument("--bf16", action="store_true", help="Run the backbone under bf16 autocast.")
    layers.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:  # before the model loads and encodes every layer, not after
        check_writable(Path(args.output_dir), "--output-dir")
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    return {"layers": run_layer_study}[args.command](args)
