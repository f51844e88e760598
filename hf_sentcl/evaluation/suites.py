"""Evaluate an encoder on STS and transfer tasks from the command line; the same suites end every training run.

    hf-sentcl evaluate --model PATH_OR_HUB_ID --pooling mean --tasks sts,transfer --output results.json
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_sentcl.common.progress import phase
from hf_sentcl.evaluation.glue import GlueEvaluator, GlueSettings, glue_markdown_table
from hf_sentcl.evaluation.plots import stsb_predictions
from hf_sentcl.evaluation.report import sts_markdown_table, transfer_markdown_table
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator
from hf_sentcl.evaluation.transfer import SENTEVAL_SEED, TRANSFER_TASKS, TransferEvaluator, transfer_summary
from hf_sentcl.evaluation.whitening import WhiteningSpec, whitened_sts_scores

EVAL_SUITES = ("sts", "transfer", "glue")


def check_suites(suites: Sequence[str]) -> None:
    """Raise ValueError naming any suite that is not one of `EVAL_SUITES`."""
    unknown = [s for s in suites if s not in EVAL_SUITES]
    if unknown:
        raise ValueError(f"unknown evaluation suite(s) {unknown}; known: {', '.join(EVAL_SUITES)}.")


def suite_settings(data) -> tuple[list[WhiteningSpec], GlueSettings | None]:
    """The whitenings and GLUE settings of a recipe's `DataArguments`, checked (ValueError naming the key)."""
    try:
        whitening = [WhiteningSpec.parse(v) for v in data.eval_whitening or ()]
    except ValueError as err:
        raise ValueError(f"key 'eval_whitening': {err}") from None
    if "glue" not in data.eval_tasks:
        return whitening, None
    glue = GlueSettings(
        tasks=tuple(data.glue_tasks), source=data.glue_source, seeds=tuple(data.glue_seeds),
        epochs=data.glue_epochs, max_train_samples=data.glue_max_train_samples,
    )
    try:
        glue.check()
    except ValueError as err:
        raise ValueError(f"keys 'glue_*': {err}") from None
    return whitening, glue


@dataclass
class SuiteResults:
    """What `EvaluationSuites` measured for one encoder; None for a suite that was not run."""

    sts: dict[str, float] | None = None
    #: gold scores and cosines of the STS-B test pairs (for the scatter plot), when STS-B was evaluated
    stsb_predictions: dict[str, list[float]] | None = None
    transfer: dict[str, float] | None = None
    transfer_details: dict[str, dict[str, Any]] | None = None
    #: GLUE dev scores after fine-tuning a copy of the backbone per task and seed (`hf-sentcl glue`)
    glue: dict[str, dict[str, Any]] | None = None
    #: the STS scores after each whitening of the embeddings (`whitening`), keyed by its description
    sts_whitened: dict[str, dict[str, float]] | None = None
    #: the STS scores of each leading prefix the encoder was trained for (`matryoshka_dims`), keyed by its size
    sts_by_dim: dict[str, dict[str, float]] | None = None


class EvaluationSuites:
    """The final evaluation of an encoder: STS (7 tasks) and/or transfer tasks, from one SentEval data directory.

    All data is read here, so a missing file fails before any model is loaded or trained.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None,
        suites: Sequence[str],
        *,
        sts_tasks: Sequence[str] = STS_TASKS,
        sts_mode: str = "all",
        sick_split: str | None = None,
        transfer_tasks: Sequence[str] = TRANSFER_TASKS,
        kfold: int = 10,
        seed: int = SENTEVAL_SEED,
        probe_jobs: int = 1,
        whitening: Sequence[WhiteningSpec] = (),
        glue: GlueSettings | None = None,
    ):
        check_suites(suites)
        for spec in whitening:
            spec.check()
        self.suites = tuple(suites)
        self.sts_mode = sts_mode
        self.whitening = tuple(whitening)
        self.sts = (
            STSEvaluator(data_dir, tasks=tuple(sts_tasks), mode=sts_mode, sick_split=sick_split)
            if "sts" in suites else None
        )
        self.transfer = (
            TransferEvaluator(data_dir, tasks=tuple(transfer_tasks), kfold=kfold, seed=seed, n_jobs=probe_jobs)
            if "transfer" in suites else None
        )
        self.glue = GlueEvaluator(data_dir, glue or GlueSettings()) if "glue" in suites else None

    def __call__(self, encoder, batch_size: int = 128, bf16: bool = False) -> SuiteResults:
        results = SuiteResults()
        if self.sts is not None:
            with phase("STS", f"encoding {len(self.sts.sentences()):,} sentences of {len(self.sts.data)} task(s)"):
                embeddings = self.sts.embed(encoder, batch_size=batch_size, bf16=bf16)
            results.sts = self.sts.score(embeddings)
            results.sts_by_dim = prefix_sts_scores(self.sts, embeddings, encoder)
            if self.whitening:  # every whitening reuses the one encode pass
                results.sts_whitened = {
                    spec.describe(): whitened_sts_scores(self.sts, embeddings, spec, encoder, batch_size, bf16)
                    for spec in self.whitening
                }
            if "STSBenchmark" in self.sts.data:
                results.stsb_predictions = stsb_predictions(self.sts, embeddings)
        if self.transfer is not None:
            with phase("Transfer", f"{len(self.transfer.tasks)} task(s), a probe each"):
                results.transfer_details = self.transfer(encoder, batch_size=batch_size, bf16=bf16)
            results.transfer = transfer_summary(results.transfer_details)
        if self.glue is not None:  # fine-tuned where the encoder is (`evaluate --device cpu` on a GPU machine)
            with phase("GLUE", f"fine-tuning on {len(self.glue.data)} task(s)"):
                results.glue = self.glue(encoder, device=encoder.device.type)
        return results


def prefix_sts_scores(sts: STSEvaluator, embeddings: np.ndarray, encoder) -> dict[str, dict[str, float]] | None:
    """STS scores of the first d dimensions of the same embeddings (cosine re-normalises them), for every d of the
    encoder's `matryoshka_dims` smaller than the embedding; None when it has none."""
    dims = getattr(getattr(encoder, "config", None), "matryoshka_dims", None) or []
    scores = {str(d): sts.score(embeddings[:, :d]) for d in dims if d < embeddings.shape[1]}
    return scores or None


def markdown_report(rows: Mapping[str, SuiteResults], sts_mode: str) -> str:
    """The STS and transfer tables (those that were run) of labelled results, one row per label (and one more per
    label and whitening for whitened STS scores)."""
    tables = []
    sts = {}
    for label, r in rows.items():
        if r.sts is not None:
            sts[label] = r.sts
        for whitening, scores in (r.sts_whitened or {}).items():
            sts[f"{label}, {whitening}"] = scores
        for dims, scores in (r.sts_by_dim or {}).items():
            sts[f"{label}, first {dims} dims"] = scores
    if sts:
        tables.append(sts_markdown_table(sts, sts_mode))
    transfer = {label: r.transfer for label, r in rows.items() if r.transfer is not None}
    if transfer:
        tables.append(transfer_markdown_table(transfer))
    glue = {label: r.glue for label, r in rows.items() if r.glue is not None}
    if glue:
        tables.append(glue_markdown_table(glue))
    return "\n\n".join(tables)


def run_results(final: Mapping[str, SuiteResults]) -> dict[str, Any]:
    """A run's `results.json` entries from its 'before'/'after' evaluations (`RUN_LABELS`): `sts` (always, maybe
    empty) and, when transfer tasks ran, `transfer` (table rows) and `transfer_details` (per-task probe results)."""
    results: dict[str, Any] = {"sts": {k: r.sts for k, r in final.items() if r.sts is not None}}
    whitened = {k: r.sts_whitened for k, r in final.items() if r.sts_whitened is not None}
    if whitened:
        results["sts_whitened"] = whitened
    by_dim = {k: r.sts_by_dim for k, r in final.items() if r.sts_by_dim is not None}
    if by_dim:
        results["sts_by_dim"] = by_dim
    transfer = {k: r.transfer for k, r in final.items() if r.transfer is not None}
    if transfer:
        results["transfer"] = transfer
        results["transfer_details"] = {k: r.transfer_details for k, r in final.items() if r.transfer is not None}
    glue = {k: r.glue for k, r in final.items() if r.glue is not None}
    if glue:
        results["glue"] = glue
    return results
