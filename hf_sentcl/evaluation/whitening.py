"""Whitening of sentence embeddings before cosine similarity (Su et al. 2021, "Whitening Sentence
Representations for Better Semantics and Faster Retrieval").

x -> (x - mu) W, with mu the mean of a fitting corpus's embeddings and W = U diag(1 / sqrt(s)) from the SVD
U diag(s) U^T of their covariance; keeping W's first k columns also reduces the dimension. On the fitting corpus the
whitened embeddings have zero mean and identity covariance, which removes the anisotropy (one dominant direction,
high cosines everywhere) that hurts raw BERT-style embeddings on STS. Like BERT-flow and SG-BERT's other
post-processing baselines, it changes the encoder's output, not its weights.

Fitting corpora (`fit`): `eval` (the default) fits one transform on every sentence the STS evaluation encodes
(all loaded tasks pooled), `task` fits one per STS task on that task's own sentences (Su et al.'s code fits on
the sentences of the task being scored), a path fits on that text file's lines (one sentence per line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: `fit` values that name no file
WHITENING_FITS = ("eval", "task")


@dataclass
class Whitening:
    """A fitted whitening transform: `(x - mean) @ matrix` with `matrix` of shape (d, k)."""

    mean: np.ndarray
    matrix: np.ndarray

    @classmethod
    def fit(cls, embeddings: np.ndarray, dims: int | None = None) -> Whitening:
        """Fit on (n, d) embeddings: mu = their mean, W = U diag(1/sqrt(s)) of their covariance's SVD, first `dims`
        columns (all d when None). Directions of (numerically) zero variance are dropped rather than blown up."""
        x = np.asarray(embeddings, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"whitening needs at least 2 embeddings to fit on, got an array of shape {x.shape}.")
        if dims is not None and not 1 <= dims <= x.shape[1]:
            raise ValueError(f"whitening dims must be in [1, {x.shape[1]}] (the embedding size), got {dims}.")
        mean = x.mean(axis=0)
        covariance = np.cov(x - mean, rowvar=False, bias=True)
        u, s, _ = np.linalg.svd(covariance)
        keep = s > s[0] * 1e-10 if s[0] > 0 else np.zeros_like(s, dtype=bool)
        if not keep.any():
            raise ValueError("whitening: the fitting embeddings are all identical (zero covariance).")
        matrix = u[:, keep] / np.sqrt(s[keep])
        return cls(mean=mean, matrix=matrix[:, :dims] if dims else matrix)

    def __call__(self, embeddings: np.ndarray) -> np.ndarray:
        """Whiten (n, d) embeddings -> (n, k)."""
        return (np.asarray(embeddings, dtype=np.float64) - self.mean) @ self.matrix


@dataclass(frozen=True)
class WhiteningSpec:
    """What to fit the whitening on (`fit`: 'eval', 'task' or a text file) and how many dimensions to keep."""

    fit: str = "eval"
    dims: int | None = None

    @classmethod
    def parse(cls, value: str) -> WhiteningSpec:
        """'eval', 'task', a file path, each optionally followed by ':K' (dimensions kept)."""
        fit, _, dims = str(value).rpartition(":") if ":" in str(value) else (str(value), "", "")
        if dims and not dims.isdigit():
            fit, dims = str(value), ""
        spec = cls(fit or "eval", int(dims) if dims else None)
        spec.check()
        return spec

    def check(self) -> None:
        """Raise ValueError naming a missing fitting file or a non-positive `dims` (before any model loads)."""
        if self.fit not in WHITENING_FITS and not fit_file(self.fit).is_file():
            raise ValueError(
                f"whitening fit '{self.fit}' is neither {' nor '.join(WHITENING_FITS)} nor an existing text file "
                "(one sentence per line)."
            )
        if self.dims is not None and self.dims < 1:
            raise ValueError(f"whitening dims must be a positive number of dimensions, got {self.dims}.")

    def describe(self) -> str:
        corpus = {"eval": "all evaluation sentences", "task": "each task's sentences"}.get(self.fit, self.fit)
        return f"whitened (fit: {corpus}" + (f", k={self.dims})" if self.dims else ")")


def fit_file(path: str) -> Path:
    return Path(os.path.expandvars(path)).expanduser()


def read_fit_sentences(path: str) -> list[str]:
    """The non-empty lines of a fitting file."""
    sentences = [line.strip() for line in fit_file(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(sentences) < 2:
        raise ValueError(f"whitening fit file '{path}' has fewer than 2 non-empty lines.")
    return sentences


def task_sentences(evaluator, task: str) -> list[str]:
    """The distinct sentences of one loaded STS task of an `STSEvaluator`."""
    unique: dict[str, None] = {}
    for pairs in evaluator.data[task].values():
        unique.update(dict.fromkeys(pairs.sentences1))
        unique.update(dict.fromkeys(pairs.sentences2))
    return list(unique)


def whitened_sts_scores(
    evaluator, embeddings: np.ndarray, spec: WhiteningSpec, encoder=None, batch_size: int = 128, bf16: bool = False
) -> dict[str, float]:
    """STS scores of an `STSEvaluator` (`embeddings` from its `embed`) after whitening as `spec` says. A fitting
    file is encoded with `encoder`."""
    if spec.fit == "task":
        results = {}
        for task in evaluator.tasks:
            whiten = Whitening.fit(evaluator.rows(embeddings, task_sentences(evaluator, task)), spec.dims)
            results[task] = evaluator.score(whiten(embeddings))[task]
        results["Avg"] = float(np.mean([results[t] for t in evaluator.tasks]))
        return results
    if spec.fit == "eval":
        fitting = embeddings
    else:
        if encoder is None:
            raise ValueError("whitening on a file needs the encoder to embed the file's sentences.")
        fitting = np.asarray(encoder.encode(read_fit_sentences(spec.fit), batch_size=batch_size, bf16=bf16))
    return evaluator.score(Whitening.fit(fitting, spec.dims)(embeddings))
