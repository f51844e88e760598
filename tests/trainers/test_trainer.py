"""SimCSE trainers on the tiny BERT: one stacked forward per step, dropout views, short training runs, dev eval."""

import math

import pytest
import torch
from datasets import Dataset
from helpers import random_sentences

from hf_sentcl import SentenceEncoder
from hf_sentcl.configs import DataArguments
from hf_sentcl.data import ViewCollator, load_training_dataset, tokenize_views
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.losses import info_nce
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer, SupervisedSimCSETrainer

TRIPLET_COLUMNS = ("sent0", "sent1", "hard_neg")


def make_args(tmp_path, config_class=SimCSEConfig, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=1e-3, num_train_epochs=1,
        eval_strategy="no", load_best_model_at_end=False, save_strategy="no", report_to="none", use_cpu=True,
        logging_steps=5, seed=0, disable_tqdm=True, warmup_steps=0, temperature=0.05,
    )
    settings.update(overrides)
    return config_class(**settings)


def unsup_dataset(encoder, n=40, seed=0):
    sentences = random_sentences(n, seed=seed)
    return tokenize_views(Dataset.from_dict({"text": sentences}), encoder.tokenizer, ("text",), 32)


def write_triplets(path, n=32, seed=0):
    """sent0, its word-reversed paraphrase sent1, and an unrelated hard negative."""
    sentences = random_sentences(2 * n, seed=seed)
    lines = ["sent0,sent1,hard_neg"]
    for i in range(n):
        anchor = sentences[i]
        lines.append(f"{anchor},{' '.join(reversed(anchor.split()))},{sentences[n + i]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def sup_dataset(encoder, tmp_path, n=32):
    raw = load_training_dataset(DataArguments(train_file=str(write_triplets(tmp_path / "nli.csv", n))), TRIPLET_COLUMNS)
    return tokenize_views(raw, encoder.tokenizer, TRIPLET_COLUMNS, 32)


def record_backbone_batches(encoder):
    """Register a hook that records the input_ids shape of every backbone forward call."""
    shapes = []
    handle = encoder.backbone.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes, handle


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def changed_parameters(model, before):
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


def losses_logged(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


# ------------------------------------------------------------------------------------------ construction checks
def test_batch_size_one_rejected(tiny_bert_dir, tmp_path):
    """In-batch negatives need a global batch of at least 2: batch size 1 is a ValueError naming the key."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        SimCSETrainer(model=encoder, args=make_args(tmp_path, per_device_train_batch_size=1),
                      train_dataset=unsup_dataset(encoder, 4), data_collator=ViewCollator(encoder.tokenizer))


# ------------------------------------------------------------------------------------------ one forward per step
@pytest.mark.slow
def test_unsupervised_one_forward_of_2b_per_step(tiny_bert_dir, tmp_path):
    """Unsupervised SimCSE: each training step is exactly one backbone forward over 2*b rows; components
    returned by contrastive_loss are logged with the loss."""

    class WithComponents(SimCSETrainer):
        def contrastive_loss(self, views, groups=None):
            loss, _ = super().contrastive_loss(views)
            positive = torch.nn.functional.cosine_similarity(views[0], views[1], dim=-1).mean()
            return loss, {"positive_similarity": positive}

    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    trainer = WithComponents(model=encoder, args=make_args(tmp_path, max_steps=3, logging_steps=1),
                             train_dataset=unsup_dataset(encoder, 24), data_collator=ViewCollator(encoder.tokenizer))
    shapes, handle = record_backbone_batches(encoder)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert len(shapes) == 3
    assert all(shape[0] == 2 * 8 for shape in shapes)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    assert all(-1.0 <= h["positive_similarity"] <= 1.0 for h in logged)


@pytest.mark.slow
def test_supervised_one_forward_of_3b_per_step(tiny_bert_dir, tmp_path):
    """Supervised SimCSE on triplets: one backbone forward over 3*b rows per step."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    trainer = SupervisedSimCSETrainer(
        model=encoder, args=make_args(tmp_path, SupervisedSimCSEConfig, max_steps=2, per_device_train_batch_size=4),
        train_dataset=sup_dataset(encoder, tmp_path, 16), data_collator=ViewCollator(encoder.tokenizer, num_views=3),
    )
    shapes, handle = record_backbone_batches(encoder)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert [s[0] for s in shapes] == [3 * 4, 3 * 4]


def test_dropout_views_differ_in_train_and_match_without_dropout(tiny_bert_dir, tmp_path):
    """embed_views returns (2, b, d); the two copies differ through dropout and coincide in eval mode."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    dataset = unsup_dataset(encoder, 8)
    trainer = SimCSETrainer(model=encoder, args=make_args(tmp_path), train_dataset=dataset,
                            data_collator=ViewCollator(encoder.tokenizer))
    inputs = ViewCollator(encoder.tokenizer)([dataset[i] for i in range(6)])
    assert inputs["input_ids"].shape[:2] == (6, 1)
    shapes, handle = record_backbone_batches(encoder)
    encoder.train()
    with torch.no_grad():
        views = trainer.embed_views(encoder, inputs)
    assert views.shape == (2, 6, 32)
    assert len(shapes) == 1 and shapes[0][0] == 12
    assert (views[0] - views[1]).abs().max() > 1e-3
    encoder.eval()
    with torch.no_grad():
        views = trainer.embed_views(encoder, inputs)
    handle.remove()
    torch.testing.assert_close(views[0], views[1], rtol=0, atol=1e-6)
    with torch.no_grad():  # and they are the embeddings of the batch's own sentences, in order
        alone = encoder(input_ids=inputs["input_ids"][:, 0], attention_mask=inputs["attention_mask"][:, 0]).embeddings
    torch.testing.assert_close(views[0], alone, rtol=1e-5, atol=1e-6)


def test_supervised_views_are_the_columns_in_order(tiny_bert_dir, tmp_path):
    """views[k][i] is the embedding of column k of example i (sent0, sent1, hard_neg); the loss is info_nce
    with the third view as hard negatives."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean").eval()
    dataset = sup_dataset(encoder, tmp_path, 5)
    args = make_args(tmp_path, SupervisedSimCSEConfig, per_device_train_batch_size=4, hard_negative_weight=0.7)
    trainer = SupervisedSimCSETrainer(model=encoder, args=args, train_dataset=dataset,
                                      data_collator=ViewCollator(encoder.tokenizer, num_views=3))
    inputs = ViewCollator(encoder.tokenizer, num_views=3)([dataset[i] for i in range(5)])
    with torch.no_grad():
        views = trainer.embed_views(encoder, inputs)
        assert views.shape == (3, 5, 32)
        for k in range(3):
            for i in range(5):
                ids = torch.tensor([dataset[i][f"view{k}"]])
                single = encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).embeddings[0]
                torch.testing.assert_close(views[k, i], single, rtol=1e-4, atol=1e-5)
        loss, _ = trainer.contrastive_loss(views)
        torch.testing.assert_close(loss, info_nce(views[0], views[1], 0.05, views[2], 0.7))


# ------------------------------------------------------------------------------------------ short training runs
@pytest.mark.slow
def test_unsupervised_training_lowers_loss_and_updates_weights(tiny_bert_dir, tmp_path):
    """40 sentences, batch 8, 40 steps: the logged loss falls well below its start and below log(b), and every
    trained parameter (backbone layers and head) moved."""
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="mlp")
    before = snapshot(encoder)
    trainer = SimCSETrainer(model=encoder, args=make_args(tmp_path, num_train_epochs=8),
                            train_dataset=unsup_dataset(encoder, 40), data_collator=ViewCollator(encoder.tokenizer))
    trainer.train()
    losses = losses_logged(trainer)
    assert len(losses) == 8
    assert losses[-1] < 0.5 * losses[0]
    assert losses[-1] < math.log(8) - 1.0  # better than the collapsed (uniform) solution
    changed = changed_parameters(encoder, before)
    unused = {k for k in before if "backbone.pooler" in k}  # BERT's pooler is not on the path
    assert changed == set(before) - unused
    assert trainer.state.global_step == 40


@pytest.mark.slow
def test_supervised_training_lowers_loss_and_updates_weights(tiny_bert_dir, tmp_path):
    """Supervised SimCSE on a sent0,sent1,hard_neg csv: loss falls and weights change."""
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="mlp")
    before = snapshot(encoder)
    args = make_args(tmp_path, SupervisedSimCSEConfig, num_train_epochs=8, hard_negative_weight=0.5)
    trainer = SupervisedSimCSETrainer(model=encoder, args=args, train_dataset=sup_dataset(encoder, tmp_path, 32),
                                      data_collator=ViewCollator(encoder.tokenizer, num_views=3))
    trainer.train()
    losses = losses_logged(trainer)
    assert losses[-1] < 0.5 * losses[0]
    changed = changed_parameters(encoder, before)
    assert {k for k in changed if k.startswith("head.")} == {"head.dense.weight", "head.dense.bias"}
    assert any("encoder.layer.0." in k for k in changed) and any("encoder.layer.1." in k for k in changed)


@pytest.mark.slow
def test_bf16_training_keeps_loss_in_fp32(tiny_bert_dir, tmp_path):
    """bf16=True on CPU: the encoder runs under bf16 autocast (the head's Linear computes in bf16) while the
    loss is fp32 and finite and the weights stay fp32."""
    losses, head_outputs = [], []

    class Recording(SimCSETrainer):
        def contrastive_loss(self, views, groups=None):
            loss, components = super().contrastive_loss(views)
            losses.append(loss.dtype)
            return loss, components

    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", head="mlp")
    encoder.head.dense.register_forward_hook(lambda module, args, out: head_outputs.append(out.dtype))
    trainer = Recording(model=encoder, args=make_args(tmp_path, bf16=True, max_steps=3, logging_steps=1),
                        train_dataset=unsup_dataset(encoder, 24), data_collator=ViewCollator(encoder.tokenizer))
    trainer.train()
    assert head_outputs == [torch.bfloat16] * 3
    assert losses == [torch.float32] * 3
    assert all(math.isfinite(loss) for loss in losses_logged(trainer))
    assert next(encoder.parameters()).dtype == torch.float32


# ------------------------------------------------------------------------------------------ dev evaluation
def test_evaluate_reports_stsb_dev_spearman(tiny_bert_dir, tmp_path, senteval_dir):
    """Trainer.evaluate with a dev evaluator returns eval_stsb_spearman equal to the evaluator's STS-B score."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    dev = STSEvaluator(senteval_dir, tasks=("STSBenchmark",), split="dev")
    trainer = SimCSETrainer(model=encoder, args=make_args(tmp_path), train_dataset=unsup_dataset(encoder, 8),
                            data_collator=ViewCollator(encoder.tokenizer), dev_evaluator=dev)
    metrics = trainer.evaluate()
    assert metrics["eval_stsb_spearman"] == pytest.approx(dev(encoder)["STSBenchmark"], abs=1e-9)
    assert any("eval_stsb_spearman" in h for h in trainer.state.log_history)
