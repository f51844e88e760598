"""The model card of an export and its results in Hub formats (model-index, mteb results folder).

The card is rendered with `huggingface_hub`'s `ModelCard.from_template` from `model_cards/sentence_encoder.md`,
using the run's results dict (`results.json`): every number in it comes from there. Its front matter carries a
`model-index` with one `cos_sim_spearman` result (0-100) per STS task, labelled as MTEB's datasets; those
numbers are computed with MTEB's protocol (`mteb_sts_scores`: subsets of a year concatenated, SICK-R on all
9,927 pairs), never SentEval's SICK-R test split.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from hf_sentcl.defaults import EMBEDDED_MODEL_ALIAS
from hf_sentcl.evaluation.plots import PLOT_CAPTIONS, PLOTS_DIRNAME
from hf_sentcl.evaluation.report import RUN_LABELS, SHORT_NAMES, sts_markdown_table, transfer_markdown_table
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator

if TYPE_CHECKING:
    from hf_sentcl.export import ExportPlan
    from hf_sentcl.parser import Recipe

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "model_cards" / "sentence_encoder.md"

# task -> (mteb dataset id, mteb task name, dataset revision); ids and revisions as in mteb's task definitions
# (mteb/tasks/sts/eng/*.py).
MTEB_STS_DATASETS: dict[str, tuple[str, str, str]] = {
    "STS12": ("mteb/sts12-sts", "STS12", "a0d554a64d88156834ff5ae9920b964011b16384"),
    "STS13": ("mteb/sts13-sts", "STS13", "7e90230a92c190f1bf69ae9002b8cea547a64cca"),
    "STS14": ("mteb/sts14-sts", "STS14", "6031580fec1f6af667f0bd2da0a551cf4f0b2375"),
    "STS15": ("mteb/sts15-sts", "STS15", "ae752c7c21bf194d8b67fd573edf7ae58183cbe3"),
    "STS16": ("mteb/sts16-sts", "STS16", "4d8694f8f0e0100860b497b999b3dbed754a0513"),
    "STSBenchmark": ("mteb/stsbenchmark-sts", "STSBenchmark", "b0fddb56ed78048fa8b90373c8a3cfc37b684831"),
    "SICKRelatedness": ("mteb/sickr-sts", "SICK-R", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
}
MTEB_NO_REVISION = "no_revision_available"

# Published training corpora recognised by file name (train_file) -> their Hub dataset.
KNOWN_TRAIN_FILES = {
    "wiki1m_for_simcse.txt": "princeton-nlp/datasets-for-simcse",
    "wiki1m_subset.txt": "princeton-nlp/datasets-for-simcse",
    "nli_for_simcse.csv": "princeton-nlp/datasets-for-simcse",
}
UNLABELED_STS_DATASETS = {
    "stsb": ["mteb/stsbenchmark-sts"],
    "all": [dataset for dataset, _, _ in MTEB_STS_DATASETS.values()],
    "all-scored": [dataset for dataset, _, _ in MTEB_STS_DATASETS.values()],
}

CITATIONS = {
    "simcse": """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year = {2021}
}""",
    "self_guided": """@inproceedings{kim2021selfguided,
  title = {Self-Guided Contrastive Learning for {BERT} Sentence Representations},
  author = {Kim, Taeuk and Yoo, Kang Min and Lee, Sang-goo},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2021}
}""",
    "consert": """@inproceedings{yan2021consert,
  title = {{ConSERT}: A Contrastive Framework for Self-Supervised Sentence Representation Transfer},
  author = {Yan, Yuanmeng and Li, Rumei and Wang, Sirui and Zhang, Fuzheng and Wu, Wei and Xu, Weiran},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics (ACL)},
  year = {2021}
}""",
    "clear": """@article{wu2020clear,
  title = {{CLEAR}: Contrastive Learning for Sentence Representation},
  author = {Wu, Zhuofeng and Wang, Sinong and Gu, Jiatao and Khabsa, Madian and Sun, Fei and Ma, Hao},
  journal = {arXiv preprint arXiv:2012.15466},
  year = {2020}
}""",
    "ifm": """@inproceedings{robinson2021shortcuts,
  title = {Can contrastive learning avoid shortcut solutions?},
  author = {Robinson, Joshua and Sun, Li and Yu, Ke and Batmanghelich, Kayhan and Jegelka, Stefanie and Sra, Suvrit},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year = {2021}
}""",
    "byop": """@misc{byop,
  title = {Bootstrap Your Own {PLM}: Boosting Semantic Features of {PLMs} for Unsupervised Contrastive Learning},
  note = {Anonymous ACL submission}
}""",
}
# recipe `method:` name -> keys of CITATIONS
METHOD_CITATIONS = {
    "simcse": ("simcse",),
    "simcse_sup": ("simcse",),
    "self_guided": ("self_guided",),
    "sg": ("self_guided",),
    "sg_opt": ("self_guided",),
    "consert": ("consert",),
    "clear": ("clear",),
}

# Settings never shown in the card: local paths, Hub plumbing and anything that could hold a secret.
HIDDEN_SETTINGS = {
    "output_dir", "logging_dir", "run_name", "sts_data_dir", "overwrite_output_dir", "resume_from_checkpoint",
    "push_to_hub", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_always_push",
}
VERSIONED_PACKAGES = (
    "hf-sentcl", "torch", "transformers", "sentence-transformers", "accelerate", "datasets", "huggingface-hub",
    "peft",
)
EXAMPLE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A cat sleeps on the sofa.")


# ------------------------------------------------------------------------------------------------ run metadata
def _plain(value: Any) -> Any:
    """A JSON/YAML-friendly version of a setting value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _default_values(group: Any) -> dict[str, Any]:
    """The values a dataclass instance would have with no recipe: for TrainingArguments, after its __post_init__."""
    cls = type(group)
    if hasattr(group, "output_dir") and hasattr(group, "to_dict"):  # a TrainingArguments subclass
        try:
            reference = cls(output_dir=group.output_dir)
            return {f.name: getattr(reference, f.name) for f in dataclasses.fields(cls) if f.init}
        except (ValueError, TypeError):
            pass
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def non_default_settings(recipe: Recipe) -> dict[str, Any]:
    """Recipe settings that differ from the dataclass defaults (the method name first), for the model card.

    Local paths, Hub settings and token fields are left out; `train_file` is reduced to its file name.
    """
    settings: dict[str, Any] = {"method": recipe.method}
    for group in (recipe.model, recipe.data, recipe.training):
        defaults = _default_values(group)
        for f in dataclasses.fields(group):
            if not f.init or f.name in HIDDEN_SETTINGS or "token" in f.name:
                continue
            value = getattr(group, f.name)
            if f.name in defaults and _plain(defaults[f.name]) == _plain(value):
                continue
            settings[f.name] = Path(value).name if f.name == "train_file" and value else _plain(value)
    return settings


def training_data_summary(recipe: Recipe, num_examples: int | None, text_columns: Sequence[str]) -> dict[str, Any]:
    """Where the training text came from and how much of it was used."""
    from hf_sentcl.trainers.registry import get_method

    data = recipe.data
    own_data = get_method(recipe.method).train_data(recipe)  # e.g. the NLI pairs of a ConSERT sup/joint stage
    if own_data is not None:
        source, name = own_data.source_key, own_data.source.description
    elif data.train_file is not None:
        source, name = "train_file", Path(os.path.expandvars(data.train_file)).name
    elif data.dataset_name is not None:
        source, name = "dataset_name", data.dataset_name
    else:
        source, name = "unlabeled_sts", data.unlabeled_sts
    return {
        "source": source,
        "name": name,
        "examples": num_examples,
        "max_train_samples": data.max_train_samples,
        "train_subset_size": data.train_subset_size,
        "train_subset_seed": data.train_subset_seed if data.train_subset_size is not None else None,
        "max_seq_length": data.max_seq_length,
        "columns": list(text_columns),
    }


def precision_summary(recipe: Recipe, weights_dtype: str) -> dict[str, str]:
    """Numeric precision of training, evaluation and the exported weights."""
    args = recipe.training
    training = "bf16 mixed precision (autocast)" if args.bf16 else "fp16 mixed precision" if args.fp16 else "fp32"
    return {
        "training": training,
        "evaluation": "bf16 autocast" if recipe.data.eval_bf16 else "fp32",
        "weights": weights_dtype.replace("torch.", ""),
    }


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that produced the model."""
    return {name: v for name in VERSIONED_PACKAGES if (v := package_version(name))}


def run_metadata(recipe: Recipe, encoder, num_examples: int, num_views: int) -> dict[str, Any]:
    """What the card needs beyond the scores, collected at the end of a run (stored in results.json)."""
    from hf_sentcl.trainers.registry import get_method

    spec = get_method(recipe.method)
    columns = (spec.text_columns + spec.optional_text_columns)[:num_views]
    return {
        "recipe_settings": non_default_settings(recipe),
        "training_data": training_data_summary(recipe, num_examples, columns),
        "precision": precision_summary(recipe, str(next(encoder.parameters()).dtype)),
        "versions": library_versions(),
    }


def mteb_sts_scores(
    encoder,
    data_dir: str | os.PathLike | None,
    sts_scores: Mapping[str, float] | None,
    sts_mode: str,
    batch_size: int = 128,
    bf16: bool = False,
) -> dict[str, float]:
    """STS Spearman x 100 under MTEB's protocol: a year's subsets concatenated, SICK-R on all 9,927 SICK pairs.

    With `sts_mode == "all"` the STS12-16 and STS-B numbers of `sts_scores` already follow it and only SICK-R is
    recomputed (about 5k more sentences); otherwise all 7 tasks are encoded again.
    """
    if sts_mode == "all" and sts_scores and all(t in sts_scores for t in STS_TASKS[:-1]):
        sick = STSEvaluator(data_dir, tasks=("SICKRelatedness",), sick_split="all")
        scores = {t: sts_scores[t] for t in STS_TASKS[:-1]}
        scores.update(sick(encoder, batch_size=batch_size, bf16=bf16))
    else:
        scores = STSEvaluator(data_dir, mode="all", sick_split="all")(encoder, batch_size=batch_size, bf16=bf16)
    scores.pop("Avg", None)
    scores["Avg"] = float(np.mean([scores[t] for t in STS_TASKS]))
    return scores


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run's results.json."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Results file '{path}' does not exist.")
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------ card pieces
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
        return UNLABELED_STS_DATASETS.get(data.get("name"))
    if data.get("source") == "train_file" and data.get("name") in KNOWN_TRAIN_FILES:
        return [KNOWN_TRAIN_FILES[data["name"]]]
    return None


def citations(method: str | None, settings: Mapping[str, Any]) -> list[str]:
    """BibTeX entries for the method and for the IFM/BYOP logit perturbation when it was used."""
    keys = list(METHOD_CITATIONS.get(method or "", ()))
    perturbation = settings.get("perturbation")
    if perturbation:
        keys.append("ifm" if set(re.findall(r"[pn][+-]", perturbation)) == {"p-", "n+"} else "byop")
    return [CITATIONS[k] for k in dict.fromkeys(keys)]


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


def transformers_snippet(plan: ExportPlan, model_id: str) -> str:
    """Plain-transformers usage: `embed(sentences)` reproduces the sentence-transformers/hf_sentcl vectors."""
    needs_layers = plan.layer_weights is not None
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
    body = [
        f"batch = tokenizer(sentences, padding=True, truncation=True, max_length={plan.max_seq_length}, "
        'return_tensors="pt")',
        "with torch.inference_mode():",
        f"    outputs = model(**batch{', output_hidden_states=True' if needs_layers else ''})",
    ]
    mean_lines = [
        'mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)',
        "embeddings = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)",
    ]
    if plan.head == "pooler":
        body.append("embeddings = outputs.pooler_output  # [CLS] through the trained head, folded into the pooler")
    elif needs_layers:
        first = "outputs.hidden_states[1]" if plan.pooling == "first_last_avg" else "outputs.hidden_states[-2]"
        body += [f"states = ({first} + outputs.hidden_states[-1]) / 2", *mean_lines]
    elif plan.token_pooling == "cls":
        body.append("embeddings = outputs.last_hidden_state[:, 0]  # [CLS] state")
    elif plan.token_pooling == "mean":
        body += ["states = outputs.last_hidden_state", *mean_lines]
    else:
        body += [
            "states = outputs.last_hidden_state",
            'padding = batch["attention_mask"].unsqueeze(-1) == 0',
            "embeddings = states.masked_fill(padding, torch.finfo(states.dtype).min).max(dim=1).values",
        ]
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


def _mteb_markdown_table(scores: Mapping[str, float]) -> str:
    tasks = [t for t in (*STS_TASKS, "Avg") if t in scores]
    header = "| | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |"
    rule = "|---|" + "---:|" * len(tasks)
    return "\n".join([header, rule, "| after training | " + " | ".join(f"{scores[t]:.2f}" for t in tasks) + " |"])


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
def build_card_data(plan: ExportPlan, results: Mapping[str, Any], model_name: str) -> ModelCardData:
    """Front matter: library, pipeline tag, tags, base model, datasets and the MTEB-protocol model-index."""
    method = results.get("method")
    mteb_scores = results.get("mteb_sts") or {}
    eval_results = mteb_eval_results(mteb_scores) or None
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
    template_path: str | os.PathLike = TEMPLATE_PATH,
) -> ModelCard:
    """Render the model card of an export from the run's results dict (which may be empty).

    `model_id` is what the usage snippets load; `model_name` (default: the last part of `repo_id`/`model_id`) is
    the card's title and the model-index name. `plots` are PNG paths relative to the export folder, shown as
    images with their `PLOT_CAPTIONS`.
    """
    from hf_sentcl.trainers.registry import METHODS

    model_name = model_name or (repo_id or model_id).rstrip("/").split("/")[-1]
    method = results.get("method")
    settings = results.get("recipe_settings") or {}
    sts = results.get("sts") or {}
    sts_table = (
        sts_markdown_table({RUN_LABELS.get(k, k): v for k, v in sts.items()}, results.get("sts_mode", "all"))
        if sts else None
    )
    mteb_scores = results.get("mteb_sts")
    train = results.get("train") or {}
    history = train.get("dev_curve") or []
    card_data = build_card_data(plan, results, model_name)
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
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
        sts_mode=results.get("sts_mode"),
        mteb_table=_mteb_markdown_table(mteb_scores) if mteb_scores else None,
        transfer_table=_transfer_table(results.get("transfer"), RUN_LABELS),
        plots=[{"path": p, "caption": PLOT_CAPTIONS.get(Path(p).name, Path(p).stem.replace("_", " "))} for p in plots],
        precision=results.get("precision"),
        versions=results.get("versions") or library_versions(),
        transformers_snippet=transformers_snippet(plan, model_id),
        st_snippet=sentence_transformers_snippet(model_id),
        citations=citations(method, settings),
    )


def write_model_card(
    out_dir: str | os.PathLike, plan: ExportPlan, results: Mapping[str, Any], repo_id: str | None = None
) -> Path:
    """Render the card into `out_dir/README.md`; snippets load `repo_id` or, without one, the folder itself. PNGs in
    `out_dir/plots/` (copied there by the export) are shown in the card."""
    out_dir = Path(out_dir).resolve()
    local_name = out_dir.parent.name if out_dir.name == "export" else out_dir.name  # a run's output_dir/export
    order = {name: i for i, name in enumerate(PLOT_CAPTIONS)}  # known plots in caption order, others after them
    pngs = sorted((out_dir / PLOTS_DIRNAME).glob("*.png"), key=lambda p: (order.get(p.name, len(order)), p.name))
    plots = [p.relative_to(out_dir).as_posix() for p in pngs]
    card = render_model_card(
        plan, results, model_id=repo_id or str(out_dir), repo_id=repo_id, model_name=None if repo_id else local_name,
        plots=plots,
    )
    path = out_dir / "README.md"
    card.save(path)
    return path


# ------------------------------------------------------------------------------------------------ mteb results
def exported_parameter_count(export_dir: str | os.PathLike) -> int:
    """Parameters stored in an export's safetensors files (backbone and modules), read from their headers."""
    from safetensors import safe_open

    total = 0
    for path in Path(export_dir).rglob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                total += int(np.prod(f.get_slice(name).get_shape()))
    return total


def write_mteb_results(
    root: str | os.PathLike,
    results: Mapping[str, Any],
    export_dir: str | os.PathLike,
    plan: ExportPlan,
    repo_id: str | None = None,
) -> Path | None:
    """Write the MTEB-protocol STS scores as `root/<org__name>/no_revision_available/<Task>.json` + model_meta.json.

    The files follow the layout of the mteb results repository (scores on a 0-1 scale, `main_score` =
    `cosine_spearman`); `mteb_version` is null because the numbers come from hf_sentcl's evaluator, not the
    mteb package. Returns the model folder, or None when the results hold no MTEB-protocol scores.
    """
    scores = results.get("mteb_sts")
    if not scores:
        return None
    name = repo_id or f"hf_sentcl/{Path(export_dir).resolve().parent.name}"
    folder = Path(root) / name.replace("/", "__") / MTEB_NO_REVISION
    folder.mkdir(parents=True, exist_ok=True)
    for task, (_dataset, task_name, revision) in MTEB_STS_DATASETS.items():
        if task not in scores:
            continue
        value = round(float(scores[task]) / 100, 6)
        content = {
            "dataset_revision": revision,
            "task_name": task_name,
            "mteb_version": None,
            "scores": {
                "test": [
                    {
                        "cosine_spearman": value,
                        "spearman": value,
                        "main_score": value,
                        "hf_subset": "default",
                        "languages": ["eng-Latn"],
                    }
                ]
            },
            "evaluation_time": None,
            "kg_co2_emissions": None,
        }
        (folder / f"{task_name}.json").write_text(json.dumps(content, indent=2) + "\n")
    meta = {
        "name": name,
        "revision": MTEB_NO_REVISION,
        "release_date": datetime.date.today().isoformat(),
        "languages": ["eng-Latn"],
        "n_parameters": exported_parameter_count(export_dir),
        "max_tokens": plan.max_seq_length,
        "embed_dim": plan.hidden_size,
        "license": None,
        "open_weights": True,
        "public_training_code": None,
        "framework": ["Sentence Transformers", "PyTorch"],
        "reference": f"https://huggingface.co/{repo_id}" if repo_id else None,
        "similarity_fn_name": "cosine",
        "use_instructions": False,
        "training_datasets": None,
        "adapted_from": hub_model_id(results.get("model_name_or_path")),
        "superseded_by": None,
    }
    (folder / "model_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return folder.parent
