"""The model card of an export: rendered from a results dict with `huggingface_hub`'s `ModelCard`.

The template, `model_cards/sentence_encoder.md`, is package data (read with `importlib.resources`). Every number
in the card comes from the results dict: a run's `results.json` or the output of `hf-sentcl evaluate
--output`, both brought to one shape by `load_results`. The front matter carries a `model-index` with one
`cos_sim_spearman` result (0-100) per STS task, labelled as MTEB's datasets; those numbers are the MTEB-protocol
scores (`hf_sentcl.evaluation.mteb`), never SentEval's SICK-R test split. The inputs of a card are saved beside
it (`CARD_INPUTS`) so that `push` can render it again for the repository it uploads to.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from hf_sentcl.evaluation.mteb import MTEB_STS_DATASETS
from hf_sentcl.evaluation.plots import PLOT_CAPTIONS, PLOTS_DIRNAME
from hf_sentcl.evaluation.report import (
    RUN_LABELS,
    SHORT_NAMES,
    read_json,
    sts_markdown_table,
    transfer_markdown_table,
    write_json,
)
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.evaluation.transfer import TRANSFER_TASKS
from hf_sentcl.export.plan import ExportPlan
from hf_sentcl.methods import METHODS, PAPERS
from hf_sentcl.modeling.backbone import EMBEDDED_MODEL_ALIAS
from hf_sentcl.modeling.pooling import masked_max, masked_mean
from hf_sentcl.recipe.metadata import library_versions

TEMPLATE = files("hf_sentcl") / "model_cards" / "sentence_encoder.md"


CARD_INPUTS = "hf_sentcl_card.json"  # the plan and results a card was rendered from, beside README.md


#: the label of the one row of results from `hf-sentcl evaluate`
EVALUATED = "evaluated"


ROW_LABELS = {**RUN_LABELS, EVALUATED: "this model"}


#: results.json keys the card reads (the rest, e.g. loss curves, stays out of the export)
CARD_KEYS = (
    "source", "method", "model_name_or_path", "pooling", "sts_mode", "sick_split", "sts", "transfer", "mteb_sts",
    "mteb_sts_seconds", "train", "recipe_settings", "training_data", "precision", "versions",
)


# Published training corpora recognised by file name (train_file) -> their Hub dataset.
KNOWN_TRAIN_FILES = {
    "wiki1m_for_simcse.txt": "princeton-nlp/datasets-for-simcse",
    "wiki1m_subset.txt": "princeton-nlp/datasets-for-simcse",
    "nli_for_simcse.csv": "princeton-nlp/datasets-for-simcse",
}


# unlabeled_sts setting -> the STS tasks whose texts were trained on ("all-scored": the scored pairs only)
UNLABELED_STS_TASKS = {
    "stsb": ["STSBenchmark"], "all": list(MTEB_STS_DATASETS), "all-scored": list(MTEB_STS_DATASETS),
}


EXAMPLE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A cat sleeps on the sofa.")


# ------------------------------------------------------------------------------------------------ results files
def _check_scores(path: Path, where: str, scores: Any, known: Sequence[str]) -> dict[str, float]:
    """`scores` as {task: finite number}, with at least one task of `known`; ValueError naming the file if not."""
    if not isinstance(scores, Mapping) or not any(t in scores for t in known):
        raise ValueError(f"Results file '{path}': {where} holds none of the tasks {', '.join(known)}.")
    bad = {k: v for k, v in scores.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    if bad:
        raise ValueError(f"Results file '{path}': {where} has scores that are not finite numbers: {bad}.")
    return {k: float(v) for k, v in scores.items()}


def _from_evaluate(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The output of `hf-sentcl evaluate --output` in the shape of a run's results (one row)."""
    results: dict[str, Any] = {
        "source": "evaluate",
        "model_name_or_path": raw["model"],
        "pooling": raw.get("pooling"),
        "sts_mode": raw.get("sts_mode", "all"),
        "sick_split": raw.get("sick_split", "test"),
    }
    if "sts" in raw["tasks"]:
        sts = {k: v for k, v in raw.items() if k in (*STS_TASKS, "Avg")}
        results["sts"] = {EVALUATED: _check_scores(path, "the STS scores", sts, STS_TASKS)}
    if "transfer" in raw["tasks"]:
        results["transfer"] = {EVALUATED: _check_scores(path, "key 'transfer'", raw.get("transfer"), TRANSFER_TASKS)}
    return results


def _from_run(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    """A run's results.json, checked, with only the keys the card reads."""
    results = {k: raw[k] for k in CARD_KEYS if k in raw}
    for key, known in (("sts", STS_TASKS), ("transfer", TRANSFER_TASKS)):
        rows = results.get(key) or {}
        if not isinstance(rows, Mapping):
            raise ValueError(f"Results file '{path}': key '{key}' should map run labels to scores.")
        flat = rows and not all(isinstance(v, Mapping) for v in rows.values())  # {task: acc}, as older runs wrote
        rows = {EVALUATED: rows} if flat else rows
        results[key] = {label: _check_scores(path, f"key '{key}.{label}'", v, known) for label, v in rows.items()}
        if not results[key]:
            del results[key]
    if results.get("mteb_sts"):
        results["mteb_sts"] = _check_scores(path, "key 'mteb_sts'", results["mteb_sts"], STS_TASKS)
    return results


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read the results a card is written from: a run's `results.json` or the JSON of `hf-sentcl evaluate
    --output` (STS and/or transfer). Both come back in the run's shape: `sts`/`transfer` map a row label
    (`before`, `after` or `evaluated`) to scores. ValueError saying why for a file that holds no usable scores.
    """
    path = Path(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"Results file '{path}' holds a JSON {type(raw).__name__}, not an object of results.")
    if "model" in raw and "tasks" in raw:
        results = _from_evaluate(path, raw)
    elif "sts" in raw or "method" in raw:
        results = _from_run(path, raw)
    else:
        raise ValueError(
            f"Results file '{path}' is neither a run's results.json (keys 'method', 'sts') nor the output of "
            "`hf-sentcl evaluate --output` (keys 'model', 'tasks'); its keys are "
            f"{sorted(raw)[:8]}."
        )
    if not any(results.get(k) for k in ("sts", "transfer", "mteb_sts")):
        raise ValueError(
            f"Results file '{path}' holds no STS or transfer scores, so the card would have no results; evaluate "
            "the model (`hf-sentcl evaluate ... --output FILE`) and pass that file with --results."
        )
    return results


def hub_model_id(name_or_path: str | None) -> str | None:
    """The Hub id of a base model name (the embedded alias maps to its Hub original); None for local paths."""
    if not name_or_path:
        return None
    if name_or_path == EMBEDDED_MODEL_ALIAS:
        return "sentence-transformers/all-MiniLM-L6-v2"
    if name_or_path.startswith((".", "/", "~")) or Path(name_or_path).exists():
        return None
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return None
    return name_or_path


def training_datasets(results: Mapping[str, Any]) -> list[str] | None:
    """Hub dataset ids of the training data, where they are known."""
    data = results.get("training_data") or {}
    if data.get("source") == "dataset_name":
        return [data["name"]]
    if data.get("source") == "unlabeled_sts":
        tasks = UNLABELED_STS_TASKS.get(data.get("name"), [])
        return [MTEB_STS_DATASETS[t][0] for t in tasks] or None
    if data.get("source") == "train_file" and data.get("name") in KNOWN_TRAIN_FILES:
        return [KNOWN_TRAIN_FILES[data["name"]]]
    return None


def mteb_training_tasks(results: Mapping[str, Any]) -> set[str] | None:
    """The MTEB task names whose texts the model was trained on (MTEB's `training_datasets`), where known."""
    data = results.get("training_data") or {}
    if data.get("source") != "unlabeled_sts":
        return None
    return {MTEB_STS_DATASETS[t][1] for t in UNLABELED_STS_TASKS.get(data.get("name"), [])} or None


def citations(method: str | None, settings: Mapping[str, Any]) -> list[str]:
    """BibTeX entries for the method and for the IFM/BYOP logit perturbation when it was used."""
    keys = [METHODS[method].paper] if method in METHODS else []
    perturbation = settings.get("perturbation")
    if perturbation:
        keys.append("ifm" if set(re.findall(r"[pn][+-]", perturbation)) == {"p-", "n+"} else "byop")
    return [PAPERS[k].bibtex for k in dict.fromkeys(keys) if k]


def mteb_eval_results(scores: Mapping[str, float]) -> list[EvalResult]:
    """One model-index entry per STS task (cos_sim_spearman, 0-100) for MTEB-protocol scores."""
    return [
        EvalResult(
            task_type="STS",
            dataset_type=dataset,
            dataset_name=f"MTEB {name}",
            dataset_config="default",
            dataset_split="test",
            dataset_revision=revision,
            metric_type="cos_sim_spearman",
            metric_value=round(float(scores[task]), 4),
        )
        for task, (dataset, name, revision) in MTEB_STS_DATASETS.items()
        if task in scores
    ]


def _source(function) -> str:
    return textwrap.dedent(inspect.getsource(function))


def transformers_snippet(plan: ExportPlan, model_id: str) -> str:
    """Plain-transformers usage: `embed(sentences)` reproduces the sentence-transformers/hf_sentcl vectors.

    The token reductions are the source of `hf_sentcl.modeling.pooling`'s own functions, and the states they read
    follow `pool` for the plan's mode (the export tests run this snippet against `SentenceEncoder.encode`).
    """
    mode = plan.mode
    lines = [
        "import torch",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        f'model_id = "{model_id}"',
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        "model = AutoModel.from_pretrained(model_id).eval()",
    ]
    if plan.head == "dense":
        dense_path = f"{plan.module_dirs['Dense']}/model.safetensors"
        lines += [
            "",
            "# The trained Linear+tanh head is stored as the sentence-transformers Dense module.",
            "import os",
            "from huggingface_hub import hf_hub_download",
            "from safetensors.torch import load_file",
            "",
            f'dense_file = os.path.join(model_id, "{dense_path}") if os.path.isdir(model_id) '
            f'else hf_hub_download(model_id, "{dense_path}")',
            "dense = load_file(dense_file)",
        ]
    reduce = None if plan.head == "pooler" or mode.token_pooling == "cls" else (
        masked_max if mode.token_pooling == "max" else masked_mean
    )
    if reduce is not None:
        lines += ["", "", _source(reduce).rstrip()]
    body = [
        f"batch = tokenizer(sentences, padding=True, truncation=True, max_length={plan.max_seq_length}, "
        'return_tensors="pt")',
        "with torch.inference_mode():",
        f"    outputs = model(**batch{', output_hidden_states=True' if mode.averaged_state is not None else ''})",
    ]
    if plan.head == "pooler":
        body.append("embeddings = outputs.pooler_output  # [CLS] through the trained head, folded into the pooler")
    elif mode.averaged_state is not None:
        body += [
            f"states = (outputs.hidden_states[{mode.averaged_state}] + outputs.hidden_states[-1]) / 2",
            f'embeddings = {reduce.__name__}(states, batch["attention_mask"])',
        ]
    elif reduce is None:
        body.append("embeddings = outputs.last_hidden_state[:, 0]  # [CLS] state")
    else:
        body.append(f'embeddings = {reduce.__name__}(outputs.last_hidden_state, batch["attention_mask"])')
    if plan.head == "dense":
        body.append('embeddings = torch.tanh(embeddings @ dense["linear.weight"].T + dense["linear.bias"])')
    body.append("return embeddings")
    lines += ["", "", "def embed(sentences: list[str]) -> torch.Tensor:", *("    " + line for line in body)]
    lines += [
        "",
        "",
        f"embeddings = embed({list(EXAMPLE_SENTENCES)!r})",
        "print(torch.nn.functional.cosine_similarity(embeddings[:1], embeddings[1:]))",
    ]
    return "\n".join(lines)


def sentence_transformers_snippet(model_id: str) -> str:
    return textwrap.dedent(
        f"""\
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer("{model_id}")
        embeddings = model.encode({list(EXAMPLE_SENTENCES)!r})
        print(model.similarity(embeddings, embeddings))"""
    )


def _mteb_markdown_table(scores: Mapping[str, float], label: str) -> str:
    tasks = [t for t in (*STS_TASKS, "Avg") if t in scores]
    header = "| | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |"
    rule = "|---|" + "---:|" * len(tasks)
    return "\n".join([header, rule, f"| {label} | " + " | ".join(f"{scores[t]:.2f}" for t in tasks) + " |"])


def _transfer_table(transfer: Mapping[str, Any] | None, labels: Mapping[str, str]) -> str | None:
    """The card's transfer table: flat `{task: acc}` or per run label (`before`/`after`, shown as `labels`)."""
    if not transfer:
        return None
    return transfer_markdown_table({labels.get(k, k): v for k, v in transfer.items()}, note=False)


DEV_COLUMNS = {"eval_stsb_spearman": "STS-B dev Spearman × 100", "eval_alignment": "alignment",
               "eval_uniformity": "uniformity"}


def dev_curve_table(history: Sequence[Mapping[str, Any]], limit: int = 20) -> str | None:
    """A Markdown table of the dev evaluations logged during training (`results["train"]["dev_curve"]`).

    At most `limit` rows, evenly spaced and always including the first and the last evaluation.
    """
    if not history:
        return None
    if len(history) > limit:
        history = [history[i] for i in sorted({round(i * (len(history) - 1) / (limit - 1)) for i in range(limit)})]
    columns = [c for c in DEV_COLUMNS if any(c in entry for entry in history)]
    lines = ["| step | " + " | ".join(DEV_COLUMNS[c] for c in columns) + " |", "|---:|" + "---:|" * len(columns)]
    for entry in history:
        cells = [f"{entry[c]:.2f}" if c == "eval_stsb_spearman" else f"{entry[c]:.4f}" if c in entry else ""
                 for c in columns]
        lines.append(f"| {entry['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the card
def build_card_data(results: Mapping[str, Any], model_name: str) -> ModelCardData:
    """Front matter: library, pipeline tag, tags, base model, datasets and the MTEB-protocol model-index."""
    method = results.get("method")
    eval_results = mteb_eval_results(results.get("mteb_sts") or {}) or None
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=["sentence-transformers", "sentence-similarity", "feature-extraction", "mteb", "hf-sentcl"]
        + ([method] if method else []),
        base_model=hub_model_id(results.get("model_name_or_path")),
        datasets=training_datasets(results),
        model_name=model_name if eval_results else None,
        eval_results=eval_results,
    )


def render_model_card(
    plan: ExportPlan,
    results: Mapping[str, Any],
    *,
    model_id: str,
    repo_id: str | None = None,
    model_name: str | None = None,
    plots: Sequence[str] = (),
) -> ModelCard:
    """Render the model card of an export from a results dict (`load_results`' shape; may be empty).

    `model_id` is what the usage snippets load; `model_name` (default: the last part of `repo_id`/`model_id`) is
    the card's title and the model-index name. `plots` are PNG paths relative to the export folder, shown as
    images with their `PLOT_CAPTIONS`.
    """
    model_name = model_name or (repo_id or model_id).rstrip("/").split("/")[-1]
    method = results.get("method")
    settings = results.get("recipe_settings") or {}
    sts = results.get("sts") or {}
    sts_table = (
        sts_markdown_table({ROW_LABELS.get(k, k): v for k, v in sts.items()}, results.get("sts_mode", "all"))
        if sts else None
    )
    mteb_scores = results.get("mteb_sts")
    train = results.get("train") or {}
    history = train.get("dev_curve") or []
    card_data = build_card_data(results, model_name)
    return ModelCard.from_template(
        card_data,
        template_str=TEMPLATE.read_text(encoding="utf-8"),
        model_title=model_name,
        model_id=model_id,
        repo_id=repo_id,
        method=method,
        method_summary=METHODS[method].summary if method in METHODS else None,
        base_model_name=results.get("model_name_or_path"),
        base_model_id=card_data.base_model,
        plan=plan,
        pooling_description=plan.describe(),
        module_dirs=plan.module_dirs,
        settings=settings,
        training_data=results.get("training_data"),
        train=train,
        dev_table=dev_curve_table(history),
        num_dev_evaluations=len(history),
        sts_table=sts_table,
        sick_split=results.get("sick_split", "test"),
        mteb_table=_mteb_markdown_table(mteb_scores, ROW_LABELS["after" if train else EVALUATED])
        if mteb_scores else None,
        transfer_table=_transfer_table(results.get("transfer"), ROW_LABELS),
        plots=[{"path": p, "caption": PLOT_CAPTIONS.get(Path(p).name, Path(p).stem.replace("_", " "))} for p in plots],
        precision=results.get("precision"),
        versions=results.get("versions") or library_versions(),
        transformers_snippet=transformers_snippet(plan, model_id),
        st_snippet=sentence_transformers_snippet(model_id),
        citations=citations(method, settings),
    )


def write_model_card(
    out_dir: str | os.PathLike,
    plan: ExportPlan,
    results: Mapping[str, Any],
    repo_id: str | None = None,
    *,
    local_id: str | None = None,
    model_name: str | None = None,
) -> Path:
    """Render the card into `out_dir/README.md` (and its inputs into `CARD_INPUTS`); return the card's path.

    The snippets load `repo_id` or, without one, `local_id` (default: the folder itself; an export built in a
    temporary folder passes its final path). PNGs in `out_dir/plots/` are shown in the card.
    """
    out_dir = Path(out_dir).resolve()
    local_id = local_id or str(out_dir)
    if model_name is None and not repo_id:
        local = Path(local_id)
        model_name = local.parent.name if local.name == "export" else local.name  # a run's output_dir/export
    order = {name: i for i, name in enumerate(PLOT_CAPTIONS)}  # known plots in caption order, others after them
    pngs = sorted((out_dir / PLOTS_DIRNAME).glob("*.png"), key=lambda p: (order.get(p.name, len(order)), p.name))
    plots = [p.relative_to(out_dir).as_posix() for p in pngs]
    card = render_model_card(
        plan, results, model_id=repo_id or local_id, repo_id=repo_id, model_name=model_name, plots=plots
    )
    inputs = {"plan": plan.to_dict(), "results": {k: results[k] for k in CARD_KEYS if k in results}}
    write_json(out_dir / CARD_INPUTS, inputs)
    path = out_dir / "README.md"
    card.save(path)
    return path


def rewrite_model_card(out_dir: str | os.PathLike, repo_id: str) -> Path:
    """Render the card of an export again with its usage snippets loading `repo_id` (e.g. before a push)."""
    inputs_path = Path(out_dir) / CARD_INPUTS
    if not inputs_path.is_file():
        raise FileNotFoundError(
            f"'{out_dir}' has no {CARD_INPUTS} (the inputs of its model card), so its card cannot be rendered for "
            f"'{repo_id}'; export it again with `hf-sentcl export ... --overwrite`."
        )
    inputs = read_json(inputs_path)
    return write_model_card(out_dir, ExportPlan.from_dict(inputs["plan"]), inputs["results"], repo_id=repo_id)
