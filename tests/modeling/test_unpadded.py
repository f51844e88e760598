"""The unpadded (padding-free) encoder path equals the padded one: forward and gradients, every pooling, both
backbone families; the route decision (CPU, CUDA + FlashAttention, fallbacks) and its log line."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
import torch
from helpers import random_sentences
from transformers import DataCollatorWithFlattening

from hf_sentcl.modeling import POOLING_MODES, SentenceEncoder, backbone_forward, unpadded
from hf_sentcl.modeling.backbone_forward import flattened_batch, position_ids_start
from hf_sentcl.modeling.fast_dropout import use_fast_dropout
from hf_sentcl.modeling.packing import TOKEN_BUCKET, Packing
from hf_sentcl.modeling.routes import backbone_route, choose_route
from hf_sentcl.modeling.unpadded import unpadded_forward

TOLERANCE = 1e-5


def mixed_batch(encoder: SentenceEncoder, n: int = 7) -> dict[str, torch.Tensor]:
    """Sentences of very different lengths, padded to the longest (right padding)."""
    sentences = [" ".join(random_sentences(1, seed=i, min_words=1 + 2 * i, max_words=2 + 3 * i)) for i in range(n)]
    # the encoder's own tokenisation: written into its template with `prompt` pooling
    batch = encoder.tokenizer.pad({"input_ids": encoder.tokenize(sentences)}, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch should contain padding"
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def left_padded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The right-padded `batch` with each row's padding moved to its front."""
    pads = (batch["attention_mask"] == 0).sum(dim=1).tolist()
    return {key: torch.stack([row.roll(pad) for row, pad in zip(value, pads)]) for key, value in batch.items()}


def embeddings_and_grads(encoder: SentenceEncoder, batch: dict, unpadded: bool):
    encoder.config.unpadded = unpadded
    encoder.zero_grad()
    embeddings = encoder(**batch).embeddings
    (embeddings * torch.linspace(-1, 1, embeddings.numel()).view_as(embeddings)).sum().backward()
    grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    return embeddings.detach(), grads


@contextmanager
def counted(owner, name: str):
    """Counts the calls of `owner.name` inside the block (the list of calls is yielded)."""
    calls = []
    original = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        yield calls
    finally:
        setattr(owner, name, original)


def max_differences(directory, pooling: str, **overrides) -> tuple[float, float]:
    with counted(backbone_forward, "unpadded_forward") as calls:
        forward, gradient = _max_differences(directory, pooling, **overrides)
    assert len(calls) == 1, "the unpadded run did not take the unpadded route"
    return forward, gradient


def _max_differences(directory, pooling: str, **overrides) -> tuple[float, float]:
    encoder = SentenceEncoder.from_backbone(str(directory), pooling=pooling, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0, **overrides)
    if pooling == "prompt":  # the [MASK] state of a template (PromptBERT)
        encoder.use_prompt('This sentence : "[X]" means [MASK] .')
    encoder.train()
    batch = mixed_batch(encoder)
    padded, padded_grads = embeddings_and_grads(encoder, batch, unpadded=False)
    packed, packed_grads = embeddings_and_grads(encoder, batch, unpadded=True)
    assert padded_grads.keys() == packed_grads.keys() and padded_grads
    # relative to the largest gradient where it exceeds 1: training runs the explicit attention product, whose fp32
    # rounding differs from transformers' SDPA by ~1e-5 of the largest gradients
    scale = max(1.0, max(g.abs().max().item() for g in padded_grads.values()))
    grad_diff = max((padded_grads[k] - packed_grads[k]).abs().max().item() for k in padded_grads) / scale
    return (padded - packed).abs().max().item(), grad_diff


@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_unpadded_equals_padded_forward_and_gradients(tiny_backbone_dir, pooling):
    forward, gradient = max_differences(tiny_backbone_dir, pooling)
    print(f"{tiny_backbone_dir.name} {pooling}: forward {forward:.2e}, gradient {gradient:.2e}")
    assert forward <= TOLERANCE and gradient <= TOLERANCE


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_explicit_attention_equals_padded(tiny_backbone_dir, pooling):
    """Eager attention takes the explicit route (mask in the score GEMM, fp32 softmax), as training with dropout
    does; with dropout 0 it equals transformers' own eager forward and gradients."""
    forward, gradient = max_differences(tiny_backbone_dir, pooling, attn_implementation="eager")
    print(f"{tiny_backbone_dir.name} {pooling} eager: forward {forward:.2e}, gradient {gradient:.2e}")
    assert forward <= TOLERANCE and gradient <= TOLERANCE


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_lora_projections_run_unfused_and_match(tiny_bert_dir, pooling):
    """LoRA layers on query and value: the fused Q|K|V GEMM steps aside for the modules' own forwards."""
    with counted(unpadded._StackedProjection, "apply") as calls:
        forward, gradient = max_differences(tiny_bert_dir, pooling, peft={"r": 4, "lora_alpha": 8,
                                                                          "init_lora_weights": False})
    assert not calls, "the fused projection ran on LoRA layers"
    assert forward <= TOLERANCE and gradient <= TOLERANCE


def test_nearly_full_batches_run_padded(tiny_bert_dir):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    with counted(backbone_forward, "unpadded_forward") as calls:
        full = encoder.tokenizer(["one two three four"] * 4, padding=True, return_tensors="pt")
        encoder(input_ids=full["input_ids"], attention_mask=full["attention_mask"])
        assert not calls, "a batch without padding took the unpadded route"
        encoder(**mixed_batch(encoder))
        assert calls == [1]


def test_packed_rows_come_in_buckets_of_real_tokens_then_padding():
    mask = torch.zeros(9, 20, dtype=torch.long)
    for row, length in enumerate([20, 3, 7, 1, 12, 20, 5, 9, 2]):
        mask[row, :length] = 1
    packing = Packing.of(mask, num_heads=2, dtype=torch.float32)
    real = mask.flatten().nonzero().flatten()
    assert len(packing.tokens.rows) == 128 and 128 % TOKEN_BUCKET == 0  # 79 real + 49 padding
    assert torch.equal(packing.tokens.rows[:79], real) and (mask.flatten()[packing.tokens.rows[79:]] == 0).all()
    assert torch.equal(packing.output.rows, real)
    small = Packing.of(mask[:2, :5], num_heads=2, dtype=torch.float32)
    assert len(small.tokens.rows) == 10  # never more rows than the padded batch has


@pytest.mark.parametrize("pooling_layer", [0, 1])
def test_unpadded_equals_padded_at_other_layers(tiny_backbone_dir, pooling_layer):
    forward, gradient = max_differences(tiny_backbone_dir, "mean", pooling_layer=pooling_layer)
    assert forward <= TOLERANCE and gradient <= TOLERANCE


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_unpadded_hidden_states_equal_on_real_tokens(tiny_backbone_dir, attention):
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean", attn_implementation=attention)
    encoder.eval()
    use_fast_dropout(encoder)  # sdpa -> sdpa_fast_dropout: plain SDPA in eval mode
    batch = mixed_batch(encoder)
    with torch.no_grad():
        padded = encoder.backbone(**batch, output_hidden_states=True).hidden_states
        packed = unpadded_forward(encoder.backbone, batch["input_ids"], batch["attention_mask"],
                                  output_hidden_states=True).hidden_states
    real = batch["attention_mask"].bool()
    assert len(padded) == len(packed)
    for a, b in zip(padded, packed):
        assert (a[real] - b[real]).abs().max().item() <= TOLERANCE
        assert (b[~real] == 0).all()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_unpadded_with_token_types_and_gradient_checkpointing(tiny_bert_dir, pooling):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling=pooling, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)
    encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    encoder.train()
    batch = mixed_batch(encoder)
    batch["token_type_ids"] = (torch.arange(batch["input_ids"].shape[1]) % 2).expand_as(batch["input_ids"])
    padded, padded_grads = embeddings_and_grads(encoder, batch, unpadded=False)
    packed, packed_grads = embeddings_and_grads(encoder, batch, unpadded=True)
    assert (padded - packed).abs().max() <= TOLERANCE
    assert max((padded_grads[k] - packed_grads[k]).abs().max().item() for k in padded_grads) <= TOLERANCE


def test_encode_uses_unpadded_path_by_default_and_matches(tiny_backbone_dir):
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean")
    assert encoder.config.unpadded and backbone_route(encoder.backbone, torch.device("cpu")) == "unpadded"
    sentences = random_sentences(20, seed=3, min_words=1, max_words=14)
    packed = encoder.encode(sentences, batch_size=8)
    encoder.config.unpadded = False
    padded = encoder.encode(sentences, batch_size=8)
    assert abs(packed - padded).max() <= TOLERANCE


def test_dropout_keeps_its_rate_on_real_tokens(tiny_bert_dir):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", hidden_dropout_prob=0.5)
    use_fast_dropout(encoder)
    encoder.train()
    batch = mixed_batch(encoder)
    torch.manual_seed(0)
    a = encoder(**batch).embeddings
    b = encoder(**batch).embeddings
    assert not torch.allclose(a, b)  # dropout is active on the unpadded path


@contextmanager
def rows_seen(module: torch.nn.Module):
    """The row counts of the (tokens, d) inputs `module` sees inside the block."""
    rows = []
    handle = module.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[:-1].numel()))
    try:
        yield rows
    finally:
        handle.remove()


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("route", ["unpadded", "padded"])
def test_cls_pooling_runs_the_last_layer_on_first_positions_only(tiny_backbone_dir, mode, route):
    """[CLS] pooling reads one position of the last layer: its query and feed-forward block run on one row per
    sentence, the layers below on every token (packed, or padded positions on the padded route); mean pooling runs
    the feed-forward block on every token."""
    batch_rows, queries = {}, {}
    for pooling in ("cls", "cls_before_pooler", "mean"):
        encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling=pooling, unpadded=route == "unpadded")
        getattr(encoder, mode)()
        batch = mixed_batch(encoder)
        layers = encoder.transformer_layers()
        with (rows_seen(layers[-1].intermediate.dense) as last, rows_seen(layers[0].intermediate.dense) as first,
              rows_seen(layers[-1].attention.self.query) as query):
            encoder(**batch)
        batch_rows[pooling], queries[pooling] = (first, last), query
    size, tokens = len(batch["input_ids"]), batch_rows["mean"][0][0]
    assert tokens > size
    assert batch_rows["cls"] == batch_rows["cls_before_pooler"] == ([tokens], [size])
    assert batch_rows["mean"] == ([tokens], [tokens])
    assert queries["cls"] == queries["cls_before_pooler"] == [size]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_first_token_layer_equals_the_full_layer_at_the_first_position(tiny_backbone_dir, mode):
    """With left padding some first positions are padding: zeros there, as the full unpadded route returns; the
    other rows equal the full route's first position."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="cls", hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)
    getattr(encoder, mode)()
    batch = mixed_batch(encoder)
    left = left_padded(batch)
    assert (left["attention_mask"][:, 0] == 0).any() and (left["attention_mask"][:, 0] == 1).any()
    for inputs in (batch, left):
        full = unpadded_forward(encoder.backbone, inputs["input_ids"], inputs["attention_mask"]).last_hidden_state
        first = unpadded_forward(encoder.backbone, inputs["input_ids"], inputs["attention_mask"],
                                 first_token_only=True).last_hidden_state
        assert first.shape == (len(full), 1, full.shape[-1])
        assert (first[:, 0] - full[:, 0]).abs().max().item() <= TOLERANCE
        assert (first[inputs["attention_mask"][:, 0] == 0] == 0).all()
    with pytest.raises(ValueError, match="hidden_states"):
        unpadded_forward(encoder.backbone, batch["input_ids"], batch["attention_mask"], output_hidden_states=True,
                         first_token_only=True)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("padding", ["mixed", "left", "none"])
def test_padded_first_token_forward_equals_the_backbones_own(tiny_backbone_dir, attention, padding):
    """The padded route's [CLS] shortcut against the backbone's own full forward: the first position's state and
    every parameter's gradient through it (training mode, dropout 0), and the state in eval mode (SDPA); batches
    with right padding, left padding, and none (SDPA's mask is then None)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="cls", attn_implementation=attention,
                                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    use_fast_dropout(encoder)
    batch = mixed_batch(encoder)
    if padding == "left":
        batch = left_padded(batch)
    elif padding == "none":
        batch = {key: value[:, :3] for key, value in batch.items()}
        assert batch["attention_mask"].all()
    weights = torch.linspace(-1, 1, encoder.config.backbone_config.hidden_size)
    for mode in ("train", "eval"):
        getattr(encoder, mode)()
        results = []
        for run in (lambda: encoder.backbone(**batch).last_hidden_state[:, 0],
                    lambda: unpadded.padded_first_token_forward(encoder.backbone, **batch).last_hidden_state[:, 0]):
            encoder.zero_grad()
            state = run()
            (state * weights).sum().backward()
            results.append((state.detach(), {n: p.grad.clone() for n, p in encoder.named_parameters()
                                             if p.grad is not None}))
        (own, own_grads), (first, first_grads) = results
        assert (own - first).abs().max().item() <= TOLERANCE, mode
        assert own_grads.keys() == first_grads.keys() and own_grads
        scale = max(1.0, max(g.abs().max().item() for g in own_grads.values()))  # as in `_max_differences`
        assert max((own_grads[k] - first_grads[k]).abs().max().item() for k in own_grads) / scale <= TOLERANCE, mode


# ---------------------------------------------------------------------- routes
def test_route_decision():
    assert choose_route(None, "cpu", "sdpa") == ("unpadded", None)
    assert choose_route(None, "cpu", "sdpa_fast_dropout") == ("unpadded", None)
    assert choose_route(None, "cpu", "eager") == ("unpadded", None)
    route, why = choose_route(None, "cuda", "sdpa")  # packing would read the token count on the host
    assert route == "padded" and "padded view" in why
    assert choose_route(None, "cuda", "flash_attention_2") == ("flattened", None)  # transformers' varlen route
    assert choose_route(None, "cuda", "kernels-community/flash-attn") == ("flattened", None)
    route, why = choose_route(None, "cpu", "flex_attention")
    assert route == "padded" and "flex_attention" in why
    route, why = choose_route("model type 'gpt2' is not ...", "cuda", "flash_attention_2")
    assert route == "padded" and "gpt2" in why


def test_unsupported_backbone_falls_back_with_one_log_line(caplog):
    from transformers import DistilBertConfig, DistilBertModel

    backbone = DistilBertModel(DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32))
    with caplog.at_level(logging.INFO, logger="hf_sentcl.modeling.routes"):
        for _ in range(3):
            assert backbone_route(backbone, torch.device("cpu")) == "padded"
    lines = [r.getMessage() for r in caplog.records if r.name == "hf_sentcl.modeling.routes"]
    assert len(lines) == 1 and "Padded encoder path for DistilBertModel" in lines[0] and "distilbert" in lines[0]


def test_disabled_route_is_padded_without_log(tiny_bert_dir, caplog):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), unpadded=False)
    with caplog.at_level(logging.INFO, logger="hf_sentcl.modeling.routes"):
        assert backbone_route(encoder.backbone, torch.device("cpu"), encoder.config.unpadded) == "padded"
    assert not caplog.records


def test_flattened_batch_matches_transformers_collator(tiny_backbone_dir):
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir))
    batch = mixed_batch(encoder)
    start = position_ids_start(encoder.backbone)
    assert start == (encoder.backbone.config.pad_token_id + 1 if "roberta" in tiny_backbone_dir.name else 0)
    ours = flattened_batch(batch["input_ids"], batch["attention_mask"], start)
    features = [{"input_ids": ids[mask.bool()].tolist()} for ids, mask in zip(batch["input_ids"],
                                                                               batch["attention_mask"])]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, position_ids_start=start)(features)
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(ours[key], theirs[key]) and ours[key].dtype == theirs[key].dtype, key
    assert ours["max_length_q"] == theirs["max_length_q"] == ours["max_length_k"]


# ---------------------------------------------------------------------- one training step per method
METHOD_RECIPES = {
    "simcse": {"pooling": "cls", "head": "mlp"},
    "byop": {"method": "simcse", "perturbation": "n-", "margin": 0.05},
    "simcse_sup": {"head": "mlp", "train_file": "{nli}"},
    "sg": {"method": "self_guided", "objective": "sg", "head": "none", "projection_size": 16},
    "sg-opt": {"method": "self_guided", "objective": "sg-opt", "head": "none", "projection_size": 16},
    "consert": {"head": "none", "pooling": "mean", "augmentation1": "shuffle", "augmentation2": "token_cutoff"},
    "consert-feature": {"method": "consert", "head": "none", "pooling": "mean", "augmentation1": "feature_cutoff",
                        "augmentation2": "dropout"},
    "clear": {"head": "none", "augmentation": "del_span", "mlm_weight": 1.0},
}


def method_stage(method, tmp_path, tiny_bert_dir, senteval_dir, **overrides):
    from hf_sentcl.pipeline.train import build_stage
    from hf_sentcl.recipe.parser import parse_recipe
    from hf_sentcl.recipe.plan import plan_run

    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=3, min_words=1, max_words=14)) + "\n")
    nli = tmp_path / "nli.csv"
    rows = random_sentences(48, seed=5, min_words=1, max_words=12)
    nli.write_text("sent0,sent1,hard_neg\n" + "".join(f"{a},{b},{c}\n" for a, b, c in zip(*[iter(rows)] * 3)))
    values = {"method": method, "model_name_or_path": tiny_bert_dir, "train_file": corpus, "sts_data_dir":
              senteval_dir, "output_dir": tmp_path / "out", "dropout": 0.0, "per_device_train_batch_size": 8,
              "use_cpu": "true", "report_to": "none", "eval_strategy": "no", "load_best_model_at_end": "false",
              "save_strategy": "no", "disable_tqdm": "true"}
    values.update({k: (nli if v == "{nli}" else v) for k, v in METHOD_RECIPES[method].items()})
    values.update(overrides)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return build_stage(plan_run(parse_recipe(recipe)))


@pytest.mark.parametrize("method", list(METHOD_RECIPES))
def test_one_training_step_per_method_equal_loss(method, tmp_path, tiny_bert_dir, senteval_dir):
    stage = method_stage(method, tmp_path, tiny_bert_dir, senteval_dir)
    trainer, encoder = stage.trainer, stage.encoder
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    assert (inputs["attention_mask"] == 0).any()
    results = []
    for unpadded_on in (False, True):
        encoder.config.unpadded = unpadded_on
        encoder.train()
        encoder.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # the same augmentations and sampled layers in both runs
        loss = trainer.compute_loss(encoder, dict(inputs))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (padded_loss, padded_grads), (loss, grads) = results
    print(f"{method}: loss {padded_loss.item():.6f} vs {loss.item():.6f}")
    assert abs(loss - padded_loss).item() <= TOLERANCE * max(1.0, abs(padded_loss.item()))
    assert grads.keys() == padded_grads.keys()
    # relative to each parameter's largest gradient where it exceeds 1 (SG's head gets gradients in the thousands)
    assert max((grads[k] - padded_grads[k]).abs().max().item() / max(1.0, padded_grads[k].abs().max().item())
               for k in grads) <= 1e-4


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_bf16_autocast_matches_padded(tiny_bert_dir, pooling):
    """Under bf16 autocast the fused Q|K|V keeps its bf16 operands for backward and returns the hidden-state
    gradient of all three projections as one GEMM: every parameter's gradient still matches the padded path's
    within bf16 rounding (relative to that parameter's largest gradient)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling=pooling, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)
    encoder.train()
    batch = mixed_batch(encoder)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded, padded_grads = embeddings_and_grads(encoder, batch, unpadded=False)
        with counted(unpadded._StackedProjection, "apply") as calls:
            packed, packed_grads = embeddings_and_grads(encoder, batch, unpadded=True)
    assert calls, "the fused projection did not run"
    assert padded_grads.keys() == packed_grads.keys()
    # a key bias shifts every score of a query alike: its exact gradient is 0, so it has no scale to compare with
    compared = [k for k in padded_grads if not k.endswith("key.bias")]
    worst = max(((padded_grads[k] - packed_grads[k]).abs().max() / padded_grads[k].abs().max()).item()
                for k in compared)
    print(f"bf16 {pooling}: forward {(padded - packed).abs().max().item():.2e}, worst relative gradient {worst:.2e}")
    assert (torch.allclose(packed.float(), padded.float(), atol=3e-2)
            and worst < 1.2e-2)  # 5.7e-3 here; 2.4e-2 without K, V


def test_training_runs_the_explicit_product_and_inference_sdpa(tiny_bert_dir):
    """SDPA's CPU backward is 7x the explicit product's in bf16: training forwards without dropout (ConSERT's)
    run the explicit product too; inference keeps SDPA."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)
    batch = mixed_batch(encoder)
    kernels = {}
    for mode in ("train", "eval"):
        getattr(encoder, mode)()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            encoder(**batch)
        kernels[mode] = {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}
    assert not kernels["train"] and kernels["eval"], kernels
