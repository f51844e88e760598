"""mteb's `ModelMeta` of an export, built once and written twice: as `model_meta.json` in the results folder (for
MTEB's results repository) and as `model_meta.py`, the module a contributor adds to mteb's model registry
(`mteb/models/model_implementations/`), which is what puts a model on today's leaderboard.

Both files come from the same `ModelMeta` object (the JSON through mteb's `to_dict`, the module through mteb's
own `to_python`), and the module is checked by importing it, as mteb's registry does, and comparing every field
with the JSON file. `mteb` is needed here (the optional `hf-sentcl[mteb]` dependency).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_sentcl.evaluation.mteb import license_problem
from hf_sentcl.evaluation.report import read_json
from hf_sentcl.export.plan import ExportError

if TYPE_CHECKING:
    from mteb.models import ModelMeta

MODEL_META_MODULE = "model_meta.py"  # beside `results/`, at the root given to `export/push --mteb-results`
MODEL_META_JSON = "model_meta.json"  # in the revision folder, as mteb's ResultCache writes it

MODULE_TEMPLATE = '''\
"""{name} in mteb's model registry, written by hf_sentcl with the same values as its model_meta.json.

Add it to a fork of embeddings-benchmark/mteb as mteb/models/model_implementations/{file_name}.
The revision must be the Hub commit whose results are in results/{folder}/<revision>/.
"""

from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
{notes}
{variable} = {code}
'''

#: the comment of `model_meta.py` that names training data without an MTEB task (mteb's own registry files list such
#: data in comments: `training_datasets` holds MTEB task names only)
NOTES_HEADER = "# Also trained on (not in mteb, so not in training_datasets):"
NOTE_PREFIX = "#   - "


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


def embedding_parameters(export_dir: str | os.PathLike) -> int | None:
    """The input embedding's size, vocab_size x width, from the exported backbone's config.json (mteb's own rule
    for `n_embedding_parameters`, which its tests require of every new open-weights model); None if unknown."""
    path = Path(export_dir) / "config.json"
    config = read_json(path) if path.is_file() else {}
    width = config.get("embedding_size") or config.get("hidden_size")
    return int(config["vocab_size"]) * int(width) if config.get("vocab_size") and width else None


def check_license(license_id: str | None) -> None:
    """ValueError unless mteb's `ModelMeta.license` accepts `license_id` (`license_problem`); checked before any work,
    so a typo does not surface after the export."""
    if problem := license_problem(str(license_id)):
        raise ValueError(f"--license {problem}")


def build_model_meta(
    name: str,
    revision: str,
    date: datetime.datetime,
    export_dir: str | os.PathLike,
    *,
    max_tokens: int,
    embed_dim: int | Sequence[int],
    adapted_from: str | None = None,
    training_tasks: set[str] | None = None,
    training_data: Sequence[str] | None = None,
    license_id: str | None = None,
    training_code: str | None = None,
    citation: str | None = None,
) -> ModelMeta:
    """mteb's `ModelMeta` of the exported model (pydantic validates it here): loaded by mteb through
    sentence-transformers, size read from its weights, cosine similarity. `embed_dim` is a list for a Matryoshka
    model (mteb's convention); `training_data` the Hub ids of its public training data.

    `training_tasks` are the MTEB tasks whose data the training used (an empty set: none; None: not known). The
    ModelMeta's `training_datasets` adds the base model's (`base_training_datasets`, when mteb knows the base), so
    that the file says everything the model saw even where mteb cannot resolve `adapted_from`; it stays None (mteb:
    zero-shot status unknown) only when the training data is not known. `max_tokens` must be the export's
    `max_seq_length` (what sentence-transformers truncates to)."""
    from mteb.models.model_meta import ModelMeta, ScoringFunction
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    check_task_names(training_tasks or ())
    datasets = None
    if training_tasks is not None:
        datasets = set(training_tasks) | (base_training_datasets(adapted_from) or set())
    n_parameters, memory_mb = parameter_count(export_dir)
    return ModelMeta(
        loader=SentenceTransformerEncoderWrapper,
        name=name,
        revision=revision,
        release_date=date.date().isoformat(),
        languages=["eng-Latn"],
        n_parameters=n_parameters,
        n_embedding_parameters=embedding_parameters(export_dir),
        memory_usage_mb=memory_mb,
        max_tokens=max_tokens,
        embed_dim=sorted(set(embed_dim)) if isinstance(embed_dim, Sequence) else embed_dim,
        license=license_id,
        open_weights=True,
        public_training_code=training_code,
        public_training_data=(
            f"https://huggingface.co/datasets/{training_data[0]}" if len(training_data) == 1 else True
        ) if training_data else None,
        framework=["Sentence Transformers", "PyTorch"],
        reference=f"https://huggingface.co/{name}",
        similarity_fn_name=ScoringFunction.COSINE,
        use_instructions=False,
        training_datasets=datasets,
        adapted_from=adapted_from,
        citation=citation,
    )


def base_training_datasets(adapted_from: str | None) -> set[str] | None:
    """The training datasets mteb records for the base model `adapted_from` (its `get_training_datasets()`, which
    follows the base's own `adapted_from` and adds the tasks mteb counts as the same data); None when mteb's
    registry does not know the base or its training data (looked up offline: `fetch_from_hf=False`)."""
    import mteb

    if not adapted_from:
        return None
    try:
        base = mteb.get_model_meta(adapted_from, fetch_from_hf=False)
    except (KeyError, ValueError):  # what mteb raises for a name its registry does not hold
        return None
    return base.get_training_datasets()


def check_task_names(names: Sequence[str] | set[str]) -> None:
    """ExportError naming each name that is not an MTEB task (`training_datasets` holds task names only)."""
    import mteb

    unknown = []
    for name in sorted(set(names)):
        try:
            mteb.get_task(name)  # superseded tasks too (e.g. STSBenchmark), which `get_tasks()` leaves out
        except KeyError:
            unknown.append(name)
    if unknown:
        raise ExportError(
            f"training data declared as MTEB datasets {unknown}, which are not MTEB task names (e.g. "
            "'STSBenchmark', 'SICK-R'); fix training_data.mteb_datasets in the results file."
        )


def meta_record(meta: ModelMeta) -> dict[str, Any]:
    """The JSON content of `meta` (mteb's `to_dict`, as its ResultCache saves it), with the training datasets
    sorted so that the file is the same on every run."""
    record = json.loads(json.dumps(meta.to_dict(), default=str))
    if isinstance(record.get("training_datasets"), list):
        record["training_datasets"] = sorted(record["training_datasets"])
    return record


def variable_name(name: str) -> str:
    """A Python name for a model, as mteb's files spell them: 'My-Org/SimCSE-v1' -> 'my_org__simcse_v1'."""
    identifier = re.sub(r"\W", "_", name.lower().replace("/", "__"))
    return identifier if identifier[0].isalpha() else f"model_{identifier}"


def render_model_meta(meta: ModelMeta, notes: Sequence[str] = ()) -> str:
    """The text of `model_meta.py`: mteb's imports and `<variable> = ModelMeta(...)` written by mteb's own
    `to_python` (the generator its contributing guide points to), after a comment naming the training data that
    has no MTEB task (`notes`), as mteb's own registry files do."""
    org = re.sub(r"\W", "_", meta.name.split("/")[0].lower())
    comment = "".join(f"{NOTE_PREFIX}{note}\n" for note in notes)
    return MODULE_TEMPLATE.format(
        name=meta.name, file_name=f"{org}_models.py", folder=meta.model_name_as_path(),
        notes=f"\n{NOTES_HEADER}\n{comment}" if notes else "", variable=variable_name(meta.name),
        code=meta.to_python(),
    )


def module_notes(text: str) -> list[str]:
    """The training-data notes of a `model_meta.py` written by `render_model_meta` (kept when it is rewritten)."""
    lines = text.splitlines()
    if NOTES_HEADER not in lines:
        return []
    notes = []
    for line in lines[lines.index(NOTES_HEADER) + 1 :]:
        if not line.startswith(NOTE_PREFIX):
            break
        notes.append(line[len(NOTE_PREFIX) :])
    return notes


def import_model_meta(path: str | os.PathLike) -> ModelMeta:
    """Import the module at `path` and return its one `ModelMeta` (found as mteb's registry finds them: every
    module attribute that is an instance); ValueError naming the file if it fails to import or has not one."""
    from mteb.models import ModelMeta

    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"hf_sentcl_mteb_meta_{variable_name(path.stem)}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ValueError(f"'{path}' is not a Python module that can be imported.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a pydantic ValidationError, a SyntaxError...: all mean "mteb cannot use this file"
        raise ValueError(f"'{path}' does not import with mteb: {err}") from err
    metas = [value for value in vars(module).values() if isinstance(value, ModelMeta)]
    if len(metas) != 1:
        raise ValueError(f"'{path}' should define exactly one mteb ModelMeta; it defines {len(metas)}.")
    return metas[0]


def check_model_meta_module(path: str | os.PathLike, json_path: str | os.PathLike) -> ModelMeta:
    """Import `model_meta.py` with mteb and check that its `ModelMeta` equals `model_meta.json`, field by field;
    ValueError naming the file and the first field that differs. Returns the imported `ModelMeta`."""
    meta = import_model_meta(path)
    module, saved = meta_record(meta), read_json(json_path)
    if isinstance(saved.get("training_datasets"), list):
        saved["training_datasets"] = sorted(saved["training_datasets"])
    for field in sorted(module.keys() | saved.keys()):
        if module.get(field) != saved.get(field):
            raise ValueError(
                f"'{path}' does not match '{json_path}': field '{field}' is {module.get(field)!r} in the module "
                f"but {saved.get(field)!r} in the JSON file."
            )
    return meta
