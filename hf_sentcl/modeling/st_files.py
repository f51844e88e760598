"""What a sentence-transformers model folder (local or on the Hub) says about how it is used: its pooling
(`1_Pooling/config.json`) and its truncation length (`sentence_bert_config.json`).

A plain backbone loaded from such a folder (e.g. all-MiniLM-L6-v2, which is mean-pooled at 256 tokens) should
embed as sentence-transformers does, not with this toolkit's defaults (cls, the tokenizer's 512).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hf_sentcl.configs.choices import Pooling

logger = logging.getLogger("hf_sentcl")

SENTENCE_BERT_CONFIG = "sentence_bert_config.json"  # where sentence-transformers keeps a model's max_seq_length
POOLING_CONFIG = "1_Pooling/config.json"

#: sentence-transformers' pooling flags -> this toolkit's pooling, in the order a flag is looked for
POOLING_FLAGS = (
    ("pooling_mode_cls_token", Pooling.CLS_BEFORE_POOLER),  # the first token's state, without BERT's pooler
    ("pooling_mode_mean_tokens", Pooling.MEAN),
    ("pooling_mode_max_tokens", Pooling.MAX),
)


def sentence_transformers_file(name_or_path: str, filename: str) -> dict[str, Any] | None:
    """The JSON object in `filename` of a local model folder or a Hub model (read from the cache or downloaded);
    None when there is no such file, it cannot be fetched, or it is not a JSON object."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        path: Path | None = folder / filename
        if not path.is_file():
            return None
    else:
        path = _hub_file(name_or_path, filename)
        if path is None:
            return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable or not JSON: no setting
        return None
    return value if isinstance(value, dict) else None


def sentence_transformers_max_seq_length(name_or_path: str) -> int | None:
    """`max_seq_length` of `sentence_bert_config.json` (where sentence-transformers before 6.0 saved it); None when
    the model has none (not such a model, a sentence-transformers 6 folder, or the file cannot be had)."""
    value = (sentence_transformers_file(name_or_path, SENTENCE_BERT_CONFIG) or {}).get("max_seq_length")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def sentence_transformers_pooling(name_or_path: str) -> Pooling | None:
    """The pooling of a sentence-transformers model's `1_Pooling/config.json` (cls, mean or max); None when it has
    none, or when it combines several modes or uses one this toolkit does not have (e.g. mean_sqrt_len)."""
    config = sentence_transformers_file(name_or_path, POOLING_CONFIG)
    if not config:
        return None
    if config.get("pooling_mode_mean_sqrt_len_tokens") or config.get("pooling_mode_weightedmean_tokens"):
        return None
    chosen = [pooling for flag, pooling in POOLING_FLAGS if config.get(flag)]
    return chosen[0] if len(chosen) == 1 else None


def _hub_file(repo_id: str, filename: str) -> Path | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename))
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, HFValidationError) as err:
        logger.info("No %s for '%s' (%s).", filename, repo_id, type(err).__name__)
        return None
