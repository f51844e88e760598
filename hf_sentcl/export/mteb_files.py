"""Result files in the layout of MTEB's results repository, written and reloaded with mteb's own classes."""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path

import numpy as np

from hf_sentcl.evaluation.mteb import (
    INSTALL_HINT,
    MTEB_STS_DATASETS,
    NO_REVISION,
    RESULTS_DIRNAME,
    MtebScores,
    mteb_available,
)
from hf_sentcl.evaluation.report import read_json, write_json


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
    folder = Path(root) / RESULTS_DIRNAME / model_folder_name(name) / revision
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    today = datetime.datetime.now(datetime.timezone.utc)
    write_task_results(folder, scores, today)
    meta = model_meta(
        name, revision, today, export_dir,
        max_tokens=max_tokens, embed_dim=embed_dim, adapted_from=adapted_from, training_tasks=training_tasks,
    )
    write_json(folder / "model_meta.json", meta.to_dict(), default=str)
    check_mteb_folder(folder)
    return folder


def write_task_results(folder: Path, scores: MtebScores, date: datetime.datetime) -> None:
    """One `{TASK}.json` per scored STS task, built with mteb's `TaskResult` (scores on mteb's 0-1 scale)."""
    import mteb
    from mteb.results import TaskResult

    for task, (_dataset, task_name, _revision) in MTEB_STS_DATASETS.items():
        if task not in scores.scores:
            continue
        value = round(float(scores.scores[task]) / 100, 6)
        result = TaskResult.from_task_results(
            mteb.get_task(task_name),
            {"test": {"default": {"cosine_spearman": value, "spearman": value, "main_score": value}}},
            evaluation_time=scores.seconds.get(task),
            date=date,
        )
        write_json(folder / f"{task_name}.json", {**result.to_dict(), "date": date.timestamp()})


def model_meta(
    name: str,
    revision: str,
    date: datetime.datetime,
    export_dir: str | os.PathLike,
    *,
    max_tokens: int,
    embed_dim: int,
    adapted_from: str | None,
    training_tasks: set[str] | None,
):
    """mteb's `ModelMeta` of the exported model: size and memory read from its weights, cosine similarity."""
    from mteb.models import ModelMeta

    n_parameters, memory_mb = parameter_count(export_dir)
    return ModelMeta(
        loader=None,  # mteb saves a loader as its name, which ModelMeta.model_validate rejects on reading
        name=name,
        revision=revision,
        release_date=date.date().isoformat(),
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
