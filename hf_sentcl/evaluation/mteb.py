"""STS under MTEB's protocol, and result files in the layout of MTEB's results repository.

MTEB scores STS12-16 with a year's subsets concatenated into one correlation, STS-B on its test split and SICK-R
on all 9,927 pairs of SICK (not SentEval's 4,927-pair test split). `mteb_sts_scores` computes exactly that with
hf_sentcl's evaluator on the SentEval copies of the data, one task at a time so that each task's evaluation time
is known (a run reuses its own STS12-16/STS-B scores when they already follow the protocol; those tasks then
carry no time). `write_mteb_results` writes the scores with the `mteb` package's own classes (`TaskResult`,
`ModelMeta`) as `ROOT/results/ORG__NAME/REVISION/{TASK}.json` + `model_meta.json`, and reloads every file with
mteb's loaders before returning. `mteb` is an optional dependency (`pip install "hf-sentcl[mteb]"`).

MTEB-protocol scores name MTEB's datasets and their revisions (in the card's model-index and the result files), so
they are claimed only for SentEval's own copies of those tasks: `mteb_data_problem` says why a data folder is not one
(a file missing, or a folder that declares sizes of its own, as samples and test layouts do).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

import numpy as np

from hf_sentcl.evaluation.sts import KNOWN_PAIRS, SIZES_FILE, STS_TASKS, STSEvaluator
from hf_sentcl.hub.download import resolve_data_dir

# task -> (mteb dataset id, mteb task name, dataset revision), as in mteb's task definitions (checked in the tests)
MTEB_STS_DATASETS: dict[str, tuple[str, str, str]] = {
    "STS12": ("mteb/sts12-sts", "STS12", "a0d554a64d88156834ff5ae9920b964011b16384"),
    "STS13": ("mteb/sts13-sts", "STS13", "7e90230a92c190f1bf69ae9002b8cea547a64cca"),
    "STS14": ("mteb/sts14-sts", "STS14", "6031580fec1f6af667f0bd2da0a551cf4f0b2375"),
    "STS15": ("mteb/sts15-sts", "STS15", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3"),
    "STS16": ("mteb/sts16-sts", "STS16", "4d8694f8f0e0100860b497b999b3dbed754a0513"),
    "STSBenchmark": ("mteb/stsbenchmark-sts", "STSBenchmark", "b0fddb56ed78048fa8b90373c8a3cfc37b684831"),
    "SICKRelatedness": ("mteb/sickr-sts", "SICK-R", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
}


NO_REVISION = "no_revision_available"  # mteb's own name for a model folder without a Hub revision


RESULTS_DIRNAME = "results"  # the results repository keeps models under results/ORG__NAME/REVISION/


INSTALL_HINT = 'install it with `pip install "hf-sentcl[mteb]"` (or `pip install "mteb>=2"`)'


#: the SentEval files MTEB's STS protocol reads: STS12-16's test inputs and their gold scores, STS-B's test split and
#: all of SICK
MTEB_FILES = tuple(
    file for name in KNOWN_PAIRS if not name.startswith("STSBenchmark/") or name.endswith("-test.csv")
    for file in ((name, name.replace("/STS.input.", "/STS.gs.")) if "/STS.input." in name else (name,))
)


def mteb_available() -> bool:
    return find_spec("mteb") is not None


def license_problem(license_id: str) -> str | None:
    """Why `license_id` is not a license the Hub and mteb's `ModelMeta.license` accept (a Hub license id such as
    'apache-2.0', or a URL), or None; None also without mteb, which holds the list."""
    if not mteb_available():
        return None
    from mteb.models import ModelMeta
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(ModelMeta.model_fields["license"].annotation).validate_python(license_id)
    except ValidationError:
        return (f"'{license_id}' is not a license mteb knows: give a Hub license id (e.g. apache-2.0, mit, cc-by-4.0) "
                "or a URL to the license.")
    return None


def mteb_data_problem(data_dir: str | os.PathLike | None) -> str | None:
    """Why the STS data in `data_dir` cannot stand for MTEB's STS tasks, or None when it is SentEval's own copy.

    SentEval's copy is what MTEB's datasets were made from: every file of `MTEB_FILES` present, none in a folder
    that declares its own sizes (`sizes.json`), so the readers hold each file to SentEval's size.
    """
    root = resolve_data_dir(data_dir)
    for name in MTEB_FILES:
        path = root / name if name.startswith("SICK/") else root / "STS" / name  # SICK/ sits beside STS/
        if not path.is_file():
            return f"{path} is missing"
        if (path.parent / SIZES_FILE).is_file():
            return f"{path.parent / SIZES_FILE} declares sizes other than SentEval's"
    return None


@dataclass
class MtebScores:
    """MTEB-protocol STS scores (Spearman x 100 of cosine similarities, with their Avg) and seconds per task."""

    scores: dict[str, float]
    seconds: dict[str, float] = field(default_factory=dict)

    def to_results(self) -> dict[str, Any]:
        """The results.json entries: `mteb_sts` (the card's model-index) and `mteb_sts_seconds`."""
        return {"mteb_sts": self.scores, "mteb_sts_seconds": self.seconds}

    @classmethod
    def from_results(cls, results: Mapping[str, Any]) -> MtebScores | None:
        """The scores stored in a results dict by `to_results`, or None when it holds none."""
        if not results.get("mteb_sts"):
            return None
        return cls(dict(results["mteb_sts"]), dict(results.get("mteb_sts_seconds") or {}))


def mteb_sts_scores(
    encoder,
    data_dir: str | os.PathLike | None,
    batch_size: int = 128,
    bf16: bool = False,
    reuse: Mapping[str, float] | None = None,
) -> MtebScores:
    """Score `encoder` on the 7 STS tasks under MTEB's protocol, timing each task (encoding + scoring).

    `reuse` holds scores already computed under that protocol (e.g. a run's final STS12-16 and STS-B in mode
    `all`); those tasks are not encoded again and have no evaluation time. SICK-R is never reused.
    """
    reused = {t: float(v) for t, v in (reuse or {}).items() if t in STS_TASKS and t != "SICKRelatedness"}
    scores: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for task in STS_TASKS:
        if task in reused:
            scores[task] = reused[task]
            continue
        evaluator = STSEvaluator(data_dir, tasks=(task,), mode="all", sick_split="all")
        start = time.perf_counter()
        scores[task] = evaluator(encoder, batch_size=batch_size, bf16=bf16)[task]
        seconds[task] = round(time.perf_counter() - start, 6)
    bad = {task: value for task, value in scores.items() if not math.isfinite(value)}
    if bad:
        raise ValueError(f"MTEB-protocol STS scores are not finite: {bad}; the encoder's embeddings are unusable.")
    scores["Avg"] = float(np.mean([scores[t] for t in STS_TASKS]))
    return MtebScores(scores, seconds)
