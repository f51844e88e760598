"""Result files in the layout of MTEB's results repository and the ModelMeta module for mteb's model registry,
written and reloaded with mteb's own classes."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_sentcl.evaluation.mteb import (
    INSTALL_HINT,
    MTEB_STS_DATASETS,
    NO_REVISION,
    RESULTS_DIRNAME,
    MtebScores,
    mteb_available,
)
from hf_sentcl.evaluation.report import write_json
from hf_sentcl.export.mteb_meta import (
    MODEL_META_JSON,
    MODEL_META_MODULE,
    build_model_meta,
    check_model_meta_module,
    import_model_meta,
    meta_record,
    module_notes,
    render_model_meta,
)

if TYPE_CHECKING:
    from mteb.models import ModelMeta

logger = logging.getLogger("hf_sentcl")

DEFAULT_ORG = "hf_sentcl"  # the organisation of an export's name when no repo id was given (`bundle.export_name`)

#: said by every check of results filed under `NO_REVISION` (the state of an export until `hf-sentcl push`)
UNPUSHED_NOTE = (
    "revision '{revision}': MTEB's results repository will not take these results under this revision (it accepts "
    "'{revision}' only for a list of historic models, and its CI loads the model by name and revision). Push the "
    "export first: `hf-sentcl push EXPORT --repo-id {repo_id} --mteb-results {root}` (or push_to_hub in the recipe) "
    "files them under the pushed commit and writes that revision into model_meta.json and model_meta.py."
)


def model_folder_name(name: str) -> str:
    """The results repository's folder name of a model: ORG/NAME -> ORG__NAME."""
    return name.replace("/", "__")


def write_mteb_results(
    root: str | os.PathLike,
    scores: MtebScores,
    *,
    name: str,
    revision: str = NO_REVISION,
    notes: Sequence[str] = (),
    **meta: Any,
) -> Path:
    """Write `ROOT/results/<ORG__NAME>/<revision>/{TASK}.json` and `model_meta.json` with mteb's classes, and
    `ROOT/model_meta.py` (the entry for mteb's model registry) from the same `ModelMeta`; return the revision
    folder once `check_mteb_submission` accepted it all.

    `name` is the Hub id (ORG/NAME) the files are for; `revision` the pushed commit (until a push, mteb's
    `no_revision_available`); `meta` holds `build_model_meta`'s keywords (`export_dir`, `max_tokens`,
    `embed_dim`, `training_tasks`: the MTEB tasks whose texts the model was trained on, `license_id`, ...);
    `notes` name the training data without an MTEB task (a comment in `model_meta.py`).
    """
    if not mteb_available():
        raise ModuleNotFoundError(f"Writing MTEB result files needs the mteb package: {INSTALL_HINT}.")
    today = datetime.datetime.now(datetime.timezone.utc)
    model_meta = build_model_meta(name, revision, today, **meta)  # refused before anything is written
    folder = Path(root) / RESULTS_DIRNAME / model_folder_name(name) / revision
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_task_results(folder, scores, today)
    write_model_meta(folder, model_meta, notes)
    check_mteb_submission(folder)
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


def write_model_meta(folder: str | os.PathLike, meta: ModelMeta, notes: Sequence[str] = ()) -> Path:
    """Write `meta` as the revision folder's `model_meta.json` and as `model_meta.py` at the root above
    `results/` (kept out of the folder that is copied into the results repository), with `notes` on the training
    data as a comment. Returns the module's path."""
    folder = Path(folder)
    write_json(folder / MODEL_META_JSON, meta_record(meta))
    module = folder.parents[2] / MODEL_META_MODULE
    module.write_text(render_model_meta(meta, notes), encoding="utf-8")
    return module


def check_mteb_folder(folder: str | os.PathLike) -> list[str]:
    """Load every file of a revision folder with mteb's loaders; ValueError naming the first file they reject.

    Returns the task names found. (`TaskResult.from_disk` for task files, `ModelMeta.model_validate_json_resolved`
    for `model_meta.json`: mteb saves the loader by its name, which that method resolves in mteb's registry.)
    """
    from mteb.models import ModelMeta
    from mteb.results import TaskResult

    folder = Path(folder)
    tasks = []
    for path in sorted(folder.glob("*.json")):
        try:
            if path.name == MODEL_META_JSON:
                ModelMeta.model_validate_json_resolved(path.read_text(encoding="utf-8"))
            else:
                tasks.append(TaskResult.from_disk(path).task_name)
        except Exception as err:  # pydantic's ValidationError, JSON errors: all mean "mteb rejects this file"
            raise ValueError(f"mteb rejects '{path}': {err}") from None
    if not (folder / MODEL_META_JSON).is_file():
        raise ValueError(f"'{folder}' has no {MODEL_META_JSON}.")
    return tasks


def check_mteb_submission(folder: str | os.PathLike) -> tuple[ModelMeta, list[str]]:
    """Check both halves of a leaderboard submission: the results `folder` loads with mteb's loaders, the
    `model_meta.py` beside `results/` imports as the `ModelMeta` of `model_meta.json`, and mteb's `ResultCache`
    (how the leaderboard reads the results repository) finds every task file under that ModelMeta's name and
    revision. Returns the ModelMeta and the task names; ValueError naming the file on any mismatch. Results still
    under `no_revision_available` (not pushed yet) pass, with a warning that says what the results repository
    requires (`submission_notes`)."""
    from mteb import ResultCache

    folder = Path(folder)
    root = folder.parents[2]
    tasks = sorted(check_mteb_folder(folder))
    meta = check_model_meta_module(root / MODEL_META_MODULE, folder / MODEL_META_JSON)
    loaded = ResultCache(root).load_results(models=[meta], include_remote=False, validate_and_filter=True)
    found = sorted(t.task_name for model in loaded.model_results for t in model.task_results)
    if found != tasks:
        raise ValueError(
            f"mteb's ResultCache finds tasks {found} under '{root}' for {meta.name} at revision {meta.revision}, "
            f"but '{folder}' holds {tasks}: its folder names must be the ModelMeta's name and revision."
        )
    for note in submission_notes(meta, root):
        logger.warning("MTEB results in %s: %s", folder, note)
    return meta, tasks


def submission_notes(meta: ModelMeta, root: str | os.PathLike = "DIR") -> list[str]:
    """What still keeps a checked submission out of MTEB's results repository: results filed under
    `no_revision_available`, i.e. before a push (see `UNPUSHED_NOTE`). Empty once pushed."""
    if meta.revision == NO_REVISION:
        placeholder = not meta.name or meta.name.startswith(f"{DEFAULT_ORG}/")  # `export_name` without a repo id
        return [UNPUSHED_NOTE.format(revision=NO_REVISION, root=root, repo_id="ORG/NAME" if placeholder else meta.name)]
    return []


def find_model_folder(root: str | os.PathLike) -> Path:
    """The one `results/ORG__NAME/REVISION` folder under `root` (as written by `write_mteb_results`)."""
    folders = sorted(p.parent for p in Path(root).glob(f"{RESULTS_DIRNAME}/*/*/{MODEL_META_JSON}"))
    if len(folders) != 1:
        raise ValueError(
            f"'{root}' should hold exactly one {RESULTS_DIRNAME}/ORG__NAME/REVISION/{MODEL_META_JSON} (found "
            f"{len(folders)}); pass the folder given to `export --mteb-results`."
        )
    return folders[0]


def check_rekeyable(root: str | os.PathLike) -> None:
    """ValueError unless `rekey_mteb_results` can file the results under `root` after a push (mteb installed, one
    model folder): checked before the upload, which cannot be taken back."""
    if not mteb_available():
        raise ValueError(f"--mteb-results: filing MTEB results needs the mteb package: {INSTALL_HINT}.")
    find_model_folder(root)


def rekey_mteb_results(root: str | os.PathLike, repo_id: str, revision: str) -> Path:
    """After a push: move the results under `root` to `results/<ORG__NAME of repo_id>/<revision>/` and write
    `model_meta.json` and `model_meta.py` again with that name, revision and reference; check them with mteb."""
    from mteb.models import ModelMeta
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    old = find_model_folder(root)
    module = Path(root) / MODEL_META_MODULE
    notes = module_notes(module.read_text(encoding="utf-8")) if module.is_file() else []
    meta = (  # an export written before model_meta.py existed has only the JSON
        import_model_meta(module) if module.is_file()
        else ModelMeta.model_validate_json_resolved((old / MODEL_META_JSON).read_text(encoding="utf-8"))
    ).model_copy(update=dict(
        name=repo_id, revision=revision, reference=f"https://huggingface.co/{repo_id}",
        loader=SentenceTransformerEncoderWrapper,
    ))
    new = Path(root) / RESULTS_DIRNAME / model_folder_name(repo_id) / revision
    if new != old:
        if new.exists():
            shutil.rmtree(new)
        new.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(old), str(new))
        if not any(old.parent.iterdir()):
            old.parent.rmdir()
    write_model_meta(new, meta, notes)
    check_mteb_submission(new)
    return new
