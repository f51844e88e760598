"""The training hot path's fast pieces give the same results as the slow ones they replace.

- `pad_token_ids` / `ViewCollator`: the same tensors as `tokenizer.pad`, and bit-identical training.
- `ContrastiveTrainer.floating_point_ops`: counts the dropout copies, counts the parameters once.
- pre-tokenisation is cached between runs (the `datasets` fingerprint does not depend on the tokenizer object).
- the optional length-grouped sampler and `pad_to_multiple_of` are wired from a recipe.
- the optional `length_buckets` forward gives the one-forward embeddings, loss and gradients (without dropout).
"""

import random
import warnings

import pytest
import torch
from datasets import Dataset
from helpers import random_sentences
from transformers import AutoTokenizer
from transformers.trainer_pt_utils import LengthGroupedSampler

from hf_sentcl import SentenceEncoder
from hf_sentcl.configs import DataArguments
from hf_sentcl.data import ViewCollator, add_length_column, load_training_dataset, tokenize_views
from hf_sentcl.data.collators import pad_token_ids
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer, SupervisedSimCSETrainer
from hf_sentcl.pipeline.build import build_train_dataset
from hf_sentcl.recipe.parser import RecipeError, parse_recipe
from hf_sentcl.trainers.length_buckets import forward_in_length_buckets


class TokenizerPadCollator(ViewCollator):
    """The collator as it was: `tokenizer.pad` on one dict per view (the reference for the fast path)."""

    def __call__(self, features):
        flat = [{"input_ids": f[f"view{v}"]} for v in range(self.num_views) for f in features]
        padded = self.tokenizer.pad(flat, return_tensors="pt", pad_to_multiple_of=self.pad_to_multiple_of)
        batch = len(features)
        return {
            key: padded[key].view(self.num_views, batch, -1).transpose(0, 1).contiguous()
            for key in ("input_ids", "attention_mask")
        }


def random_id_lists(n: int, seed: int, vocab: int = 50) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(1, 12))] for _ in range(n)]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("multiple", [None, 8])
def test_pad_token_ids_equals_tokenizer_pad(tiny_backbone_dir, padding_side, multiple):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_backbone_dir))
    tokenizer.padding_side = padding_side
    sequences = random_id_lists(17, seed=3)
    expected = tokenizer.pad({"input_ids": sequences}, return_tensors="pt", pad_to_multiple_of=multiple)
    input_ids, attention_mask = pad_token_ids(sequences, tokenizer.pad_token_id, padding_side, multiple)
    assert input_ids.dtype == expected["input_ids"].dtype and attention_mask.dtype == expected["attention_mask"].dtype
    assert torch.equal(input_ids, expected["input_ids"])
    assert torch.equal(attention_mask, expected["attention_mask"])
    if multiple:
        assert input_ids.shape[1] % multiple == 0


def test_pad_token_ids_rejects_unknown_side():
    with pytest.raises(ValueError, match="padding_side"):
        pad_token_ids([[1, 2]], 0, padding_side="middle")


@pytest.mark.parametrize("num_views", [1, 3])
def test_view_collator_equals_tokenizer_pad_collator(tiny_bert_dir, num_views):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    features = [{f"view{v}": ids for v, ids in enumerate(random_id_lists(num_views, seed=i))} for i in range(9)]
    fast = ViewCollator(tokenizer, num_views=num_views)(features)
    slow = TokenizerPadCollator(tokenizer, num_views=num_views)(features)
    assert fast.keys() == slow.keys()
    for key in fast:
        assert fast[key].shape == slow[key].shape and torch.equal(fast[key], slow[key])


def test_view_collator_needs_a_pad_token(tiny_bert_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        ViewCollator(tokenizer)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        ViewCollator(AutoTokenizer.from_pretrained(str(tiny_bert_dir)), pad_to_multiple_of=0)


def _train(tiny_bert_dir, tmp_path, collator_class):
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    initial = {k: v.clone() for k, v in encoder.state_dict().items()}
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(48, seed=1)}), encoder.tokenizer,
                             ("text",), 32)
    args = SimCSEConfig(
        output_dir=str(tmp_path / collator_class.__name__), per_device_train_batch_size=8, learning_rate=1e-3,
        max_steps=5, eval_strategy="no", save_strategy="no", load_best_model_at_end=False, report_to="none",
        use_cpu=True, logging_steps=1, seed=0, disable_tqdm=True,
    )
    trainer = SimCSETrainer(model=encoder, args=args, train_dataset=dataset,
                            data_collator=collator_class(encoder.tokenizer))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, initial, encoder.state_dict()


@pytest.mark.slow
def test_training_with_the_fast_collator_is_bit_identical(tiny_bert_dir, tmp_path):
    """Same seed, same data: every logged loss and every final weight equal those of the tokenizer.pad path."""
    fast_losses, initial, fast_weights = _train(tiny_bert_dir, tmp_path, ViewCollator)
    slow_losses, _, slow_weights = _train(tiny_bert_dir, tmp_path, TokenizerPadCollator)
    assert len(fast_losses) == 5 and fast_losses == slow_losses
    assert all(torch.equal(fast_weights[k], slow_weights[k]) for k in fast_weights)
    assert any(not torch.equal(fast_weights[k], initial[k]) for k in initial)  # it did train


@pytest.mark.parametrize(("trainer_class", "config_class", "copies"),
                         [(SimCSETrainer, SimCSEConfig, 2), (SupervisedSimCSETrainer, SupervisedSimCSEConfig, 1)])
def test_floating_point_ops_counts_copies_and_parameters_once(tiny_bert_dir, tmp_path, monkeypatch,
                                                             trainer_class, config_class, copies):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls")
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(8)}), encoder.tokenizer, ("text",), 32)
    args = config_class(output_dir=str(tmp_path), eval_strategy="no", save_strategy="no", report_to="none",
                        load_best_model_at_end=False, use_cpu=True, per_device_train_batch_size=4)
    trainer = trainer_class(model=encoder, args=args, train_dataset=dataset,
                            data_collator=ViewCollator(encoder.tokenizer))
    parameters = encoder.num_parameters(exclude_embeddings=True)
    calls = []
    original = encoder.num_parameters
    monkeypatch.setattr(encoder, "num_parameters", lambda **kw: calls.append(kw) or original(**kw))
    inputs = ViewCollator(encoder.tokenizer)([dataset[i] for i in range(4)])
    for _ in range(3):
        assert trainer.floating_point_ops(inputs) == 6 * inputs["input_ids"].numel() * copies * parameters
    assert len(calls) == 1
    assert trainer.floating_point_ops({"labels": torch.zeros(2)}) == 0


def test_pre_tokenisation_is_cached_across_runs(tiny_bert_dir, tmp_path):
    """A file-backed corpus tokenised by two separately loaded tokenizers (one already used for padding and
    truncation, which changes a fast tokenizer's internal state) gets the same fingerprint and cache file, so a
    second run reads the first run's tokens instead of tokenising again."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(random_sentences(30, seed=2)) + "\n")
    data_args = DataArguments(train_file=str(corpus))
    runs = []
    for used in (False, True):
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
        if used:
            tokenizer(["a cat", "the dog plays"], truncation=True, max_length=4, padding="max_length")
        raw = load_training_dataset(data_args, ("text",))
        runs.append(tokenize_views(raw, tokenizer, ("text",), 16))
    first, second = runs
    assert first.cache_files and first.cache_files == second.cache_files
    assert first._fingerprint == second._fingerprint
    assert first["view0"] == second["view0"]


@pytest.mark.slow
def test_length_grouped_sampling_and_pad_multiple_from_a_recipe(tiny_bert_dir, senteval_dir, tmp_path):
    """`train_sampling_strategy: group_by_length` gets a `length` column (longest view) and transformers'
    LengthGroupedSampler; `pad_to_multiple_of` reaches the collator; training runs and changes the weights."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(random_sentences(40, seed=4)) + "\n")
    recipe = parse_recipe(
        None, method="simcse", model_name_or_path=str(tiny_bert_dir), pooling="mean", head="none",
        train_file=str(corpus), sts_data_dir=str(senteval_dir), output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8, max_steps=3, eval_strategy="no", save_strategy="no",
        load_best_model_at_end=False, disable_tqdm=True, train_sampling_strategy="group_by_length",
        pad_to_multiple_of=8, learning_rate=1e-3,
    )
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    dataset, num_views, collator = build_train_dataset(recipe, encoder.tokenizer)
    assert num_views == 1 and collator.pad_to_multiple_of == 8
    assert dataset["length"] == [len(ids) for ids in dataset["view0"]]
    trainer = SimCSETrainer(model=encoder, args=recipe.training, train_dataset=dataset, data_collator=collator)
    assert isinstance(trainer._get_train_sampler(), LengthGroupedSampler)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    widths = []
    handle = encoder.backbone.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        trainer.train()
    finally:
        handle.remove()
    assert len(widths) == 3 and all(width % 8 == 0 for width in widths)
    assert any(not torch.equal(v, before[k]) for k, v in encoder.state_dict().items())


def test_add_length_column_takes_the_longest_view_and_names_missing_columns():
    dataset = Dataset.from_dict({"view0": [[1, 2, 3], [4]], "view1": [[5], [6, 7, 8, 9]]})
    assert add_length_column(dataset, 2)["length"] == [3, 4]
    with pytest.raises(ValueError, match="view2"):
        add_length_column(dataset, 3)


def test_pad_to_multiple_of_must_be_positive(tmp_path):
    with pytest.raises(RecipeError, match="pad_to_multiple_of"):
        parse_recipe(None, method="simcse", output_dir=str(tmp_path), pad_to_multiple_of=0)


# ------------------------------------------------------------------------------------------ length buckets (optional)
def _padded_batch(tokenizer, sentences):
    ids = [tokenizer(s)["input_ids"] for s in sentences]
    return pad_token_ids(ids, tokenizer.pad_token_id)


@pytest.mark.parametrize("buckets", [1, 3, 50])
def test_length_buckets_give_the_one_forward_embeddings(tiny_backbone_dir, buckets):
    """Without dropout, encoding length-sorted groups cut to their own longest row gives every row the embedding of
    the single padded forward, in the input order; each group is encoded at its own width."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean").eval()
    input_ids, attention_mask = _padded_batch(encoder.tokenizer, random_sentences(11, seed=5, max_words=14))
    widths = []
    handle = encoder.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            bucketed = forward_in_length_buckets(encoder, input_ids, attention_mask, buckets)
    finally:
        handle.remove()
    with torch.no_grad():
        whole = encoder(input_ids=input_ids, attention_mask=attention_mask).embeddings
    torch.testing.assert_close(bucketed, whole, rtol=1e-5, atol=1e-5)
    lengths = sorted(attention_mask.sum(1).tolist())
    expected = [int(max(group)) for group in torch.tensor(lengths).tensor_split(buckets) if len(group)]
    assert widths == expected


def test_length_buckets_keep_the_simcse_loss_and_gradients(tiny_bert_dir, tmp_path):
    """With dropout off, SimCSE's loss and every gradient with length_buckets match the single forward's."""
    results = []
    for buckets in (None, 4):
        torch.manual_seed(0)
        encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp", hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0)
        dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(12, seed=6, max_words=14)}),
                                 encoder.tokenizer, ("text",), 32)
        args = SimCSEConfig(output_dir=str(tmp_path), eval_strategy="no", save_strategy="no", report_to="none",
                            load_best_model_at_end=False, use_cpu=True, per_device_train_batch_size=12,
                            length_buckets=buckets)
        trainer = SimCSETrainer(model=encoder, args=args, train_dataset=dataset,
                                data_collator=ViewCollator(encoder.tokenizer))
        inputs = ViewCollator(encoder.tokenizer)([dataset[i] for i in range(12)])
        loss = trainer.compute_loss(encoder, inputs)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (plain_loss, plain_grads), (bucket_loss, bucket_grads) = results
    torch.testing.assert_close(bucket_loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == bucket_grads.keys() and plain_grads
    for name in plain_grads:
        torch.testing.assert_close(bucket_grads[name], plain_grads[name], rtol=1e-4, atol=1e-6)


def test_length_buckets_are_refused_where_views_are_encoded_differently(tmp_path):
    class OwnEmbedding(SimCSETrainer):
        def embed_views(self, model, inputs):
            return super().embed_views(model, inputs)

    args = SimCSEConfig(output_dir=str(tmp_path), length_buckets=4, report_to="none")
    SimCSETrainer.check_length_buckets(args)  # the base encoding accepts it
    with pytest.raises(ValueError, match="length_buckets"):
        OwnEmbedding.check_length_buckets(args)
    OwnEmbedding.check_length_buckets(SimCSEConfig(output_dir=str(tmp_path), length_buckets=1, report_to="none"))
    with pytest.raises(RecipeError, match="length_buckets"):
        parse_recipe(None, method="simcse", output_dir=str(tmp_path), length_buckets=0)


def test_bf16_on_a_cpu_without_bf16_kernels_warns(tmp_path, monkeypatch):
    from hf_sentcl.configs import arguments

    monkeypatch.setattr(arguments, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no native bf16"):
        SimCSEConfig(output_dir=str(tmp_path), bf16=True, use_cpu=True, report_to="none")
    monkeypatch.setattr(arguments, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SimCSEConfig(output_dir=str(tmp_path), bf16=True, use_cpu=True, report_to="none")
    assert not [w for w in caught if "native bf16" in str(w.message)]
