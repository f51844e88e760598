"""The model card of an export: rendered from a results dict with `huggingface_hub`'s `ModelCard`.

The template, `model_cards/sentence_encoder.md`, is package data (read with `importlib.resources`). Every number
in the card comes from the results dict: a run's `results.json` or the output of `hf-sentcl evaluate
--output`, both brought to one shape by `load_results`. The front matter carries a `model-index` with one
`cos_sim_spearman` result (0-100) per STS task, labelled as MTEB's datasets; those numbers are the MTEB-protocol
scores (`hf_sentcl.evaluation.mteb`), never SentEval's SICK-R test split. The metadata also carries the license and
language when known and a sentence-similarity widget. The card names no local path: without a repository id its
snippets load the placeholder `PLACEHOLDER_ID` (the card says to replace it). The inputs of a card are saved beside
it (`CARD_INPUTS`, never uploaded) so that `push` can render it again for the repository it uploads to.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_sentcl.evaluation.mteb import MTEB_STS_DATASETS
from hf_sentcl.evaluation.plots import PLOT_CAPTIONS, PLOTS_DIRNAME
from hf_sentcl.evaluation.report import (
    SHORT_NAMES,
    read_json,
    sts_markdown_table,
    transfer_markdown_table,
    write_json,
)
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.export.card_fields import PLACEHOLDER_ID, card_settings, data_line, public_name, public_value, widget
from hf_sentcl.export.plan import ExportPlan
from hf_sentcl.export.results import (
    CARD_INPUTS,
    CARD_KEYS,
    EVALUATED,
    ROW_LABELS,
    hub_model_id,
    training_datasets,
)
from hf_sentcl.export.snippets import sentence_transformers_snippet, transformers_snippet
from hf_sentcl.recipe.metadata import library_versions
from hf_sentcl.recipe.parallelism import parallelism_summary
from hf_sentcl.registry import METHODS, PAPERS

TEMPLATE = files("hf_sentcl") / "model_cards" / "sentence_encoder.md"


def citations(method: str | None, settings: Mapping[str, Any]) -> list[str]:
    """BibTeX entries for the method and for the IFM/BYOP logit perturbation when it was used."""
    papers = [METHODS[method].paper] if method in METHODS else []
    perturbation = settings.get("perturbation")
    if perturbation:
        papers.append(PAPERS["ifm" if set(re.findall(r"[pn][+-]", perturbation)) == {"p-", "n+"} else "byop"])
    return [paper.bibtex for paper in dict.fromkeys(papers) if paper]


#: `Project-URL` labels of the hf-sentcl distribution that name where its code is, in the order they are preferred
CODE_URL_LABELS = ("repository", "source", "source code", "code", "homepage")


def project_code_url() -> str | None:
    """hf_sentcl's own repository URL from its installed distribution's metadata (pyproject's `[project.urls]`:
    Repository, Source, ...), or None when it names none (the case while pyproject has no `[project.urls]`)."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        meta = metadata("hf-sentcl")
    except PackageNotFoundError:
        return None
    urls = {}
    for entry in meta.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        urls.setdefault(label.strip().lower(), url.strip())
    found = [urls[label] for label in CODE_URL_LABELS if urls.get(label)]
    return found[0] if found else (meta.get("Home-page") or None)


def training_code_url(method: str | None) -> str | None:
    """The `public_training_code` of a model trained here: hf_sentcl's repository (`project_code_url`) when the
    package names one, else the public code of the method's paper (`Paper.code`, the reference implementation
    that defines the method), else None (e.g. CLEAR, whose authors released no code)."""
    paper = METHODS[method].paper if method in METHODS else None
    return project_code_url() or (paper.code if paper else None)


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


def matryoshka_table(results: Mapping[str, Any]) -> tuple[list[int], str | None]:
    """The sizes the encoder was trained to be truncated to and the STS table of the trained encoder at each
    (the full size first); ([], None) for an encoder trained without `matryoshka_dims`."""
    by_dim = results.get("sts_by_dim") or {}
    label = "after" if "after" in by_dim else next(iter(by_dim), None)
    if label is None:
        return [], None
    rows = {f"first {d} dims": scores for d, scores in by_dim[label].items()}
    full = (results.get("sts") or {}).get(label)
    if full:
        rows = {"full size": full, **rows}
    dims = sorted((int(d) for d in by_dim[label]), reverse=True)
    return dims, sts_markdown_table(rows, results.get("sts_mode", "all"))


# ------------------------------------------------------------------------------------------------ the card
def build_card_data(
    results: Mapping[str, Any], model_name: str, license_id: str | None = None,
    language: str | list[str] | None = None, sentence_transformers: bool = True,
) -> ModelCardData:
    """Front matter: library, pipeline tag, tags, license, language, base model, the datasets the run declared, the
    sentence-similarity widget and the MTEB-protocol model-index. An export without sentence-transformers files
    (prompt pooling) is a transformers feature extractor, without the widget (the Hub's runs sentence-transformers)."""
    method = results.get("method")
    eval_results = mteb_eval_results(results.get("mteb_sts") or {}) or None
    library = ["sentence-transformers", "sentence-similarity"] if sentence_transformers else []
    return ModelCardData(
        library_name="sentence-transformers" if sentence_transformers else "transformers",
        pipeline_tag="sentence-similarity" if sentence_transformers else "feature-extraction",
        tags=[*library, "feature-extraction", "mteb", "hf-sentcl"] + ([method] if method else []),
        license=license_id,
        language=language,
        base_model=hub_model_id(results.get("model_name_or_path")),
        datasets=training_datasets(results),
        model_name=model_name if eval_results else None,
        eval_results=eval_results,
        widget=widget() if sentence_transformers else None,
    )


def _sts_table(results: Mapping[str, Any]) -> str | None:
    """The markdown STS table of the results' "sts" rows (None without them)."""
    sts = results.get("sts") or {}
    if not sts:
        return None
    return sts_markdown_table({ROW_LABELS.get(k, k): v for k, v in sts.items()}, results.get("sts_mode", "all"))


def render_model_card(
    plan: ExportPlan,
    results: Mapping[str, Any],
    *,
    model_id: str,
    repo_id: str | None = None,
    model_name: str | None = None,
    plots: Sequence[str] = (),
    license_id: str | None = None,
    language: str | list[str] | None = None,
) -> ModelCard:
    """Render the model card of an export from a results dict (`load_results`' shape; may be empty).

    `model_id` is what the usage snippets load (`PLACEHOLDER_ID` until the repository is known); `model_name`
    (default: the last part of `repo_id`/`model_id`) is the card's title and the model-index name. `plots` are PNG
    paths relative to the export folder, shown as images with their `PLOT_CAPTIONS`. `license_id` and `language`
    go into the metadata.
    """
    model_name = model_name or (repo_id or model_id).rstrip("/").split("/")[-1]
    method = results.get("method")
    settings = results.get("recipe_settings") or {}
    mteb_scores = results.get("mteb_sts")
    train = results.get("train") or {}
    history = train.get("dev_curve") or []
    card_data = build_card_data(results, model_name, license_id, language, plan.sentence_transformers)
    truncate_dims, truncate_table = matryoshka_table(results)
    return ModelCard.from_template(
        card_data,
        template_str=TEMPLATE.read_text(encoding="utf-8"),
        model_title=model_name,
        model_id=model_id,
        repo_id=repo_id,
        placeholder=model_id == PLACEHOLDER_ID,
        method=method,
        method_summary=METHODS[method].summary if method in METHODS else None,
        base_model_name=public_name(results.get("model_name_or_path") or "") or None,
        base_model_id=card_data.base_model,
        plan=plan,
        pooling_description=plan.describe(),
        module_dirs=plan.module_dirs,
        settings=public_value(results.get("hyperparameters") or card_settings(settings)),
        training_data=data_line(results.get("training_data") or {}),
        train=train,
        dev_table=dev_curve_table(history),
        num_dev_evaluations=len(history),
        sts_table=_sts_table(results),
        sick_split=results.get("sick_split", "test"),
        mteb_table=_mteb_markdown_table(mteb_scores, ROW_LABELS["after" if train else EVALUATED])
        if mteb_scores else None,
        transfer_table=_transfer_table(results.get("transfer"), ROW_LABELS),
        plots=[{"path": p, "caption": PLOT_CAPTIONS.get(Path(p).name, Path(p).stem.replace("_", " "))} for p in plots],
        precision=results.get("precision"),
        parallelism=parallelism_summary(results["parallelism"]) if results.get("parallelism") else None,
        versions=results.get("versions") or library_versions(),
        transformers_snippet=transformers_snippet(plan, model_id),
        st_snippet=sentence_transformers_snippet(model_id) if plan.sentence_transformers else None,
        citations=citations(method, settings),
        matryoshka_dims=truncate_dims, matryoshka_table=truncate_table,
        mteb_evaluated=mteb_evaluated_section(results.get("mteb_evaluated")),
    )


def mteb_evaluated_section(evaluated: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The card's section of the scores mteb computed itself (`hf-sentcl evaluate --mteb`'s summary): mteb's version
    and a table of task, metric and main score x 100; None without any."""
    tasks = (evaluated or {}).get("tasks") or {}
    if not tasks:
        return None
    metrics = evaluated.get("main_metrics") or {}
    rows = [f"| {task} | `{metrics.get(task, 'main_score')}` | {100 * score:.2f} |" for task, score in tasks.items()]
    return {"version": evaluated.get("mteb_version", "?"),
            "table": "\n".join(["| task | metric | score |", "|---|---|---:|", *rows])}


def add_mteb_evaluation(out_dir: str | os.PathLike, summary: Mapping[str, Any]) -> Path:
    """Render the card of the export in `out_dir` again with the scores mteb computed itself (`summary`:
    `hf-sentcl evaluate --mteb`'s, `source: mteb`), in their own section that says so, beside (not in) the
    MTEB-protocol scores of hf_sentcl's evaluator. Tasks evaluated again replace their earlier scores."""
    inputs = read_json(Path(out_dir) / CARD_INPUTS)
    results = dict(inputs["results"])
    earlier = results.get("mteb_evaluated") or {}
    results["mteb_evaluated"] = {
        "mteb_version": summary["mteb_version"],
        "tasks": {**(earlier.get("tasks") or {}), **summary["tasks"]},
        "main_metrics": {**(earlier.get("main_metrics") or {}), **(summary.get("main_metrics") or {})},
    }
    card = inputs.get("card") or {}
    return write_model_card(out_dir, ExportPlan.from_dict(inputs["plan"]), results, repo_id=card.get("repo_id"),
                            license_id=card.get("license"), language=card.get("language"))


def write_model_card(
    out_dir: str | os.PathLike,
    plan: ExportPlan,
    results: Mapping[str, Any],
    repo_id: str | None = None,
    *,
    local_id: str | None = None,
    model_name: str | None = None,
    license_id: str | None = None,
    language: str | list[str] | None = None,
) -> Path:
    """Render the card into `out_dir/README.md` (and its inputs into `CARD_INPUTS`); return the card's path.

    The snippets load `repo_id` or, without one, `PLACEHOLDER_ID` with a line saying to replace it: a card names no
    local path, since whoever uploads the folder publishes it. The title is the repository's name, else the name of
    `local_id`'s folder (default: `out_dir`; an export built in a temporary folder passes its final path; a run's
    `output_dir/export` is named after the run). PNGs in `out_dir/plots/` are shown in the card. `license_id` and
    `language` go into the metadata and into `CARD_INPUTS`, so that `push` renders them again, as do the
    hyperparameters (`card_settings`: the recorded settings over the method's defaults, resolved here once unless the
    results record them as `hyperparameters`).
    """
    out_dir = Path(out_dir).resolve()
    if model_name is None and not repo_id:
        local = Path(local_id or out_dir)
        model_name = local.parent.name if local.name == "export" else local.name  # a run's output_dir/export
    order = {name: i for i, name in enumerate(PLOT_CAPTIONS)}  # known plots in caption order, others after them
    pngs = sorted((out_dir / PLOTS_DIRNAME).glob("*.png"), key=lambda p: (order.get(p.name, len(order)), p.name))
    plots = [p.relative_to(out_dir).as_posix() for p in pngs]
    if results.get("recipe_settings") and not results.get("hyperparameters"):  # resolved once, kept for `push`
        results = {**results, "hyperparameters": card_settings(results["recipe_settings"])}
    card = render_model_card(
        plan, results, model_id=repo_id or PLACEHOLDER_ID, repo_id=repo_id, model_name=model_name, plots=plots,
        license_id=license_id, language=language,
    )
    inputs = {
        "plan": plan.to_dict(),
        "results": {k: results[k] for k in CARD_KEYS if k in results},
        "card": {"license": license_id, "language": language, "repo_id": repo_id},
    }
    write_json(out_dir / CARD_INPUTS, inputs)
    path = out_dir / "README.md"
    card.save(path)
    return path


def rewrite_model_card(out_dir: str | os.PathLike, repo_id: str) -> Path:
    """Render the card of an export again with its usage snippets loading `repo_id` (e.g. before a push), with the
    license and language it was exported with."""
    inputs_path = Path(out_dir) / CARD_INPUTS
    if not inputs_path.is_file():
        raise FileNotFoundError(
            f"'{out_dir}' has no {CARD_INPUTS} (the inputs of its model card), so its card cannot be rendered for "
            f"'{repo_id}'; export it again with `hf-sentcl export ... --overwrite`."
        )
    inputs = read_json(inputs_path)
    card = inputs.get("card") or {}
    return write_model_card(out_dir, ExportPlan.from_dict(inputs["plan"]), inputs["results"], repo_id=repo_id,
                            license_id=card.get("license"), language=card.get("language"))
