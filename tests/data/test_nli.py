"""NLI pairs for ConSERT's supervised settings: SentEval SNLI folders, csv files and `datasets` ids, label mapping,
errors that name the missing file, and the labelled collator."""

import pytest
import torch
from datasets import ClassLabel, Dataset, Features, Value
from helpers import write_snli

import hf_sentcl.data.nli as nli
from hf_sentcl import SentenceEncoder
from hf_sentcl.data.nli import (
    LabelledViewCollator,
    NLISource,
    NLITrainData,
    check_nli_source,
    label_ids,
    load_nli_pairs,
    resolve_nli_source,
)


def test_senteval_folder_splits_concatenated_in_order(tmp_path):
    """dev then test, premise/hypothesis stripped, labels entailment/neutral/contradiction -> 0/1/2."""
    folder = tmp_path / "SNLI"
    dev = write_snli(folder, "dev", n=4, seed=1)
    test = write_snli(folder, "test", n=3, seed=2, labels=["contradiction", "entailment", "neutral"])
    pairs = load_nli_pairs(resolve_nli_source(str(folder), ["dev", "test"]))
    assert pairs.column_names == ["premise", "hypothesis", "label"]
    assert pairs["premise"] == [f"{s} ." for s in dev[:4] + test[:3]]
    assert pairs["hypothesis"][4] == f"{test[3]} ."
    assert pairs["label"] == [0, 1, 2, 1, 2, 0, 1]


def test_senteval_keyword_uses_the_data_directory(tmp_path):
    """nli_source 'senteval' means <data dir>/SNLI; the default split is train."""
    write_snli(tmp_path / "SNLI", "train", n=3)
    source = resolve_nli_source("senteval", None, str(tmp_path))
    assert source == NLISource("senteval", str(tmp_path / "SNLI"), ("train",))
    assert len(load_nli_pairs(source)) == 3


def test_missing_senteval_file_is_named(tmp_path):
    write_snli(tmp_path / "SNLI", "dev")
    with pytest.raises(FileNotFoundError, match=r"s1\.train.*nli_splits"):
        check_nli_source(resolve_nli_source("senteval", None, str(tmp_path)))
    (tmp_path / "SNLI" / "labels.dev").unlink()
    with pytest.raises(FileNotFoundError, match=r"labels\.dev"):
        check_nli_source(resolve_nli_source("senteval", ["dev"], str(tmp_path)))


def test_unequal_senteval_files_are_refused(tmp_path):
    write_snli(tmp_path, "dev", n=4)
    (tmp_path / "labels.dev").write_text("neutral\n")
    with pytest.raises(ValueError, match="different lengths"):
        load_nli_pairs(resolve_nli_source(str(tmp_path), ["dev"]))


def test_csv_file_with_string_and_integer_labels(tmp_path):
    """A csv with premise, hypothesis, label; names or 0/1/2, '-' rows (no gold label) dropped."""
    path = tmp_path / "nli.csv"
    path.write_text("premise,hypothesis,label\na cat,an animal,entailment\na dog,a cat,Contradiction\nx,y,-\n"
                    "a man,a person,1\n")
    pairs = load_nli_pairs(resolve_nli_source(str(path)))
    assert pairs["premise"] == ["a cat", "a dog", "a man"]
    assert pairs["label"] == [0, 2, 1]


def test_csv_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        check_nli_source(resolve_nli_source(str(tmp_path / "nowhere.csv")))
    path = tmp_path / "bad.csv"
    path.write_text("sentence1,sentence2,label\na,b,entailment\n")
    with pytest.raises(ValueError, match=r"no column\(s\) \['premise', 'hypothesis'\]"):
        load_nli_pairs(resolve_nli_source(str(path)))
    path.write_text("premise,hypothesis,label\na,b,maybe\n")
    with pytest.raises(ValueError, match="unknown NLI label.*maybe"):
        load_nli_pairs(resolve_nli_source(str(path)))
    with pytest.raises(ValueError, match="nli_splits"):
        resolve_nli_source(str(path), ["train"])


def test_class_label_ids_go_through_their_names():
    """A `datasets` ClassLabel in another order is mapped by name; -1 (no gold label) is dropped."""
    features = Features({"premise": Value("string"), "hypothesis": Value("string"),
                         "label": ClassLabel(names=["contradiction", "entailment", "neutral"])})
    data = Dataset.from_dict({"premise": ["a", "b", "c", "d"], "hypothesis": ["e", "f", "g", "h"],
                              "label": [0, 1, 2, -1]}, features=features)
    assert label_ids(data, "test")["label"] == [2, 0, 1]


def test_datasets_id_is_loaded_per_split(monkeypatch):
    """Anything that is not a folder or file is a `datasets` id: one load_dataset call per split, concatenated."""
    calls = []

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        return Dataset.from_dict({"premise": [f"{split} p"], "hypothesis": [f"{split} h"], "label": [2],
                                  "idx": [0]})

    monkeypatch.setattr(nli, "load_dataset", fake_load_dataset)
    source = resolve_nli_source("org/some-nli", ["train", "validation"], config_name="pairs")
    assert source == NLISource("dataset", "org/some-nli", ("train", "validation"), "pairs")
    pairs = load_nli_pairs(source, max_samples=1)
    assert calls == [("org/some-nli", "pairs", "train"), ("org/some-nli", "pairs", "validation")]
    assert pairs.column_names == ["premise", "hypothesis", "label"] and pairs["premise"] == ["train p"]


def test_train_data_and_collator(tmp_path, tiny_bert_dir):
    """NLITrainData tokenises two views and keeps labels; the collator stacks (batch, 2, L), L a multiple of
    pad_to_multiple_of, plus labels (batch,)."""
    write_snli(tmp_path, "dev", n=5)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir))
    data = NLITrainData(resolve_nli_source(str(tmp_path), ["dev"]), max_seq_length=16, max_samples=4,
                        pad_to_multiple_of=8)
    data.check()
    dataset, num_views, collator = data.build(encoder.tokenizer)
    assert (len(dataset), num_views) == (4, 2) and isinstance(collator, LabelledViewCollator)
    batch = collator([dataset[i] for i in range(3)])
    assert batch["input_ids"].shape[:2] == (3, 2) and batch["attention_mask"].shape == batch["input_ids"].shape
    assert batch["labels"].tolist() == [0, 1, 2] and batch["labels"].dtype == torch.long
    assert batch["input_ids"].shape[2] % 8 == 0
    expected = encoder.tokenizer(load_nli_pairs(data.source)["premise"][0])["input_ids"]
    assert batch["input_ids"][0, 0, : len(expected)].tolist() == expected


@pytest.mark.slow
def test_real_snli_dev_and_test(real_data_dir):
    """The SentEval SNLI files shipped here: dev + test, every line labelled."""
    pairs = load_nli_pairs(resolve_nli_source("senteval", ["dev", "test"], str(real_data_dir)))
    assert len(pairs) == 9842 + 9824
    assert set(pairs["label"]) == {0, 1, 2}
