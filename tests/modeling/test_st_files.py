"""A plain backbone from a sentence-transformers folder embeds as sentence-transformers does: its pooling and
truncation length come from the folder's `1_Pooling/config.json` and `sentence_bert_config.json`."""

from __future__ import annotations

import json

import pytest
import torch
from sentence_transformers import SentenceTransformer

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.encoder import load_encoder
from hf_sentcl.modeling.st_files import sentence_transformers_pooling


def test_the_embedded_minilm_loads_mean_pooled_at_256_tokens_and_matches_sentence_transformers():
    encoder = load_encoder(EMBEDDED_MODEL_ALIAS)
    assert encoder.config.pooling == "mean" and encoder.max_seq_length == 256
    texts = ["A man is playing a guitar.", "word " * 400]  # the second is cut at 256 tokens by both
    ours = torch.from_numpy(encoder.encode(texts, normalize=True))  # the folder ends with a Normalize module
    theirs = SentenceTransformer(resolve_model_name(EMBEDDED_MODEL_ALIAS), device="cpu").encode(
        texts, convert_to_tensor=True
    )
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-5, rtol=1e-4)


def test_an_explicit_pooling_wins(tmp_path):
    assert load_encoder(EMBEDDED_MODEL_ALIAS, pooling="cls").config.pooling == "cls"


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"pooling_mode_cls_token": True}, "cls_before_pooler"),
        ({"pooling_mode_max_tokens": True}, "max"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, None),  # concatenated: not ours
        ({"pooling_mode_mean_sqrt_len_tokens": True}, None),
        ({}, None),
    ],
)
def test_pooling_flags(tmp_path, flags, expected):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    found = sentence_transformers_pooling(str(tmp_path))
    assert (found.value if found else None) == expected
    assert sentence_transformers_pooling(str(tmp_path / "elsewhere")) is None
