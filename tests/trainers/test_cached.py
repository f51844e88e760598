"""The cached (GradCache-style) step, `mini_batch_size`: same loss and gradients as the plain large-batch step for
SimCSE (unsupervised and supervised) and SG-OPT, with dropout on (same masks), with gradient accumulation, under
bf16 autocast, in training with logged metrics, and across 2 gloo processes."""

import copy
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp
from datasets import Dataset
from helpers import assert_same, build_tiny_bert, gradients, random_sentences, reference_step, step

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.methods.self_guided.config import SelfGuidedConfig
from hf_sentcl.methods.self_guided.trainer import SelfGuidedTrainer
from hf_sentcl.methods.simcse.config import SimCSEConfig, SupervisedSimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer, SupervisedSimCSETrainer
from hf_sentcl.modeling.compiled import CompiledTrainingLayer, transformer_layers, uncompile_layers
from hf_sentcl.trainers.base import ViewsOutput
from hf_sentcl.trainers.cached import RandomState, split_batch

BATCH, MINI = 8, 3  # mini-batches of 3, 3 and 2 examples


NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


METHODS = {
    "simcse": (SimCSEConfig, SimCSETrainer, ("text",), dict(pooling="cls", head="mlp"), {}),
    "simcse_sup": (
        SupervisedSimCSEConfig, SupervisedSimCSETrainer, ("sent0", "sent1", "hard_neg"),
        dict(pooling="cls", head="mlp"), dict(hard_negative_weight=0.5),
    ),
    "sg-opt": (
        SelfGuidedConfig, SelfGuidedTrainer, ("text",), dict(pooling="cls", head="none"),
        dict(projection_size=16, objective="sg-opt"),
    ),
}


def make_trainer(model_dir, tmp_path, method, dropout=True, n=BATCH, **overrides):
    config_class, trainer_class, columns, encoder_kwargs, method_kwargs = METHODS[method]
    torch.manual_seed(0)  # the same SimCSE head initialisation in every trainer (and process)
    encoder = SentenceEncoder.from_backbone(str(model_dir), **encoder_kwargs, **({} if dropout else NO_DROPOUT))
    sentences = random_sentences(n * len(columns), seed=5)
    data = {column: sentences[i * n : (i + 1) * n] for i, column in enumerate(columns)}
    dataset = tokenize_views(Dataset.from_dict(data), encoder.tokenizer, columns, 32)
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, learning_rate=1e-3, eval_strategy="no",
        load_best_model_at_end=False, save_strategy="no", use_cpu=True, logging_steps=1, disable_tqdm=True,
        report_to="none", seed=0, temperature=0.1, **method_kwargs,
    )
    settings.update(overrides)
    trainer = trainer_class(
        model=encoder, args=config_class(**settings), train_dataset=dataset,
        data_collator=ViewCollator(encoder.tokenizer, num_views=len(columns)),
    )
    trainer.current_gradient_accumulation_steps = settings.get("gradient_accumulation_steps", 1)
    return trainer


def first_batch(trainer):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(BATCH)])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("bert"))


# ---------------------------------------------------------------------------------------------- equality
@pytest.mark.parametrize("method", list(METHODS))
def test_cached_step_equals_plain_step_without_dropout(model_dir, tmp_path, method):
    """With dropout off, mini-batching changes nothing: Trainer's own training_step on the whole batch and the
    cached step give the same loss and the same gradient for every parameter (SG: projection head and
    regularizer included)."""
    trainer = make_trainer(model_dir, tmp_path, method, dropout=False)
    inputs = first_batch(trainer)
    assert_same(step(trainer, inputs, None), step(trainer, inputs, MINI))


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_cached_step_equals_plain_step_with_dropout(model_dir, tmp_path, method):
    """Dropout on: the replayed random state gives every mini-batch the masks of its first pass, so loss and
    gradients equal the full-autograd step with those masks (max |diff| < 1e-5); the masks matter (a different
    mini-batch split draws others and changes the result)."""
    trainer = make_trainer(model_dir, tmp_path, method)
    inputs = first_batch(trainer)
    cached = step(trainer, inputs, MINI)
    assert_same(cached, reference_step(trainer, inputs, MINI))
    other_masks = reference_step(trainer, inputs, BATCH)
    assert (cached[0] - other_masks[0]).abs() > 1e-4


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor needs a C++ compiler")
def test_cached_step_with_compiled_layers_equals_the_eager_cached_step(model_dir, tmp_path):
    """`compile_layers`: the first pass runs eager (no gradients), the replay compiled; both draw their dropout masks
    from torch's generator, so the replay reproduces the first pass and the step equals the eager one."""
    trainer = make_trainer(model_dir, tmp_path, "simcse", compile_layers=True)
    assert all(isinstance(layer, CompiledTrainingLayer) for layer in transformer_layers(trainer.model))
    inputs = first_batch(trainer)
    compiled = step(trainer, inputs, MINI)
    uncompile_layers(trainer.model)
    assert_same(compiled, step(trainer, inputs, MINI))


class WithLocalTerm(SimCSETrainer):
    """SimCSE plus a per-example term from the same forward, a mean over real tokens (like an MLM loss): its
    mini-batch values must combine weighted by their token counts, not by example counts."""

    def forward_views(self, model, inputs):
        views = self.embed_views(model, inputs)
        tokens = inputs["attention_mask"][:, 0].sum(-1)
        local = 0.1 * (views[0].float().pow(2).sum(-1) * tokens).sum() / tokens.sum()
        return ViewsOutput(views, local, local_weight=tokens.sum(), components={"local_term": local})


@pytest.mark.slow
def test_local_loss_is_weighted_by_local_weight(model_dir, tmp_path):
    """The per-example term: with dropout off, Trainer's plain step and the cached one agree; with dropout on, the
    cached step equals full autograd over the same masks with the term computed on the whole batch (token-mean over
    all examples), and the logged component is that whole-batch value."""
    METHODS["local"] = (SimCSEConfig, WithLocalTerm, ("text",), dict(pooling="cls", head="mlp"), {})
    try:
        trainer = make_trainer(model_dir, tmp_path, "local", dropout=False)
        inputs = first_batch(trainer)
        assert_same(step(trainer, inputs, None), step(trainer, inputs, MINI))
        trainer = make_trainer(model_dir, tmp_path, "local")
    finally:
        del METHODS["local"]
    inputs = first_batch(trainer)
    trainer._metrics.clear()
    cached = step(trainer, inputs, MINI)
    logged = trainer._metrics["train/local_term"]

    model = trainer.model
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    views = torch.cat([trainer.embed_views(model, chunk) for chunk in split_batch(inputs, MINI)], dim=1)
    tokens = inputs["attention_mask"][:, 0].sum(-1)
    local = 0.1 * (views[0].pow(2).sum(-1) * tokens).sum() / tokens.sum()
    loss = trainer.batch_loss(model, views, inputs)[0] + local
    loss.backward()
    assert_same(cached, (loss.detach(), gradients(model)))
    assert len(logged) == 1 and torch.allclose(logged[0], local.detach(), atol=1e-6)
    assert len({int(t) for t in tokens}) > 1  # unequal lengths: example-count weights would be wrong


def test_gradient_accumulation_scale(model_dir, tmp_path):
    """Under gradient accumulation the cached step divides loss and gradients like Trainer.training_step does."""
    trainer = make_trainer(model_dir, tmp_path, "simcse", dropout=False, gradient_accumulation_steps=2)
    inputs = first_batch(trainer)
    plain, cached = step(trainer, inputs, None), step(trainer, inputs, MINI)
    assert_same(plain, cached)
    trainer.current_gradient_accumulation_steps = 1
    full = step(trainer, inputs, MINI)
    assert torch.allclose(full[0], 2 * cached[0]) and torch.allclose(
        full[1]["backbone.encoder.layer.0.output.dense.weight"],
        2 * cached[1]["backbone.encoder.layer.0.output.dense.weight"], atol=1e-6,
    )


@pytest.mark.parametrize("method", ["simcse", "sg-opt"])
def test_bf16_autocast(model_dir, tmp_path, method):
    """Under CPU bf16 autocast (what accelerate wraps the forward in), with dropout on, the cached step matches the
    full-autograd step with the same masks to bf16 precision (the full step sums the mini-batches' weight gradients
    in bf16 through autocast's cached weight copies, the cached step in fp32); the loss stays fp32."""
    trainer = make_trainer(model_dir, tmp_path, method)
    inputs = first_batch(trainer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached, reference = step(trainer, inputs, MINI), reference_step(trainer, inputs, MINI)
    assert cached[0].dtype == torch.float32
    assert_same(cached, reference, atol=1e-2, relative=1e-2)


def test_random_state_replays_dropout():
    """RandomState.restore makes the next dropout mask the one drawn after capture."""
    x = torch.ones(1000)
    state = RandomState.capture(x)
    first = torch.nn.functional.dropout(x, 0.5)
    torch.nn.functional.dropout(x, 0.5)
    state.restore()
    assert torch.equal(torch.nn.functional.dropout(x, 0.5), first)


def test_split_batch():
    inputs = {"input_ids": torch.arange(16).view(8, 1, 2), "attention_mask": torch.ones(8, 1, 2)}
    chunks = split_batch(inputs, 3)
    assert [len(c["input_ids"]) for c in chunks] == [3, 3, 2]
    assert torch.equal(torch.cat([c["input_ids"] for c in chunks]), inputs["input_ids"])


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.slow
@pytest.mark.parametrize("method, learning_rate", [("simcse", 5.0), ("sg-opt", 0.05)])
def test_training_logs_match_plain_training(model_dir, tmp_path, method, learning_rate):
    """A few optimizer steps: the cached run logs the same losses (and SG's contrastive loss and parameter
    distance) as the plain run and ends with the same weights; the loss falls and the weights change."""
    histories, weights = [], []
    for mini in (None, MINI):
        # SGD: the update is proportional to the gradient (Adam's normalisation would blow up rounding-level
        # differences of near-zero gradients, e.g. the regularizer's on the unused pooler, into lr-sized steps)
        trainer = make_trainer(model_dir, tmp_path, method, dropout=False, n=16, max_steps=4, mini_batch_size=mini,
                               optim="sgd", learning_rate=learning_rate)
        before = copy.deepcopy(trainer.model.state_dict())
        trainer.train()
        histories.append([h for h in trainer.state.log_history if "loss" in h])
        weights.append(trainer.model.state_dict())
        changed = [k for k, v in weights[-1].items() if k in before and not torch.equal(v, before[k])]
        assert any("encoder.layer.1" in k for k in changed)
    plain, cached = histories
    keys = {"loss", "contrastive_loss", "param_distance"} & plain[0].keys()
    assert len(plain) == len(cached) == 4 and keys >= {"loss"}
    for a, b in zip(plain, cached):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    assert cached[-1]["loss"] < cached[0]["loss"]
    if method == "sg-opt":
        assert cached[0]["param_distance"] == 0 and cached[-1]["param_distance"] > 0
    for key, value in weights[0].items():
        torch.testing.assert_close(value, weights[1][key], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- refusals
def test_refused_for_a_trainer_with_its_own_compute_loss(model_dir, tmp_path):
    class OwnLoss(SimCSETrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    METHODS["own"] = (SimCSEConfig, OwnLoss, ("text",), dict(pooling="cls", head="mlp"), {})
    try:
        with pytest.raises(ValueError, match="mini_batch_size: OwnLoss computes its loss in its own compute_loss"):
            make_trainer(model_dir, tmp_path, "own", mini_batch_size=2)
        make_trainer(model_dir, tmp_path, "own")  # fine without mini_batch_size
    finally:
        del METHODS["own"]
    with pytest.raises(ValueError, match="mini_batch_size must be a positive"):
        SimCSEConfig(output_dir=str(tmp_path), mini_batch_size=0)


def test_refused_under_deepspeed(tmp_path):
    """A DeepSpeed launch (accelerate exports ACCELERATE_USE_DEEPSPEED) with mini_batch_size is refused before any
    model is loaded."""
    args = type("Args", (), {"mini_batch_size": 4, "deepspeed_plugin": object()})()
    with pytest.raises(ValueError, match="not supported under DeepSpeed"):
        SimCSETrainer.check_cached_step(args)
    args.deepspeed_plugin = None
    SimCSETrainer.check_cached_step(args)
    SelfGuidedTrainer.check_cached_step(args)


def test_recipe_validation_refuses_it_before_loading(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    """validate_recipe names mini_batch_size for a method whose loss the cached step cannot split."""
    from hf_sentcl.recipe.checks import validate_recipe
    from hf_sentcl.recipe.parser import RecipeError, parse_recipe
    from hf_sentcl.registry import METHODS

    class OwnLoss(SimCSETrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(8)) + "\n")
    recipe = parse_recipe(None, method="simcse", model_name_or_path=str(tiny_bert_dir), train_file=str(corpus),
                          sts_data_dir=str(senteval_dir), output_dir=str(tmp_path), mini_batch_size=4,
                          per_device_train_batch_size=8)
    validate_recipe(recipe)
    spec = METHODS["simcse"]
    monkeypatch.setattr(type(spec), "trainer_class", property(lambda self: OwnLoss))
    with pytest.raises(RecipeError, match="mini_batch_size: OwnLoss"):
        validate_recipe(recipe)


@pytest.mark.parametrize("fsdp, zero_stage", [(True, None), (False, 3)])
def test_self_guided_refuses_sharded_weights(fsdp, zero_stage):
    """SG's head and regularizer read whole weights outside the forward: FSDP and ZeRO-3 are refused, ZeRO-2 not."""
    plugin = None if zero_stage is None else type("Plugin", (), {"zero_stage": zero_stage})()
    stub = type("Stub", (), {"is_fsdp_enabled": fsdp})()
    stub.accelerator = type("Accelerator", (), {"state": type("State", (), {"deepspeed_plugin": plugin})()})()
    with pytest.raises(ValueError, match="cannot run under FSDP or DeepSpeed ZeRO-3"):
        SelfGuidedTrainer._check_parallelism(stub)
    stub.is_fsdp_enabled = False
    if plugin is not None:
        plugin.zero_stage = 2
    SelfGuidedTrainer._check_parallelism(stub)  # DDP / ZeRO-2: fine


# ---------------------------------------------------------------------------------------------- 2 processes
WORLD = 2


def _worker(rank, model_dir, out_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import pathlib

    results = {}
    for method in ("simcse", "sg-opt"):
        trainer = make_trainer(pathlib.Path(model_dir), pathlib.Path(out_dir) / f"r{rank}", method, dropout=False,
                               global_train_batch_size=BATCH, mini_batch_size=MINI - 1)
        results["per_device_train_batch_size"] = trainer.args.per_device_train_batch_size
        model = trainer.accelerator.prepare(trainer.model)  # DDP, without the unused-parameter search
        inputs = first_batch(trainer)
        part = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        for _ in range(2):  # DDP complains on the step after one where a trained weight got no gradient
            trainer.model.zero_grad(set_to_none=True)
            loss = trainer.training_step(model, {k: v[part] for k, v in inputs.items()})
        results[method] = (loss.detach(), gradients(trainer.model))
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_process_results(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cached-ddp")
    mp.spawn(_worker, args=(str(model_dir), str(out), 29000 + os.getpid() % 1000), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["simcse", "sg-opt"])
def test_two_processes_cached_equals_one_process_plain(two_process_results, model_dir, tmp_path, method):
    """2 gloo processes with DDP, each with half the batch (global_train_batch_size) in mini-batches of 2 (gathered
    negatives, no_sync on
    all but the last replay, the whole-batch loss riding on it): every process ends with the gradients of the
    1-process plain step on the whole batch, loss included (SG: head and regularizer averaged by DDP too)."""
    trainer = make_trainer(model_dir, tmp_path, method, dropout=False)
    expected = step(trainer, first_batch(trainer), None)
    for result in two_process_results:
        assert result["per_device_train_batch_size"] == BATCH // WORLD  # from global_train_batch_size
        assert_same(result[method], expected)
