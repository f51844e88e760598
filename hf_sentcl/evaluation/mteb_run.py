"""mteb's own evaluation of an encoder (`hf-sentcl evaluate --model MODEL --mteb TASKS_OR_BENCHMARK`).

`hf_sentcl.evaluation.mteb` scores the 7 STS tasks with hf_sentcl's evaluator under MTEB's protocol. This module hands
the encoder to `mteb.evaluate` instead, so that data, protocol and metric are mteb's for any task type (STS,
retrieval, classification, clustering, ...): `MtebEncoder` is the encoder seen through mteb's `EncoderProtocol`, and
mteb's `ResultCache` saves each task as `ROOT/results/<ORG__NAME>/<REVISION>/<Task>.json` (with `model_meta.json` and
mteb's `run_settings.jsonl`), ROOT being the `mteb_results/` folder that `hf-sentcl export` writes and `push` files.
When an export's result files are already there, their ModelMeta (name, revision) is reused, so mteb's files join
them and `push` moves them together; mteb's own score then replaces the export's for a task both hold.

Offline (`HF_HUB_OFFLINE`), `datasets` loads a Hub dataset only from its own cache of prepared datasets
(`HF_DATASETS_CACHE/<org>___<name>/<config>/<version>/<hash>/`), never from the Hub download cache, so
`check_offline_data` names the tasks whose data is not there before any model loads.
`mteb` is imported inside the functions: it is an optional dependency (`pip install "hf-sentcl[mteb]"`).
"""

from __future__ import annotations

import difflib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_sentcl.common.argv import split_commas
from hf_sentcl.common.layout import EXPORT_DIRNAME, MTEB_RESULTS_DIRNAME, RESULTS_JSON
from hf_sentcl.evaluation.mteb import NO_REVISION, RESULTS_DIRNAME

if TYPE_CHECKING:
    from mteb import AbsTask
    from mteb.models import ModelMeta

DEFAULT_ORG = "hf_sentcl"  # the organisation of a model name made up here, as `hf-sentcl export` names its models
MODEL_META_JSON = "model_meta.json"  # what mteb's ResultCache writes beside the task files of a revision folder
CHECKPOINT_NAME = re.compile(r"checkpoint-\d+")


class MtebDataError(ValueError):
    """A task's data cannot be had here (offline and not cached): says which task and what to do."""


# ------------------------------------------------------------------------------------------------ task names
def resolve_tasks(value: str) -> tuple[list[AbsTask], str | None]:
    """The mteb tasks that `value` names, and the benchmark's name when it names one.

    `value` is one benchmark name (tried first as a whole, since names such as 'MTEB(eng, v2)' hold commas) or
    comma-separated task names, as mteb spells them. ValueError naming every unknown name with mteb's closest one.
    """
    import mteb

    text = value.strip()
    if not text:
        raise ValueError("no task or benchmark named; give e.g. STS12,STSBenchmark or 'MTEB(eng, v2)'.")
    try:
        benchmark = mteb.get_benchmark(text)
    except KeyError:
        benchmark = None
    if benchmark is not None:
        return list(benchmark.tasks), benchmark.name
    tasks, unknown = [], []
    for name in dict.fromkeys(split_commas(text)):
        try:
            tasks.append(mteb.get_task(name))
        except KeyError:
            unknown.append(name)
    if unknown:
        raise ValueError(unknown_names_message(text, unknown))
    return tasks, None


def unknown_names_message(text: str, unknown: Sequence[str]) -> str:
    """What `resolve_tasks` says about unknown names: each with mteb's closest task name, or the whole value with the
    closest benchmark name when it looks like one (a benchmark name's commas split it into pieces that are no tasks)."""
    import mteb

    benchmarks = [b.name for b in mteb.get_benchmarks()]
    guess = closest(text, benchmarks)
    if guess is not None and (len(unknown) > 1 or "(" in text):
        return f"unknown MTEB benchmark '{text}' (did you mean '{guess}'?)."
    # beta tasks left out: mteb logs a warning for each of the ~400 it instantiates
    names = [t.metadata.name for t in mteb.get_tasks(exclude_superseded=False, exclude_private=False)]
    parts = []
    for name in unknown:
        guess = closest(name, names) or closest(name, benchmarks)
        parts.append(f"'{name}'" + (f" (did you mean '{guess}'?)" if guess else ""))
    return (f"unknown MTEB task or benchmark {', '.join(parts)}. Give comma-separated task names as mteb spells them "
            "(mteb.get_tasks()) or one benchmark name (mteb.get_benchmarks()).")


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate closest to `name`, ignoring case (an exact match in another case first); None if none is close."""
    lowered = {candidate.lower(): candidate for candidate in candidates}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
    return lowered[close[0]] if close else None


# ------------------------------------------------------------------------------------------------ offline data
def leaf_tasks(tasks: Sequence[AbsTask]) -> list[AbsTask]:
    """The tasks that load data: an aggregate task (one score over several tasks) stands for its parts."""
    from mteb.abstasks.aggregated_task import AbsTaskAggregate

    leaves: list[AbsTask] = []
    for task in tasks:
        leaves += leaf_tasks(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]
    return leaves


def prepared_dataset_cached(path: str) -> bool:
    """Whether `datasets` holds a prepared copy of the Hub dataset `path`: where `load_dataset` looks when offline
    (`CachedDatasetModuleFactory`: HF_DATASETS_CACHE/<org>___<snake_name>/<config>/<version>/<hash>/)."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    if not path.strip("/"):
        return False
    *namespace, name = path.split("/")
    folder = Path(datasets.config.HF_DATASETS_CACHE) / "___".join([*namespace, camelcase_to_snakecase(name)])
    return any(entry.is_dir() for entry in folder.glob("*/*/*"))


def loads_offline(task: AbsTask) -> bool:
    """Whether `task` loads its data now (tried only for data `datasets` does not hold: a task may read it another
    way); the data is released again, since mteb loads each task when it evaluates it."""
    try:
        task.load_data()
    except (ConnectionError, FileNotFoundError):  # datasets' offline error; DatasetNotFoundError
        return False
    task.unload_data()
    return True


def offline_message(tasks: Sequence[AbsTask]) -> str:
    """The error for tasks whose data is not here while offline: which, where `datasets` looked, and what to do."""
    import datasets

    named = ", ".join(
        f"{task.metadata.name} (Hub dataset {task.metadata.dataset.get('path')}, "
        f"revision {task.metadata.dataset.get('revision')})"
        for task in tasks
    )
    first = tasks[0].metadata.name
    state = "HF_HUB_OFFLINE is set and" if datasets.config.HF_HUB_OFFLINE else "the Hub cannot be reached and"
    return (
        f"{state} the data of mteb task(s) {named} is not in the datasets cache "
        f"({datasets.config.HF_DATASETS_CACHE}). It must be downloaded online first: run this command once with "
        f"HF_HUB_OFFLINE unset, or `python -c \"import mteb; mteb.get_task('{first}').load_data()\"`, then again "
        "offline."
    )


def check_offline_data(tasks: Sequence[AbsTask]) -> None:
    """Offline only: MtebDataError naming every task whose data `load_data` cannot get here (before a model loads)."""
    import datasets

    if not datasets.config.HF_HUB_OFFLINE:
        return
    missing = [
        task for task in leaf_tasks(tasks)
        if not (prepared_dataset_cached(str(task.metadata.dataset.get("path", ""))) or loads_offline(task))
    ]
    if missing:
        raise MtebDataError(offline_message(missing))


# ------------------------------------------------------------------------------------------------ where and as whom
def run_folder_of(model: str) -> Path | None:
    """The run folder `model` belongs to: itself, or the folder above an `export/` or `checkpoint-N/` folder, when
    that holds a run's `results.json` or `mteb_results/`; None for anything else (a backbone, a Hub id)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    if folder.name == EXPORT_DIRNAME or CHECKPOINT_NAME.fullmatch(folder.name):
        folder = folder.parent
    if (folder / RESULTS_JSON).is_file() or (folder / MTEB_RESULTS_DIRNAME).is_dir():
        return folder
    return None


def results_root(model: str, output: str | None) -> tuple[Path, str]:
    """Where mteb's result files go (`mteb_results/` in --output's folder, else in the run folder) and the model
    name a new ModelMeta gets (`hf_sentcl/<run folder>`, as `hf-sentcl export` names it, else
    `hf_sentcl/<model's last name part>`). ValueError when there is neither --output nor a run folder."""
    run = run_folder_of(model)
    if output is None and run is None:
        raise ValueError(
            f"'{model}' is no run folder, so give --output: its folder gets {MTEB_RESULTS_DIRNAME}/ (the results "
            "folder that `hf-sentcl export` and `push` file) and the summary JSON."
        )
    root = (Path(output).resolve().parent if output else run) / MTEB_RESULTS_DIRNAME
    base = run.name if run is not None else re.split(r"[/:]", model.rstrip("/"))[-1]
    return root, f"{DEFAULT_ORG}/{re.sub(r'[^A-Za-z0-9_.-]', '_', base)}"


def existing_meta(root: Path, name: str) -> ModelMeta | None:
    """The ModelMeta of result files already under `root` (an export's, after a push its pushed revision): the one
    named `name`, else the only one there; None when there is none (or several, none named `name`)."""
    from mteb.models import ModelMeta

    metas = [
        ModelMeta.model_validate_json_resolved(path.read_text(encoding="utf-8"))
        for path in sorted(root.glob(f"{RESULTS_DIRNAME}/*/*/{MODEL_META_JSON}"))
    ]
    named = [meta for meta in metas if meta.name == name]
    return named[0] if named else metas[0] if len(metas) == 1 else None


def model_meta(root: Path, name: str, encoder) -> ModelMeta:
    """The ModelMeta the results are filed under: `existing_meta`'s, else a new one for `name` at mteb's
    `no_revision_available` (cosine similarity, the encoder's size and token limit; what is not known stays None)."""
    from mteb.models import ModelMeta
    from mteb.models.model_meta import ScoringFunction

    found = existing_meta(root, name)
    if found is not None:
        return found
    return ModelMeta(
        loader=None, name=name, revision=NO_REVISION, release_date=None, languages=None,
        n_parameters=encoder.num_parameters(), memory_usage_mb=None, max_tokens=encoder.max_seq_length,
        embed_dim=None, license=None, open_weights=True, public_training_code=None, public_training_data=None,
        framework=["PyTorch"], similarity_fn_name=ScoringFunction.COSINE, use_instructions=False,
        training_datasets=None,
    )


# ------------------------------------------------------------------------------------------------ the encoder
class MtebEncoder:
    """An hf_sentcl `SentenceEncoder` as mteb's `EncoderProtocol`: each `encode` embeds the texts of mteb's
    DataLoader with the encoder's own `encode` (its pooling, head and length sort), and similarities are cosine,
    computed by mteb's functions. No prompts or instructions: the encoder was trained without them."""

    def __init__(self, encoder, meta: ModelMeta, batch_size: int = 128, bf16: bool = False, bars: bool = False):
        self.encoder = encoder
        self.meta = meta
        self.batch_size = batch_size
        self.bf16 = bf16
        self.bars = bars

    @property
    def mteb_model_meta(self) -> ModelMeta:
        """Name, revision and similarity mteb files the results under."""
        return self.meta

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None, **kwargs: Any):
        """The embeddings of every text of `inputs` (mteb's batches), in order, as a float32 array."""
        texts = [text for batch in inputs for text in batch["text"]]
        bars = None if self.bars else False  # the encoder's bar: only on a terminal and for long jobs
        return self.encoder.encode(texts, batch_size=self.batch_size, bf16=self.bf16, show_progress_bar=bars)

    def similarity(self, embeddings1, embeddings2):
        """Cosine similarity of every row of `embeddings1` with every row of `embeddings2` (mteb's `cos_sim`)."""
        from mteb.similarity_functions import cos_sim

        return cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """Cosine similarity of row i of `embeddings1` with row i of `embeddings2` (mteb's `pairwise_cos_sim`)."""
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(embeddings1, embeddings2)


# ------------------------------------------------------------------------------------------------ the run
@dataclass
class TaskScore:
    """One task's main score as mteb reports it (its own scale, 0-1 for correlations and ranking metrics)."""

    main_score: float
    metric: str
    seconds: float


def say_now(line: str) -> None:
    """Print `line` at once, so that it keeps its place among the log lines on stderr when stdout is a file."""
    print(line, flush=True)


def evaluate_tasks(
    model: MtebEncoder, tasks: Sequence[AbsTask], root: Path, *, bars: bool = False,
    say: Callable[[str], None] = say_now,
) -> dict[str, TaskScore]:
    """Run `mteb.evaluate` on each task in turn, saving through a `ResultCache` at `root`; `say` one line as a task
    starts and one with its main score as it ends. Every task is evaluated again (mteb's overwrite strategy
    'always'), so a file the export wrote from hf_sentcl's own STS scores is replaced by mteb's."""
    import mteb

    cache = mteb.ResultCache(root)
    scores: dict[str, TaskScore] = {}
    for number, task in enumerate(tasks, start=1):
        name, metric, prefix = task.metadata.name, task.metadata.main_score, f"[{number}/{len(tasks)}]"
        say(f"{prefix} {name} ({task.metadata.type}): evaluating with mteb ...")
        start = time.perf_counter()
        try:
            result = mteb.evaluate(
                model, task, cache=cache, overwrite_strategy="always", co2_tracker=False, show_progress_bar=bars,
                encode_kwargs={"batch_size": model.batch_size, "show_progress_bar": bars},
            )
        except ConnectionError as err:  # datasets' error for data neither cached nor reachable
            raise MtebDataError(f"{offline_message([task])} ({err})") from err
        if not result.task_results:
            raise RuntimeError(f"mteb returned no result for task {name}: {result.exceptions}")
        score = TaskScore(float(result.task_results[0].get_score()), metric, round(time.perf_counter() - start, 3))
        scores[name] = score
        say(f"{prefix} {name}: {metric} = {score.main_score:.4f} ({100 * score.main_score:.2f} x 100) "
            f"in {score.seconds:.1f} s")
    return scores


def check_results_load(root: Path, meta: ModelMeta, names: Sequence[str]) -> Path:
    """The revision folder of `meta` under `root`, once mteb's `ResultCache` has loaded a result for each of `names`
    there (how mteb and its leaderboard read result folders); ValueError naming what it did not find."""
    import mteb

    loaded = mteb.ResultCache(root).load_results(models=[meta], include_remote=False)
    found = {result.task_name for model in loaded.model_results for result in model.task_results}
    folder = root / RESULTS_DIRNAME / meta.model_name_as_path() / str(meta.revision)
    missing = sorted(set(names) - found)
    if missing:
        raise ValueError(f"mteb's ResultCache does not load {missing} from '{folder}' (it found {sorted(found)}).")
    return folder


def mteb_summary(
    scores: dict[str, TaskScore], meta: ModelMeta, folder: Path, *, model: str, pooling: str,
    benchmark: str | None,
) -> dict[str, Any]:
    """The --output JSON: which scores mteb itself computed (`source: mteb`), with mteb's version, the name and
    revision the result files are filed under, and each task's main score on mteb's own scale."""
    import mteb

    return {
        "source": "mteb",
        "mteb_version": mteb.__version__,
        "model": model,
        "pooling": pooling,
        "benchmark": benchmark,
        "mteb_model_name": meta.name,
        "mteb_revision": meta.revision,
        "results_folder": str(folder),
        "scale": "mteb's own: main_score as mteb reports it (0-1 for correlations and ranking metrics)",
        "tasks": {name: round(score.main_score, 6) for name, score in scores.items()},
        "main_metrics": {name: score.metric for name, score in scores.items()},
        "seconds": {name: score.seconds for name, score in scores.items()},
    }
