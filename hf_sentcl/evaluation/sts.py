"""Semantic textual similarity: SentEval-format readers and the 7-task evaluator.

Scores are Spearman x 100 between gold scores and cosine similarities. STS12-16 consist of several subsets;
`mode` says how they are combined: `all` concatenates a year's subsets into one correlation (the
SimCSE/ConSERT/MTEB convention), `mean` averages per-subset correlations, `wmean` weights them by size.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hf_sentcl.configs.choices import STS_MODES
from hf_sentcl.hub.download import resolve_data_dir

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")

#: the names tables, the model card and MTEB give STS-B and SICK-R, accepted for the internal ones (any case)
STS_TASK_ALIASES = {
    "STS-B": "STSBenchmark", "STSB": "STSBenchmark", "SICK-R": "SICKRelatedness", "SICKR": "SICKRelatedness",
}


def canonical_sts_tasks(names: Sequence[str]) -> list[str]:
    """The `STS_TASKS` names of `names`, matched case-insensitively and through `STS_TASK_ALIASES`, repeats dropped:
    ['sts-b', 'SICK-R', 'sts12'] -> ['STSBenchmark', 'SICKRelatedness', 'STS12']. The tables and MTEB write STS-B and
    SICK-R, so a user typing what they read is understood; ValueError naming any other name."""
    lookup = {task.lower(): task for task in STS_TASKS} | {k.lower(): v for k, v in STS_TASK_ALIASES.items()}
    unknown = [name for name in names if name.lower() not in lookup]
    if unknown:
        raise ValueError(
            f"Unknown STS task(s) {unknown}. Choose from: {', '.join(STS_TASKS)} (also {', '.join(STS_TASK_ALIASES)})."
        )
    return list(dict.fromkeys(lookup[name.lower()] for name in names))


# SentEval's subset lists. STS13's SMT subset ships without its input file (license), so it is skipped.
STS_YEAR_SUBSETS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}


#: Scored pairs of each SentEval STS file, keyed "folder/file": rows without a gold score are dropped (SentEval's
#: convention) and not counted. A file of another size is refused, so a truncated or altered copy cannot quietly
#: change the scores. A folder may declare other sizes in `SIZES_FILE` ({"file name": pairs}; test layouts do).
KNOWN_PAIRS = {
    "STS12-en-test/STS.input.MSRpar.txt": 750, "STS12-en-test/STS.input.MSRvid.txt": 750,
    "STS12-en-test/STS.input.SMTeuroparl.txt": 459, "STS12-en-test/STS.input.surprise.OnWN.txt": 750,
    "STS12-en-test/STS.input.surprise.SMTnews.txt": 399,
    "STS13-en-test/STS.input.FNWN.txt": 189, "STS13-en-test/STS.input.headlines.txt": 750,
    "STS13-en-test/STS.input.OnWN.txt": 561,
    "STS14-en-test/STS.input.deft-forum.txt": 450, "STS14-en-test/STS.input.deft-news.txt": 300,
    "STS14-en-test/STS.input.headlines.txt": 750, "STS14-en-test/STS.input.images.txt": 750,
    "STS14-en-test/STS.input.OnWN.txt": 750, "STS14-en-test/STS.input.tweet-news.txt": 750,
    "STS15-en-test/STS.input.answers-forums.txt": 375, "STS15-en-test/STS.input.answers-students.txt": 750,
    "STS15-en-test/STS.input.belief.txt": 375, "STS15-en-test/STS.input.headlines.txt": 750,
    "STS15-en-test/STS.input.images.txt": 750,
    "STS16-en-test/STS.input.answer-answer.txt": 254, "STS16-en-test/STS.input.headlines.txt": 249,
    "STS16-en-test/STS.input.plagiarism.txt": 230, "STS16-en-test/STS.input.postediting.txt": 244,
    "STS16-en-test/STS.input.question-question.txt": 209,
    "STSBenchmark/sts-train.csv": 5749, "STSBenchmark/sts-dev.csv": 1500, "STSBenchmark/sts-test.csv": 1379,
    "SICK/SICK_train.txt": 4500, "SICK/SICK_trial.txt": 500, "SICK/SICK_test_annotated.txt": 4927,
}
SIZES_FILE = "sizes.json"


def expected_size(path: Path, known: dict[str, int]) -> int | None:
    """The size `path` must have: from its folder's `SIZES_FILE` if there is one, else from `known`."""
    manifest = path.parent / SIZES_FILE
    if manifest.is_file():
        return json.loads(manifest.read_text()).get(path.name)
    return known.get(f"{path.parent.name}/{path.name}")


def check_size(path: Path, actual: int, known: dict[str, int], what: str = "scored pairs") -> None:
    """ValueError naming `path` if it holds another number of rows than SentEval's copy (see `KNOWN_PAIRS`)."""
    expected = expected_size(path, known)
    if expected is not None and actual != expected:
        raise ValueError(
            f"{path}: {actual} {what}, expected {expected} (the size of SentEval's copy); the file is truncated or "
            f"altered. Restore it from SentEval (or declare its size in {path.parent / SIZES_FILE})."
        )


def split_row(line: str, path: Path, number: int, columns: int) -> list[str]:
    """The tab-separated fields of line `number` of `path`; ValueError naming both if it has fewer than `columns`."""
    fields = line.split("\t")
    if len(fields) < columns:
        raise ValueError(f"{path}, line {number}: expected {columns} tab-separated columns, found {len(fields)}.")
    return fields


def gold_score(text: str, path: Path, number: int) -> float:
    """A finite gold score; ValueError naming the file and line otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{path}, line {number}: gold score '{text.strip()}' is not a number.") from None
    if not math.isfinite(value):
        raise ValueError(f"{path}, line {number}: gold score '{text.strip()}' is not finite.")
    return value


@dataclass
class STSPairs:
    """Sentence pairs with gold scores."""

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def read_lines(path: Path, kind: str = "STS", encoding: str = "utf-8") -> list[str]:
    """The lines of a SentEval data file; a missing file is a FileNotFoundError naming it (`kind`: STS, Transfer)."""
    if not path.is_file():
        raise FileNotFoundError(f"{kind} data file '{path}' is missing; is the data directory a SentEval layout?")
    return path.read_text(encoding=encoding).splitlines()


def read_sts_year_subset(folder: Path, subset: str) -> STSPairs:
    """Read one `STS.input.<subset>.txt` / `STS.gs.<subset>.txt` pair, dropping rows without a gold score."""
    input_path, gold_path = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
    inputs, gold = read_lines(input_path), read_lines(gold_path)
    if len(inputs) != len(gold):
        raise ValueError(f"{folder}: subset '{subset}' has {len(inputs)} pairs but {len(gold)} gold lines.")
    s1, s2, scores = [], [], []
    for number, (pair, score) in enumerate(zip(inputs, gold), start=1):
        if not score.strip():
            continue
        a, b = split_row(pair, input_path, number, 2)[:2]
        s1.append(a)
        s2.append(b)
        scores.append(gold_score(score, gold_path, number))
    check_size(input_path, len(scores), KNOWN_PAIRS)
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def read_stsbenchmark(path: Path) -> STSPairs:
    """Read SentEval's `sts-{train,dev,test}.csv` (tab-separated; score in column 5, sentences in 6 and 7)."""
    s1, s2, scores = [], [], []
    for number, line in enumerate(read_lines(path), start=1):
        columns = split_row(line, path, number, 7)
        s1.append(columns[5])
        s2.append(columns[6])
        scores.append(gold_score(columns[4], path, number))
    check_size(path, len(scores), KNOWN_PAIRS)
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def read_sick(path: Path) -> STSPairs:
    """Read a SICK file (header line; sentence_A, sentence_B, relatedness_score)."""
    s1, s2, scores = [], [], []
    for number, line in enumerate(read_lines(path)[1:], start=2):
        columns = split_row(line, path, number, 4)
        s1.append(columns[1])
        s2.append(columns[2])
        scores.append(gold_score(columns[3], path, number))
    check_size(path, len(scores), KNOWN_PAIRS)
    return STSPairs(s1, s2, np.asarray(scores, dtype=np.float64))


def load_sts_task(data_dir: str | os.PathLike | None, task: str, split: str = "test") -> dict[str, STSPairs]:
    """Load one STS task as {subset: pairs}. STSBenchmark and SICKRelatedness have one subset and a split."""
    root = resolve_data_dir(data_dir)
    if task in STS_YEAR_SUBSETS:
        folder = root / "STS" / f"{task}-en-test"
        subsets = [s for s in STS_YEAR_SUBSETS[task] if (folder / f"STS.input.{s}.txt").is_file()]
        if not subsets:
            raise FileNotFoundError(f"No STS input files found in '{folder}'.")
        return {subset: read_sts_year_subset(folder, subset) for subset in subsets}
    if task == "STSBenchmark":
        return {split: read_stsbenchmark(root / "STS" / "STSBenchmark" / f"sts-{split}.csv")}
    if task == "SICKRelatedness":
        files = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
        if split == "all":
            return {"all": _concat([read_sick(root / "SICK" / name) for name in files.values()])}
        return {split: read_sick(root / "SICK" / files[split])}
    raise ValueError(f"Unknown STS task '{task}'. Choose from: {', '.join(STS_TASKS)}.")


#: `unlabeled_sts` values: which STS data gives unlabeled training text
UNLABELED_STS = ("stsb", "all", "all-scored")


def sts_year_input_texts(folder: Path, subset: str) -> list[str]:
    """Both sentences of EVERY row of `STS.input.<subset>.txt`, whether or not the row has a gold score."""
    texts = []
    for row in read_lines(folder / f"STS.input.{subset}.txt"):
        texts.extend(row.split("\t")[:2])
    return texts


def unlabeled_sts_texts(data_dir: str | os.PathLike | None, which: str) -> list[str]:
    """Every text (both sentences of every input row, duplicates kept) of STS data used as unlabeled training text.

    `stsb`: STS-B train+dev+test (SG-BERT). `all`: every input row of STS12-16 (scored or not) and every split of
    STS-B and SICK: ConSERT's 89,192 texts (its Table 1; STS15 and STS16 have 8,500 and 9,183 input pairs of which
    3,000 and 1,186 are scored). `all-scored`: the same without the STS12-16 rows that have no gold score.
    """
    if which not in UNLABELED_STS:
        raise ValueError(f"unlabeled_sts must be one of {', '.join(UNLABELED_STS)}, got '{which}'.")
    splits = ("train", "dev", "test")
    parts = [load_sts_task(data_dir, "STSBenchmark", split) for split in splits]
    if which == "all-scored":
        parts += [load_sts_task(data_dir, task) for task in STS_TASKS[:5]]
    if which != "stsb":
        parts += [load_sts_task(data_dir, "SICKRelatedness", split) for split in splits]
    texts = [s for subsets in parts for pairs in subsets.values() for s in (*pairs.sentences1, *pairs.sentences2)]
    if which == "all":
        root = resolve_data_dir(data_dir)
        for task in STS_TASKS[:5]:
            folder = root / "STS" / f"{task}-en-test"
            for subset in load_sts_task(data_dir, task):  # the subsets whose input file exists
                texts += sts_year_input_texts(folder, subset)
    return texts


def unlabeled_sts_sentences(data_dir: str | os.PathLike | None, which: str) -> list[str]:
    """The distinct texts of `unlabeled_sts_texts` (first occurrence order); gold scores are not read for training.
    ConSERT's `all`: 48,699 distinct of 89,192; `all-scored`: 30,840."""
    return list(dict.fromkeys(unlabeled_sts_texts(data_dir, which)))


def _concat(parts: list[STSPairs]) -> STSPairs:
    return STSPairs(
        [s for p in parts for s in p.sentences1],
        [s for p in parts for s in p.sentences2],
        np.concatenate([p.scores for p in parts]),
    )


def spearman_x100(gold: np.ndarray, predicted: np.ndarray) -> float:
    """Spearman rank correlation x 100."""
    from scipy.stats import spearmanr  # on first use: 0.6 s of import in every process that never scores

    return float(spearmanr(gold, predicted).statistic * 100)


def combine_subsets(per_subset: dict[str, tuple[np.ndarray, np.ndarray]], mode: str) -> float:
    """Combine (gold, cosine) arrays of a task's subsets into one score according to `mode`."""
    if mode == "all":
        gold = np.concatenate([g for g, _ in per_subset.values()])
        pred = np.concatenate([p for _, p in per_subset.values()])
        return spearman_x100(gold, pred)
    scores = np.array([spearman_x100(g, p) for g, p in per_subset.values()])
    if mode == "mean":
        return float(scores.mean())
    if mode == "wmean":
        sizes = np.array([len(g) for g, _ in per_subset.values()], dtype=np.float64)
        return float((scores * sizes).sum() / sizes.sum())
    raise ValueError(f"Unknown STS averaging mode '{mode}'. Choose one of: {', '.join(STS_MODES)}.")


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays."""
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return (a * b).sum(axis=1)


class EncodedSentences:
    """Base of the evaluators: every distinct sentence of the loaded data (`sentences()`, defined by the subclass)
    goes through one `encode` call; `sentence_index` maps a sentence to its row of that output."""

    def sentences(self) -> list[str]:
        raise NotImplementedError

    @cached_property
    def sentence_index(self) -> dict[str, int]:
        """Row of each sentence in the output of `embed`."""
        return {s: i for i, s in enumerate(self.sentences())}

    def embed(self, encoder, batch_size: int = 128, bf16: bool = False) -> np.ndarray:
        """One encode pass over `sentences()`; row i embeds sentence i. Reusable by `score` and other metrics."""
        return np.asarray(encoder.encode(self.sentences(), batch_size=batch_size, bf16=bf16))

    def rows(self, embeddings: np.ndarray, sentences: list[str]) -> np.ndarray:
        """The rows of `embeddings` (from `embed`) for `sentences`."""
        index = self.sentence_index
        return embeddings[[index[s] for s in sentences]]


class STSEvaluator(EncodedSentences):
    """Evaluate an encoder on STS tasks, encoding every distinct sentence of all tasks in one `encode` call.

    Args:
        data_dir: SentEval-format directory (defaults to `$HF_SENTCL_DATA`).
        tasks: names from `STS_TASKS`.
        mode: how STS12-16 subsets are combined (`all`, `mean`, `wmean`).
        split: split of STSBenchmark/SICKRelatedness (`test`; `dev` for model selection).
        sick_split: overrides `split` for SICKRelatedness; `all` pools train+trial+test (9,927 pairs), which is
            MTEB's SICK-R, whereas SentEval and the papers use the 4,927 test pairs.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        tasks: tuple[str, ...] = STS_TASKS,
        mode: str = "all",
        split: str = "test",
        sick_split: str | None = None,
    ):
        if mode not in STS_MODES:
            raise ValueError(f"Unknown STS averaging mode '{mode}'. Choose one of: {', '.join(STS_MODES)}.")
        unknown = [t for t in tasks if t not in STS_TASKS]
        if unknown:
            raise ValueError(f"Unknown STS task(s) {unknown}. Choose from: {', '.join(STS_TASKS)}.")
        self.mode = mode
        self.tasks = tuple(tasks)
        self.data = {
            task: load_sts_task(data_dir, task, sick_split if task == "SICKRelatedness" and sick_split else split)
            for task in tasks
        }

    def sentences(self) -> list[str]:
        """Every distinct sentence of the loaded tasks."""
        unique: dict[str, None] = {}
        for subsets in self.data.values():
            for pairs in subsets.values():
                unique.update(dict.fromkeys(pairs.sentences1))
                unique.update(dict.fromkeys(pairs.sentences2))
        return list(unique)

    def __call__(self, encoder, batch_size: int = 128, bf16: bool = False) -> dict[str, float]:
        """Return {task: Spearman x 100, ..., 'Avg': mean over tasks}. `encoder` needs `encode(list) -> array`."""
        return self.score(self.embed(encoder, batch_size=batch_size, bf16=bf16))

    def pair_embeddings(self, embeddings: np.ndarray, pairs: STSPairs) -> tuple[np.ndarray, np.ndarray]:
        """The rows of `embeddings` (from `embed`) for the first and second sentences of `pairs`."""
        return self.rows(embeddings, pairs.sentences1), self.rows(embeddings, pairs.sentences2)

    def score(self, embeddings: np.ndarray) -> dict[str, float]:
        """Spearman x 100 per task (and 'Avg') from the output of `embed`."""
        results: dict[str, float] = {}
        for task, subsets in self.data.items():
            per_subset = {
                name: (pairs.scores, cosine_rows(*self.pair_embeddings(embeddings, pairs)))
                for name, pairs in subsets.items()
            }
            results[task] = combine_subsets(per_subset, self.mode)
        results["Avg"] = float(np.mean([results[t] for t in self.tasks]))
        return results
