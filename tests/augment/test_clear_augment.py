"""CLEAR's sentence augmentations on known token lists (counts, span structure, merge rule, special tokens,
determinism), the word segmentation of subword ids, WordNet synonyms as ids, and the collator's views and MLM
labels."""

import numpy as np
import pytest
import torch
from helpers import write_wordnet
from transformers import AutoTokenizer

from hf_sentcl.augment.text import (
    SentenceAugmenter,
    delete_spans,
    delete_words,
    merge_deletions,
    parse_augmentation,
    reorder_spans,
    sample_spans,
    substitute_synonyms,
)
from hf_sentcl.augment.wordnet import WordNet
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.methods.clear.collator import (
    EXAMPLE_INDEX,
    CLEARCollator,
    WordNetSynonyms,
    WordSegmenter,
    add_delete_token,
    protected_ids,
)
from hf_sentcl.modeling.backbone import resolve_model_name

DEL = "[DEL]"
SPECIAL = {"[CLS]", "[SEP]", "[PAD]"}


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def expected_after_deleting(units, deleted_positions) -> list:
    """The reference: deleted positions become [DEL], each maximal run of them ONE [DEL]."""
    out = []
    for i, unit in enumerate(units):
        if i not in deleted_positions:
            out.append(unit)
        elif not out or out[-1] != DEL:
            out.append(DEL)
    return out


def deleted_positions(units, out) -> set[int]:
    kept = {u for u in out if u != DEL}
    return {i for i, u in enumerate(units) if u not in kept}


def runs(positions: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(positions):
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


# ------------------------------------------------------------------------------------------ spec parsing
def test_parse_augmentation():
    assert parse_augmentation("del_word") == ("del_word",)
    assert parse_augmentation("subs+del_span") == ("subs", "del_span")
    assert parse_augmentation(" del_span + reorder ") == ("del_span", "reorder")
    with pytest.raises(ValueError, match=r"unknown augmentation \['shuffle'\]"):
        parse_augmentation("subs+shuffle")
    with pytest.raises(ValueError, match="repeats"):
        parse_augmentation("reorder+reorder")


# ------------------------------------------------------------------------------------------ the operations
def test_merge_deletions():
    assert merge_deletions(["a", DEL, DEL, "b", DEL, DEL, DEL], DEL) == ["a", DEL, "b", DEL]
    assert merge_deletions([DEL, DEL], DEL) == [DEL]
    assert merge_deletions(["a", "b"], DEL) == ["a", "b"]


@pytest.mark.parametrize("n,expected_deleted", [(10, 7), (20, 14), (5, 4), (2, 1), (1, 0)])
@pytest.mark.parametrize("seed", range(5))
def test_del_word_rate_and_merge_rule(n, expected_deleted, seed):
    """70% of n units (rounded, at least one kept) become [DEL]; runs of deleted units are ONE [DEL]."""
    units = words(n)
    out = delete_words(units, 0.7, DEL, rng(seed))
    gone = deleted_positions(units, out)
    assert len(gone) == expected_deleted
    assert out == expected_after_deleting(units, gone)
    assert out.count(DEL) == len(runs(gone))
    assert all(not (a == b == DEL) for a, b in zip(out, out[1:]))


@pytest.mark.parametrize("n,span,spans", [(100, 5, 5), (40, 2, 5), (20, 1, 5), (6, 1, 5), (3, 1, 2), (1, 1, 0)])
@pytest.mark.parametrize("seed", range(5))
def test_del_span_count_length_and_merge(n, span, spans, seed):
    """5 spans of round(5% of n) (min 1) units are deleted (fewer if they would leave nothing); each span is
    replaced by one [DEL], and touching spans merge."""
    units = words(n)
    out = delete_spans(units, 5, 0.05, DEL, rng(seed))
    gone = deleted_positions(units, out)
    assert len(gone) == span * spans
    assert all(len(r) % span == 0 for r in runs(gone))
    assert out == expected_after_deleting(units, gone)


@pytest.mark.parametrize("n,span,pairs", [(100, 5, 5), (40, 2, 5), (20, 1, 5), (7, 1, 3), (1, 1, 0)])
@pytest.mark.parametrize("seed", range(5))
def test_reorder_swaps_span_pairs(n, span, pairs, seed):
    """2 x 5 spans of round(5% of n) units are swapped pairwise: the output is a permutation; exactly the units of
    the 2 * pairs spans moved, and cut into spans, each span holds the original content of its partner, whose
    content it holds in turn."""
    units = words(n)
    out = reorder_spans(units, 5, 0.05, rng(seed))
    assert sorted(out) == sorted(units)
    moved = [i for i in range(n) if out[i] != units[i]]
    assert len(moved) == 2 * pairs * span
    starts = [r[k] for r in runs(set(moved)) for k in range(0, len(r), span)]
    assert len(starts) == 2 * pairs
    partner = {}
    for s in starts:
        matches = [t for t in starts if t != s and out[s:s + span] == units[t:t + span]]
        assert len(matches) == 1
        partner[s] = matches[0]
    assert all(partner[partner[s]] == s for s in starts)


def test_sample_spans_are_disjoint_and_fill_exactly_when_tight():
    for seed in range(20):
        starts = sample_spans(23, 4, 3, rng(seed))
        covered = [i for s in starts for i in range(s, s + 3)]
        assert len(set(covered)) == 12 and max(covered) < 23
    assert sample_spans(10, 5, 2, rng(0)) == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="do not fit"):
        sample_spans(5, 3, 2, rng(0))


@pytest.mark.parametrize("seed", range(5))
def test_subs_rate_among_units_with_synonyms(seed):
    """30% of n units (rounded) are replaced, chosen among those that have synonyms, by one of their synonyms."""
    table = {f"w{i}": [f"s{i}a", f"s{i}b"] for i in range(0, 20, 2)}  # 10 of 20 units have synonyms
    units = words(20)
    out = substitute_synonyms(units, 0.3, lambda u: table.get(u, []), rng(seed))
    changed = [i for i in range(20) if out[i] != units[i]]
    assert len(changed) == 6
    assert all(units[i] in table and out[i] in table[units[i]] for i in changed)
    # fewer candidates than the rate asks for: all of them are replaced
    few = substitute_synonyms(units, 0.3, lambda u: table.get(u, []) if u in ("w0", "w2") else [], rng(seed))
    assert [i for i in range(20) if few[i] != units[i]] == [0, 2]
    assert substitute_synonyms(units, 0.3, lambda u: [], rng(seed)) == units


# ------------------------------------------------------------------------------------------ the augmenter
def augmenter(spec: str, **kwargs) -> SentenceAugmenter:
    table = {f"w{i}": [f"syn{i}"] for i in range(0, 60, 3)}
    return SentenceAugmenter(spec, deleted=DEL, synonyms=lambda u: table.get(u, []), **kwargs)


SPECS = ["del_word", "del_span", "reorder", "subs", "subs+del_span", "del_span+reorder", "subs+del_word"]


@pytest.mark.parametrize("spec", SPECS)
def test_special_tokens_are_never_deleted_moved_or_replaced(spec):
    """[CLS], [SEP] and padding keep their order and boundaries; each sentence of a pair is augmented alone."""
    first, second = words(30), [f"v{i}" for i in range(25)]
    tokens = ["[CLS]", *first, "[SEP]", *second, "[SEP]", "[PAD]", "[PAD]"]
    for seed in range(10):
        out = augmenter(spec)(tokens, rng(seed), special=SPECIAL)
        assert [t for t in out if t in SPECIAL] == ["[CLS]", "[SEP]", "[SEP]", "[PAD]", "[PAD]"]
        assert out[0] == "[CLS]" and out[-2:] == ["[PAD]", "[PAD]"]
        sep = out.index("[SEP]")
        assert all(t in (DEL,) or t.startswith(("w", "syn")) for t in out[1:sep])
        assert all(t in (DEL,) or t.startswith(("v", "syn")) for t in out[sep + 1:-3])
        assert out != tokens


def test_sequences_apply_left_to_right_with_one_generator():
    """'subs+del_span' == del_span(subs(x)) drawing from the same generator in that order."""
    units = words(40)
    aug = augmenter("subs+del_span")
    expected_rng = rng(7)
    expected = delete_spans(
        substitute_synonyms(units, 0.3, aug.synonyms, expected_rng), 5, 0.05, DEL, expected_rng
    )
    assert aug(units, rng(7)) == expected
    assert any(t.startswith("syn") for t in expected) and DEL in expected


def test_reorder_after_deletion_never_leaves_two_dels_together():
    aug = augmenter("del_word+reorder", del_word_rate=0.5, reorder_fraction=0.1)
    for seed in range(30):
        out = aug(words(40), rng(seed))
        assert all(not (a == b == DEL) for a, b in zip(out, out[1:]))


@pytest.mark.parametrize("spec", SPECS)
def test_determinism_under_a_seed(spec):
    tokens = ["[CLS]", *words(40), "[SEP]"]
    aug = augmenter(spec)
    assert aug(tokens, rng(3), special=SPECIAL) == aug(tokens, rng(3), special=SPECIAL)
    outputs = {tuple(aug(tokens, rng(seed), special=SPECIAL)) for seed in range(10)}
    assert len(outputs) > 5  # different seeds give different views


def test_rates_and_counts_are_settings():
    units = words(40)
    out = augmenter("del_word", del_word_rate=0.25)(units, rng(0))
    assert len(deleted_positions(units, out)) == 10
    out = augmenter("del_span", del_span_count=2, del_span_fraction=0.1)(units, rng(0))
    assert len(deleted_positions(units, out)) == 8
    out = augmenter("reorder", reorder_pairs=1, reorder_fraction=0.25)(units, rng(0))
    assert sum(a != b for a, b in zip(out, units)) == 20


def test_augmenter_needs_its_ingredients():
    with pytest.raises(ValueError, match=r"\[DEL\]"):
        SentenceAugmenter("del_word")
    with pytest.raises(ValueError, match="synonyms"):
        SentenceAugmenter("subs+reorder", deleted=DEL)
    with pytest.raises(ValueError, match="unknown augmentation"):
        SentenceAugmenter("crop", deleted=DEL)


# ------------------------------------------------------------------------------------------ words from subword ids
@pytest.fixture(scope="module")
def minilm_tokenizer():
    """The embedded MiniLM's uncased WordPiece tokenizer (offline), with [DEL] added."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name(EMBEDDED_MODEL_ALIAS))
    add_delete_token(tokenizer)
    return tokenizer


def segment(tokenizer, text: str, level: str = "word") -> list[list[str]]:
    ids = tokenizer(text)["input_ids"]
    return [tokenizer.convert_ids_to_tokens(list(w)) for w in WordSegmenter(tokenizer, level)(ids)]


def test_wordpiece_words(minilm_tokenizer):
    assert segment(minilm_tokenizer, "Unbelievably, the cars [DEL] ran") == [
        ["[CLS]"], ["un", "##bel", "##ie", "##va", "##bly"], [","], ["the"], ["cars"], ["[DEL]"], ["ran"], ["[SEP]"]
    ]
    tokens = segment(minilm_tokenizer, "Unbelievably good", level="token")
    assert tokens == [["[CLS]"], ["un"], ["##bel"], ["##ie"], ["##va"], ["##bly"], ["good"], ["[SEP]"]]


def test_byte_level_bpe_words(tiny_roberta_dir):
    """RoBERTa-style vocabularies: a word starts at a 'Ġ' token (or after <s>) and takes the tokens after it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_roberta_dir)
    add_delete_token(tokenizer)
    ids = tokenizer("water street")["input_ids"][:-1] + tokenizer.convert_tokens_to_ids(["[DEL]", "</s>"])
    ids[-1:-1] = tokenizer(" park", add_special_tokens=False)["input_ids"]
    out = [tokenizer.convert_ids_to_tokens(list(w)) for w in WordSegmenter(tokenizer)(ids)]
    assert [w[0] for w in out] == ["<s>", "w", "Ġs", "[DEL]", "Ġp", "</s>"]
    assert ["".join(w).replace("Ġ", "") for w in out[1:-1]] == ["water", "street", "[DEL]", "park"]


def test_protected_ids_are_the_special_tokens_but_not_del(minilm_tokenizer):
    ids = protected_ids(minilm_tokenizer)
    names = set(minilm_tokenizer.convert_ids_to_tokens(sorted(ids)))
    assert {"[CLS]", "[SEP]", "[PAD]", "[MASK]"} <= names and "[DEL]" not in names


# ------------------------------------------------------------------------------------------ synonyms as ids
def test_wordnet_synonyms_as_subword_ids(minilm_tokenizer, tmp_path):
    synonyms = WordNetSynonyms(minilm_tokenizer, WordNet(write_wordnet(tmp_path / "wn")))
    seg = WordSegmenter(minilm_tokenizer)

    def lookup(text):
        (word,) = seg(minilm_tokenizer(text, add_special_tokens=False)["input_ids"])
        return [minilm_tokenizer.decode(list(s)) for s in synonyms(word)]

    assert lookup("cars") == ["auto", "automobile", "machine", "motorcar", "railcar"]  # no multi-word lemmas
    assert lookup("children") == ["kid", "youngster"]
    assert lookup("automobile") == ["car", "auto", "machine", "motorcar"]
    assert lookup("the") == [] and lookup("xylophone") == []  # stop word; not in WordNet
    assert synonyms.words("Ford") == []  # only lower-case lemmas: no proper nouns
    assert synonyms.words("Kid") == ["Child", "Youngster"]  # capitalisation follows the word


# ------------------------------------------------------------------------------------------ the collator
def make_collator(tokenizer, spec="del_span+reorder", **kwargs) -> CLEARCollator:
    deleted = (add_delete_token(tokenizer),)
    return CLEARCollator(tokenizer, SentenceAugmenter(spec, deleted=deleted), WordSegmenter(tokenizer), **kwargs)


SENTENCES = [
    "a man is playing a large guitar on the stage while people in the crowd sing along to every song",
    "the quick brown fox jumps over the lazy dog near the river bank in the early morning light today",
]


def features(tokenizer, sentences=SENTENCES, start=0):
    return [{"view0": tokenizer(s)["input_ids"], EXAMPLE_INDEX: start + i} for i, s in enumerate(sentences)]


def test_collator_layout_and_views(minilm_tokenizer):
    collator = make_collator(minilm_tokenizer, seed=1)
    feats = features(minilm_tokenizer)
    batch = collator(feats)
    assert batch["input_ids"].shape[:2] == (2, 3) and batch["attention_mask"].shape == batch["input_ids"].shape
    assert batch["mlm_labels"].shape == (2, batch["input_ids"].shape[2])
    for b, f in enumerate(feats):
        for v in (1, 2):
            ids = batch["input_ids"][b, v][batch["attention_mask"][b, v].bool()].tolist()
            assert ids == collator.augment(f["view0"], f[EXAMPLE_INDEX], v)
            assert ids[0] == minilm_tokenizer.cls_token_id and ids[-1] == minilm_tokenizer.sep_token_id
        assert batch["input_ids"][b, 1].tolist() != batch["input_ids"][b, 2].tolist()


def test_views_are_seeded_by_example_epoch_and_view_not_by_batch(minilm_tokenizer):
    collator = make_collator(minilm_tokenizer, seed=5)
    feats = features(minilm_tokenizer)
    alone = collator([feats[1]])["input_ids"][0, 1:]
    together = collator(feats)["input_ids"][1, 1:, : alone.shape[1]]
    assert torch.equal(alone, together)
    first_epoch = collator.augment(feats[0]["view0"], 0, 1)
    assert make_collator(minilm_tokenizer, seed=5).augment(feats[0]["view0"], 0, 1) == first_epoch
    collator.epoch = 1
    assert collator.augment(feats[0]["view0"], 0, 1) != first_epoch
    assert make_collator(minilm_tokenizer, seed=6).augment(feats[0]["view0"], 0, 1) != first_epoch


def test_mlm_labels_only_at_masked_positions(minilm_tokenizer):
    """Labels hold the original id where a token was chosen and -100 everywhere else (special tokens, padding,
    unchosen tokens); unchosen inputs are unchanged; about 15% are chosen, of which ~80% become [MASK], ~10% a
    random token and ~10% stay."""
    collator = make_collator(minilm_tokenizer, seed=0)
    long_text = " ".join(SENTENCES * 3)
    original = minilm_tokenizer(long_text)["input_ids"]
    chosen = masked = kept = 0
    for index in range(300):
        inputs, labels = collator.mask(original, index)
        assert len(inputs) == len(labels) == len(original)
        for token, new, label in zip(original, inputs, labels):
            if label == -100:
                assert new == token
            else:
                assert label == token and token not in collator.special
                chosen += 1
                masked += new == minilm_tokenizer.mask_token_id
                kept += new == token
    content = 300 * (len(original) - 2)
    assert chosen / content == pytest.approx(0.15, abs=0.01)
    assert masked / chosen == pytest.approx(0.8, abs=0.03)
    assert kept / chosen == pytest.approx(0.1, abs=0.03)

    batch = collator(features(minilm_tokenizer, [SENTENCES[0], "short one"]))
    labels, inputs = batch["mlm_labels"], batch["input_ids"][:, 0]
    assert (labels[batch["attention_mask"][:, 0] == 0] == -100).all()
    assert (labels[:, 0] == -100).all()  # [CLS]
    for b in range(2):
        assert collator.mask(features(minilm_tokenizer, [SENTENCES[0], "short one"])[b]["view0"], b)[1] == \
            labels[b][: batch["attention_mask"][b, 0].sum()].tolist()
        assert ((inputs[b] != batch["input_ids"][b, 0]) <= (labels[b] != -100)).all()


def test_collator_without_mlm_has_two_views(minilm_tokenizer):
    batch = make_collator(minilm_tokenizer, mlm_probability=None)(features(minilm_tokenizer))
    assert batch["input_ids"].shape[1] == 2 and "mlm_labels" not in batch


def test_collator_needs_example_index(minilm_tokenizer):
    with pytest.raises(KeyError, match=EXAMPLE_INDEX):
        make_collator(minilm_tokenizer)([{"view0": [101, 102]}])


def test_long_views_are_cut_before_their_last_token(minilm_tokenizer):
    collator = make_collator(minilm_tokenizer, spec="reorder", max_length=8)
    ids = minilm_tokenizer(SENTENCES[0])["input_ids"]
    out = collator.augment(ids, 0, 1)
    assert len(out) == 8 and out[-1] == minilm_tokenizer.sep_token_id
