"""CLEAR's collator in data-loader worker processes (`dataloader_num_workers: 2` in the CLEAR recipes): it pickles,
and the batches (views, masks, MLM labels and positions) do not depend on how many workers build them."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import build_trainer, random_sentences
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from hf_sentcl.augment.text import SentenceAugmenter
from hf_sentcl.data.corpus import VIEW_PREFIX
from hf_sentcl.methods.clear.collator import EXAMPLE_INDEX, CLEARCollator, WordSegmenter, add_delete_token


def collator_and_features(tiny_bert_dir, n=16):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    deleted = (add_delete_token(tokenizer),)
    collator = CLEARCollator(tokenizer, SentenceAugmenter("del_span+reorder", deleted=deleted),
                             WordSegmenter(tokenizer), seed=3)
    features = [{f"{VIEW_PREFIX}0": tokenizer(s)["input_ids"], EXAMPLE_INDEX: i}
                for i, s in enumerate(random_sentences(n, seed=9))]
    return collator, features


def batches(collator, features, workers: int) -> list[dict[str, torch.Tensor]]:
    return list(DataLoader(features, batch_size=4, collate_fn=collator, num_workers=workers))


def assert_same(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_clear_collator_pickles(tiny_bert_dir):
    collator, features = collator_and_features(tiny_bert_dir)
    copy = pickle.loads(pickle.dumps(collator))
    assert_same([collator(features[:4])], [copy(features[:4])])


def test_batches_do_not_depend_on_the_number_of_workers(tiny_bert_dir):
    """Two workers give the batches the training thread gives, and in epoch 1 (set before the workers start, as
    `CollatorEpoch` does) both give other views than in epoch 0."""
    collator, features = collator_and_features(tiny_bert_dir)
    inline = batches(collator, features, 0)
    assert "mlm_positions" in inline[0]
    assert_same(inline, batches(collator, features, 2))
    collator.epoch = 1
    later = batches(collator, features, 2)
    assert_same(later, batches(collator, features, 0))
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(inline, later))


@pytest.mark.slow
def test_clear_trains_with_workers(tmp_path, tiny_bert_dir, senteval_dir, train_files):
    """A CLEAR run with `dataloader_num_workers: 2` trains (the collator and its epoch reach the workers)."""
    trainer = build_trainer(tmp_path, "clear", tiny_bert_dir, senteval_dir, train_files, fp16=False,
                            dataloader_num_workers=2, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
