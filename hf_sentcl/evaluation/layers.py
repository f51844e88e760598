"""Analyses of a sentence encoder. `layers`: the layer x pooling study of the SG-BERT paper's Figure 1.

    hf-sentcl analyze layers --model PATH_OR_HUB_ID [--split dev|test] [--output-dir DIR] [--bf16]

Every hidden state 0..l (0 = the embedding layer's output) is pooled with [CLS], mean and max pooling and scored
on STS-B (Spearman x 100 of cosine similarity). The backbone runs ONCE per batch with all hidden states
returned, and every layer/pooling cell is pooled from that one forward pass. Writes `layers_<split>.csv`
(one row per hidden state, one column per pooling) and `layers_<split>.png` (the heatmap, best cell framed).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from scipy.stats import ConstantInputWarning
from tqdm.auto import tqdm

from hf_sentcl.common.tables import markdown_table
from hf_sentcl.evaluation.plots import plot_layer_heatmap
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.modeling.pooling import pool

LAYER_POOLINGS = ("cls", "mean", "max")


def pool_every_layer(
    hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, poolings: Sequence[str] = LAYER_POOLINGS
) -> torch.Tensor:
    """(batch, layers, poolings, dim): every hidden state pooled every way, from one forward pass's states."""
    return torch.stack(
        [torch.stack([pool(hidden_states, attention_mask, mode, k) for mode in poolings], dim=1)
         for k in range(len(hidden_states))],
        dim=1,
    )


def layer_pooling_scores(
    encoder: SentenceEncoder,
    evaluator: STSEvaluator,
    poolings: Sequence[str] = LAYER_POOLINGS,
    batch_size: int = 128,
    bf16: bool = False,
) -> np.ndarray:
    """Spearman x 100 on `evaluator`'s single task for every (hidden state, pooling): shape (l + 1, len(poolings)).

    A cell whose vectors are all equal (e.g. [CLS] of the embedding layer, which no sentence changes) has no
    correlation and is NaN.
    """
    if len(evaluator.tasks) != 1:
        raise ValueError(f"layer_pooling_scores scores one STS task; the evaluator has {list(evaluator.tasks)}.")
    backbone = encoder.backbone

    def every_layer(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        outputs = backbone(**batch, output_hidden_states=True, return_dict=True)
        return pool_every_layer(outputs.hidden_states, batch["attention_mask"], poolings)

    pooled = encoder.map_batches(
        evaluator.sentences(), every_layer, batch_size=batch_size, bf16=bf16, show_progress_bar=True
    ).numpy()
    task = evaluator.tasks[0]
    scores = np.full(pooled.shape[1:3], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        cells = [(k, j) for k in range(scores.shape[0]) for j in range(scores.shape[1])]
        for k, j in tqdm(cells, desc="Scoring layer x pooling", leave=False):
            scores[k, j] = evaluator.score(pooled[:, k, j])[task]
    return scores


def write_layer_csv(scores: np.ndarray, poolings: Sequence[str], path: str | os.PathLike) -> Path:
    """CSV with a header `layer,<pooling>...` and one row per hidden state (NaN written as `nan`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", *poolings])
        for k, row in enumerate(scores):
            writer.writerow([k, *(f"{v:.4f}" for v in row)])
    return path


def best_cell(scores: np.ndarray, poolings: Sequence[str]) -> tuple[int, str, float]:
    """(hidden state, pooling, score) of the highest cell."""
    layer, column = np.unravel_index(np.nanargmax(scores), scores.shape)
    return int(layer), poolings[column], float(scores[layer, column])


def run_layer_study(args: argparse.Namespace) -> int:
    try:
        data_dir = resolve_data_dir(args.data_dir)
        evaluator = STSEvaluator(data_dir, tasks=("STSBenchmark",), split=args.split)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    encoder = SentenceEncoder.load(args.model)
    encoder.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    scores = layer_pooling_scores(encoder, evaluator, LAYER_POOLINGS, args.batch_size, args.bf16)
    output_dir = Path(args.output_dir)
    csv_path = write_layer_csv(scores, LAYER_POOLINGS, output_dir / f"layers_{args.split}.csv")
    title = f"{Path(args.model).name or args.model}: STS-B {args.split}, Spearman × 100"
    png_path = plot_layer_heatmap(scores, LAYER_POOLINGS, output_dir / f"layers_{args.split}.png", title=title)
    body = ([k, *(f"{v:.2f}" if np.isfinite(v) else "n/a" for v in row)] for k, row in enumerate(scores))
    print("\n".join(markdown_table(["hidden state", *LAYER_POOLINGS], body, numeric_from=0)))
    if not np.isfinite(scores).all():
        print("\nn/a: every sentence gets the same vector there (e.g. [CLS] of the embedding layer), so the cosines "
              "are constant and Spearman's correlation is undefined.")
    layer, pooling, value = best_cell(scores, LAYER_POOLINGS)
    print(f"\nBest cell: hidden state {layer}, {pooling} pooling: {value:.2f}")
    print(f"Wrote {csv_path} and {png_path}")
    return 0
