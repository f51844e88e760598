"""Several datasets in one run (`train_file` / `dataset_name` lists, `mixing`): the batch sampler against
sentence-transformers' definitions of its policies, one dataset per batch (and per step over processes under
accelerate's sharding), determinism by seed and epoch, the resume position, the column mapping, every refusal before
the model loads, and the per-dataset losses a short training logs."""

from __future__ import annotations

import csv
from collections import Counter

import pytest
import yaml
from accelerate.data_loader import BatchSamplerShard, SkipBatchSampler
from helpers import random_sentences
from transformers import TrainerState, set_seed

from hf_sentcl import SentenceEncoder
from hf_sentcl.configs import DataArguments
from hf_sentcl.configs.sources import TrainingSource, listed_sources
from hf_sentcl.data.corpus import load_training_data
from hf_sentcl.data.mixing import DATASET_INDEX, MixedBatchSampler, MixedCollator
from hf_sentcl.pipeline.train import build_stage
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.recipe.plan import plan_run
from hf_sentcl.trainers.mixing import SamplerEpoch

SIZES = (40, 16, 8)  # three datasets of different sizes
BATCH = 4


def dataset_of(batch: list[int], sizes=SIZES) -> int:
    """The one dataset whose index range holds every index of `batch` (fails when the batch mixes datasets)."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    owners = {next(d for d, (lo, hi) in enumerate(bounds) if lo <= i < hi) for i in batch}
    assert len(owners) == 1, f"batch {batch} mixes datasets {owners}"
    return owners.pop()


# ------------------------------------------------------------------------------------------ the sampler
def test_proportional_uses_every_batch_of_every_dataset_once():
    """sentence-transformers' PROPORTIONAL: each dataset in proportion to its size, i.e. each of its full batches
    exactly once per epoch (10, 4 and 2 batches of 4), every example at most once, in a shuffled order."""
    sampler = MixedBatchSampler(SIZES, BATCH, "proportional", seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == sum(s // BATCH for s in SIZES)
    counts = Counter(dataset_of(b) for b in batches)
    assert counts == {0: 10, 1: 4, 2: 2}
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) and all(len(b) == BATCH for b in batches)
    order = [dataset_of(b) for b in batches]
    assert order != sorted(order)  # shuffled, not dataset after dataset


def test_round_robin_takes_turns_and_stops_with_the_smallest():
    """sentence-transformers' ROUND_ROBIN: one batch of each dataset in turn until the smallest (2 batches) runs
    out: 0, 1, 2, 0, 1, 2."""
    sampler = MixedBatchSampler(SIZES, BATCH, "round_robin", seed=3)
    batches = list(sampler)
    assert [dataset_of(b) for b in batches] == [0, 1, 2, 0, 1, 2]
    assert len(sampler) == 6


@pytest.mark.parametrize("policy", ["proportional", "round_robin"])
def test_order_is_a_function_of_seed_and_epoch(policy):
    first, again = MixedBatchSampler(SIZES, BATCH, policy, seed=1), MixedBatchSampler(SIZES, BATCH, policy, seed=1)
    assert list(first) == list(again)
    other_seed = MixedBatchSampler(SIZES, BATCH, policy, seed=2)
    assert list(other_seed) != list(first)
    epoch0 = list(first)
    first.set_epoch(1)
    assert list(first) != epoch0
    first.set_epoch(0)
    assert list(first) == epoch0


@pytest.mark.parametrize("policy", ["proportional", "round_robin"])
def test_every_process_draws_from_the_same_dataset_at_each_step(policy):
    """accelerate gives process k the batches k, k+n, ... (`BatchSamplerShard`, split_batches false): with group n,
    the n processes' batches of one step come from one dataset, and no two share an example."""
    processes = 2
    sampler = MixedBatchSampler(SIZES, BATCH, policy, seed=5, group=processes)
    shards = [list(BatchSamplerShard(sampler, processes, k)) for k in range(processes)]
    assert len(shards[0]) == len(shards[1]) == len(sampler) // processes
    for step, batches in enumerate(zip(*shards)):
        assert len({dataset_of(b) for b in batches}) == 1, f"step {step}: processes draw from different datasets"
        assert not set(batches[0]) & set(batches[1])
    expected = {0: 5, 1: 2, 2: 1} if policy == "proportional" else {0: 1, 1: 1, 2: 1}
    assert Counter(dataset_of(b) for b in shards[0]) == expected


def test_resume_replays_the_epochs_order():
    """A resumed run skips the epoch's consumed batches (accelerate's SkipBatchSampler); the epoch is set from the
    Trainer's state (`SamplerEpoch`, also where the sampler sits under the skipper), so the rest is the same."""
    sampler = MixedBatchSampler(SIZES, BATCH, "proportional", seed=9)
    sampler.set_epoch(1)
    uninterrupted = list(sampler)
    resumed = MixedBatchSampler(SIZES, BATCH, "proportional", seed=9)
    SamplerEpoch(resumed).on_epoch_begin(None, TrainerState(epoch=1.375), None)
    assert resumed.epoch == 1
    assert list(SkipBatchSampler(resumed, skip_batches=6)) == uninterrupted[6:]


def test_a_dataset_smaller_than_one_draw_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"whole batches of 16 examples .*'tiny' \(8 examples\) cannot fill one"):
        MixedBatchSampler(SIZES, 8, "round_robin", group=2, names=["big", "mid", "tiny"])


def test_the_collator_refuses_a_batch_of_two_datasets():
    collator = MixedCollator([lambda f: {"n": len(f)}, lambda f: {"n": len(f)}])
    assert collator([{DATASET_INDEX: 1, "x": 0}] * 2) == {"n": 2, DATASET_INDEX: 1}
    with pytest.raises(ValueError, match="every batch must come from one"):
        collator([{DATASET_INDEX: 0}, {DATASET_INDEX: 1}])


# ------------------------------------------------------------------------------------------ column mapping
def write_csv(path, header, rows):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_column_mapping_renames_and_copies(tmp_path):
    """`columns` maps the method's column to the dataset's: renamed ({sent0: premise, ...}) or one column copied
    into two (unsupervised text as (sent0, sent1) = (text, text))."""
    rows = random_sentences(6, seed=1)
    nli = write_csv(tmp_path / "nli.csv", ["premise", "hypothesis", "label"], [(a, b, 0) for a, b in zip(rows, rows)])
    source = TrainingSource("train_file", str(nli), "nli", columns=(("sent0", "premise"), ("sent1", "hypothesis")))
    data, _ = load_training_data(DataArguments(train_file=str(nli)), ("sent0", "sent1"), ("hard_neg",), source)
    assert data.column_names == ["sent0", "sent1"] and data["sent0"] == rows
    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(rows) + "\n")
    source = TrainingSource("train_file", str(text), "wiki", columns=(("sent0", "text"), ("sent1", "text")))
    data, _ = load_training_data(DataArguments(train_file=str(text)), ("sent0", "sent1"), ("hard_neg",), source)
    assert data["sent0"] == data["sent1"] == rows


def test_sentence_transformers_names_are_read_by_default(tmp_path):
    """anchor / positive / negative are read as sent0 / sent1 / hard_neg without any mapping."""
    rows = random_sentences(9, seed=2)
    path = write_csv(tmp_path / "st.csv", ["anchor", "positive", "negative"], zip(rows[:3], rows[3:6], rows[6:]))
    data, _ = load_training_data(DataArguments(train_file=str(path)), ("sent0", "sent1"), ("hard_neg",))
    assert data.column_names == ["sent0", "sent1", "hard_neg"]
    assert (data["sent0"], data["sent1"], data["hard_neg"]) == (rows[:3], rows[3:6], rows[6:])


def test_a_mapping_to_a_missing_or_unread_column_is_refused(tmp_path):
    path = write_csv(tmp_path / "p.csv", ["a", "b"], [("x y", "y z")])
    missing = TrainingSource("train_file", str(path), "p", columns=(("sent0", "a"), ("sent1", "premise")))
    with pytest.raises(ValueError, match=r"maps 'sent1' -> 'premise', but it has no such column: its columns are 'a'"):
        load_training_data(DataArguments(train_file=str(path)), ("sent0", "sent1"), (), missing)
    unread = TrainingSource("train_file", str(path), "p", columns=(("label", "a"),))
    with pytest.raises(ValueError, match="maps 'label', which the method does not read"):
        load_training_data(DataArguments(train_file=str(path)), ("sent0", "sent1"), (), unread)


# ------------------------------------------------------------------------------------------ recipe keys and refusals
def test_list_entries_parse_into_named_sources():
    sources = listed_sources(["a/wiki.txt", {"path": "b/wiki.txt", "columns": {"sent0": "text", "sent1": "text"}}],
                             [{"name": "sentence-transformers/all-nli", "config": "triplet"}, "org/sts"], None)
    assert [s.name for s in sources] == ["wiki", "wiki_2", "all-nli_triplet", "sts"]
    assert sources[1].column_map == {"sent0": "text", "sent1": "text"} and sources[2].config == "triplet"
    assert [s.index for s in sources] == [0, 1, 0, 1]


@pytest.fixture
def mixed_recipe(tmp_path, tiny_bert_dir, senteval_dir, train_files):
    """Write a simcse_sup recipe on the tiny BERT mixing the triplets (32) and the text file (32) mapped to pairs;
    `values` override."""

    def write(**values):
        text = {"path": str(train_files["text"]), "columns": {"sent0": "text", "sent1": "text"}}
        recipe = {"method": "simcse_sup", "model_name_or_path": str(tiny_bert_dir), "sts_data_dir": str(senteval_dir),
                  "output_dir": str(tmp_path / "out"), "train_file": [str(train_files["triplets"]), text],
                  "per_device_train_batch_size": 4, "max_seq_length": 16, "use_cpu": True, "seed": 0,
                  "max_steps": 6, "logging_steps": 2, "eval_strategy": "no", "save_strategy": "no",
                  "load_best_model_at_end": False, "eval_before_training": False, "eval_tasks": [],
                  "learning_rate": 1e-4, "warmup_steps": 0, **values}
        path = tmp_path / "mixed.yaml"
        path.write_text(yaml.safe_dump({k: v for k, v in recipe.items() if v is not None}))
        return path

    return write


@pytest.mark.parametrize("train_file, message", [
    ([3], r"key 'train_file' entry 0 \(3\): an entry is a string or a mapping with the keys path, columns"),
    ([{"path": "a.txt", "colums": {}}], r"entry 0 .*unknown entry key\(s\) 'colums'; an entry of 'train_file' takes"),
    ([{"columns": {"sent0": "a"}}], r"entry 0 .*'path' must name the file"),
    ([{"path": "a.txt", "columns": ["sent0"]}], r"'columns' maps the method's column to the dataset's"),
    ([], r"key 'train_file' is an empty list"),
])
def test_malformed_entries_are_refused_naming_them(mixed_recipe, train_file, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(mixed_recipe(train_file=train_file))


def test_mixing_refusals_at_parse_time(mixed_recipe, train_files):
    with pytest.raises(RecipeError, match="key 'mixing' must be one of proportional, round_robin; got 'random'"):
        parse_recipe(mixed_recipe(mixing="random"))
    with pytest.raises(RecipeError, match="key 'mixing' is 'round_robin' but the recipe names 1 dataset"):
        parse_recipe(mixed_recipe(mixing="round_robin", train_file=[str(train_files["triplets"])]))
    with pytest.raises(RecipeError, match="'unlabeled_sts' cannot be mixed with a list of datasets"):
        parse_recipe(mixed_recipe(unlabeled_sts="stsb"))


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("a model was loaded before the datasets were checked")

    monkeypatch.setattr(SentenceEncoder, "from_backbone", refuse)
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", refuse)


def test_a_dataset_without_the_methods_columns_is_refused_naming_it(mixed_recipe, train_files, tmp_path, no_model):
    """The plain text file listed without a mapping: simcse_sup reads sent0, sent1; entry 1 is named."""
    recipe = parse_recipe(mixed_recipe(train_file=[str(train_files["triplets"]), str(train_files["text"])]))
    with pytest.raises(RecipeError, match=r"train_file entry 1 \('.*train.txt'\): train_file '.*' has no columns "
                                          r"'sent0', 'sent1': its columns are 'text'"):
        validate_recipe(recipe)


def test_a_dataset_smaller_than_a_batch_is_refused_naming_it(mixed_recipe, tmp_path, train_files, no_model):
    small = tmp_path / "small.txt"
    small.write_text("\n".join(random_sentences(3, seed=8)) + "\n")
    entry = {"path": str(small), "columns": {"sent0": "text", "sent1": "text"}}
    recipe = parse_recipe(mixed_recipe(train_file=[str(train_files["triplets"]), entry], mixing="round_robin"))
    with pytest.raises(RecipeError, match=r"train_file entry 1 .*\(dataset 'small'\) has 3 usable example\(s\): "
                                          r"fewer than one global batch of 4 .*mixing 'round_robin'"):
        validate_recipe(recipe)


def test_a_length_sampler_is_refused_with_mixing(mixed_recipe, no_model):
    with pytest.raises(RecipeError, match="key 'train_sampling_strategy' is 'group_by_length'"):
        validate_recipe(parse_recipe(mixed_recipe(train_sampling_strategy="group_by_length")))


def test_the_plan_holds_the_sources(mixed_recipe):
    plan = plan_run(parse_recipe(mixed_recipe()))
    assert [s.name for s in plan.training_sources] == ["triplets", "train"]
    assert plan.stages[-1].training_sources == plan.training_sources


# ------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("mixing", ["proportional", "round_robin"])
def test_a_mixed_training_logs_each_datasets_loss(mixing, mixed_recipe):
    """Triplets (3 views) beside text pairs (2 views): every batch is one dataset's (the collator refuses others),
    and the log holds loss_triplets and loss_train beside the loss."""
    recipe = parse_recipe(mixed_recipe(mixing=mixing))
    set_seed(0)
    trainer = build_stage(validate_recipe(recipe)).trainer
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    per_dataset = {key for entry in logged for key in entry if key.startswith("loss_")}
    assert per_dataset == {"loss_triplets", "loss_train"}
    for entry in logged:
        assert all(value > 0 for key, value in entry.items() if key.startswith("loss_"))
    if mixing == "round_robin":  # 0, 1, 0, 1, ...: each logging window of 2 steps has one batch of each
        assert all({"loss_triplets", "loss_train"} <= set(entry) for entry in logged)


def test_a_dataset_name_entry_reads_its_split_and_st_names(tmp_path, mixed_recipe, train_files):
    """A `dataset_name` entry (here a local folder `datasets` reads as a dataset id would be read) with its split,
    beside a file; its anchor/positive columns are read as sent0/sent1. One smaller than a global batch is refused,
    naming it, when it has loaded (before training)."""
    folder = tmp_path / "st_pairs"
    folder.mkdir()
    rows = random_sentences(24, seed=12)
    write_csv(folder / "train.csv", ["anchor", "positive"], zip(rows[:12], rows[12:]))
    recipe = parse_recipe(mixed_recipe(dataset_name=[{"name": str(folder), "split": "train"}]))
    sources = plan_run(recipe).training_sources
    assert [(s.key, s.name, s.split) for s in sources][-1] == ("dataset_name", "st_pairs", "train")
    data, _ = load_training_data(recipe.data, ("sent0", "sent1"), ("hard_neg",), sources[-1])
    assert data["sent0"] == rows[:12] and data["sent1"] == rows[12:]
    big = parse_recipe(mixed_recipe(dataset_name=[{"name": str(folder), "split": "train"}],
                                    per_device_train_batch_size=16, train_file=[str(train_files["triplets"])]))
    with pytest.raises(ValueError, match=r"'st_pairs' \(12 examples\) cannot fill one"):
        build_stage(validate_recipe(big))


def test_a_mixed_runs_hub_datasets_are_credited_and_its_local_files_are_not():
    """The card's `datasets:` of a mixed run: an hf:// file's and a Hub id's datasets, never a local file's name."""
    from hf_sentcl.export.results import training_datasets

    listed = [{"key": "train_file", "name": "hf://datasets/princeton-nlp/datasets-for-simcse/nli_for_simcse.csv"},
              {"key": "train_file", "name": "wiki1m_subset.txt"},
              {"key": "dataset_name", "name": "sentence-transformers/all-nli"}]
    data = {"source": "mixed", "name": "...", "datasets": listed}
    assert training_datasets({"training_data": data}) == ["princeton-nlp/datasets-for-simcse",
                                                          "sentence-transformers/all-nli"]


def test_a_resumed_training_replays_the_batches_of_the_uninterrupted_one(mixed_recipe, monkeypatch):
    """Through the Trainer: a run resumed from its checkpoint at step 18 (epoch 1, where the sampler sits under
    accelerate's batch skipper) trains on the same datasets and examples at steps 18 and 19 as the whole run."""
    from hf_sentcl.trainers.mixing import MixedSources

    seen: list[tuple[int, list[int]]] = []
    original = MixedSources.batch_source

    def recording(self, inputs):
        source = original(self, inputs)
        seen.append((source, inputs["input_ids"][:, 0, 1].tolist()))
        return source

    monkeypatch.setattr(MixedSources, "batch_source", recording)
    values = dict(max_steps=20, save_strategy="steps", save_steps=18, save_total_limit=3, logging_steps=10)

    def train(resume=None):
        set_seed(0)
        trainer = build_stage(validate_recipe(parse_recipe(mixed_recipe(**values)))).trainer
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = train()
    uninterrupted, seen[:] = list(seen), []
    train(f"{whole.args.output_dir}/checkpoint-18")
    assert len(uninterrupted) == 20 and seen == uninterrupted[18:]
