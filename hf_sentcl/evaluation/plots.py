"""Figures of a run and of the layer study, drawn with matplotlib's object API on the Agg canvas (no display,
no pyplot global state, safe in a training process).

- `plot_training_curves`: training loss, STS-B dev Spearman and (when logged) alignment/uniformity against steps,
  from `Trainer.state.log_history`.
- `plot_sts_scatter`: gold score against predicted cosine similarity of STS-B test pairs, before and after
  training (the ConSERT paper's Figure 1: a collapsed space squeezes every pair into a narrow band of high
  cosines).
- `plot_layer_heatmap`: Spearman of every hidden state x pooling (the SG-BERT paper's Figure 1).
- `plot_fewshot_curve`: 7-STS average against the number of training texts (the ConSERT paper's Figure 6).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_sentcl.common.layout import PLOTS_DIRNAME
from hf_sentcl.evaluation.sts import STSEvaluator, cosine_rows, spearman_x100

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TRAINING_CURVES = "training_curves.png"
STS_SCATTER = "stsb_scatter.png"
# file name -> caption, in the order the model card shows them
PLOT_CAPTIONS = {
    TRAINING_CURVES: "Training loss, STS-B dev Spearman and (when logged) dev alignment/uniformity against steps.",
    STS_SCATTER: "STS-B test: gold similarity against the cosine similarity of the sentence vectors, before and "
    "after training.",
}
DPI = 120


def _figure(**kwargs: Any) -> Figure:
    """A matplotlib `Figure` (no pyplot, no GUI backend). matplotlib is imported here, on the first plot: its 0.4 s
    of import would otherwise be in the start of every process that imports the package."""
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def _save(figure: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(entry["step"], float(entry[key])) for entry in history if key in entry and "step" in entry]
    return [s for s, _ in points], [v for _, v in points]


def plot_training_curves(history: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path | None:
    """Loss, dev Spearman and alignment/uniformity against steps, one panel each, for what `history` holds.

    `history` is `Trainer.state.log_history` (loss logs have `loss`, dev evaluations `eval_stsb_spearman`,
    `eval_alignment`, `eval_uniformity`). Returns the PNG path, or None when nothing was logged.
    """
    loss = _series(history, "loss")
    dev = _series(history, "eval_stsb_spearman")
    alignment, uniformity = _series(history, "eval_alignment"), _series(history, "eval_uniformity")
    panels = [p for p, series in (("loss", loss), ("dev", dev), ("geometry", alignment)) if series[0]]
    if not panels:
        return None
    figure = _figure(figsize=(4.2 * len(panels), 3.4))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if panel == "loss":
            ax.plot(*loss, color="tab:blue", linewidth=1.2)
            ax.set_ylabel("training loss")
            ax.set_title("Training loss", pad=14)
        elif panel == "dev":
            ax.plot(*dev, color="tab:green", marker="o", markersize=3)
            best = int(np.argmax(dev[1]))
            ax.plot(dev[0][best], dev[1][best], marker="*", markersize=10, color="tab:orange")
            ax.set_ylabel("Spearman × 100")
            ax.set_title(f"STS-B dev (best {dev[1][best]:.2f} at step {dev[0][best]})", pad=14)
        else:
            ax.plot(*alignment, color="tab:red", marker="o", markersize=3, label="alignment")
            ax.set_ylabel("alignment (lower is better)", color="tab:red")
            ax.set_title("STS-B dev alignment / uniformity", pad=14)
            if uniformity[0]:
                twin = ax.twinx()
                twin.plot(*uniformity, color="tab:purple", marker="s", markersize=3, label="uniformity")
                twin.set_ylabel("uniformity (lower is better)", color="tab:purple")
    return _save(figure, path)


def stsb_predictions(evaluator: STSEvaluator, embeddings: np.ndarray, task: str = "STSBenchmark") -> dict[str, list]:
    """Gold scores and cosine similarities of `task`'s pairs from `evaluator.embed` output (no second encode).

    Returned as JSON-friendly lists: {'gold': [...], 'cosine': [...]}.
    """
    if task not in evaluator.data:
        raise ValueError(f"the evaluator has no '{task}' data (tasks: {', '.join(evaluator.data)}).")
    gold, cosine = [], []
    for pairs in evaluator.data[task].values():
        gold.append(pairs.scores)
        cosine.append(cosine_rows(*evaluator.pair_embeddings(embeddings, pairs)))
    return {"gold": np.concatenate(gold).tolist(), "cosine": np.concatenate(cosine).tolist()}


def plot_sts_scatter(
    predictions: Mapping[str, Mapping[str, Sequence[float]]], path: str | os.PathLike, task: str = "STS-B test"
) -> Path | None:
    """One panel per label (e.g. 'before training', 'after training'): gold score (x) against cosine (y).

    `predictions` maps a label to {'gold': [...], 'cosine': [...]} (see `stsb_predictions`). The panels share
    their y axis, so a collapsed space (all cosines high) is visible at a glance. None when `predictions` is empty.
    """
    if not predictions:
        return None
    figure = _figure(figsize=(4.2 * len(predictions), 3.8))
    axes = figure.subplots(1, len(predictions), squeeze=False, sharey=True)[0]
    lowest = 0.0
    for ax, (label, values) in zip(axes, predictions.items()):
        gold, cosine = np.asarray(values["gold"]), np.asarray(values["cosine"])
        ax.scatter(gold, cosine, s=6, alpha=0.4, color="tab:blue", edgecolors="none")
        lowest = min(lowest, float(cosine.min()))
        ax.set_title(f"{label}\nSpearman × 100 = {spearman_x100(gold, cosine):.2f}", fontsize=10)
        ax.set_xlabel("gold similarity")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine similarity")
    # from 0 (or below) to 1, so a collapsed space shows as a thin band near 1 rather than being zoomed into
    axes[0].set_ylim(lowest - 0.05, 1.05)
    figure.suptitle(task, fontsize=11)
    return _save(figure, path)


def plot_layer_heatmap(
    scores: np.ndarray, poolings: Sequence[str], path: str | os.PathLike, title: str = "STS-B Spearman × 100"
) -> Path:
    """A heatmap of `scores` (hidden states 0..l as rows, `poolings` as columns), each cell annotated and the best
    one framed. NaN cells (no correlation defined) are blank and marked n/a."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(poolings):
        raise ValueError(f"scores must be (layers, {len(poolings)}), got shape {scores.shape}.")
    layers = scores.shape[0]
    figure = _figure(figsize=(1.3 * len(poolings) + 2.2, 0.42 * layers + 1.6))
    ax = figure.subplots()
    image = ax.imshow(scores, cmap="viridis", aspect="auto", origin="lower")
    figure.colorbar(image, ax=ax, label="Spearman × 100")
    ax.set_xticks(range(len(poolings)), labels=list(poolings))
    ax.set_yticks(range(layers), labels=[("0 (embeddings)" if k == 0 else str(k)) for k in range(layers)])
    ax.set_xlabel("pooling")
    ax.set_ylabel("hidden state")
    middle = (np.nanmax(scores) + np.nanmin(scores)) / 2
    for k in range(layers):
        for j in range(len(poolings)):
            value = scores[k, j]
            ax.text(j, k, f"{value:.1f}" if np.isfinite(value) else "n/a", ha="center", va="center", fontsize=8,
                    color="black" if not value <= middle else "white")
    from matplotlib.patches import Rectangle

    best_layer, best_pooling = np.unravel_index(np.nanargmax(scores), scores.shape)
    ax.add_patch(Rectangle((best_pooling - 0.5, best_layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    ax.set_title(title, fontsize=10)
    return _save(figure, path)


def plot_fewshot_curve(
    points: Mapping[int, tuple[float, float]],
    path: str | os.PathLike,
    before: float | None = None,
    full: float | None = None,
    ylabel: str = "7-STS average Spearman × 100",
) -> Path:
    """Score against the number of training texts on a log x axis: {texts: (mean, std)} as points with error bars,
    the untouched model (`before`) and the full-data run (`full`) as horizontal lines."""
    if not points:
        raise ValueError("plot_fewshot_curve needs at least one (texts, (mean, std)) point.")
    sizes = sorted(points)
    means = np.array([points[n][0] for n in sizes])
    stds = np.array([points[n][1] for n in sizes])
    figure = _figure(figsize=(5.4, 3.8))
    ax = figure.subplots()
    ax.errorbar(sizes, means, yerr=stds, marker="o", markersize=4, capsize=3, color="tab:blue",
                label="random subset (mean ± std over seeds)")
    if full is not None:
        ax.axhline(full, color="tab:green", linestyle="--", label=f"full data ({full:.2f})")
    if before is not None:
        ax.axhline(before, color="tab:gray", linestyle=":", label=f"untouched model ({before:.2f})")
    ax.set_xscale("log")
    ax.set_xticks(sizes, labels=[f"{n:,}" for n in sizes])
    ax.set_xlabel("number of unlabeled training texts")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(figure, path)


def write_run_plots(
    output_dir: str | os.PathLike,
    history: Sequence[Mapping[str, Any]],
    sts_predictions: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
) -> dict[str, str]:
    """Write a run's figures into `output_dir/plots/`; returns {file name: path relative to output_dir} of those
    written.

    `sts_predictions` maps 'before training' / 'after training' to `stsb_predictions` output; the scatter plot
    is drawn when it is given.
    """
    folder = Path(output_dir) / PLOTS_DIRNAME
    written = {
        TRAINING_CURVES: plot_training_curves(history, folder / TRAINING_CURVES),
        STS_SCATTER: plot_sts_scatter(sts_predictions or {}, folder / STS_SCATTER),
    }
    return {name: f"{PLOTS_DIRNAME}/{name}" for name, path in written.items() if path is not None}
