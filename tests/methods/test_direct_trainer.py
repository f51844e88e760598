"""A method's trainer used directly, as TRL's are: a model id, the method's config and a raw `Dataset` of its text
columns; it trains (loss fell, weights changed), and a dataset without the method's columns is refused naming them."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers import random_sentences

from hf_sentcl.methods.angle.config import AnglEConfig
from hf_sentcl.methods.angle.trainer import AnglETrainer
from hf_sentcl.methods.simcse.config import SimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer


def settings(tmp_path, **more):
    return dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=1e-3, max_steps=6,
                logging_steps=1, use_cpu=True, report_to="none", save_strategy="no", eval_strategy="no",
                disable_tqdm=True, seed=0, **more)


def trained(trainer):
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    changed = [k for k, v in trainer.model.named_parameters() if k in before and not before[k].equal(v.detach())]
    return losses, changed


def test_simcse_trainer_from_a_model_id_and_raw_text(tmp_path, tiny_bert_dir):
    trainer = SimCSETrainer(model=str(tiny_bert_dir), args=SimCSEConfig(**settings(tmp_path)),
                            train_dataset=Dataset.from_dict({"text": random_sentences(48, seed=2)}))
    assert trainer.train_dataset.column_names == ["view0"]
    losses, changed = trained(trainer)
    assert len(losses) == 6 and losses[-1] < losses[0] and changed


def test_angle_trainer_from_raw_scored_pairs(tmp_path, tiny_bert_dir):
    sentences = random_sentences(96, seed=4)
    pairs = Dataset.from_dict({"sent0": sentences[:48], "sent1": sentences[48:], "score": [i % 6 for i in range(48)]})
    trainer = AnglETrainer(model=str(tiny_bert_dir), args=AnglEConfig(**settings(tmp_path)), train_dataset=pairs,
                           max_seq_length=16)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert batch["labels"].tolist() == [0.0, 1.0, 2.0, 3.0] and batch["labels"].dtype == torch.float32
    assert batch["input_ids"].shape[1] == 2 and batch["input_ids"].shape[2] <= 16  # the two views, max_seq_length
    losses, changed = trained(trainer)
    assert losses[-1] < losses[0] and changed


def test_a_raw_dataset_without_the_method_columns_is_refused(tmp_path, tiny_bert_dir):
    with pytest.raises(ValueError, match=r"train_dataset has no column 'score'.*method 'angle' reads"):
        AnglETrainer(model=str(tiny_bert_dir), args=AnglEConfig(**settings(tmp_path)),
                     train_dataset=Dataset.from_dict({"sent0": ["a b"] * 8, "sent1": ["c d"] * 8}))


def test_a_method_folder_trainer_with_its_own_init_takes_a_model_id(tmp_path, tiny_bert_dir):
    """ESimCSE builds its momentum encoder from the model in its own __init__: a model id works there too."""
    from hf_sentcl.methods.esimcse.config import ESimCSEConfig
    from hf_sentcl.methods.esimcse.trainer import ESimCSETrainer

    trainer = ESimCSETrainer(model=str(tiny_bert_dir), args=ESimCSEConfig(**settings(tmp_path), queue_size=16),
                             train_dataset=Dataset.from_dict({"text": random_sentences(48, seed=2)}))
    losses, changed = trained(trainer)
    assert len(losses) == 6 and changed
    assert int(trainer.momentum.filled) == 16  # 6 steps of 8 filled the queue
