"""STS under MTEB's protocol, and result files in the layout of MTEB's results repository.

MTEB scores STS12-16 with a year's subsets concatenated into one correlation, STS-B on its test split and SICK-R
on all 9,927 pairs of SICK (not SentEval's 4,927-pair test split). `mteb_sts_scores` computes exactly that with
hf_sentcl's evaluator on the SentEval copies of the data, one task at a time so that each task's evaluation time
is known (a run reuses its own STS12-16/STS-B scores when they already follow the protocol; those tasks then
carry no time). `write_mteb_results` writes the scores with the `mteb` package's own classes (`TaskResult`,
`ModelMeta`) as `ROOT/results/ORG__NAME/REVISION/{TASK}.json` + `model_meta.json`, and reloads every file with
mteb's loaders before returning. `mteb` is an optional dependency (`pip install "hf-sentcl[mteb]"`).
"""

from __future__ import annotations

import datetime
import math
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from hf_sentcl.evaluation.report import read_json, write_json
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator

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


def mteb_available() -> bool:
    return find_spec("mteb") is not None


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
        seconds[task] = round(time.perf_counter() - start, 3)
    bad = {task: value for task, value in scores.items() if not math.isfinite(value)}
    if bad:
        raise ValueError(f"MTEB-protocol STS scores are not finite: {bad}; the encoder's embeddings are unusable.")
    scores["Avg"] = float(np.mean([scores[t] for t in STS_TASKS]))
    return MtebScores(scores, seconds)


def model_folder_name(name: str) -> str:
    """The results repository's folder name of a model: ORG/NAME -> ORG__NAME."""
    return name.replace("/", "__")


def parameter_count(export_dir: str | os.PathLike) -> tuple[int, float]:
    """Parameters stored in an export's safetensors files (backbone and modules) and their size in MiB."""
    from safetensors import safe_open

    count, size = 0, 0
    for path in Path(export_dir).rglob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                count += int(np.prod(f.get_slice(name).get_shape()))
        size += path.stat().st_size
    return count, round(size / 2**20, 1)


def write_mteb_results(
    root: str | os.PathLike,
    scores: MtebScores,
    *,
    name: str,
    export_dir: str | os.PathLike,
    max_tokens: int,
    embed_dim: int,
    revision: str = NO_REVISION,
    adapted_from: str | None = None,
    training_tasks: set[str] | None = None,
) -> Path:
    """Write `ROOT/results/<ORG__NAME>/<revision>/{TASK}.json` and `model_meta.json` with mteb's classes; return
    the revision folder after every file was reloaded with mteb's own loaders.

    `name` is the Hub id (ORG/NAME) the files are for; `revision` the pushed commit (until a push, mteb's
    `no_revision_available`). `training_tasks` names the MTEB tasks whose texts the model was trained on.
    """
    if not mteb_available():
        raise ModuleNotFoundError(f"Writing MTEB result files needs the mteb package: {INSTALL_HINT}.")
    import mteb
    from mteb.models import ModelMeta
    from mteb.results import TaskResult

    folder = Path(root) / RESULTS_DIRNAME / model_folder_name(name) / revision
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    today = datetime.datetime.now(datetime.timezone.utc)
    for task, (_dataset, task_name, _revision) in MTEB_STS_DATASETS.items():
        if task not in scores.scores:
            continue
        value = round(float(scores.scores[task]) / 100, 6)
        result = TaskResult.from_task_results(
            mteb.get_task(task_name),
            {"test": {"default": {"cosine_spearman": value, "spearman": value, "main_score": value}}},
            evaluation_time=scores.seconds.get(task),
            date=today,
        )
        write_json(folder / f"{task_name}.json", {**result.to_dict(), "date": today.timestamp()})
    n_parameters, memory_mb = parameter_count(export_dir)
    meta = ModelMeta(
        loader=None,  # mteb saves a loader as its name, which ModelMeta.model_validate rejects on reading
        name=name,
        revision=revision,
        release_date=today.date().isoformat(),
        languages=["eng-Latn"],
        n_parameters=n_parameters,
        memory_usage_mb=memory_mb,
        max_tokens=max_tokens,
        embed_dim=embed_dim,
        license=None,
        open_weights=True,
        public_training_code=None,
        public_training_data=None,
        framework=["Sentence Transformers", "PyTorch"],
        reference=f"https://huggingface.co/{name}",
        similarity_fn_name="cosine",
        use_instructions=False,
        training_datasets=training_tasks,
        adapted_from=adapted_from,
    )
    write_json(folder / "model_meta.json", meta.to_dict(), default=str)
    check_mteb_folder(folder)
    return folder


def check_mteb_folder(folder: str | os.PathLike) -> list[str]:
    """Load every file of a revision folder with mteb's loaders; ValueError naming the first file they reject.

    Returns the task names found. (`TaskResult.from_disk` for task files, `ModelMeta.model_validate` for
    `model_meta.json`, as the results repository's checks do.)
    """
    from mteb.models import ModelMeta
    from mteb.results import TaskResult

    folder = Path(folder)
    tasks = []
    for path in sorted(folder.glob("*.json")):
        try:
            if path.name == "model_meta.json":
                ModelMeta.model_validate(read_json(path))
            else:
                tasks.append(TaskResult.from_disk(path).task_name)
        except Exception as err:  # pydantic's ValidationError, JSON errors: all mean "mteb rejects this file"
            raise ValueError(f"mteb rejects '{path}': {err}") from None
    if not (folder / "model_meta.json").is_file():
        raise ValueError(f"'{folder}' has no model_meta.json.")
    return tasks


def find_model_folder(root: str | os.PathLike) -> Path:
    """The one `results/ORG__NAME/REVISION` folder under `root` (as written by `write_mteb_results`)."""
    folders = sorted(p.parent for p in Path(root).glob(f"{RESULTS_DIRNAME}/*/*/model_meta.json"))
    if len(folders) != 1:
        raise ValueError(
            f"'{root}' should hold exactly one {RESULTS_DIRNAME}/ORG__NAME/REVISION/model_meta.json (found "
            f"{len(folders)}); pass the folder given to `export --mteb-results`."
        )
    return folders[0]


def rekey_mteb_results(root: str | os.PathLike, repo_id: str, revision: str) -> Path:
    """After a push: move the results under `root` to `results/<ORG__NAME of repo_id>/<revision>/`, with the
    name, revision and reference of `model_meta.json` updated, and check them with mteb again."""
    old = find_model_folder(root)
    meta = read_json(old / "model_meta.json")
    meta.update(name=repo_id, revision=revision, reference=f"https://huggingface.co/{repo_id}")
    new = Path(root) / RESULTS_DIRNAME / model_folder_name(repo_id) / revision
    if new != old:
        if new.exists():
            shutil.rmtree(new)
        new.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(old), str(new))
        if not any(old.parent.iterdir()):
            old.parent.rmdir()
    write_json(new / "model_meta.json", meta)
    check_mteb_folder(new)
    return new
