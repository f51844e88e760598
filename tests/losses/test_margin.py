"""IFM/BYOP margin-perturbed InfoNCE against an independent float64 loop computation, plus spec and config checks."""

import math
import statistics
import warnings

import numpy as np
import pytest
import torch

from hf_sentcl.losses import info_nce, margin_cross_entropy, margin_info_nce, parse_perturbation
from hf_sentcl.losses.margin import dynamic_margin
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig

ALL_SPECS = ["p+", "p-", "n+", "n-", "p+n-", "p-n+", "p-n-", "p+n+"]


def reference_margin_info_nce(z1, z2, temperature, spec, margin=0.0, dynamic=False, multi_task=False,
                              hard=None, weight=0.0) -> float:
    """Loops in float64, written from BYOP Eq. 3: row i's logits are (cos(z1_i, c_j) + shift_ij) / t with
    shift = (sign of 'p') * m_i on the positive column j == i and (sign of 'n') * m_i on every other column
    (hard negatives included); m_i = margin, or cos(z1_i, z2_i) / (#columns - 1) when dynamic; a hard-negative
    weight is added to logit (i, own hard negative) after the division. Loss = mean_i [lse_j - logit_ii]."""
    signs = {"p": 0.0, "n": 0.0}
    for k in range(0, len(spec), 2):
        signs[spec[k]] = 1.0 if spec[k + 1] == "+" else -1.0
    a = np.asarray(z1, dtype=np.float64)
    b = np.asarray(z2, dtype=np.float64)
    h = None if hard is None else np.asarray(hard, dtype=np.float64)

    def cos(u, v):
        return float(np.dot(u, v) / (math.sqrt(np.dot(u, u)) * math.sqrt(np.dot(v, v))))

    def row_loss(i, perturbed):
        sims = [cos(a[i], b[j]) for j in range(n)]
        if h is not None:
            sims += [cos(a[i], h[j]) for j in range(n)]
        m = sims[i] / (len(sims) - 1) if dynamic else margin
        logits = []
        for j, s in enumerate(sims):
            shift = (signs["p"] if j == i else signs["n"]) * m if perturbed else 0.0
            logits.append((s + shift) / temperature + (weight if j == n + i else 0.0))
        top = max(logits)
        return top + math.log(sum(math.exp(x - top) for x in logits)) - logits[i]

    n = a.shape[0]
    perturbed = sum(row_loss(i, True) for i in range(n)) / n
    if not multi_task:
        return perturbed
    return 0.5 * (perturbed + sum(row_loss(i, False) for i in range(n)) / n)


def random_views(n=6, d=5, seed=0, views=2):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=generator) for _ in range(views)]


# ------------------------------------------------------------------------------------------ the loss
@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("multi_task", [False, True])
def test_constant_margin_matches_loops(spec, multi_task):
    """Every spec with a constant margin (BYOP-C / IFM), single and multi-task, equals the loop computation."""
    z1, z2 = random_views()
    loss = margin_info_nce(z1, z2, 0.05, spec, margin=0.07, multi_task=multi_task)
    expected = reference_margin_info_nce(z1, z2, 0.05, spec, 0.07, multi_task=multi_task)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_dynamic_margin_matches_loops(spec):
    """BYOP-D: m_i = cos(z_i, z'_i) / (N - 1) per row, every spec."""
    z1, z2 = random_views(n=7, d=4, seed=3)
    loss = margin_info_nce(z1, z2, 0.1, spec, dynamic=True)
    assert loss.item() == pytest.approx(reference_margin_info_nce(z1, z2, 0.1, spec, dynamic=True), rel=1e-5)


@pytest.mark.parametrize("spec,dynamic", [("p-n+", False), ("n-", True), ("p+n-", False)])
def test_hard_negatives_are_negatives_too(spec, dynamic):
    """Supervised SimCSE: hard-negative columns get the 'n' shift, the weight is added after /t, and the dynamic
    margin divides by all 2N - 1 negatives."""
    z1, z2, z3 = random_views(n=5, d=6, seed=4, views=3)
    loss = margin_info_nce(z1, z2, 0.05, spec, margin=0.05, dynamic=dynamic, hard_negatives=z3,
                           hard_negative_weight=0.8)
    expected = reference_margin_info_nce(z1, z2, 0.05, spec, 0.05, dynamic, hard=z3, weight=0.8)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_perturbation_changes_the_loss_in_the_expected_direction():
    """The reference is not trivially equal to InfoNCE: IFM ('p-n+') raises the loss, BYOP's 'p+n-' lowers it."""
    z1, z2 = random_views(seed=5)
    plain = info_nce(z1, z2, 0.05).item()
    assert margin_info_nce(z1, z2, 0.05, "p-n+", margin=0.05).item() > plain + 1e-3
    assert margin_info_nce(z1, z2, 0.05, "p+n-", margin=0.05).item() < plain - 1e-3


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_zero_margin_is_exactly_info_nce(spec):
    """A zero constant margin (and perturbation=None) gives bit-identical results to info_nce, hard negatives too."""
    z1, z2, z3 = random_views(seed=6, views=3)
    torch.testing.assert_close(margin_info_nce(z1, z2, 0.05, spec, margin=0.0), info_nce(z1, z2, 0.05), rtol=0, atol=0)
    torch.testing.assert_close(
        margin_info_nce(z1, z2, 0.05, spec, 0.0, hard_negatives=z3, hard_negative_weight=0.3),
        info_nce(z1, z2, 0.05, z3, 0.3), rtol=0, atol=0,
    )
    torch.testing.assert_close(margin_info_nce(z1, z2, 0.05, None, margin=0.5), info_nce(z1, z2, 0.05), rtol=0, atol=0)


def test_shift_invariance_equivalences():
    """Only the positive-minus-negative shift matters: n- == p+, p+n- (m) == p+ (2m), p-n- == plain, also dynamic."""
    z1, z2 = random_views(seed=7)

    def loss(spec, m=0.03, **kw):
        return margin_info_nce(z1, z2, 0.05, spec, margin=m, **kw)

    torch.testing.assert_close(loss("n-"), loss("p+"))
    torch.testing.assert_close(loss("p+n-"), loss("p+", 0.06))
    torch.testing.assert_close(loss("p-n+"), loss("p-", 0.06))
    torch.testing.assert_close(loss("p-n-"), info_nce(z1, z2, 0.05))
    torch.testing.assert_close(loss("p-n-", 0.0, dynamic=True, detach_margin=False), info_nce(z1, z2, 0.05))


def test_dynamic_margin_shape_and_value():
    """dynamic_margin is (rows, 1) = sim(i, target_i) / (finite entries of row i - 1): masked -inf entries (an
    NT-Xent self-similarity) do not count as negatives."""
    sims = torch.tensor([[0.9, 0.1, -0.2, 0.3], [0.2, 0.6, 0.0, 0.4], [0.5, 0.1, 0.8, -0.1]])
    margin = dynamic_margin(sims, torch.tensor([0, 1, 2]))
    assert margin.shape == (3, 1)
    torch.testing.assert_close(margin.squeeze(1), torch.tensor([0.9, 0.6, 0.8]) / 3)
    sims[0, 3] = float("-inf")
    torch.testing.assert_close(dynamic_margin(sims, torch.tensor([1, 1, 2]))[:2, 0], torch.tensor([0.1 / 2, 0.6 / 3]))


def test_nt_xent_matrix_with_masked_diagonal():
    """margin_cross_entropy on a 2N-view NT-Xent matrix (self-similarity -inf, positive = the other view)."""
    z = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(8)), dim=-1)
    sims = (z @ z.T).fill_diagonal_(float("-inf"))
    targets = torch.tensor([3, 4, 5, 0, 1, 2])
    loss = margin_cross_entropy(sims, targets, 0.1, "n-", dynamic=True)
    expected = 0.0
    for i in range(6):
        m = sims[i, targets[i]].item() / 4  # 6 columns - self - positive = 4 negatives
        logits = [(sims[i, j].item() + (0.0 if j == targets[i] else -m)) / 0.1 for j in range(6) if j != i]
        positive = (sims[i, targets[i]].item()) / 0.1
        expected += math.log(sum(math.exp(x) for x in logits)) - positive
    assert loss.item() == pytest.approx(expected / 6, rel=1e-5)


def test_detach_margin_changes_gradient_not_value():
    """detach_margin only removes the gradient path through m_i: same loss, different gradient for 'p+'."""
    z1, z2 = random_views(seed=9)
    grads = {}
    for detach in (True, False):
        a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        loss = margin_info_nce(a, b, 0.05, "p+", dynamic=True, detach_margin=detach)
        loss.backward()
        grads[detach] = (loss.detach(), a.grad.clone())
    torch.testing.assert_close(grads[True][0], grads[False][0])
    assert not torch.allclose(grads[True][1], grads[False][1])


def test_bf16_autocast_computes_in_fp32():
    """Under bf16 autocast the loss is fp32 and matches the fp32 computation."""
    z1, z2 = random_views(seed=10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = margin_info_nce(z1.bfloat16(), z2.bfloat16(), 0.05, "p+n-", margin=0.02)
    assert loss.dtype == torch.float32
    reference = margin_info_nce(z1.bfloat16().float(), z2.bfloat16().float(), 0.05, "p+n-", margin=0.02)
    torch.testing.assert_close(loss, reference)


# ------------------------------------------------------------------------------------------ the spec and the config
@pytest.mark.parametrize(
    "spec,signs,canonical",
    [("p+", (1, 0), "p+"), ("n-", (0, -1), "n-"), ("p-n+", (-1, 1), "p-n+"), ("n-p+", (1, -1), "p+n-")],
)
def test_parse_perturbation(spec, signs, canonical):
    """Signs of the positive / negative shift, and the canonical ('p' first) spelling."""
    parsed = parse_perturbation(spec)
    assert (parsed.positive, parsed.negative) == signs
    assert parsed.spec == canonical


@pytest.mark.parametrize(
    "bad,fragment",
    [("p*", "p+, p-, n+, n-"), ("x+", "p+, p-, n+, n-"), ("", "p+, p-, n+, n-"), ("pn", "p+, p-, n+, n-"),
     ("+p", "p+, p-, n+, n-"), ("p+p-", "perturbed twice")],
)
def test_invalid_spec_rejected(bad, fragment):
    """Invalid specs raise ValueError quoting the spec and saying what is accepted."""
    with pytest.raises(ValueError) as err:
        parse_perturbation(bad)
    assert repr(bad) in str(err.value)
    assert fragment in str(err.value)


@pytest.mark.parametrize("bad", ["p*", "x+", ""])
def test_config_rejects_invalid_spec_naming_the_key(bad, tmp_path):
    with pytest.raises(ValueError, match="key 'perturbation'"):
        SimCSEConfig(output_dir=str(tmp_path), perturbation=bad, margin=0.01, use_cpu=True)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"perturbation": "p+", "margin": 0.0}, "margin 0 is plain InfoNCE"),
        ({"perturbation": "p+", "margin": -0.1}, "margin must be >= 0"),
        ({"perturbation": "p+", "margin_type": "adaptive"}, "margin_type"),
        ({"perturbation": "n-", "margin": 0.01, "margin_type": "dynamic"}, "unused with margin_type: dynamic"),
        ({"margin": 0.01}, "without 'perturbation'"),
        ({"multi_task": True}, "without 'perturbation'"),
    ],
)
def test_config_rejects_inconsistent_knobs(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)


def test_config_kwargs_and_identity_warning(tmp_path):
    """The config canonicalises the spec, hands the loss its kwargs, is inherited by the supervised config, and
    warns that p-n- is a no-op."""
    args = SupervisedSimCSEConfig(output_dir=str(tmp_path), use_cpu=True, perturbation="n-p+", margin_type="dynamic")
    assert args.perturbation == "p+n-"
    assert args.margin_loss_kwargs() == {"perturbation": "p+n-", "margin": 0.0, "dynamic": True,
                                         "multi_task": False, "detach_margin": True}
    assert SimCSEConfig(output_dir=str(tmp_path), use_cpu=True).margin_loss_kwargs()["perturbation"] is None
    with pytest.warns(UserWarning, match="equals plain InfoNCE"):
        SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, perturbation="p-n-", margin=0.04)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SimCSEConfig(output_dir=str(tmp_path), use_cpu=True, perturbation="p+n-", margin=0.04)


# ------------------------------------------------------------------------------------------ the trainers
def _trainer(tiny_bert_dir, tmp_path, config_class=SimCSEConfig, **overrides):
    from datasets import Dataset
    from helpers import random_sentences

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.data import ViewCollator, tokenize_views
    from hf_sentcl.registry import METHODS

    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="mlp")
    settings = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8, "learning_rate": 1e-3,
                "eval_strategy": "no", "load_best_model_at_end": False, "save_strategy": "no", "use_cpu": True,
                "logging_steps": 5, "seed": 0, "disable_tqdm": True, "temperature": 0.05}
    args = config_class(**{**settings, **overrides})
    trainer_class = next(s.trainer_class for s in METHODS.values() if s.config_class is config_class)
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(40)}), encoder.tokenizer, ("text",), 32)
    return trainer_class(model=encoder, args=args, train_dataset=dataset, data_collator=ViewCollator(encoder.tokenizer))


@pytest.mark.parametrize("config_class", [SimCSEConfig, SupervisedSimCSEConfig])
def test_trainers_use_the_perturbed_loss(config_class, tiny_bert_dir, tmp_path):
    """SimCSE's trainers compute margin_info_nce with the recipe's knobs (hard negatives for the supervised one)."""
    extra = {"hard_negative_weight": 0.5} if config_class is SupervisedSimCSEConfig else {}
    trainer = _trainer(tiny_bert_dir, tmp_path, config_class, perturbation="p-n+", margin=0.1, multi_task=True,
                       **extra)
    views = torch.stack(random_views(n=8, d=32, seed=11, views=3 if extra else 2))
    loss, _ = trainer.contrastive_loss(views)
    hard = {"hard_negatives": views[2], "hard_negative_weight": 0.5} if extra else {}
    expected = reference_margin_info_nce(views[0], views[1], 0.05, "p-n+", 0.1, multi_task=True,
                                         hard=views[2] if extra else None, weight=0.5 if extra else 0.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert loss.item() != pytest.approx(info_nce(views[0], views[1], 0.05, **hard).item(), rel=1e-3)


@pytest.mark.slow
def test_byop_d_training_lowers_loss_and_updates_weights(tiny_bert_dir, tmp_path):
    """A short BYOP-D run ('p+n-', dynamic margin): the logged loss falls and every trained weight moves."""
    trainer = _trainer(tiny_bert_dir, tmp_path, perturbation="p+n-", margin_type="dynamic", num_train_epochs=4,
                       logging_steps=1)  # the first logged loss is the untrained model's
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # medians of the first and last five steps: the loss is near 0 within a few steps on this easy task, and
    # single steps spike by 10x with the dropout draw
    assert statistics.median(losses[-5:]) < 0.7 * statistics.median(losses[:5])
    changed = {k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {k for k in before if "backbone.pooler" not in k}
