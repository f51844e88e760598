"""`false_negatives: mask`: every in-batch loss against a hand computation that decides duplicates by comparing the
texts themselves (strings), so a wrong text grouping or a wrong mask layout makes the comparison fail."""

import math

import pytest
import torch

from hf_sentcl.losses import info_nce, margin_info_nce, nt_xent
from hf_sentcl.losses.false_negatives import (
    false_negative_mask,
    info_nce_mask,
    nt_xent_mask,
    text_groups,
)
from hf_sentcl.methods.self_guided.loss import sg_opt1_loss, sg_opt_loss

TAU = 0.1
VOCAB: dict[str, int] = {}  # one word -> id map for every call, as one tokenizer


def tokenize(texts, width=None, left=False, pad_id=0):
    """Word ids (+5, so none equals the pad id) padded to `width`; a tiny stand-in tokenizer."""
    rows = [[5 + VOCAB.setdefault(w, len(VOCAB)) for w in text.split()] for text in texts]
    width = width or max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


def groups_of(texts, **kwargs):
    return text_groups(*tokenize(texts, **kwargs))


def cos(a, b):
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def hand_row_loss(anchor, positive, candidates):
    """-log exp(s_pos / tau) / (exp(s_pos / tau) + sum over kept candidates)."""
    pos = math.exp(cos(anchor, positive) / TAU)
    return -math.log(pos / (pos + sum(math.exp(cos(anchor, c) / TAU) for c in candidates)))


def test_text_groups_compare_real_tokens_only():
    """Same text = same group whatever the padding (side, length, pad id); different texts never share one."""
    texts = ["a b c", "a b", "a b c", "c b a", "a b"]
    right = groups_of(texts)
    assert right.tolist()[0] == right.tolist()[2] and right[1] == right[4]
    assert len(set(right.tolist())) == 3
    ids, mask = tokenize(texts, width=6, left=True, pad_id=1)
    left = text_groups(ids, mask)
    assert torch.equal(left == left[:, None], right == right[:, None])
    # two batches padded differently, joined as the cross-process gather joins them
    a_ids, a_mask = tokenize(texts[:2], width=3)
    b_ids, b_mask = tokenize(texts[2:], width=5)
    joined = text_groups(
        torch.cat([torch.nn.functional.pad(a_ids, (0, 2)), b_ids]),
        torch.cat([torch.nn.functional.pad(a_mask, (0, 2)), b_mask])
    )
    assert torch.equal(joined == joined[:, None], right == right[:, None])


def test_unsupervised_info_nce_drops_duplicate_sentences():
    texts = ["the cat sat", "a dog ran", "the cat sat", "birds fly", "a dog ran", "rain falls"]
    torch.manual_seed(0)
    z1, z2 = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    g = groups_of(texts)
    exclude = info_nce_mask(g, g)
    assert int(exclude.sum()) == 4  # (0,2), (2,0), (1,4), (4,1)
    expected = sum(
        hand_row_loss(z1[i], z2[i], [z2[j] for j in range(6) if j != i and texts[j] != texts[i]]) for i in range(6)
    ) / 6
    assert info_nce(z1, z2, TAU, exclude=exclude).item() == pytest.approx(expected, rel=1e-6)
    assert info_nce(z1, z2, TAU).item() != pytest.approx(expected, rel=1e-3)  # masking changed something


def test_supervised_info_nce_with_hard_negatives():
    """Anchor i keeps as negatives the other rows' entailments and every contradiction, except texts identical to
    its anchor or to a positive of its premise (its own entailment, or the entailment of another row with the same
    premise), in whichever column they sit."""
    premises = ["p one", "p two", "p one", "p three"]
    entailments = ["e one", "e two", "e three", "p two"]  # row 3's entailment is row 1's premise
    contradictions = ["c one", "e one", "c three", "c four"]  # row 1's contradiction is row 0's entailment
    torch.manual_seed(1)
    z1, z2, z3 = (torch.randn(4, 8, dtype=torch.float64) for _ in range(3))
    exclude = info_nce_mask(groups_of(premises + entailments + contradictions).view(3, 4)[0],
                            *groups_of(premises + entailments + contradictions).view(3, 4)[1:])
    rows = []
    for i in range(4):
        own = {premises[i]} | {entailments[m] for m in range(4) if premises[m] == premises[i]}
        kept = [z2[j] for j in range(4) if j != i and entailments[j] not in own]
        kept += [z3[j] for j in range(4) if contradictions[j] not in own]
        rows.append(hand_row_loss(z1[i], z2[i], kept))
    expected = sum(rows) / 4
    assert info_nce(z1, z2, TAU, z3, exclude=exclude).item() == pytest.approx(expected, rel=1e-6)
    # row 0: entailment of row 2 (same premise) and contradiction of row 1 (= its own entailment) are dropped
    assert exclude[0].nonzero().flatten().tolist() == [2, 4 + 1]
    # row 1: row 3's entailment is its own premise
    assert exclude[1].nonzero().flatten().tolist() == [3]
    # row 2: row 0's entailment "e one" is another positive of its premise, as row 0's positive and as row 1's
    # contradiction alike
    assert exclude[2].nonzero().flatten().tolist() == [0, 4 + 1]


def test_a_positive_of_one_row_as_another_rows_hard_negative():
    """"someone sings" is row 0's and row 3's positive, and row 1's and row 2's contradiction. Rows 0 and 2 share
    their premise, so for row 2 it is another positive of its anchor: masked in every column that holds it, the
    hard-negative columns included (before the fix only row 0's positive column was). The expected mask is worked
    out on the strings: column c is masked for row i (c != i) when its text is i's premise or the entailment of
    any row whose premise is i's."""
    premises = ["a man sings", "a dog runs", "a man sings", "kids play"]
    entailments = ["someone sings", "an animal moves", "a person makes music", "someone sings"]
    contradictions = ["nobody sings", "someone sings", "someone sings", "a dog runs"]
    groups = groups_of(premises + entailments + contradictions).view(3, 4)
    exclude = info_nce_mask(*groups)

    columns = entailments + contradictions
    expected = torch.tensor([
        [c != i and (columns[c] == premises[i]
                     or columns[c] in {entailments[m] for m in range(4) if premises[m] == premises[i]})
         for c in range(8)]
        for i in range(4)
    ])
    assert torch.equal(exclude, expected)
    # the same, listed: row 1 keeps "someone sings" (its own contradiction, no positive of "a dog runs")
    assert [row.nonzero().flatten().tolist() for row in exclude] == [[2, 3, 5, 6], [7], [0, 3, 5, 6], [0, 5, 6]]

    torch.manual_seed(7)
    z1, z2, z3 = (torch.randn(4, 8, dtype=torch.float64) for _ in range(3))
    views = list(z2) + list(z3)
    loss = sum(hand_row_loss(z1[i], z2[i], [views[c] for c in range(8) if not expected[i, c] and c != i])
               for i in range(4)) / 4
    assert info_nce(z1, z2, TAU, z3, exclude=exclude).item() == pytest.approx(loss, rel=1e-6)


def test_gathered_order_is_what_the_mask_follows():
    """Groups from two processes' batches, joined in rank order, give the mask of the 1-process batch; rows of one
    process interleaved with the other's (a wrong gather order) give another mask."""
    texts = ["x y", "y z", "x y", "z z", "y z", "w"]
    whole = groups_of(texts)
    ranks = [tokenize(texts[:3], width=4), tokenize(texts[3:], width=2)]
    width = 4
    ids = torch.cat([torch.nn.functional.pad(t[0], (0, width - t[0].shape[1])) for t in ranks])
    mask = torch.cat([torch.nn.functional.pad(t[1], (0, width - t[1].shape[1])) for t in ranks])
    joined = text_groups(ids, mask)
    assert torch.equal(info_nce_mask(joined, joined), info_nce_mask(whole, whole))
    interleaved = joined[torch.tensor([0, 3, 1, 4, 2, 5])]
    assert not torch.equal(info_nce_mask(interleaved, interleaved), info_nce_mask(whole, whole))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nt_xent_drops_every_view_of_a_duplicate(reduction):
    texts = ["one two", "three", "one two", "four five"]
    torch.manual_seed(2)
    z1, z2 = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    views = list(z1) + list(z2)
    sentence = texts + texts
    terms = []
    for a in range(8):
        pos = (a + 4) % 8
        kept = [views[c] for c in range(8) if c not in (a, pos) and sentence[c] != sentence[a]]
        terms.append(hand_row_loss(views[a], views[pos], kept))
    expected = sum(terms) / (1 if reduction == "sum" else 8)
    got = nt_xent(z1, z2, TAU, reduction=reduction, exclude=nt_xent_mask(groups_of(texts)))
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_dynamic_margin_counts_only_the_kept_negatives():
    """BYOP-D: m_i = sim(z_i, z'_i) / (number of negatives of row i), the masked ones not counted; p+ adds it."""
    texts = ["a", "b", "a", "c"]
    torch.manual_seed(3)
    z1, z2 = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    g = groups_of(texts)
    rows = []
    for i in range(4):
        negatives = [j for j in range(4) if j != i and texts[j] != texts[i]]
        s_pos = cos(z1[i], z2[i])
        m = s_pos / len(negatives)
        pos = math.exp((s_pos + m) / TAU)
        rows.append(-math.log(pos / (pos + sum(math.exp(cos(z1[i], z2[j]) / TAU) for j in negatives))))
    got = margin_info_nce(z1, z2, TAU, "p+", dynamic=True, exclude=info_nce_mask(g, g))
    assert got.item() == pytest.approx(sum(rows) / 4, rel=1e-6)


def test_sg_opt_drops_every_view_of_a_duplicate_sentence():
    texts = ["s1", "s2", "s1"]
    torch.manual_seed(4)
    c, h = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 2, 4, dtype=torch.float64)
    terms = []
    for i in range(3):
        others = [h[m, n] for m in range(3) if texts[m] != texts[i] for n in range(2)]
        terms += [hand_row_loss(c[i], h[i, k], others) for k in range(2)]
    g = groups_of(texts)
    assert sg_opt_loss(c, h, TAU, info_nce_mask(g, g)).item() == pytest.approx(sum(terms) / 6, rel=1e-6)


def test_sg_opt1_mask_layout():
    """L_opt1's candidates are [h_j, c_j]: a duplicate sentence leaves both of its columns."""
    texts = ["s1", "s2", "s1"]
    torch.manual_seed(5)
    c, h = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    g = groups_of(texts)
    exclude = false_negative_mask(g, g, torch.cat([g, g]), torch.arange(3))
    terms = []
    for i in range(3):
        kept = [h[j] for j in range(3) if j != i and texts[j] != texts[i]]
        kept += [c[j] for j in range(3) if j != i and texts[j] != texts[i]]
        terms.append(hand_row_loss(c[i], h[i], kept))
    assert sg_opt1_loss(c, h, TAU, exclude).item() == pytest.approx(sum(terms) / 3, rel=1e-4)


def test_no_duplicates_no_change():
    """Without repeated texts the mask is empty and the loss is the plain one, bit for bit."""
    g = groups_of(["a", "b", "c"])
    torch.manual_seed(6)
    z1, z2 = torch.randn(3, 4), torch.randn(3, 4)
    exclude = info_nce_mask(g, g)
    assert not exclude.any()
    assert torch.equal(info_nce(z1, z2, TAU, exclude=exclude), info_nce(z1, z2, TAU))
