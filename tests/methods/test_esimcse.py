"""ESimCSE as a method: word repetition checked by hand, the loss against a hand computation with the queue's extra
negatives, the momentum update once per optimizer step, the FIFO queue of the momentum encoder's embeddings of the
original sentences (on one process and gathered over two), the cached step, a training run from a recipe, and exact
resume with the momentum encoder and the queue restored from the checkpoint."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from datasets import Dataset
from helpers import assert_same, build_tiny_bert, random_sentences, reference_step, step, write_yaml_recipe
from launching import cut_back, max_difference
from safetensors.torch import load_file
from transformers import TrainerCallback

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.losses import info_nce
from hf_sentcl.methods.esimcse.augment import word_repetition
from hf_sentcl.methods.esimcse.config import ESimCSEConfig
from hf_sentcl.methods.esimcse.loss import queue_info_nce
from hf_sentcl.methods.esimcse.trainer import MOMENTUM_FILE, MOMENTUM_NAME, ESimCSETrainer
from hf_sentcl.registry import METHODS

BATCH, MINI, QUEUE = 8, 3, 12
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CLS, SEP, PAD = 2, 3, 0  # the tiny BERT's toy vocabulary (helpers.SPECIAL_BERT)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("bert"))


def tiny_encoder(model_dir, dropout):
    torch.manual_seed(0)  # the same MLP head in every encoder built here
    return SentenceEncoder.from_backbone(str(model_dir), pooling="cls", head="mlp", **({} if dropout else NO_DROPOUT))


def make_trainer(model_dir, tmp_path, dropout=False, n=BATCH, **overrides) -> ESimCSETrainer:
    encoder = tiny_encoder(model_dir, dropout)
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(n, seed=5)}), encoder.tokenizer, ("text",), 32)
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, learning_rate=1e-3, eval_strategy="no",
        save_strategy="no", load_best_model_at_end=False, use_cpu=True, report_to="none", disable_tqdm=True,
        logging_steps=1, seed=0, queue_size=QUEUE,
    )
    settings.update(overrides)
    trainer = ESimCSETrainer(model=encoder, args=ESimCSEConfig(**settings), train_dataset=dataset,
                             data_collator=ViewCollator(encoder.tokenizer, num_views=1))
    trainer.current_gradient_accumulation_steps = settings.get("gradient_accumulation_steps", 1)
    return trainer


def batch_of(trainer, start=0, size=BATCH):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(start, start + size)])


def fill_queue(trainer, filled, seed=11):
    """Queue entries near the batch's own embeddings (the momentum encoder's, plus noise), so that they weigh in the
    loss at tau 0.05 as real ones do; `filled` of them counted as filled."""
    queue = trainer.momentum
    inputs = batch_of(trainer)
    keys = queue.encode(inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0]).repeat(2, 1)[: len(queue.queue)]
    noise = torch.randn(keys.shape, generator=torch.Generator().manual_seed(seed))
    queue.queue.copy_(keys + 0.05 * keys.std() * noise)
    queue.filled.fill_(filled)


# ---------------------------------------------------------------------------------------------- word repetition
IDS = torch.tensor([
    [CLS, 10, 11, 12, 13, 14, 15, SEP, PAD, PAD],  # 6 words: up to max(2, int(0.32 * 6)) = 2 repeated
    [CLS, 20, 21, SEP, PAD, PAD, PAD, PAD, PAD, PAD],  # 2 words: up to 2
    [CLS, SEP, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD],  # empty sentence: nothing to repeat
    [PAD, PAD, CLS, 30, 31, 32, SEP, PAD, PAD, PAD],  # padding on both sides, 3 words: up to 2
])
MASK = (torch.arange(10)[None, :] < torch.tensor([8, 4, 2, 7])[:, None]).long()
MASK[3, :2] = 0


def by_hand(ids, mask, dup_rate, specials, seed):
    """The repeated rows from the same random numbers, in plain Python: dup_len = floor(u * (upper + 1)) with
    upper = min(max(2, int(dup_rate * N)), N), then the dup_len candidates with the smallest keys repeated."""
    torch.manual_seed(seed)
    u = torch.rand(len(ids), dtype=torch.float64).tolist()
    keys = torch.rand(ids.shape).tolist()
    rows = []
    for r, (row, row_mask) in enumerate(zip(ids.tolist(), mask.tolist())):
        candidates = [j for j, (t, m) in enumerate(zip(row, row_mask)) if m and t not in specials]
        upper = min(max(2, int(dup_rate * len(candidates))), len(candidates))
        chosen = sorted(candidates, key=lambda j: keys[r][j])[: min(int(u[r] * (upper + 1)), upper)]
        rows.append([t for j, (t, m) in enumerate(zip(row, row_mask)) if m for _ in range(1 + (j in chosen))])
    return rows


def test_word_repetition_by_hand():
    torch.manual_seed(0)
    ids, mask = word_repetition(IDS, MASK, 0.32, special_ids={CLS, SEP, PAD}, pad_id=PAD)
    assert ids.tolist() == [  # seed 0, read and checked by eye: 13 and 14; 20 and 21; nothing; 30 and 32
        [CLS, 10, 11, 12, 13, 13, 14, 14, 15, SEP, PAD, PAD, PAD],
        [CLS, 20, 20, 21, 21, SEP, PAD, PAD, PAD, PAD, PAD, PAD, PAD],
        [CLS, SEP, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD],
        [CLS, 30, 30, 31, 32, 32, SEP, PAD, PAD, PAD, PAD, PAD, PAD],
    ]  # 13 columns: room for the most any row of 10 may repeat, min(10, max(2, int(3.2))) = 3, known without a sync
    assert mask.tolist() == [[int(t != PAD) for t in row] for row in ids.tolist()] and mask.dtype == MASK.dtype
    for seed in range(20):  # every draw: the vectorised draws are the plain-Python ones
        torch.manual_seed(seed)
        ids, mask = word_repetition(IDS, MASK, 0.32, special_ids={CLS, SEP, PAD}, pad_id=PAD)
        rows = by_hand(IDS, MASK, 0.32, {CLS, SEP, PAD}, seed)
        assert [row[: int(m.sum())] for row, m in zip(ids.tolist(), mask)] == rows
        assert ids.shape[1] == 13 and all(m.sum() == len(r) for m, r in zip(mask, rows))


def repeats(original, repeated):
    """Which tokens of `original` (distinct ids) appear twice in `repeated`, and that nothing else changed."""
    doubled = [t for t in original if repeated.count(t) == 2]
    assert [t for i, t in enumerate(repeated) if i == 0 or repeated[i - 1] != t] == original
    return doubled


def test_repetition_counts_follow_the_paper_and_never_touch_special_tokens():
    """N = 10 words at dup_rate 0.32: dup_len uniform on 0..3 (max(2, int(3.2))); [CLS], [SEP], padding never
    repeated; the repeats are in place (each copy right after its token)."""
    ids = torch.tensor([[CLS, *range(10, 20), SEP, PAD]]).repeat(4000, 1)
    mask = (ids != PAD).long()
    torch.manual_seed(1)
    out, out_mask = word_repetition(ids, mask, 0.32, special_ids={CLS, SEP, PAD}, pad_id=PAD)
    counts = torch.zeros(4, dtype=torch.long)
    for row, row_mask in zip(out.tolist(), out_mask.tolist()):
        real = row[: sum(row_mask)]
        doubled = repeats(ids[0, :12].tolist(), real)
        assert CLS not in doubled and SEP not in doubled and PAD not in real
        counts[len(doubled)] += 1
    assert counts.sum() == 4000 and (counts - 1000).abs().max() < 120, counts  # uniform on {0, 1, 2, 3}
    torch.manual_seed(1)
    _, out_mask = word_repetition(ids[:200], mask[:200], 1.0, special_ids={CLS, SEP, PAD}, pad_id=PAD)
    assert out_mask.sum(1).max() == 22  # dup_rate 1: up to all 10 words


def test_repetition_keeps_within_max_length():
    """`max_length` (the backbone's positions) caps the repeated length by repeating fewer tokens: none is cut."""
    ids = torch.tensor([[CLS, *range(10, 16), SEP]]).repeat(200, 1)
    for room in (0, 1):
        torch.manual_seed(2)
        out, mask = word_repetition(ids, torch.ones_like(ids), 0.5, {CLS, SEP, PAD}, PAD, max_length=8 + room)
        lengths = mask.sum(1)
        assert lengths.max() == 8 + room and lengths.min() == 8
        for row, length in zip(out.tolist(), lengths.tolist()):
            repeats(ids[0].tolist(), row[:length])


def test_the_trainer_encodes_each_sentence_and_its_repeated_copy(model_dir, tmp_path):
    """embed_views: view 0 the sentence, view 1 `word_repetition` of it with the tokenizer's special ids, drawn from
    torch's generator, in one forward (padding to the common length changes nothing)."""
    trainer = make_trainer(model_dir, tmp_path)
    model, inputs = trainer.model.train(), batch_of(trainer)
    assert trainer.special_ids == {CLS, SEP, PAD} and trainer.max_repeated_length == 64
    torch.manual_seed(4)
    views = trainer.embed_views(model, inputs)
    ids, mask = inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0]
    torch.manual_seed(4)
    repeated, repeated_mask = word_repetition(ids, mask, 0.32, {CLS, SEP, PAD}, PAD, 64)
    assert repeated.shape[1] > ids.shape[1]
    torch.testing.assert_close(views[0], model(input_ids=ids, attention_mask=mask).embeddings, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(views[1], model(input_ids=repeated, attention_mask=repeated_mask).embeddings,
                               atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- the loss
def hand_loss(z1, z2, queue, valid, tau, margin=0.0):
    """-log e^{(s_ii + m)/tau} / (e^{(s_ii + m)/tau} + sum_{j != i} e^{(s_ij - m)/tau} + sum_valid e^{(s_iq - m)/tau}),
    cosines in float64, one term at a time (the margin m is 'p+n-' of IFM/BYOP; 0: plain ESimCSE)."""
    def cos(a, b):
        a, b = a.double(), b.double()
        return float(a @ b / (a.norm() * b.norm()))

    total = 0.0
    for i in range(len(z1)):
        positive = math.exp((cos(z1[i], z2[i]) + margin) / tau)
        negatives = sum(math.exp((cos(z1[i], z2[j]) - margin) / tau) for j in range(len(z2)) if j != i)
        negatives += sum(math.exp((cos(z1[i], q) - margin) / tau) for q, ok in zip(queue, valid) if ok)
        total += -math.log(positive / (positive + negatives))
    return total / len(z1)


def test_queue_info_nce_by_hand():
    g = torch.Generator().manual_seed(0)
    z1, z2, queue = (torch.randn(n, 6, generator=g) for n in (5, 5, 7))
    valid = torch.tensor([False, False, True, True, True, True, True])
    for tau in (0.05, 0.5):
        loss = queue_info_nce(z1, z2, tau, queue, valid)
        assert loss.item() == pytest.approx(hand_loss(z1, z2, queue, valid, tau), rel=1e-5)
    full = queue_info_nce(z1, z2, 0.5, queue)
    assert full.item() == pytest.approx(hand_loss(z1, z2, queue, [True] * 7, 0.5), rel=1e-5)
    assert queue_info_nce(z1, z2, 0.5, None).item() == pytest.approx(hand_loss(z1, z2, [], [], 0.5), rel=1e-5)
    assert torch.equal(queue_info_nce(z1, z2, 0.5, queue, torch.zeros(7, dtype=torch.bool)), info_nce(z1, z2, 0.5))
    margin = queue_info_nce(z1, z2, 0.5, queue, valid, perturbation="p+n-", margin=0.1)
    assert margin.item() == pytest.approx(hand_loss(z1, z2, queue, valid, 0.5, margin=0.1), rel=1e-5)
    exclude = torch.zeros(5, 5, dtype=torch.bool)
    exclude[0, 3] = True  # a false negative leaves row 0's denominator; the queue columns are untouched
    masked = queue_info_nce(z1, z2, 0.5, queue, valid, exclude=exclude)
    z2_masked = [z2[j] if j != 3 else None for j in range(5)]
    row0 = hand_loss(z1[:1], torch.stack([z for z in z2_masked if z is not None]), queue, valid, 0.5)
    rest = hand_loss(z1, z2, queue, valid, 0.5) * 5 - hand_loss(z1[:1], z2, queue, valid, 0.5)
    assert masked.item() == pytest.approx((row0 + rest) / 5, rel=1e-5)


def test_the_trainer_loss_is_queue_info_nce_of_the_batch_and_the_queue_before_it(model_dir, tmp_path):
    """compute_loss = the hand computation on the step's own embeddings (same draws) with the queue as it stood:
    8 of 12 entries filled, the 4 empty ones left out; the step's keys enter the queue only after its loss."""
    trainer = make_trainer(model_dir, tmp_path, dropout=True)
    fill_queue(trainer, 8)
    before = trainer.momentum.queue.clone()
    model, inputs = trainer.model.train(), batch_of(trainer)
    torch.manual_seed(3)
    loss = trainer.compute_loss(model, inputs)
    torch.manual_seed(3)
    with torch.no_grad():
        z1, z2 = trainer.embed_views(model, inputs)
    valid = [False] * 4 + [True] * 8
    assert loss.item() == pytest.approx(hand_loss(z1, z2, before, valid, 0.05), rel=1e-5)
    assert abs(loss.item() - hand_loss(z1, z2, [], [], 0.05)) > 1e-3  # the queue's negatives count
    assert trainer.momentum.filled == QUEUE and not torch.equal(trainer.momentum.queue, before)


# ---------------------------------------------------------------------------------------------- momentum encoder
class Snapshots(TrainerCallback):
    """The encoder's and the momentum encoder's weights at the start and after each optimizer step (after the
    trainer's own update, which was added first), and the momentum weights after each micro-batch without a step."""

    def __init__(self, trainer):
        self.trainer, self.steps, self.substeps = trainer, [], []

    def weights(self):
        online = {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()
                  if not n.startswith(MOMENTUM_NAME)}
        momentum = {n: p.detach().clone() for n, p in self.trainer.momentum.encoder.named_parameters()}
        return online, momentum

    def on_train_begin(self, args, state, control, **kwargs):
        self.steps.append(self.weights())

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self.weights())

    def on_substep_end(self, args, state, control, **kwargs):
        self.substeps.append(self.weights()[1])


@pytest.mark.parametrize("accumulation", [1, 2])
def test_momentum_update_once_per_optimizer_step(model_dir, tmp_path, accumulation, monkeypatch):
    """After every optimizer step every momentum tensor is m * old + (1 - m) * the encoder's new value, starting
    from a copy of the encoder; with gradient accumulation 2 the update runs once per step, not per micro-batch."""
    trainer = make_trainer(model_dir, tmp_path, n=16, momentum=0.9, learning_rate=0.05, max_steps=2,
                           per_device_train_batch_size=BATCH // accumulation, gradient_accumulation_steps=accumulation)
    calls = []
    update = trainer.update_momentum
    monkeypatch.setattr(trainer, "update_momentum", lambda: (calls.append(trainer.state.global_step), update()))
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    trainer.train()
    assert calls == [1, 2] and len(snapshots.steps) == 3 and len(snapshots.substeps) == 2 * (accumulation - 1)
    online, momentum = snapshots.steps[0]
    assert online.keys() == momentum.keys() and all(torch.equal(online[k], momentum[k]) for k in online)
    for (_, old), (new, updated) in zip(snapshots.steps, snapshots.steps[1:]):
        for name, value in updated.items():
            torch.testing.assert_close(value, 0.9 * old[name] + 0.1 * new[name], rtol=1e-5, atol=1e-7)
        assert not torch.equal(updated["backbone.encoder.layer.1.output.dense.weight"],
                               old["backbone.encoder.layer.1.output.dense.weight"])
    for index, momentum in enumerate(snapshots.substeps):  # micro-batches without a step leave it as it was
        assert all(torch.equal(momentum[k], snapshots.steps[index][1][k]) for k in momentum)
    assert not any(p.requires_grad for p in trainer.momentum.parameters())
    assert not {id(p) for p in trainer.momentum.parameters()} & {id(p) for g in trainer.optimizer.param_groups
                                                                  for p in g["params"]}


# ---------------------------------------------------------------------------------------------- the queue
def momentum_keys_by_hand(encoder, inputs):
    """The untouched encoder's [CLS] through its MLP head (the training pooling and head), dropout off."""
    encoder.eval()
    with torch.no_grad():
        hidden = encoder.backbone(input_ids=inputs["input_ids"][:, 0],
                                  attention_mask=inputs["attention_mask"][:, 0]).last_hidden_state
        return encoder.head(hidden[:, 0])


def test_queue_is_a_fifo_of_the_momentum_encoders_original_sentences(model_dir, tmp_path):
    """Three steps of 8 sentences into a queue of 12 (encoder dropout on, momentum untouched: no optimizer step):
    the queue holds the momentum encoder's dropout-free embeddings of the ORIGINAL sentences (not the repeated
    ones), oldest first, filled 8 then 12, the oldest entries dropped."""
    trainer = make_trainer(model_dir, tmp_path, dropout=True, n=3 * BATCH)
    reference = tiny_encoder(model_dir, dropout=True)
    model, queue = trainer.model.train(), trainer.momentum
    keys, expected = [], []
    for index in range(3):
        inputs = batch_of(trainer, index * BATCH)
        torch.manual_seed(index)
        trainer.compute_loss(model, inputs)
        keys.append(momentum_keys_by_hand(reference, inputs))
        expected = torch.cat([expected, keys[-1]])[-QUEUE:] if index else keys[-1]
        filled = min((index + 1) * BATCH, QUEUE)
        assert queue.filled == filled and queue.valid().tolist() == [False] * (QUEUE - filled) + [True] * filled
        torch.testing.assert_close(queue.queue[QUEUE - filled :], expected, atol=1e-6, rtol=1e-5)
    inputs = batch_of(trainer, 2 * BATCH)
    torch.manual_seed(5)
    repeated = word_repetition(inputs["input_ids"][:, 0], inputs["attention_mask"][:, 0], 0.32, {CLS, SEP, PAD}, PAD)
    with torch.no_grad():
        reference.eval()
        of_repeated = reference.head(reference.backbone(input_ids=repeated[0], attention_mask=repeated[1])
                                     .last_hidden_state[:, 0])
    assert (of_repeated - keys[-1]).abs().max() > 1e-3  # which view it encodes shows


def _queue_worker(rank, model_dir, out_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    import pathlib

    trainer = make_trainer(pathlib.Path(model_dir), pathlib.Path(out_dir) / f"r{rank}", global_train_batch_size=BATCH)
    inputs = batch_of(trainer)
    part = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    trainer.model.train()
    trainer.compute_loss(trainer.model, {k: v[part] for k, v in inputs.items()})
    torch.save({"queue": trainer.momentum.queue, "filled": trainer.momentum.filled,
                "per_device": trainer.args.per_device_train_batch_size}, f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_processes_enqueue_the_gathered_keys(model_dir, tmp_path):
    """2 gloo processes with half the batch each: both queues hold the keys of the whole global batch, in the
    order of the gathered embeddings, equal to the 1-process queue."""
    mp.spawn(_queue_worker, args=(str(model_dir), str(tmp_path), 29500 + os.getpid() % 500), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    trainer = make_trainer(model_dir, tmp_path / "one")
    trainer.model.train()
    trainer.compute_loss(trainer.model, batch_of(trainer))
    for result in ranks:
        assert result["per_device"] == BATCH // 2 and result["filled"] == BATCH
        torch.testing.assert_close(result["queue"], trainer.momentum.queue, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- the cached step
def test_cached_step_equals_the_plain_step(model_dir, tmp_path):
    """With the queue 10/12 full: without random draws (no repetition room, dropout off) the cached step equals
    Trainer's plain step; with repetition and dropout it equals the full-autograd step with the same draws, and the
    draws matter (the whole batch drawn at once differs). Each step enqueues the same keys once."""
    trainer = make_trainer(model_dir, tmp_path)
    fill_queue(trainer, 10)
    start = {k: v.clone() for k, v in trainer.momentum.state_dict().items()}
    inputs = batch_of(trainer)

    def fresh(run):
        trainer.momentum.load_state_dict(start)
        result = run()
        return result, trainer.momentum.queue.clone()

    trainer.max_repeated_length = 0  # room for no repeated token: both views are the sentence
    (plain, after_plain), (cached, after_cached) = fresh(lambda: step(trainer, inputs, None)), fresh(
        lambda: step(trainer, inputs, MINI))
    assert_same(plain, cached)
    assert torch.allclose(after_plain, after_cached, atol=1e-6) and not torch.equal(after_plain, start["queue"])

    trainer = make_trainer(model_dir, tmp_path, dropout=True)
    trainer.momentum.load_state_dict(start)
    (cached, after_cached), (reference, after_reference) = fresh(lambda: step(trainer, inputs, MINI)), fresh(
        lambda: reference_step(trainer, inputs, MINI))
    assert_same(cached, reference)
    assert torch.allclose(after_cached, after_reference, atol=1e-6)
    other_draws, _ = fresh(lambda: reference_step(trainer, inputs, BATCH))
    assert (cached[0] - other_draws[0]).abs() > 1e-4


# ---------------------------------------------------------------------------------------------- runs
def esimcse_recipe(tmp_path, model_dir, senteval_dir, **values):
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(64, seed=7)) + "\n")
    return write_yaml_recipe(tmp_path, **{
        "method": "esimcse", "model_name_or_path": str(model_dir), "train_file": str(corpus),
        "sts_data_dir": str(senteval_dir), "output_dir": str(tmp_path / "out"), "pooling": "cls", "head": "mlp",
        "global_train_batch_size": 8, "max_seq_length": 16, "max_steps": 8, "logging_steps": 1,
        "learning_rate": 1e-3, "use_cpu": True, "eval_before_training": False, "eval_tasks": ["sts"],
        "save_steps": 8, "eval_steps": 8, "seed": 0, "queue_size": 16, **values})


@pytest.mark.slow
def test_esimcse_trains_from_a_recipe(tmp_path, model_dir, senteval_dir):
    """`python -m hf_sentcl.run`: 8 steps, the loss falls once the queue is full (steps 3-8), the weights change,
    checkpoints carry the momentum encoder and the full queue, and the exported encoder does not."""
    recipe = esimcse_recipe(tmp_path, model_dir, senteval_dir, learning_rate=3e-3)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(recipe)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    curve = [entry["loss"] for entry in results["train"]["loss_curve"]]
    assert results["train"]["global_step"] == 8 and curve[-1] < curve[2], curve
    saved = load_file(out / "checkpoint-8" / MOMENTUM_FILE)
    assert saved["filled"] == 16 and saved["queue"].shape == (16, 32) and saved["queue"].abs().sum(1).min() > 0
    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert not any(MOMENTUM_NAME in key for key in after)
    assert any(not before[k.removeprefix("backbone.")].equal(v) for k, v in after.items()
               if k.removeprefix("backbone.") in before)


def test_resume_restores_the_momentum_encoder_and_the_queue(tmp_path, model_dir, senteval_dir):
    """8 steps saving at 4 and 8 (dropout on), against the same run cut back to its checkpoint-4 and resumed with
    `resume_from_checkpoint: auto`: the same final weights, momentum weights and queue."""
    from hf_sentcl.cli.train import main

    values = dict(save_total_limit="null", load_best_model_at_end=False, eval_tasks=[], save_steps=4, eval_steps=4)
    recipe = esimcse_recipe(tmp_path, model_dir, senteval_dir, **values)
    full = tmp_path / "out"
    assert main([str(recipe)]) == 0
    assert load_file(full / "checkpoint-4" / MOMENTUM_FILE)["filled"] == 16  # a full queue at the cut
    resumed = cut_back(shutil.copytree(full, tmp_path / "resumed"), 4)
    recipe = esimcse_recipe(tmp_path, model_dir, senteval_dir, **values, output_dir=str(resumed))
    assert main([str(recipe), "--resume_from_checkpoint", "auto"]) == 0
    train = json.loads((resumed / "results.json").read_text())["train"]
    assert (train["started_at_step"], train["global_step"]) == (4, 8)
    assert max_difference(load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")) <= 1e-6
    momentum = [load_file(folder / "checkpoint-8" / MOMENTUM_FILE) for folder in (full, resumed)]
    assert momentum[0].keys() == momentum[1].keys()
    assert max_difference(*momentum) <= 1e-6


# ---------------------------------------------------------------------------------------------- settings
def test_registration_and_checkpoint_layout(model_dir, tmp_path):
    spec = METHODS["esimcse"]
    assert spec.text_columns == ("text",) and spec.paper.arxiv == "2109.04380" and spec.sharded_weights_problem
    assert spec.config_class is ESimCSEConfig and spec.trainer_class is ESimCSETrainer
    trainer = make_trainer(model_dir, tmp_path)
    assert trainer._training_heads == {MOMENTUM_FILE: trainer.momentum}
    assert all(key.startswith(f"{MOMENTUM_NAME}.") for key in trainer.model._keys_to_ignore_on_save)
    assert {"queue", "filled"} <= set(trainer.momentum.state_dict())
    without = make_trainer(model_dir, tmp_path, queue_size=0)  # SimCSE with word repetition only
    assert without.momentum is None and not getattr(without, "_training_heads", {})


def test_defaults_are_the_papers(tmp_path):
    config = ESimCSEConfig(output_dir=str(tmp_path))
    assert (config.dup_rate, config.momentum, config.queue_size, config.temperature) == (0.32, 0.995, 160, 0.05)


@pytest.mark.parametrize("key, value, message", [
    ("dup_rate", -0.1, "dup_rate must be a finite number"),
    ("momentum", 1.5, "momentum must be a finite number"),
    ("queue_size", -1, "queue_size must be a finite number"),
    ("queue_size", 2.5, "queue_size must be a whole number"),
])
def test_bad_values_are_refused(tmp_path, key, value, message):
    with pytest.raises(ValueError, match=message):
        ESimCSEConfig(output_dir=str(tmp_path), **{key: value})
