"""A run's export: the checked export folder, its model card, plots and MTEB result files together."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from hf_sentcl.common.layout import EXPORT_DIRNAME, MTEB_RESULTS_DIRNAME
from hf_sentcl.configs.choices import pooling_mode
from hf_sentcl.evaluation.mteb import INSTALL_HINT, MtebScores, mteb_available
from hf_sentcl.evaluation.plots import PLOTS_DIRNAME
from hf_sentcl.export.base_model import backbone_source, base_language
from hf_sentcl.export.card import citations, matryoshka_table, training_code_url, write_model_card
from hf_sentcl.export.history import with_run_history
from hf_sentcl.export.mteb_files import DEFAULT_ORG, write_mteb_results
from hf_sentcl.export.plan import ExportError, ExportPlan
from hf_sentcl.export.results import (
    base_model_id,
    mteb_training_tasks,
    training_data_outside_mteb,
    training_datasets,
    training_lineage,
)
from hf_sentcl.export.verify import PROBE_SENTENCES, verify_export
from hf_sentcl.export.writer import staged_export, write_export
from hf_sentcl.modeling import POOLING_MODES, SentenceEncoder, SentenceEncoderConfig
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.encoder import load_encoder

logger = logging.getLogger("hf_sentcl")


# ------------------------------------------------------------------------------------------------ card and MTEB
def copy_plots(run_dir: str | Path, export_dir: str | Path) -> list[Path]:
    """Copy a run's figures (`run_dir/plots/*.png`) to `export_dir/plots/`, where the model card's relative image
    links point, so they show on the Hub too. Returns the copies."""
    pngs = sorted((Path(run_dir) / PLOTS_DIRNAME).glob("*.png"))
    if pngs:
        (Path(export_dir) / PLOTS_DIRNAME).mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(png, Path(export_dir) / PLOTS_DIRNAME / png.name)) for png in pngs]


def export_name(out_dir: str | Path, repo_id: str | None) -> str:
    """The model's name: `repo_id`, else `hf_sentcl/<folder>` (a run's output_dir for `output_dir/export`)."""
    out_dir = Path(out_dir).resolve()
    return repo_id or f"{DEFAULT_ORG}/{out_dir.parent.name if out_dir.name == EXPORT_DIRNAME else out_dir.name}"


def export_mteb_results(
    root: str | Path,
    results: dict[str, Any],
    export_dir: str | Path,
    plan: ExportPlan,
    repo_id: str | None,
    *,
    license_id: str | None = None,
    training_code: str | None = None,
) -> Path | None:
    """Write the results' MTEB-protocol scores as MTEB result files under `root`, with the ModelMeta module for
    mteb's registry; None when there are none, or when the export has no sentence-transformers files (prompt pooling).

    From `results` (and, for a model trained from another hf_sentcl export, that export's own results:
    `training_lineage`): the Matryoshka sizes, the base model (`adapted_from`), the MTEB datasets among the training
    data (`training_datasets`, plus the base model's as mteb records them), a comment naming the rest of the
    training data, the BibTeX of the method's papers (`citation`) and, unless `training_code` is given, the code
    URL (`training_code_url`). `max_tokens` is the export's `max_seq_length` (`plan`)."""
    scores = MtebScores.from_results(results)
    if scores is None:
        return None
    if not plan.sentence_transformers:  # mteb's ModelMeta would load it with sentence-transformers: other vectors
        logger.warning("No MTEB result files: their ModelMeta loads the model with sentence-transformers, which "
                       "cannot embed through the prompt template %r.", plan.prompt_template)
        return None
    dims, _table = matryoshka_table(results)  # the sizes the card reports the model was trained to be cut to
    method = results.get("method")
    papers = citations(method, results.get("recipe_settings") or {})
    hub_data = [d for entry in training_lineage(results) for d in (training_datasets(entry) or [])]
    return write_mteb_results(
        root, scores, name=export_name(export_dir, repo_id), export_dir=export_dir, max_tokens=plan.max_seq_length,
        embed_dim=[plan.hidden_size, *dims] if dims else plan.hidden_size,
        adapted_from=base_model_id(results), training_tasks=mteb_training_tasks(results),
        training_data=list(dict.fromkeys(hub_data)) or None, license_id=license_id,
        training_code=training_code or training_code_url(method), citation="\n\n".join(papers) or None,
        notes=training_data_outside_mteb(results),
    )


def card_language(encoder: SentenceEncoder, results: dict[str, Any], language: str | list[str] | None
                  ) -> str | list[str] | None:
    """The card's `language`: `language` when given (the command line's or the recipe's), else the base model's
    card's (the base of the results' hf_sentcl lineage, else the folder or Hub id the backbone was loaded from),
    else None."""
    if language:
        return language
    bases = [training_lineage(results)[-1].get("model_name_or_path"), backbone_source(encoder.config.backbone_config)]
    for base in dict.fromkeys(b for b in bases if b):
        found = base_language(base)
        if found:
            return found
    return None


def export_with_card(
    encoder: SentenceEncoder,
    out_dir: str | Path,
    results: dict[str, Any],
    *,
    repo_id: str | None = None,
    plots_from: str | Path | None = None,
    overwrite: bool = False,
    verify: bool = True,
    probes: Sequence[str] = PROBE_SENTENCES,
    tolerance: float = 1e-4,
    license_id: str | None = None,
    language: str | list[str] | None = None,
) -> tuple[ExportPlan, dict[str, float] | None]:
    """Export `encoder` to `out_dir` with its model card (and `plots_from/plots/*.png`), all built and checked
    beside `out_dir` before it is moved in. Returns the plan and the loaders' differences (None unverified).

    The card's results are completed with the history of the run the encoder was loaded from (`with_run_history`:
    a `checkpoint-N` or a run's output_dir, from `encoder.name_or_path`); `license_id` and the language
    (`card_language`) go into its metadata."""
    out_dir = Path(out_dir)
    card_results = with_run_history(results, getattr(encoder, "name_or_path", None))
    language = card_language(encoder, card_results, language)
    with staged_export(out_dir, overwrite) as stage:
        plan = write_export(encoder, stage)
        differences = verify_export(encoder, stage, plan, probes, tolerance) if verify else None
        if plots_from is not None:
            copy_plots(plots_from, stage)
        write_model_card(stage, plan, card_results, repo_id=repo_id, local_id=str(out_dir.resolve()),
                         license_id=license_id, language=language)
    return plan, differences


def export_run(
    encoder: SentenceEncoder,
    results: dict[str, Any],
    output_dir: str | Path,
    repo_id: str | None = None,
    *,
    license_id: str | None = None,
    language: str | list[str] | None = None,
) -> tuple[Path, ExportPlan]:
    """Export a run's final encoder to `output_dir/export` with its model card (from `results`) and plots, and its
    MTEB-protocol STS scores as MTEB result files under `output_dir/mteb_results` (when mteb is installed).
    Result files an earlier run left in `output_dir` are removed first: a push files whatever that folder holds
    under this export's commit. `license_id` and `language` go into the card's metadata (the language otherwise
    comes from the base model's card). Returns (folder, plan)."""
    export_dir, mteb_dir = Path(output_dir) / EXPORT_DIRNAME, Path(output_dir) / MTEB_RESULTS_DIRNAME
    plan, _ = export_with_card(encoder, export_dir, results, repo_id=repo_id, plots_from=output_dir, overwrite=True,
                               license_id=license_id, language=language)
    if mteb_dir.exists():
        shutil.rmtree(mteb_dir)
        logger.info("Removed %s, an earlier run's MTEB result files: they are not this run's.", mteb_dir)
    if results.get("mteb_sts"):
        if mteb_available():
            export_mteb_results(mteb_dir, results, export_dir, plan, repo_id, license_id=license_id)
        else:
            logger.info("MTEB result files were not written: mteb is not installed (%s).", INSTALL_HINT)
    return export_dir, plan


# ------------------------------------------------------------------------------------------------ CLI
def find_results(checkpoint: Path) -> Path | None:
    """The run's results.json beside a checkpoint (the run's output_dir or the parent of a checkpoint-N folder)."""
    for folder in (checkpoint, checkpoint.parent):
        if (folder / "results.json").is_file():
            return folder / "results.json"
    return None


def load_checkpoint(name: str, pooling: str | None = None, pooling_layer: int | None = None) -> SentenceEncoder:
    """Load a saved `SentenceEncoder`, or wrap a plain backbone with `pooling`; a clear error for anything else."""
    path = resolve_model_name(name)
    if Path(path).exists() and not (Path(path) / "config.json").is_file():
        raise ExportError(f"'{name}' holds no config.json; pass a run's output_dir, a checkpoint-N or a model folder.")
    model_type = getattr(AutoConfig.from_pretrained(path), "model_type", None)
    if model_type != SentenceEncoderConfig.model_type and pooling is None:
        raise ExportError(
            f"'{name}' is a plain '{model_type}' model, not a saved SentenceEncoder: say how it pools with --pooling "
            f"({', '.join(POOLING_MODES)})."
        )
    return load_encoder(name, pooling, pooling_layer).eval()  # the pooling asked for is the one exported


def _same_model(a: str, b: str) -> bool:
    a, b = resolve_model_name(a), resolve_model_name(b)
    if Path(a).exists() and Path(b).exists():
        return Path(a).resolve() == Path(b).resolve()
    return a == b


def check_results_match(
    results: dict[str, Any], name: str, path: Path, encoder: SentenceEncoder | None = None
) -> None:
    """ExportError when `hf-sentcl evaluate` results were measured on another model than `name` or (once it is
    loaded) with another pooling or pooled hidden state than `encoder`'s."""
    if results.get("source") != "evaluate":
        return
    if not _same_model(results["model_name_or_path"], name):
        raise ExportError(
            f"Results file '{path}' was measured on '{results['model_name_or_path']}', not on '{name}'; evaluate "
            "this encoder and pass that file with --results."
        )
    if encoder is None:
        return
    pooling = encoder.config.active_pooling(training=False)
    if results.get("pooling") not in (None, pooling):
        raise ExportError(
            f"Results file '{path}' was measured with pooling '{results['pooling']}' but the export pools with "
            f"'{pooling}'; pass --pooling {results['pooling']} or evaluate with --pooling {pooling}."
        )
    layer, measured = encoder.config.pooling_layer, results.get("pooling_layer")
    count = getattr(encoder.config.backbone_config, "num_hidden_layers", None)
    states = count + 1 if isinstance(count, int) else None  # the embeddings' output and each layer's: -1 is 12 of 13
    same = measured == layer if states is None else measured % states == layer % states
    reads_one_state = pooling_mode(pooling).averaged_state is None  # first_last_avg / last2_avg ignore the index
    if reads_one_state and isinstance(measured, int) and not same:
        raise ExportError(
            f"Results file '{path}' was measured pooling hidden state {results['pooling_layer']} but the export pools "
            f"hidden state {layer}; pass --pooling-layer {results['pooling_layer']} or evaluate with --pooling-layer "
            f"{layer}."
        )
