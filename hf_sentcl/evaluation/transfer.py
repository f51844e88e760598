"""Transfer tasks: SentEval-format readers and a logistic-regression probe on frozen sentence embeddings.

Seven classification tasks, evaluated as SentEval does with its scikit-learn classifier:

- MR, CR, SUBJ, MPQA have no split: nested stratified k-fold cross-validation (k = 10). For each outer fold the
  L2 strength C is chosen by an inner k-fold over the outer training part; the score is the mean outer-fold
  test accuracy.
- SST-2 has train/dev/test: C is the one with the best dev accuracy; the score is test accuracy.
- TREC (6 coarse classes) and MRPC have train/test: C is chosen by k-fold cross-validation on train, the probe is
  refitted on all of train and scored on test. MRPC classifies the pair features [u, v, |u - v|, u * v] and
  also reports F1 of the paraphrase class.

C grids, fold seeds and the sample order that the folds are drawn from (sorted by token count, then label) are
SentEval's, so a fold holds the same sentences as in SentEval. Every distinct sentence of all tasks is embedded
in one `encode` call; accuracies are percentages.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from joblib import Parallel, delayed
from threadpoolctl import ThreadpoolController
from tqdm.auto import tqdm

from hf_sentcl.evaluation.sts import EncodedSentences, check_size, read_lines
from hf_sentcl.hub.download import resolve_data_dir

if TYPE_CHECKING:  # scikit-learn is imported where a probe is fitted, not in every process's start
    from sklearn.linear_model import LogisticRegression

logger = logging.getLogger("hf_sentcl")

TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
SENTEVAL_SEED = 1111
# SentEval's L2 grids for its scikit-learn probe: nested CV and dev-split selection / k-fold selection.
C_GRID_NESTED = tuple(2.0**t for t in range(-2, 4))
C_GRID_KFOLD = tuple(2.0**t for t in range(-1, 6))
LBFGS_MAX_ITER = 1000
# Files of each task under the data directory, in the order the readers take them. MR/CR/SUBJ/MPQA: label 1, then
# label 0 (SentEval gives SUBJ's objective sentences label 1); SST2: train, dev, test; TREC, MRPC: train, test.
TRANSFER_FILES = {
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
    "SST2": ("SST/binary/sentiment-train", "SST/binary/sentiment-dev", "SST/binary/sentiment-test"),
    "TREC": ("TREC/train_5500.label", "TREC/TREC_10.label"),
    "MRPC": ("MRPC/msr_paraphrase_train.txt", "MRPC/msr_paraphrase_test.txt"),
}


#: Rows of each SentEval transfer file, keyed "folder/file" (MRPC: pairs, without the header). A file of another
#: size is refused (see `hf_sentcl.evaluation.sts.check_size`; a folder's sizes.json may declare other sizes).
KNOWN_ROWS = {
    "MR/rt-polarity.pos": 5331, "MR/rt-polarity.neg": 5331, "CR/custrev.pos": 2407, "CR/custrev.neg": 1368,
    "SUBJ/subj.objective": 5000, "SUBJ/subj.subjective": 5000, "MPQA/mpqa.pos": 3312, "MPQA/mpqa.neg": 7294,
    "binary/sentiment-train": 67349, "binary/sentiment-dev": 872, "binary/sentiment-test": 1821,
    "TREC/train_5500.label": 5452, "TREC/TREC_10.label": 500,
    "MRPC/msr_paraphrase_train.txt": 4076, "MRPC/msr_paraphrase_test.txt": 1725,
}


@dataclass
class LabeledSentences:
    """Sentences with integer class labels."""

    sentences: list[str]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class LabeledPairs:
    """Sentence pairs with integer class labels (MRPC: 1 = paraphrase)."""

    sentences1: list[str]
    sentences2: list[str]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


# ------------------------------------------------------------------------------------------------ readers
def _normalize_whitespace(text: str) -> str:
    """SentEval splits on whitespace and the encoder sees the tokens joined by single spaces."""
    return " ".join(text.split())


def _senteval_order(lengths: Sequence[int], labels: Sequence[int]) -> list[int]:
    """SentEval's order of samples before building folds: by token count, then label (stable)."""
    return sorted(range(len(labels)), key=lambda i: (lengths[i], labels[i]))


def _labeled(sentences: list[str], labels: list[int]) -> LabeledSentences:
    order = _senteval_order([len(s.split()) for s in sentences], labels)
    return LabeledSentences([sentences[i] for i in order], np.asarray([labels[i] for i in order], dtype=np.int64))


def read_binary_task(positive: Path, negative: Path) -> LabeledSentences:
    """MR/CR/SUBJ/MPQA: one sentence per line (latin-1, as SentEval reads them), label 1 for `positive`'s lines.

    Empty lines are kept as empty sentences, as in SentEval (CR and MPQA have a few).
    """
    pos = [_normalize_whitespace(line) for line in read_lines(positive, "Transfer", "latin-1")]
    neg = [_normalize_whitespace(line) for line in read_lines(negative, "Transfer", "latin-1")]
    check_size(positive, len(pos), KNOWN_ROWS, "sentences")
    check_size(negative, len(neg), KNOWN_ROWS, "sentences")
    return _labeled(pos + neg, [1] * len(pos) + [0] * len(neg))


def read_sst_binary(path: Path) -> LabeledSentences:
    """SST/binary/sentiment-{train,dev,test}: `sentence<TAB>label` per line (utf-8), label 0 or 1."""
    sentences, labels = [], []
    for number, line in enumerate(read_lines(path, "Transfer"), start=1):
        text, _, label = line.strip().rpartition("\t")
        if label not in ("0", "1") or not text:
            raise ValueError(f"{path}:{number}: expected 'sentence<TAB>0|1', got {line[:80]!r}.")
        sentences.append(_normalize_whitespace(text))
        labels.append(int(label))
    check_size(path, len(labels), KNOWN_ROWS, "sentences")
    return _labeled(sentences, labels)


def read_trec(path: Path) -> LabeledSentences:
    """TREC/{train_5500,TREC_10}.label: `COARSE:fine question` per line (latin-1); the label is the coarse class."""
    sentences, labels = [], []
    for number, line in enumerate(read_lines(path, "Transfer", "latin-1"), start=1):
        coarse, _, rest = line.strip().partition(":")
        question = rest.split(" ", 1)[1] if " " in rest else ""
        if coarse not in TREC_CLASSES or not question.strip():
            raise ValueError(
                f"{path}:{number}: expected 'CLASS:fine question' with CLASS in {', '.join(TREC_CLASSES)}, "
                f"got {line[:80]!r}."
            )
        sentences.append(_normalize_whitespace(question))
        labels.append(TREC_CLASSES.index(coarse))
    check_size(path, len(labels), KNOWN_ROWS, "questions")
    return _labeled(sentences, labels)


def read_mrpc(path: Path) -> LabeledPairs:
    """MRPC/msr_paraphrase_{train,test}.txt: a header, then `Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String`.

    Pairs are ordered as SentEval orders them (by the token counts of both sentences, then label).
    """
    lines = read_lines(path, "Transfer", "utf-8-sig")  # the files start with a byte-order mark
    first, second, labels = [], [], []
    for number, line in enumerate(lines[1:], start=2):
        columns = line.strip().split("\t")
        if len(columns) < 5 or columns[0] not in ("0", "1"):
            raise ValueError(f"{path}:{number}: expected 'Quality<TAB>ID<TAB>ID<TAB>sentence<TAB>sentence'.")
        labels.append(int(columns[0]))
        first.append(_normalize_whitespace(columns[3]))
        second.append(_normalize_whitespace(columns[4]))
    check_size(path, len(labels), KNOWN_ROWS, "pairs")
    order = sorted(range(len(labels)), key=lambda i: (len(first[i].split()), len(second[i].split()), labels[i]))
    return LabeledPairs(
        [first[i] for i in order], [second[i] for i in order], np.asarray([labels[i] for i in order], dtype=np.int64)
    )


def _check_task(task: str) -> None:
    if task not in TRANSFER_FILES:
        raise ValueError(f"Unknown transfer task '{task}'. Choose from: {', '.join(TRANSFER_TASKS)}.")


def check_transfer_files(data_dir: str | os.PathLike | None, tasks: Sequence[str] = TRANSFER_TASKS) -> None:
    """Fail early, before a model is loaded, when a task name is unknown or any of its files is missing."""
    for task in tasks:
        _check_task(task)
    root = resolve_data_dir(data_dir)
    missing = [str(root / name) for task in tasks for name in TRANSFER_FILES[task] if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Transfer task file(s) missing: {', '.join(missing)}. The data directory needs SentEval's layout "
            "(MR/, CR/, SUBJ/, MPQA/, SST/binary/, TREC/, MRPC/); or leave the tasks without data out."
        )


def load_transfer_task(data_dir: str | os.PathLike | None, task: str) -> dict[str, LabeledSentences | LabeledPairs]:
    """Load one transfer task as {split: data}: `all` for MR/CR/SUBJ/MPQA, train/dev/test for SST2, train/test else."""
    _check_task(task)
    root = resolve_data_dir(data_dir)
    paths = [root / name for name in TRANSFER_FILES[task]]
    if task == "SST2":
        return dict(zip(("train", "dev", "test"), map(read_sst_binary, paths)))
    if task == "TREC":
        return dict(zip(("train", "test"), map(read_trec, paths)))
    if task == "MRPC":
        return dict(zip(("train", "test"), map(read_mrpc, paths)))
    return {"all": read_binary_task(*paths)}


# ------------------------------------------------------------------------------------------------ the probe
@dataclass
class ProbeResult:
    """Test accuracy (%), the model-selection accuracy (%) behind the chosen C, the chosen C(s), predictions."""

    acc: float
    devacc: float
    c: float | list[float]
    predictions: np.ndarray | None = None


@cache
def _threadpools() -> ThreadpoolController:
    return ThreadpoolController()


def fit_probe(x: np.ndarray, y: np.ndarray, c: float, seed: int = SENTEVAL_SEED) -> LogisticRegression:
    """A logistic-regression probe with L2 strength 1/C (multinomial for more than two classes).

    Fitted with L-BFGS (scikit-learn's default, fast on well-scaled features); a fit that has not converged after
    `LBFGS_MAX_ITER` iterations (ill-conditioned features, e.g. MRPC's products of MiniLM's [CLS] vectors with a
    weak penalty) is redone in float64 with the Newton-Cholesky solver, which reaches the unique optimum of this
    strictly convex problem in a few steps (in float32 its Cholesky factorisation can fail on such features).
    One thread: the problems are small, and multi-threaded BLAS/OpenMP on them is slower, 10x so on a busy machine.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with _threadpools().limit(limits=1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = LogisticRegression(C=c, max_iter=LBFGS_MAX_ITER, random_state=seed).fit(x, y)
        if model.n_iter_.max() >= LBFGS_MAX_ITER:
            newton = LogisticRegression(C=c, solver="newton-cholesky", max_iter=100, random_state=seed)
            model = newton.fit(np.asarray(x, dtype=np.float64), y)
    return model


def _accuracy(model: LogisticRegression, x: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * float(model.score(x, y))


def _folds(x: np.ndarray, y: np.ndarray, kfold: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    _check_folds(y, kfold)
    return list(StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(x, y))


def _mean_fold_accuracy(x: np.ndarray, y: np.ndarray, folds, c: float, seed: int) -> float:
    return float(np.mean([_accuracy(fit_probe(x[tr], y[tr], c, seed), x[te], y[te]) for tr, te in folds]))


def _select_c_by_kfold(
    x: np.ndarray, y: np.ndarray, grid: Sequence[float], kfold: int, seed: int, n_jobs: int = 1
) -> tuple[float, float]:
    """The C of `grid` with the best mean k-fold accuracy on (x, y), and that accuracy (first C wins ties)."""
    folds = _folds(x, y, kfold, seed)
    means = Parallel(n_jobs=n_jobs)(delayed(_mean_fold_accuracy)(x, y, folds, c, seed) for c in grid)
    best = int(np.argmax(means))
    return grid[best], means[best]


def nested_cv_probe(
    x: np.ndarray,
    y: np.ndarray,
    kfold: int = 10,
    seed: int = SENTEVAL_SEED,
    grid: Sequence[float] = C_GRID_NESTED,
    n_jobs: int = 1,
) -> ProbeResult:
    """Tasks without a split: C chosen per outer fold by an inner k-fold; mean outer-fold test accuracy."""
    outer = Parallel(n_jobs=n_jobs)(
        delayed(kfold_selected_probe)(x[train], y[train], x[test], y[test], kfold, seed, grid)
        for train, test in _folds(x, y, kfold, seed)
    )
    return ProbeResult(
        acc=float(np.mean([r.acc for r in outer])), devacc=float(np.mean([r.devacc for r in outer])),
        c=[r.c for r in outer],
    )


def kfold_selected_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    kfold: int = 10,
    seed: int = SENTEVAL_SEED,
    grid: Sequence[float] = C_GRID_KFOLD,
    n_jobs: int = 1,
) -> ProbeResult:
    """Tasks with train/test: C chosen by k-fold cross-validation on train, refit on train, scored on test."""
    c, dev = _select_c_by_kfold(x_train, y_train, grid, kfold, seed, n_jobs)
    predictions = fit_probe(x_train, y_train, c, seed).predict(x_test)
    return ProbeResult(acc=100.0 * float(np.mean(predictions == y_test)), devacc=dev, c=c, predictions=predictions)


def dev_selected_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_dev: np.ndarray,
    y_dev: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    seed: int = SENTEVAL_SEED,
    grid: Sequence[float] = C_GRID_NESTED,
    n_jobs: int = 1,
) -> ProbeResult:
    """Tasks with train/dev/test: C with the best dev accuracy; that probe's test accuracy."""
    models = Parallel(n_jobs=n_jobs)(delayed(fit_probe)(x_train, y_train, c, seed) for c in grid)
    devs = [_accuracy(m, x_dev, y_dev) for m in models]
    best = int(np.argmax(devs))
    return ProbeResult(acc=_accuracy(models[best], x_test, y_test), devacc=devs[best], c=grid[best])


def _check_folds(y: np.ndarray, kfold: int) -> None:
    counts = np.unique(y, return_counts=True)[1]
    if kfold < 2 or len(counts) < 2 or counts.min() < kfold:
        raise ValueError(
            f"Stratified {kfold}-fold cross-validation needs kfold >= 2, two classes and at least {kfold} samples "
            f"of each class; got class sizes {counts.tolist()}. Lower `kfold` or use more data."
        )


def pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """MRPC's pair representation [u, v, |u - v|, u * v]."""
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


# ------------------------------------------------------------------------------------------------ the evaluator
class TransferEvaluator(EncodedSentences):
    """Evaluate an encoder on transfer tasks with SentEval's probe protocol, embedding all sentences in one call.

    Args:
        data_dir: SentEval-format directory (defaults to `$HF_SENTCL_DATA`).
        tasks: names from `TRANSFER_TASKS`.
        kfold: folds of the (nested) cross-validation, 10 as in SentEval's full protocol.
        seed: seed of the folds and the probe, SentEval's 1111 by default.
        n_jobs: processes that fit probes in parallel (joblib); results do not depend on it.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        tasks: Sequence[str] = TRANSFER_TASKS,
        kfold: int = 10,
        seed: int = SENTEVAL_SEED,
        n_jobs: int = 1,
    ):
        check_transfer_files(data_dir, tasks)
        if kfold < 2:
            raise ValueError(f"kfold must be at least 2, got {kfold}.")
        self.tasks = tuple(tasks)
        self.kfold = kfold
        self.seed = seed
        self.n_jobs = n_jobs
        self.data = {task: load_transfer_task(data_dir, task) for task in self.tasks}

    def sentences(self) -> list[str]:
        """Every distinct sentence of the loaded tasks."""
        unique: dict[str, None] = {}
        for splits in self.data.values():
            for data in splits.values():
                if isinstance(data, LabeledPairs):
                    unique.update(dict.fromkeys(data.sentences1))
                    unique.update(dict.fromkeys(data.sentences2))
                else:
                    unique.update(dict.fromkeys(data.sentences))
        return list(unique)

    def __call__(self, encoder, batch_size: int = 128, bf16: bool = False) -> dict[str, dict[str, Any]]:
        """Per task: acc, devacc, C, ntrain, ntest (and f1 for MRPC). See `transfer_summary` for the table row."""
        return self.score(self.embed(encoder, batch_size=batch_size, bf16=bf16))

    def _rows(self, embeddings: np.ndarray, sentences: Sequence[str]) -> np.ndarray:
        return np.asarray(self.rows(embeddings, sentences), dtype=np.float32)

    def _features(self, embeddings: np.ndarray, data: LabeledSentences | LabeledPairs) -> np.ndarray:
        if isinstance(data, LabeledPairs):
            return pair_features(self._rows(embeddings, data.sentences1), self._rows(embeddings, data.sentences2))
        return self._rows(embeddings, data.sentences)

    def score_task(self, task: str, embeddings: np.ndarray) -> dict[str, Any]:
        """Train and score the probe of one task on the output of `embed`."""
        splits = self.data[task]
        x = {split: self._features(embeddings, data) for split, data in splits.items()}
        y = {split: data.labels for split, data in splits.items()}
        if "all" in splits:
            result = nested_cv_probe(x["all"], y["all"], self.kfold, self.seed, n_jobs=self.n_jobs)
            sizes = {"ntrain": len(y["all"]), "ntest": len(y["all"])}
        elif "dev" in splits:
            result = dev_selected_probe(
                x["train"], y["train"], x["dev"], y["dev"], x["test"], y["test"], self.seed, n_jobs=self.n_jobs
            )
            sizes = {"ntrain": len(y["train"]), "ndev": len(y["dev"]), "ntest": len(y["test"])}
        else:
            result = kfold_selected_probe(
                x["train"], y["train"], x["test"], y["test"], self.kfold, self.seed, n_jobs=self.n_jobs
            )
            sizes = {"ntrain": len(y["train"]), "ntest": len(y["test"])}
        scores: dict[str, Any] = {"acc": result.acc, "devacc": result.devacc, "C": result.c, **sizes}
        if task == "MRPC":
            from sklearn.metrics import f1_score

            scores["f1"] = 100.0 * float(f1_score(y["test"], result.predictions))
        return scores

    def score(self, embeddings: np.ndarray) -> dict[str, dict[str, Any]]:
        """Every task's probe results from the output of `embed`."""
        results = {}
        for task in tqdm(self.tasks, desc="Transfer probes", leave=False, disable=None):  # none without a terminal
            results[task] = self.score_task(task, embeddings)
            logger.info("Transfer %s: accuracy %.2f (model selection %.2f)", task, results[task]["acc"],
                        results[task]["devacc"])
        return results


def transfer_summary(details: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The table row of `TransferEvaluator` results: accuracy per task, `MRPC_F1`, and `Avg` over the accuracies."""
    row = {task: float(scores["acc"]) for task, scores in details.items()}
    if "MRPC" in details:
        row["MRPC_F1"] = float(details["MRPC"]["f1"])
    row["Avg"] = float(np.mean([details[t]["acc"] for t in details]))
    return row
