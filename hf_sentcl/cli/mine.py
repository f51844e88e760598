"""`hf-sentcl mine`: mine a hard negative per (anchor, positive) pair and write the CSV supervised SimCSE reads.

    hf-sentcl mine --model embedded:all-MiniLM-L6-v2 --pooling mean --pairs stsb --corpus wiki.txt \\
        --relative-margin 0.05 --output mined.csv

Candidates are ranked by the encoder's cosine to the anchor, exactly (torch, by blocks); a sentence equal to the
anchor or to any positive of that anchor (pairs sharing an anchor are one group) is never a candidate; --rank-window
and the margins (against the anchor's lowest-scoring positive) skip likely false negatives (docs/mining.md).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.logs import setup_logging, watched
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.data.mining import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_POOL,
    OUTPUT_FORMATS,
    SAMPLING,
    MiningResult,
    MiningSettings,
    Pairs,
    build_pool,
    check_pool_size,
    mine_hard_negatives,
    parse_rank_window,
    read_corpus,
    read_pairs,
    write_rows,
)
from hf_sentcl.data.provenance import write_provenance
from hf_sentcl.modeling import POOLING_MODES
from hf_sentcl.modeling.backbone import backbone_config
from hf_sentcl.modeling.encoder import load_encoder
from hf_sentcl.recipe.run_folder import check_writable

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-sentcl mine", description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", required=True, help=f"Encoder: a run or export folder, a Hub id, or '{EMBEDDED_MODEL_ALIAS}'.")
    add("--pooling", choices=POOLING_MODES, default=None,
        help="Pooling (default: the saved encoder's, else the sentence-transformers folder's, else cls).")
    add("--pooling-layer", type=int, default=None, help="Hidden-state index for cls/mean/max.")
    add("--pairs", required=True,
        help="(anchor, positive) pairs: a .csv/.tsv file with a header row, or 'stsb' / 'stsb:SPLIT' (STS-B of the "
        "SentEval data, train by default).")
    add("--columns", default="sent0,sent1", help="The anchor and positive columns of a .csv/.tsv --pairs file.")
    add("--format", choices=("table", "stsb"), default=None,
        help="Layout of --pairs: a table, or SentEval's sts-*.csv (default: stsb for 'stsb[:SPLIT]', else table).")
    add("--min-score", type=float, default=None, help="STS-B pairs: keep those scored at least this (default 4.0).")
    add("--data-dir", default=None, help="SentEval data directory for 'stsb' (default: $HF_SENTCL_DATA).")
    add("--corpus", default=None, help="Candidate sentences, one per line, added to the pool.")
    add("--corpus-only", action="store_true", help="Candidates from --corpus alone, not the pairs' own sentences.")
    add("--rank-window", default="0:30",
        help="START:END: keep candidates ranked START..END-1 (from 0, after removing every sentence equal to the "
        "anchor or to one of its positives; default %(default)s).")
    add("--absolute-margin", type=float, default=None,
        help="Skip a candidate whose score + MARGIN > the positive's score (the lowest of the anchor's positives; "
        "sentence-transformers' absolute_margin).")
    add("--relative-margin", type=float, default=None,
        help="Skip a candidate scoring above positive - |positive| * MARGIN (positive: the lowest score of the "
        "anchor's positives; sentence-transformers' relative_margin; 0.05 is NV-Retriever's setting).")
    add("--sampling", choices=SAMPLING, default="top",
        help="top: the best-ranked survivor; random: one survivor drawn with --seed.")
    add("--seed", type=int, default=42, help="Seed of --sampling random (default %(default)s).")
    add("--num-negatives", type=int, default=1,
        help="Negatives per pair (default %(default)s), each chosen as --sampling says.")
    add("--output-format", choices=OUTPUT_FORMATS, default="triplet",
        help="triplet: a sent0,sent1,hard_neg row per negative (what simcse_sup trains on); n-tuple: one row per "
        "pair, sent0,sent1,hard_neg_1..N, only for pairs with all N (sentence-transformers' formats).")
    add("--max-pool", type=int, default=DEFAULT_MAX_POOL,
        help="Largest candidate pool the exact search accepts (default %(default)s).")
    add("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
        help="Pool sentences scored per block of the search (default %(default)s).")
    add("--batch-size", type=int, default=128, help="Sentences per encoding batch (default %(default)s).")
    add("--bf16", action="store_true", help="Encode under bf16 autocast.")
    add("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available).")
    add("--output", required=True,
        help="The .csv to write (columns sent0, sent1, hard_neg), and beside it OUTPUT.provenance.json, which names "
        "the MTEB datasets the file was built from (a run on the file copies it into its model card and "
        "leaderboard entry).")
    add("--mteb-dataset", action="append", default=[], metavar="TASK[:SPLIT]",
        help="Declare that --pairs or --corpus was taken from this MTEB dataset (repeatable), e.g. "
        "STSBenchmark:train for a copy of STS-B's train pairs; 'stsb[:SPLIT]' pairs are declared on their own.")
    return parser


def declared_datasets(pairs: Pairs, options: Sequence[str]) -> dict[str, list[str]]:
    """The MTEB datasets the mined file comes from: those of the pairs (STS-B when `--pairs stsb`) and every
    `--mteb-dataset TASK[:SPLIT]`."""
    declared = {task: list(splits) for task, splits in pairs.mteb_datasets.items()}
    for option in options:
        task, _, split = option.partition(":")
        if not task.strip():
            raise ValueError(f"--mteb-dataset '{option}': expected an MTEB task name, e.g. STSBenchmark:train.")
        splits = declared.setdefault(task.strip(), [])
        if split.strip() and split.strip() not in splits:
            splits.append(split.strip())
    return declared


def prepare(args: argparse.Namespace) -> tuple[MiningSettings, Pairs, list[str], dict[str, list[str]]]:
    """Check every option and read every input before the model loads: the settings, the pairs, the pool and the
    MTEB datasets the output will declare."""
    start, end = parse_rank_window(args.rank_window)
    settings = MiningSettings(
        rank_start=start, rank_end=end, absolute_margin=args.absolute_margin, relative_margin=args.relative_margin,
        sampling=args.sampling, seed=args.seed, max_pool=args.max_pool, block_size=args.block_size,
        num_negatives=args.num_negatives, output_format=args.output_format,
    )
    columns = split_commas(args.columns)
    if len(columns) != 2 or columns[0] == columns[1]:
        raise ValueError(f"--columns '{args.columns}': name two different columns, anchor then positive.")
    if Path(args.output).suffix.lower() != ".csv":
        raise ValueError(f"--output '{args.output}': the mined triplets are written as a .csv file.")
    check_writable(Path(args.output).expanduser().absolute().parent, "--output")
    pairs = read_pairs(args.pairs, columns, args.min_score, args.data_dir, args.format)
    if args.corpus_only and not args.corpus:
        raise ValueError("--corpus-only needs --corpus.")
    corpus = read_corpus(Path(args.corpus).expanduser()) if args.corpus else []
    pool = build_pool(pairs, corpus, include_pairs=not args.corpus_only)
    check_pool_size(len(pool), settings.max_pool)
    declared = declared_datasets(pairs, args.mteb_dataset)
    backbone_config(args.model, "--model")  # a model that cannot load fails here, saying what was looked for
    return settings, pairs, pool, declared


def summary(pairs: Pairs, result: MiningResult, output: str, seconds: float) -> str:
    """What the run did, in a few lines: pairs in, triplets out, anchors dropped, time."""
    skipped = ", ".join(f"{n:,} by the {name.replace('_', ' ')}" for name, n in result.skipped.items()) or "none"
    return "\n".join([
        f"Pairs in: {result.pairs_in:,} from {pairs.source} ({pairs.skipped:,} rows left out)",
        f"Candidate pool: {result.pool_size:,} sentences",
        f"Candidates in the rank window skipped: {skipped}",
        f"Rows out: {len(result.rows):,} -> {output}",
        f"Dropped anchors (no candidate left): {result.dropped:,}",
        f"Time: {seconds:.1f} s (encoding and search)",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        settings, pairs, pool, declared = prepare(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    encoder = load_encoder(args.model, args.pooling, args.pooling_layer)
    encoder.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logger.info("Mining %d pairs against %d candidate sentences", len(pairs), len(pool))
    started = time.perf_counter()
    result = mine_hard_negatives(encoder, pairs, pool, settings, args.batch_size, args.bf16, show_progress=watched())
    seconds = time.perf_counter() - started
    write_rows(Path(args.output).expanduser(), settings.columns(), result.rows)
    sidecar = write_provenance(
        args.output, declared, tool="hf-sentcl mine", pairs=pairs.source, corpus=args.corpus, model=args.model
    )
    print(summary(pairs, result, args.output, seconds))
    print(f"MTEB datasets in the file: {', '.join(declared) or 'none declared'} -> {sidecar}")
    return 0
