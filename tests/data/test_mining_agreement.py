"""`hf-sentcl mine` against sentence-transformers' `mine_hard_negatives` on one small fixed set: the same pairs (some
anchors repeated with several positives), the same pool and the same tiny model (a random BERT with mean pooling,
loaded by each library), with settings where the documented differences of docs/mining.md cannot apply:

- the window covers the whole pool, so counting it before the margins (here) or after them (sentence-transformers)
  names the same candidates; `rank_start` > 0 is compared without margins only;
- the pool holds no anchor, or a margin removes every anchor (its score 1 is above any threshold), so "the anchor is
  never a candidate" changes nothing.

Every pair must then get the same negative, or be dropped by both."""

import pytest
import torch
from datasets import Dataset
from helpers import random_sentences
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
from sentence_transformers.util import mine_hard_negatives as st_mine_hard_negatives

from hf_sentcl.data.mining import MiningSettings, Pairs, build_pool, mine_hard_negatives
from hf_sentcl.modeling.encoder import load_encoder

ANCHORS = random_sentences(7, seed=21, min_words=5, max_words=8)


def variant(sentence: str, k: int) -> str:
    """`sentence` with its k-th word (from the end) swapped for another: a positive close to its anchor."""
    words = sentence.split()
    words[-1 - k % len(words)] = ["dog", "park", "music", "red", "runs"][k % 5]
    return " ".join(words)


# 12 pairs: anchors 0 and 1 have three positives each, anchor 2 two, anchors 3-6 one; no positive is an anchor
PAIRS = [(ANCHORS[a], variant(ANCHORS[a], k)) for a, k in
         [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (3, 0), (0, 2), (4, 0), (2, 1), (5, 0), (1, 2), (6, 0)]]
CORPUS = random_sentences(20, seed=22, min_words=4, max_words=8) + [variant(a, 3) for a in ANCHORS[:4]]
WINDOW = 64  # above the pool's size: the whole pool is in the window


@pytest.fixture(scope="module")
def models(tiny_bert_dir):
    transformer = Transformer(str(tiny_bert_dir))
    theirs = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")],
                                 device="cpu")
    ours = load_encoder(tiny_bert_dir, pooling="mean").eval()
    return theirs, ours


def test_fixed_set_is_what_it_claims():
    anchors = [a for a, _ in PAIRS]
    assert len(set(PAIRS)) == 12 and len(set(anchors)) == 7  # no repeated pair, 5 of the 7 anchors repeated
    assert sorted(anchors.count(a) for a in set(anchors)) == [1, 1, 1, 1, 2, 3, 3]
    assert not {p for _, p in PAIRS} & set(anchors) and not set(CORPUS) & set(anchors)


def mine_both(models, settings: dict, with_anchors: bool) -> tuple[dict, dict]:
    """(anchor, positive) -> negative from each library; a pair without a negative is absent."""
    theirs, ours = models
    pairs = Pairs([a for a, _ in PAIRS], [p for _, p in PAIRS], "fixed")
    # sentence-transformers' candidates: `corpus` plus the positives, deduplicated; the same list here
    pool = build_pool(pairs, CORPUS, include_pairs=True) if with_anchors else list(dict.fromkeys(
        CORPUS + pairs.positives))
    result = mine_hard_negatives(
        ours, pairs, pool,
        MiningSettings(rank_start=settings.get("range_min", 0), rank_end=WINDOW,
                       absolute_margin=settings.get("absolute_margin"),
                       relative_margin=settings.get("relative_margin")),
    )
    mined = st_mine_hard_negatives(
        Dataset.from_dict({"anchor": pairs.anchors, "positive": pairs.positives}), theirs, corpus=pool,
        range_max=WINDOW, num_negatives=1, sampling_strategy="top", output_format="triplet", verbose=False, **settings,
    )
    assert len(pool) < WINDOW
    return ({(a, p): n for a, p, n in result.rows},
            {(row["anchor"], row["positive"]): row["negative"] for row in mined})


@pytest.mark.parametrize(
    "settings, with_anchors",
    [
        ({}, False),
        ({"range_min": 2}, False),
        ({"relative_margin": 0.05}, False),
        ({"absolute_margin": 0.01}, False),
        ({"relative_margin": 0.05}, True),  # the margin removes every anchor from sentence-transformers' candidates
        ({"absolute_margin": 0.01}, True),
    ],
)
def test_same_negatives_as_sentence_transformers(models, settings, with_anchors):
    torch.manual_seed(0)
    ours, theirs = mine_both(models, settings, with_anchors)
    assert ours == theirs
    assert len(ours) >= 6  # the comparison is not vacuous: at least half the pairs get a negative
    positives = {a: {p for b, p in PAIRS if b == a} for a, _ in PAIRS}
    assert all(n not in positives[a] and n != a for (a, _), n in ours.items())


@pytest.mark.parametrize("output_format", ["triplet", "n-tuple"])
def test_several_negatives_as_sentence_transformers(models, output_format):
    """Three negatives per pair, as a row each or as one n-tuple row: the same rows as sentence-transformers."""
    theirs, ours = models
    pairs = Pairs([a for a, _ in PAIRS], [p for _, p in PAIRS], "fixed")
    pool = list(dict.fromkeys(CORPUS + pairs.positives))
    result = mine_hard_negatives(ours, pairs, pool, MiningSettings(rank_end=WINDOW, relative_margin=0.05,
                                                                  num_negatives=3, output_format=output_format))
    mined = st_mine_hard_negatives(
        Dataset.from_dict({"anchor": pairs.anchors, "positive": pairs.positives}), theirs, corpus=pool,
        range_max=WINDOW, num_negatives=3, sampling_strategy="top", output_format=output_format, verbose=False,
        relative_margin=0.05,
    )
    expected = sorted(tuple(row.values()) for row in mined)
    assert sorted(result.rows) == expected and len(expected) >= 6
    if output_format == "n-tuple":
        assert all(len(row) == 5 for row in result.rows)
