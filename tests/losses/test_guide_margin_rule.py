"""`false_negatives: guide` on hand-made guide embeddings: unit vectors in a plane at chosen angles, so every guide
cosine is cos(angle difference), computed here with `math.cos` cell by cell. The mask of each loss layout (supervised
InfoNCE with hard negatives, unsupervised InfoNCE, NT-Xent, SG-OPT's layouts) must equal the rule of
sentence-transformers' GISTEmbedLoss applied to those cosines, for both margin strategies; the row's own positive is
never dropped; and the loss with the mask is the cross-entropy over the kept candidates only."""

import math

import pytest
import torch

from hf_sentcl.losses import info_nce, nt_xent
from hf_sentcl.losses.false_negatives import GuideMargin, false_negative_mask, info_nce_mask, nt_xent_mask

TAU = 0.1


def unit(angles):
    """(n, 2) unit vectors at `angles` (radians)."""
    t = torch.tensor(angles, dtype=torch.float64)
    return torch.stack([t.cos(), t.sin()], dim=1)


def rule(anchor_angles, candidate_angles, targets, margin, strategy):
    """The guided rule, cell by cell on cosines of angle differences (no matrix product)."""
    mask = []
    for i, a in enumerate(anchor_angles):
        positive = math.cos(a - candidate_angles[targets[i]])
        threshold = positive - margin if strategy == "absolute" else positive - abs(positive) * margin
        mask.append([j != targets[i] and math.cos(a - c) > threshold for j, c in enumerate(candidate_angles)])
    return torch.tensor(mask)


# anchors, their positives (guide cosine to the anchor: 0.98, 0.80, 0.50, -0.20, -0.20 via the angle) and hard
# negatives; several candidates lie just above or below each row's threshold, and rows 3-4 have a negative positive
# score, where |positive| matters to the relative strategy
ANCHORS = [0.0, 1.0, 2.0, 3.0, 1.6]
POSITIVES = [a + math.acos(c) for a, c in zip(ANCHORS, (0.98, 0.80, 0.50, -0.20, -0.20))]
HARD = [0.05, 1.0 + math.acos(0.85), 0.9, 3.0 + math.acos(-0.4), 1.6 + math.acos(-0.18)]


@pytest.mark.parametrize("strategy", ["absolute", "relative"])
@pytest.mark.parametrize("margin", [0.0, 0.1, 0.3])
def test_supervised_info_nce_mask_is_the_rule_on_the_guides_cosines(strategy, margin):
    guide = GuideMargin(margin, strategy)
    got = info_nce_mask(unit(ANCHORS), unit(POSITIVES), unit(HARD), guide=guide)
    expected = rule(ANCHORS, POSITIVES + HARD, list(range(5)), margin, strategy)
    assert torch.equal(got, expected)


def test_the_hand_case_and_the_strategies_differ():
    """Row 3's positive scores -0.2, so the relative margin lowers its threshold by 0.2 * margin, the absolute one
    by the margin itself: the strategies disagree there, and both cases are written out by hand."""
    absolute = info_nce_mask(unit(ANCHORS), unit(POSITIVES), unit(HARD), guide=GuideMargin(0.3, "absolute"))
    relative = info_nce_mask(unit(ANCHORS), unit(POSITIVES), unit(HARD), guide=GuideMargin(0.3, "relative"))
    assert not torch.equal(absolute, relative)
    # row 0 (positive 0.98, absolute threshold 0.68): only its hard negative (cos 0.9988); positive 1 scores 0.54
    assert absolute[0].tolist() == [False] * 5 + [True] + [False] * 4
    # row 0, relative threshold 0.98 - 0.294 = 0.686: the same
    assert relative[0].tolist() == absolute[0].tolist()
    # row 3 (positive -0.2): absolute threshold -0.5, relative -0.2 - 0.06 = -0.26; its hard negative scores -0.4
    assert absolute[3, 8] and not relative[3, 8]
    # row 4 (positive -0.2): its hard negative scores -0.18, above -0.26 (relative) though below -0.2 + 0.06
    assert relative[4, 9]


def test_the_true_positive_is_never_dropped():
    anchors = unit([0.0, 0.5, 1.0])
    positives = unit([2.0, 0.5, 1.0])  # row 0's positive scores lowest of all its candidates
    for guide in (GuideMargin(0.0), GuideMargin(5.0), GuideMargin(5.0, "relative")):
        mask = info_nce_mask(anchors, positives, guide=guide)
        assert not mask.diagonal().any()
    assert info_nce_mask(anchors, positives, guide=GuideMargin(5.0)).sum() == 6  # every other cell


def test_a_duplicate_of_the_positive_ties_and_is_kept():
    """Strictly above the threshold, as sentence-transformers: with margin 0 a candidate equal to the positive
    scores exactly the positive's score and stays a negative."""
    anchors, positives = unit([0.0, 2.0]), unit([0.3, 0.3])
    mask = info_nce_mask(anchors, positives, guide=GuideMargin(0.0))
    assert not mask.any()


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.4])
def test_nt_xent_mask_two_views_of_one_text(margin):
    """Unsupervised layouts: both views of sentence i are i's text, so its positive scores 1 and the margin alone
    decides which other sentences are dropped."""
    angles = [0.0, 0.2, 1.0, 1.1, 2.5]
    got = nt_xent_mask(unit(angles), guide=GuideMargin(margin))
    both = angles + angles
    n = len(angles)
    expected = rule(both, both, [(i + n) % (2 * n) for i in range(2 * n)], margin, "absolute")
    assert torch.equal(got, expected)
    assert (got.sum() > 0) == (margin > 0)  # distinct angles: nothing scores above 1


def test_sg_opt1_layout():
    """SG-OPT's opt1 candidates [h, c] for every sentence: the layout function takes the same guide rule."""
    angles = [0.0, 0.1, 1.5]
    g = unit(angles)
    got = false_negative_mask(g, g, torch.cat([g, g]), torch.arange(3), GuideMargin(0.05))
    assert torch.equal(got, rule(angles, angles + angles, [0, 1, 2], 0.05, "absolute"))


def test_the_loss_with_the_guided_mask_is_the_cross_entropy_over_the_kept_candidates():
    torch.manual_seed(0)
    z1, z2, z3 = (torch.randn(5, 6, dtype=torch.float64) for _ in range(3))
    guide = GuideMargin(0.1)
    mask = info_nce_mask(unit(ANCHORS), unit(POSITIVES), unit(HARD), guide=guide)
    assert mask.any()
    loss = info_nce(z1, z2, TAU, hard_negatives=z3, exclude=mask)
    candidates = torch.cat([z2, z3])
    expected = 0.0
    for i in range(5):
        score = [float(torch.cosine_similarity(z1[i], c, dim=0)) / TAU for c in candidates]
        kept = [math.exp(s) for j, s in enumerate(score) if not mask[i, j]]
        expected += -(score[i] - math.log(sum(kept)))
    assert loss.item() == pytest.approx(expected / 5, rel=1e-6)  # the loss computes in fp32
    nt = nt_xent(z1, z2, TAU, exclude=nt_xent_mask(unit([0.0, 0.05, 1.0, 2.0, 3.0]), guide=guide))
    assert torch.isfinite(nt)
