"""Cross-process in-batch negatives: 2 gloo processes reproduce the 1-process loss and (after DDP's averaging)
its gradients, through `gather_with_grad` + `scale_gradient` and through `ContrastiveTrainer.compute_loss`."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_sentcl.common.distributed import gather_with_grad, mean_over_processes, world_size
from hf_sentcl.losses import info_nce
from hf_sentcl.losses.false_negatives import GuideMargin
from hf_sentcl.methods.simcse.trainer import SupervisedSimCSETrainer
from hf_sentcl.trainers.base import ContrastiveTrainer, scale_gradient

pytestmark = pytest.mark.slow  # every test here starts a process group

WORLD = 2
LOCAL_BATCH = 3
DIM = 5
TEMPERATURE = 0.1
HARD_WEIGHT = 0.3


def full_batch():
    """The global (z1, z2, z3) batch every process slices its part from."""
    generator = torch.Generator().manual_seed(1234)
    return [torch.randn(WORLD * LOCAL_BATCH, DIM, generator=generator, dtype=torch.float64) for _ in range(3)]


def local_leaves(rank):
    part = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    return [z[part].clone().requires_grad_() for z in full_batch()]


class StubTrainer(ContrastiveTrainer):
    """ContrastiveTrainer's loss path (forward_views -> batch_loss) around fixed embeddings, without a Trainer."""

    def __init__(self, z1, z2):  # no Trainer.__init__: only the loss methods are used
        self.views = torch.stack([z1, z2])
        self.args = SimpleNamespace(false_negatives="keep", matryoshka_dims=None)

    def embed_views(self, model, inputs):
        return self.views

    def contrastive_loss(self, views, groups=None):
        return info_nce(views[0], views[1], TEMPERATURE), {}

    def record_metrics(self, components):
        pass


class StubSupervisedTrainer(SupervisedSimCSETrainer):
    """Supervised SimCSE's own contrastive_loss on fixed (anchor, entailment, contradiction) views (3, b, d)."""

    def __init__(self, *views, false_negatives="keep"):  # no Trainer.__init__
        self.views = torch.stack(views)
        self.args = SimpleNamespace(temperature=TEMPERATURE, hard_negative_weight=HARD_WEIGHT,
                                    margin_loss_kwargs=lambda: {"perturbation": None},
                                    false_negatives=false_negatives, matryoshka_dims=None)
        guided = false_negatives == "guide"
        self.guide, self.guide_rule = (HandGuide(), GuideMargin(GUIDE_MARGIN)) if guided else (None, None)

    def embed_views(self, model, inputs):
        return self.views

    def record_metrics(self, components):
        pass


def _worker(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {"world_size": world_size()}

        # (1) unsupervised: gather z1 and z2 separately (dim 0)
        z1, z2, _ = local_leaves(rank)
        loss = scale_gradient(info_nce(gather_with_grad(z1), gather_with_grad(z2), TEMPERATURE), world_size())
        loss.backward()
        results["unsup"] = (loss.detach(), z1.grad.clone(), z2.grad.clone())

        # (2) supervised with hard negatives
        z1, z2, z3 = local_leaves(rank)
        gathered = [gather_with_grad(z) for z in (z1, z2, z3)]
        loss = scale_gradient(info_nce(gathered[0], gathered[1], TEMPERATURE, gathered[2], HARD_WEIGHT), world_size())
        loss.backward()
        results["sup"] = (loss.detach(), z1.grad.clone(), z2.grad.clone(), z3.grad.clone())

        # (3) the trainer's own path: stacked views (V, b, d) gathered along dim 1 inside compute_loss
        z1, z2, _ = local_leaves(rank)
        loss = StubTrainer(z1, z2).compute_loss(model=None, inputs={})
        loss.backward()
        results["trainer"] = (loss.detach(), z1.grad.clone(), z2.grad.clone())

        # (4) supervised SimCSE's trainer with hard negatives: the gathered views keep anchor i with its own
        # positive i and hard negative i (an interleaved gather would pair anchors with other rows)
        z1, z2, z3 = local_leaves(rank)
        loss = StubSupervisedTrainer(z1, z2, z3).compute_loss(model=None, inputs={})
        loss.backward()
        results["trainer_sup"] = (loss.detach(), z1.grad.clone(), z2.grad.clone(), z3.grad.clone())

        # (5) supervised SimCSE with `false_negatives: mask`: texts repeat across processes, whose batches are
        # padded to different lengths; the gathered text groups must line up with the gathered embeddings
        z1, z2, z3 = local_leaves(rank)
        part = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        inputs = token_batch([TRIPLETS[i] for i in range(WORLD * LOCAL_BATCH)[part]], width=6 + 3 * rank)
        loss = StubSupervisedTrainer(z1, z2, z3, false_negatives="mask").compute_loss(model=None, inputs=inputs)
        loss.backward()
        results["trainer_sup_masked"] = (loss.detach(), z1.grad.clone(), z2.grad.clone(), z3.grad.clone())

        # (6) the same with `false_negatives: guide`: each process embeds its own rows with the (hand-made) guide;
        # the gathered guide embeddings must line up with the gathered embeddings
        z1, z2, z3 = local_leaves(rank)
        loss = StubSupervisedTrainer(z1, z2, z3, false_negatives="guide").compute_loss(model=None, inputs=inputs)
        loss.backward()
        results["trainer_sup_guided"] = (loss.detach(), z1.grad.clone(), z2.grad.clone(), z3.grad.clone())

        # (7) logged loss components are averaged over processes
        results["mean"] = mean_over_processes(torch.tensor(float(rank + 1)))
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


#: (premise, entailment, contradiction) of the global batch; rank 0 holds rows 0-2, rank 1 rows 3-5
TRIPLETS = [
    ("a man sleeps", "someone rests", "a man runs"),
    ("kids play", "children play", "kids sleep"),
    ("a dog barks", "an animal is loud", "a cat sleeps"),
    ("a man sleeps", "a person is asleep", "a man sings"),  # rank 0's premise again: row 0's entailment masked
    ("rain falls", "someone rests", "it is dry"),  # row 0's entailment again
    ("birds fly", "animals move", "children play"),  # contradiction = row 1's entailment
]


#: the guide's hand-made embedding of each text: a unit vector in a plane at the angle given here, so every guide
#: cosine is known (`hand_guided_mask`)
GUIDE_ANGLES = {text: 0.45 * k for k, text in enumerate(sorted({t for triplet in TRIPLETS for t in triplet}))}
GUIDE_MARGIN = 0.1


def text_of(ids_row):
    words = sorted({w for t in TRIPLETS for text in t for w in text.split()})
    return " ".join(words[i - 1] for i in ids_row.tolist() if i > 0)


class HandGuide:
    """A guide whose embedding of a text is the unit vector at GUIDE_ANGLES[text]."""

    def embed(self, input_ids, attention_mask):
        angles = torch.tensor([GUIDE_ANGLES[text_of(row * mask)] for row, mask in zip(input_ids, attention_mask)])
        return torch.stack([angles.cos(), angles.sin()], dim=1)


def hand_guided_mask():
    """The guided rule on the strings' angles, columns [entailments, contradictions], cell by cell."""
    n = len(TRIPLETS)
    columns = [e for _, e, _ in TRIPLETS] + [c for _, _, c in TRIPLETS]
    mask = torch.zeros(n, 2 * n, dtype=torch.bool)
    for i, (p, e, _) in enumerate(TRIPLETS):
        threshold = math.cos(GUIDE_ANGLES[p] - GUIDE_ANGLES[e]) - GUIDE_MARGIN
        for j, text in enumerate(columns):
            mask[i, j] = j != i and math.cos(GUIDE_ANGLES[p] - GUIDE_ANGLES[text]) > threshold
    return mask


def token_batch(triplets, width):
    """(batch, 3, width) word ids (stable across processes, 0 = padding) and attention mask."""
    words = sorted({w for t in TRIPLETS for text in t for w in text.split()})
    ids = torch.zeros(len(triplets), 3, width, dtype=torch.long)
    for i, triplet in enumerate(triplets):
        for v, text in enumerate(triplet):
            row = [1 + words.index(w) for w in text.split()]
            ids[i, v, : len(row)] = torch.tensor(row)
    return {"input_ids": ids, "attention_mask": (ids > 0).long()}


def hand_mask():
    """Supervised false negatives decided on the strings: columns [entailments, contradictions]."""
    n = len(TRIPLETS)
    mask = torch.zeros(n, 2 * n, dtype=torch.bool)
    for i, (p, e, _) in enumerate(TRIPLETS):
        for j, (pj, ej, cj) in enumerate(TRIPLETS):
            mask[i, j] = j != i and (ej in (p, e) or pj == p)
            mask[i, n + j] = cj in (p, e)
    return mask


def reference(kind):
    """1-process loss and gradients on the concatenated batch."""
    z1, z2, z3 = [z.clone().requires_grad_() for z in full_batch()]
    if kind == "sup_masked":
        loss = info_nce(z1, z2, TEMPERATURE, z3, HARD_WEIGHT, exclude=hand_mask())
    elif kind == "sup_guided":
        loss = info_nce(z1, z2, TEMPERATURE, z3, HARD_WEIGHT, exclude=hand_guided_mask())
    elif kind == "sup":
        loss = info_nce(z1, z2, TEMPERATURE, z3, HARD_WEIGHT)
    else:
        loss = info_nce(z1, z2, TEMPERATURE)
    loss.backward()
    grads = (z1.grad, z2.grad, z3.grad) if kind.startswith("sup") else (z1.grad, z2.grad)
    return loss.detach(), grads


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]


def test_world_size_seen_by_workers(two_process_results):
    """Inside the process group, world_size() is 2 (and 1 outside)."""
    assert [r["world_size"] for r in two_process_results] == [WORLD, WORLD]
    assert world_size() == 1


def expected_kind(kind):
    return {"sup": "sup", "trainer_sup": "sup", "trainer_sup_masked": "sup_masked",
            "trainer_sup_guided": "sup_guided"}.get(kind, "unsup")


def test_hand_guided_mask_is_neither_empty_nor_the_duplicate_mask():
    """The guided comparison can fail: the guide drops some candidates, not the same as the text mask, and dropping
    them changes the loss."""
    guided = hand_guided_mask()
    assert 0 < guided.sum() < guided.numel() - len(guided) and not torch.equal(guided, hand_mask())
    assert (reference("sup_guided")[0] - reference("sup")[0]).abs() > 1e-3


def test_hand_mask_is_not_empty():
    """The masked comparison can fail: the batch has duplicates, and masking them changes the loss."""
    # rows 0 and 3 share a premise, rows 0 and 4 an entailment, row 5 contradicts with row 1's entailment
    assert hand_mask().sum() == 5
    assert (reference("sup_masked")[0] - reference("sup")[0]).abs() > 1e-3


@pytest.mark.parametrize(
    "kind", ["unsup", "sup", "trainer", "trainer_sup", "trainer_sup_masked", "trainer_sup_guided"]
)
def test_gathered_loss_equals_single_process_loss(two_process_results, kind):
    """Every process computes the loss of the whole global batch."""
    expected, _ = reference(expected_kind(kind))
    for result in two_process_results:
        torch.testing.assert_close(result[kind][0], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kind", ["unsup", "sup", "trainer", "trainer_sup", "trainer_sup_masked", "trainer_sup_guided"]
)
def test_averaged_gradients_equal_single_process_gradients(two_process_results, kind):
    """grad on a process's own slice / world_size (what DDP's averaging produces for the parameters that made
    the slice) equals the 1-process gradient w.r.t. that slice, for every view."""
    _, full_grads = reference(expected_kind(kind))
    for rank, result in enumerate(two_process_results):
        local_grads = result[kind][1:]
        assert len(local_grads) == len(full_grads)
        part = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        for local, full in zip(local_grads, full_grads):
            assert local.abs().max() > 0
            torch.testing.assert_close(local / WORLD, full[part], rtol=0, atol=1e-6)


def test_scale_gradient_keeps_value_and_scales_gradient():
    """scale_gradient(loss, k) has loss's value and k times its gradient; k=1 is the identity."""
    x = torch.tensor([1.5, -0.5], requires_grad=True)
    loss = (x ** 2).sum()
    scaled = scale_gradient(loss, 3)
    assert scaled.item() == pytest.approx(loss.item())
    scaled.backward()
    torch.testing.assert_close(x.grad, 3 * 2 * x.detach())
    assert scale_gradient(loss, 1) is loss


def test_gather_is_identity_without_process_group():
    """Outside a process group gather_with_grad returns its input unchanged."""
    z = torch.randn(3, 4)
    assert gather_with_grad(z) is z


def test_interleaved_hard_negatives_would_change_the_loss():
    """The comparison above can fail: pairing anchors with another row's positive and negative (the interleaving a
    sibling toolkit once did) gives a different loss than the 1-process one."""
    z1, z2, z3 = full_batch()
    expected, _ = reference("sup")
    order = torch.arange(WORLD * LOCAL_BATCH).view(WORLD, LOCAL_BATCH).t().reshape(-1)  # rank-interleaved rows
    interleaved = info_nce(z1, z2[order], TEMPERATURE, z3[order], HARD_WEIGHT)
    assert (interleaved - expected).abs() > 1e-3


def test_logged_components_are_averaged_over_processes(two_process_results):
    assert [float(r["mean"]) for r in two_process_results] == [1.5, 1.5]
