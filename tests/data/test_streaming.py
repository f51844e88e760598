"""`streaming: true` (hf_sentcl.data.streaming): the split across processes (disjoint, the whole data once per epoch,
the same number of batches everywhere), the bounded-buffer shuffle, the repairs and counts on the stream, the resumed
position, and the refusals before any model loads. A streamed run end to end, and SIGTERM + `auto` on 1 and 2
processes, are tests/pipeline/test_streaming_resume.py."""

from __future__ import annotations

import itertools

import pytest
from helpers import random_sentences

from hf_sentcl.configs import DataArguments
from hf_sentcl.data.streaming import StreamSplit, stream_views
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe


class IdTokenizer:
    """Tokenises `id<i> ...` into [i]: an example's id is its one token (the stream calls it as a tokenizer)."""

    def __call__(self, texts, **_):
        return {"input_ids": [[int(t.split()[0][2:])] for t in texts]}

    def decode(self, ids):
        return f"id{ids[0]}"


@pytest.fixture
def tokenizer():
    return IdTokenizer()


def numbered_corpus(path, n):
    """Lines `#<i> <words>`: each example's id is its first token."""
    path.write_text("".join(f"id{i} {s}\n" for i, s in enumerate(random_sentences(n, seed=3))))
    return path


def views(path, tokenizer, rank=0, processes=2, batch=4, buffer=8, **data):
    args = DataArguments(train_file=str(path), streaming=True, max_seq_length=16, **data)
    dataset, _ = stream_views(args, ("text",), (), tokenizer, StreamSplit(batch, processes, rank, 0, buffer), 200)
    return dataset


def ids(tokenizer, examples):
    return [tokenizer.decode(e["view0"][:1]) for e in examples]


def take(dataset, n):
    return list(itertools.islice(iter(dataset), n))


def test_two_processes_read_disjoint_examples_that_cover_each_epoch_once(tmp_path, tokenizer):
    """40 rows, 2 processes x 4: 5 global batches an epoch; each process 20 examples an epoch, none shared, all 40
    together, epoch after epoch (another order each epoch)."""
    corpus = numbered_corpus(tmp_path / "train.txt", 40)
    per_epoch = 20
    seen = {rank: ids(tokenizer, take(views(corpus, tokenizer, rank), 2 * per_epoch)) for rank in (0, 1)}
    for epoch in range(2):
        parts = [seen[rank][epoch * per_epoch:(epoch + 1) * per_epoch] for rank in (0, 1)]
        assert not set(parts[0]) & set(parts[1])
        assert sorted(parts[0] + parts[1]) == sorted(f"id{i}" for i in range(40))
    assert seen[0][:per_epoch] != seen[0][per_epoch:]  # reshuffled each epoch


def test_uneven_end_gives_every_process_the_same_batches(tmp_path, tokenizer):
    """43 rows: the incomplete last global batch (3 rows) is dropped on both processes and counted; every process
    has 5 batches an epoch, so none waits for another at the end of the data."""
    corpus = numbered_corpus(tmp_path / "train.txt", 43)
    streams = [views(corpus, tokenizer, rank) for rank in (0, 1)]
    batches = [list(itertools.islice(s.global_batches(), 6)) for s in streams]
    assert [len(b) for b in batches] == [6, 6]
    assert streams[0].account.counts["epoch_tail_rows_dropped"] == 3
    first = [ids(tokenizer, streams[r].tokenised(streams[r].split.mine(batches[r][0]))) for r in (0, 1)]
    assert len(first[0]) == len(first[1]) == 4 and not set(first[0]) & set(first[1])


def test_shuffle_is_bounded_and_repeatable(tmp_path, tokenizer):
    """The same seed gives the same order on every process and every run; buffer 1 keeps the file order."""
    corpus = numbered_corpus(tmp_path / "train.txt", 40)
    again = [ids(tokenizer, take(views(corpus, tokenizer, 0), 20)) for _ in range(2)]
    assert again[0] == again[1]
    in_order = ids(tokenizer, take(views(corpus, tokenizer, 0, processes=1, buffer=1), 8))
    assert in_order == [f"id{i}" for i in range(8)]


def test_resumed_stream_continues_with_the_next_unseen_examples(tmp_path, tokenizer):
    """A stream started after 3 global batches yields what the uninterrupted one yields from its 4th batch on,
    across the epoch boundary."""
    corpus = numbered_corpus(tmp_path / "train.txt", 40)
    full = ids(tokenizer, take(views(corpus, tokenizer, 1), 40))
    resumed = views(corpus, tokenizer, 1)
    resumed.start_batch = 3
    assert ids(tokenizer, take(resumed, 28)) == full[12:40]


def test_dirty_rows_are_repaired_dropped_and_counted_as_read(tmp_path, tokenizer):
    corpus = tmp_path / "dirty.txt"
    rows = [f"id{i} good words here" for i in range(8)]
    rows[1] = "id1 has a\x00nul"
    rows[3] = "   "
    rows[5] = "id5 " + "long " * 100
    corpus.write_bytes(("\r\n".join(rows) + "\r\n").encode())
    stream = views(corpus, tokenizer, 0, processes=1, batch=7, buffer=1)
    examples = take(stream, 7)
    counts = stream.account.as_dict()
    assert counts["blank_lines_dropped"] == 1 and counts["nul_lines_repaired"] == 1
    assert counts["lines_truncated"] == 1 and counts["rows_read"] == 8 and counts["rows_kept"] == 7
    assert len(examples) == 7 and ids(tokenizer, examples)[1] == "id1"


def refusal(tmp_path, tiny_bert_dir, senteval_dir, **values):
    corpus = numbered_corpus(tmp_path / "train.txt", 40)
    base = dict(method="simcse", model_name_or_path=tiny_bert_dir, train_file=corpus, sts_data_dir=senteval_dir,
                output_dir=tmp_path / "out", per_device_train_batch_size=4, use_cpu="true", streaming="true",
                max_steps=4, eval_tasks="[]")
    base.update(values)
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in base.items() if v is not None))

    with pytest.raises(RecipeError) as err:
        validate_recipe(parse_recipe(path))
    return str(err.value)


@pytest.mark.parametrize("values, words", [
    ({"max_steps": None}, ("max_steps", "no length")),
    ({"train_subset_size": 8}, ("train_subset_size", "not yet")),
    ({"train_sampling_strategy": "group_by_length"}, ("train_sampling_strategy",)),
    ({"logging_strategy": "epoch"}, ("logging_strategy", "epoch")),
])
def test_refused_before_the_model_loads(tmp_path, tiny_bert_dir, senteval_dir, values, words):
    message = refusal(tmp_path, tiny_bert_dir, senteval_dir, **values)
    assert "streaming" in message and all(w in message for w in words), message


def test_dataset_name_streams_through_load_dataset(tmp_path, tokenizer):
    """`dataset_name` goes through `load_dataset(name, streaming=True)`, the call a Hub id takes (offline here: a
    local dataset folder stands in for the id); its `sentence` column is read through `text_column`."""
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(f'{{"sentence": "id{i} words", "n": {i}}}\n' for i in range(12)))
    args = DataArguments(dataset_name=str(folder), streaming=True, text_column="sentence", max_seq_length=16)
    dataset, columns = stream_views(args, ("text",), (), tokenizer, StreamSplit(4, 1, 0, 0, 1), 200)
    assert columns == ("text",) and dataset.account.source == f"dataset '{folder}'"
    assert ids(tokenizer, take(dataset, 8)) == [f"id{i}" for i in range(8)]


def test_dataloader_workers_take_global_batches_in_turn(tmp_path, tokenizer):
    """With 2 DataLoader workers (each tokenising every other global batch) the batches come in the order of the
    stream read in the training process, resumed position included."""
    import torch

    corpus = numbered_corpus(tmp_path / "train.txt", 40)

    def batches(workers, start=0):
        dataset = views(corpus, tokenizer, 1)
        dataset.start_batch = start
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=lambda b: b)
        return [ids(tokenizer, batch) for batch in itertools.islice(loader, 7)]

    assert batches(2) == batches(0)
    assert batches(2, start=3) == batches(0)[3:] + batches(0, start=7)[:3]


def test_csv_pairs_stream_with_their_optional_column(tmp_path, tokenizer):
    """A supervised .csv (sent0, sent1, hard_neg) streams as three views, cells read as text ("NA" stays "NA"); a row
    with a blank cell is dropped and counted."""
    corpus = tmp_path / "pairs.csv"
    rows = [f"id{i} a,id{i} b,id{i} NA" for i in range(9)]
    rows[4] = "id4 a,,id4 c"
    corpus.write_text("sent0,sent1,hard_neg\n" + "\n".join(rows) + "\n")
    args = DataArguments(train_file=str(corpus), streaming=True, max_seq_length=16)
    dataset, columns = stream_views(args, ("sent0", "sent1"), ("hard_neg",), tokenizer, StreamSplit(4, 1, 0, 0, 1), 200)
    examples = take(dataset, 8)
    assert columns == ("sent0", "sent1", "hard_neg") and set(examples[0]) == {"view0", "view1", "view2"}
    assert [e["view2"][0] for e in examples] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert dataset.account.counts["blank_lines_dropped"] == 1


def test_hub_id_offline_refused_naming_the_key(tmp_path, tiny_bert_dir, senteval_dir):
    """A Hub id that cannot be reached (offline here) is refused before the model loads, naming dataset_name."""
    message = refusal(tmp_path, tiny_bert_dir, senteval_dir, train_file=None, dataset_name="some-org/some-corpus")
    assert "dataset_name" in message and "some-org/some-corpus" in message, message
