"""Training data: loading corpora, tokenising views, collating them into (batch, views, length)."""

import pytest
import torch
from transformers import AutoTokenizer

from hf_sentcl.configs import DataArguments
from hf_sentcl.data import ViewCollator, load_training_dataset, tokenize_views
from hf_sentcl.evaluation.sts import load_sts_task, unlabeled_sts_sentences


def test_txt_one_sentence_per_line_blank_lines_dropped(tmp_path):
    """A .txt corpus gives one `text` row per non-blank line, in order."""
    path = tmp_path / "corpus.txt"
    path.write_text("the cat plays\n\n   \na dog runs\nthe man sings\n")
    dataset = load_training_dataset(DataArguments(train_file=str(path)), ("text",))
    assert dataset["text"] == ["the cat plays", "a dog runs", "the man sings"]


def test_max_train_samples(tmp_path):
    """max_train_samples keeps the first N examples."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"sentence {i}\n" for i in range(10)))
    dataset = load_training_dataset(DataArguments(train_file=str(path), max_train_samples=3), ("text",))
    assert dataset["text"] == ["sentence 0", "sentence 1", "sentence 2"]


def test_empty_corpus_is_error(tmp_path):
    """A .txt holding only blank lines is a ValueError saying there are no usable examples."""
    path = tmp_path / "empty.txt"
    path.write_text("\n\n  \n\n")
    with pytest.raises(ValueError, match="no usable"):
        load_training_dataset(DataArguments(train_file=str(path)), ("text",))


def test_missing_train_file_named(tmp_path):
    """A train_file that does not exist is a FileNotFoundError naming it."""
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_training_dataset(DataArguments(train_file=str(missing)), ("text",))


def test_unsupported_extension(tmp_path):
    """An unknown file type is refused with its extension named."""
    path = tmp_path / "corpus.parquetx"
    path.write_text("x\n")
    with pytest.raises(ValueError, match="parquetx"):
        load_training_dataset(DataArguments(train_file=str(path)), ("text",))


def test_csv_triplets_and_missing_columns(tmp_path):
    """A csv gives its named columns; rows with an empty required cell are dropped; absent columns are named."""
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1,hard_neg\na cat,the cat,a dog\nthe man,a man,\nthe sky,blue sky,a tree\n")
    dataset = load_training_dataset(DataArguments(train_file=str(path)), ("sent0", "sent1", "hard_neg"))
    assert dataset["sent0"] == ["a cat", "the sky"] and dataset["hard_neg"] == ["a dog", "a tree"]
    pairs = load_training_dataset(DataArguments(train_file=str(path)), ("sent0", "sent1"))
    assert len(pairs) == 3
    with pytest.raises(ValueError, match="sentence"):
        load_training_dataset(DataArguments(train_file=str(path)), ("sentence",))


def test_text_column_maps_csv_column(tmp_path):
    """text_column names the csv column used as the single sentence view."""
    path = tmp_path / "corpus.csv"
    path.write_text("id,sentence\n1,the cat plays\n2,a dog runs\n")
    dataset = load_training_dataset(DataArguments(train_file=str(path), text_column="sentence"), ("text",))
    assert dataset["text"] == ["the cat plays", "a dog runs"]


def test_no_or_two_sources_is_error(tmp_path):
    """Exactly one training source must be set."""
    with pytest.raises(ValueError, match="exactly one"):
        load_training_dataset(DataArguments(), ("text",))
    path = tmp_path / "c.txt"
    path.write_text("a\n")
    with pytest.raises(ValueError, match="exactly one"):
        load_training_dataset(DataArguments(train_file=str(path), unlabeled_sts="stsb"), ("text",))


def test_unlabeled_sts_sentences(senteval_dir):
    """unlabeled_sts 'stsb' is the distinct sentences of STS-B train+dev+test; 'all' also has the STS12-16 and
    SICK sentences."""
    expected = set()
    for split in ("train", "dev", "test"):
        pairs = load_sts_task(senteval_dir, "STSBenchmark", split)[split]
        expected |= set(pairs.sentences1) | set(pairs.sentences2)
    stsb = unlabeled_sts_sentences(senteval_dir, "stsb")
    assert len(stsb) == len(set(stsb)) and set(stsb) == expected
    everything = unlabeled_sts_sentences(senteval_dir, "all")
    sick = load_sts_task(senteval_dir, "SICKRelatedness", "train")["train"]
    sts12 = load_sts_task(senteval_dir, "STS12")["MSRvid"]
    assert set(stsb) < set(everything)
    assert set(sick.sentences1) <= set(everything) and set(sts12.sentences2) <= set(everything)
    dataset = load_training_dataset(DataArguments(unlabeled_sts="stsb", sts_data_dir=str(senteval_dir)), ("text",))
    assert set(dataset["text"]) == expected


def test_tokenize_views_and_collator(tiny_bert_dir):
    """tokenize_views makes view0..viewK id lists (truncated); ViewCollator pads them into (b, views, L)."""
    from datasets import Dataset

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    raw = Dataset.from_dict({"sent0": ["the cat plays", "a dog"], "sent1": ["a cat plays with a big red ball", "dog"]})
    views = tokenize_views(raw, tokenizer, ("sent0", "sent1"), max_seq_length=6)
    assert views.column_names == ["view0", "view1"]
    assert views[0]["view0"] == tokenizer("the cat plays")["input_ids"]
    assert len(views[0]["view1"]) == 6  # truncated
    batch = ViewCollator(tokenizer, num_views=2)([views[0], views[1]])
    assert batch["input_ids"].shape == (2, 2, 6) and batch["attention_mask"].shape == (2, 2, 6)
    for i in range(2):
        for k in range(2):
            ids = views[i][f"view{k}"]
            assert batch["input_ids"][i, k, : len(ids)].tolist() == ids
            assert batch["attention_mask"][i, k].tolist() == [1] * len(ids) + [0] * (6 - len(ids))
            assert (batch["input_ids"][i, k, len(ids):] == tokenizer.pad_token_id).all()
    padded = ViewCollator(tokenizer, num_views=1, pad_to_multiple_of=8)([views[0], views[1]])
    assert padded["input_ids"].shape == (2, 1, 8) and padded["input_ids"].dtype == torch.long
