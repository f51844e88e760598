"""CLEARTrainer on tiny random BERT/RoBERTa: the MLM head (loaded or initialised, tied, training-only), the single
forward pass against separate passes, the training smoke test (both loss terms fall, weights change), the saved
encoder as a plain backbone, from-scratch pre-training, and the config's checks."""

import logging
import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import build_tiny_bert, build_tiny_roberta, random_sentences, write_wordnet
from safetensors import safe_open
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, TrainerState

from hf_sentcl import SentenceEncoder
from hf_sentcl.augment.wordnet import WordNetError
from hf_sentcl.cli import train as train_cli
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.export.writer import export_encoder
from hf_sentcl.losses import nt_xent
from hf_sentcl.methods.clear.collator import DELETE_TOKEN, EXAMPLE_INDEX, CLEARCollator
from hf_sentcl.methods.clear.config import CLEARConfig
from hf_sentcl.methods.clear.trainer import (
    HEADS_FILE,
    HEADS_NAME,
    CLEARTrainer,
    CollatorEpoch,
    masked_lm_loss,
)
from hf_sentcl.pipeline import train as run_module
from hf_sentcl.trainers.heads import refuse_sharded_weights


def make_args(tmp_path, **overrides) -> CLEARConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=2e-3, num_train_epochs=1,
        eval_strategy="no", load_best_model_at_end=False, save_strategy="no", report_to="none", use_cpu=True,
        logging_steps=1, seed=0, disable_tqdm=True, projection_dim=16,
    )
    settings.update(overrides)
    return CLEARConfig(**settings)


def make_trainer(model_dir, tmp_path, n=16, encoder_kwargs=None, **overrides):
    encoder = SentenceEncoder.from_backbone(str(model_dir), pooling="cls", head="none", **(encoder_kwargs or {}))
    sentences = random_sentences(n, seed=3, min_words=8, max_words=14)
    dataset = tokenize_views(Dataset.from_dict({"text": sentences}), encoder.tokenizer, ("text",), 32)
    trainer = CLEARTrainer(
        model=encoder, args=make_args(tmp_path, **overrides), train_dataset=dataset,
        data_collator=ViewCollator(encoder.tokenizer),
    )
    return encoder, trainer


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------------ the MLM loss
def test_masked_lm_loss_matches_hand_computation():
    """Mean over the masked positions of -log softmax(head(h))[label], in float64 loops for the reference."""
    torch.manual_seed(0)
    head = nn.Linear(6, 11)
    hidden = torch.randn(3, 5, 6)
    labels = torch.full((3, 5), -100)
    labels[0, 1], labels[1, 4], labels[2, 0], labels[2, 3] = 3, 10, 0, 7
    logits = head(hidden).detach().double().numpy()
    terms = []
    for b in range(3):
        for t in range(5):
            if labels[b, t] != -100:
                row = logits[b, t]
                terms.append(math.log(sum(math.exp(x) for x in row)) - row[labels[b, t]])
    assert masked_lm_loss(head, hidden, labels).item() == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    nothing = masked_lm_loss(head, hidden, torch.full((3, 5), -100))
    assert nothing.item() == 0.0 and nothing.requires_grad


# ------------------------------------------------------------------------------------------ setup
def test_bare_checkpoint_gets_a_fresh_tied_mlm_head_and_del_token(tiny_bert_dir, tmp_path, caplog):
    """The tiny BERT (like all-MiniLM-L6-v2) is a bare BertModel: the head is initialised and the log says so;
    [DEL] is added and the embeddings (and the tied decoder) grow by one row; the heads are training-only."""
    vocab = len(AutoTokenizer.from_pretrained(tiny_bert_dir))
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        encoder, trainer = make_trainer(tiny_bert_dir, tmp_path)
    assert "no masked-LM head weights" in caplog.text and "freshly initialised" in caplog.text
    tokenizer = encoder.tokenizer
    assert len(tokenizer) == vocab + 1 and tokenizer.convert_tokens_to_ids(DELETE_TOKEN) == vocab
    embeddings = encoder.backbone.get_input_embeddings().weight
    assert embeddings.shape[0] == vocab + 1
    assert encoder.config.backbone_config.vocab_size == encoder.backbone.config.vocab_size == vocab + 1
    heads = getattr(encoder, HEADS_NAME)
    assert heads["mlm"].predictions.decoder.weight is embeddings
    assert heads["mlm"].predictions.decoder.bias is heads["mlm"].predictions.bias
    assert heads["mlm"].predictions.decoder.out_features == vocab + 1
    assert heads["mlm"].predictions.bias.shape == (vocab + 1,)
    assert {f"{HEADS_NAME}.{k}" for k in heads.state_dict()} <= encoder._keys_to_ignore_on_save
    assert isinstance(trainer.data_collator, CLEARCollator) and trainer.data_collator.num_views == 3
    assert EXAMPLE_INDEX in trainer.train_dataset.column_names


@pytest.mark.slow
def test_existing_mlm_head_is_loaded(tiny_bert_dir, tmp_path, caplog):
    """A checkpoint saved with its masked-LM head (BertForMaskedLM) keeps the head's trained weights."""
    torch.manual_seed(1)
    mlm = AutoModelForMaskedLM.from_pretrained(tiny_bert_dir)
    with torch.no_grad():
        mlm.cls.predictions.transform.dense.weight.normal_()
    mlm.save_pretrained(tmp_path / "mlm")
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "mlm")
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        encoder, _ = make_trainer(tmp_path / "mlm", tmp_path, augmentation="reorder")
    assert "freshly initialised" not in caplog.text
    head = getattr(encoder, HEADS_NAME)["mlm"]
    torch.testing.assert_close(head.predictions.transform.dense.weight, mlm.cls.predictions.transform.dense.weight)
    assert len(encoder.tokenizer) == mlm.config.vocab_size  # reorder deletes nothing: no [DEL], no resize


def test_encoder_head_must_be_none(tiny_bert_dir, tmp_path):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    with pytest.raises(ValueError, match="head: none"):
        CLEARTrainer(model=encoder, args=make_args(tmp_path), train_dataset=None)


# ------------------------------------------------------------------------------------------ the training step
@pytest.mark.parametrize("perturbation,reduction", [(None, "sum"), ("p+n-", "sum"), (None, "mean")])
def test_one_forward_equals_separate_passes(tiny_backbone_dir, tmp_path, perturbation, reduction):
    """compute_loss stacks the masked originals and both views into ONE backbone forward; with dropout off the
    loss equals an MLM pass on the originals alone plus a pass on the views alone (and the IFM/BYOP margin reaches
    the NT-Xent, summed over the 2N views or averaged as cl_reduction says)."""
    margin = {"perturbation": perturbation, "margin": 0.1} if perturbation else {}
    encoder, trainer = make_trainer(tiny_backbone_dir, tmp_path, augmentation="del_word", temperature=0.2,
                                    cl_reduction=reduction, **margin)
    batch = next(iter(trainer.get_train_dataloader()))
    calls = []
    encoder.backbone.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    encoder.train()
    encoder.backbone.eval()  # no dropout, so both computations see the same network
    loss = trainer.compute_loss(encoder, batch)
    assert calls == [(3 * 8, batch["input_ids"].shape[2])]

    heads = getattr(encoder, HEADS_NAME)
    embeddings = encoder.backbone.get_input_embeddings().weight
    assert [m for m in heads["mlm"].modules() if isinstance(m, nn.Linear) and m.weight is embeddings]  # tied decoder
    ids, mask = batch["input_ids"], batch["attention_mask"]
    originals = encoder.backbone(input_ids=ids[:, 0], attention_mask=mask[:, 0]).last_hidden_state
    mlm = masked_lm_loss(heads["mlm"], originals, batch["mlm_labels"])
    views = [encoder.backbone(input_ids=ids[:, v], attention_mask=mask[:, v]).last_hidden_state[:, 0] for v in (1, 2)]
    z1, z2 = (heads["projection"](v) for v in views)
    contrastive = nt_xent(z1, z2, 0.2, **({"perturbation": perturbation, "margin": 0.1} if perturbation else {}))
    if reduction == "sum":
        contrastive = contrastive * 2 * 8
    assert loss.item() == pytest.approx((mlm + contrastive).item(), rel=1e-5)
    logged = {k: torch.stack(v).item() for k, v in trainer._metrics.items()}
    assert logged["train/mlm_loss"] == pytest.approx(mlm.item(), rel=1e-5)
    assert logged["train/contrastive_loss"] == pytest.approx(contrastive.item(), rel=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_heads_follow_the_training_precision(tiny_bert_dir, tmp_path, bf16):
    """With `bf16: true`, g and the MLM head run under the model's bf16 autocast although they sit outside its
    forward; the MLM cross-entropy and the loss stay fp32."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, augmentation="del_word", bf16=bf16)
    heads = getattr(encoder, HEADS_NAME)
    dtypes = {}
    for name in ("projection", "mlm"):
        linear = [m for m in heads[name].modules() if isinstance(m, nn.Linear)][-1]
        linear.register_forward_hook(lambda module, args, out, name=name: dtypes.update({name: out.dtype}))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test skips
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.training_step(trainer.model, batch)
    expected = torch.bfloat16 if bf16 else torch.float32
    assert dtypes == {"projection": expected, "mlm": expected} and loss.dtype == torch.float32


@pytest.fixture(scope="module", params=["bert", "roberta"])
def spread_backbone_dir(request, tmp_path_factory):
    """Tiny BERT / RoBERTa initialised with std 0.2: with BERT's 0.02 the 2-layer random model gives every sentence
    the same [CLS] state (cosine 1.0), the collapse point where the contrastive loss has no gradient to start from."""
    build = build_tiny_bert if request.param == "bert" else build_tiny_roberta
    return build(tmp_path_factory.mktemp(f"spread-{request.param}"), initializer_range=0.2)


def test_cached_step_equals_plain_step(tiny_bert_dir, tmp_path):
    """`mini_batch_size` splits CLEAR's batch (mini-batches of 3, 3, 2 sentences): with dropout off the loss and the
    gradient of every parameter (backbone, g and the MLM head) equal the plain step's, the MLM term weighted by the
    mini-batches' masked tokens."""
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, encoder_kwargs=no_dropout, augmentation="del_word")
    trainer.current_gradient_accumulation_steps = 1
    inputs = next(iter(trainer.get_train_dataloader()))

    def step(mini_batch_size):
        trainer.args.mini_batch_size = mini_batch_size
        encoder.zero_grad(set_to_none=True)
        loss = trainer.training_step(trainer.model, inputs)
        return loss.detach(), {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}

    (plain_loss, plain), (cached_loss, cached) = step(None), step(3)
    assert cached_loss.item() == pytest.approx(plain_loss.item(), rel=1e-5)
    assert plain.keys() == cached.keys()
    assert any(k.startswith(f"{HEADS_NAME}.mlm.") for k in plain) and any(".projection." in k for k in plain)
    for name in plain:
        torch.testing.assert_close(cached[name], plain[name], atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.slow
def test_training_both_losses_fall_and_weights_change(spread_backbone_dir, tmp_path):
    """80 steps on 16 sentences: the logged MLM and contrastive terms both fall clearly (the contrastive one from
    about ln(2N - 1) = 2.71), and the backbone and both heads change; the saved checkpoint holds no head weights
    (they go to their own file)."""
    encoder, trainer = make_trainer(
        spread_backbone_dir, tmp_path, num_train_epochs=40, augmentation="del_word", del_word_rate=0.2
    )
    before = snapshot(encoder)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "mlm_loss" in entry]
    assert len(logs) == 80
    for key in ("mlm_loss", "contrastive_loss"):
        values = np.array([entry[key] for entry in logs])
        assert np.isfinite(values).all()
        assert values[-10:].mean() < values[:10].mean() - 0.2, (key, values[:10].mean(), values[-10:].mean())
    after = encoder.state_dict()
    for prefix in ("backbone.encoder.", "backbone.embeddings.word", f"{HEADS_NAME}.projection.", f"{HEADS_NAME}.mlm."):
        changed = [k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])]
        assert changed, prefix

    trainer.save_model(str(tmp_path / "saved"))
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(k.startswith("backbone.") for k in keys)
    with safe_open(str(tmp_path / "saved" / HEADS_FILE), "pt") as f:
        head_keys = set(f.keys())
    assert any(k.startswith("projection.") for k in head_keys) and any(k.startswith("mlm.") for k in head_keys)
    assert not any(k.endswith("decoder.weight") for k in head_keys)  # tied to the embeddings, saved with them


@pytest.mark.slow
def test_export_is_a_plain_backbone_with_the_del_token(tiny_bert_dir, tmp_path):
    """The exported encoder loads with AutoModel as a plain BertModel (resized vocabulary, [DEL] in the tokenizer)
    and holds no MLM or projection weights; the export reproduces the encoder (verify=True)."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=2)
    trainer.train()
    out = tmp_path / "export"
    export_encoder(trainer.accelerator.unwrap_model(trainer.model), out, verify=True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert not any(part in k for k in keys for part in ("cls.", "predictions", "lm_head", "projection", HEADS_NAME))
    model = AutoModel.from_pretrained(out)
    assert type(model).__name__ == "BertModel"
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert DELETE_TOKEN in tokenizer.get_vocab() and model.config.vocab_size == len(tokenizer)


@pytest.mark.slow
def test_mlm_weight_zero_trains_contrastive_only(tiny_bert_dir, tmp_path):
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, mlm_weight=0.0, max_steps=2)
    assert "mlm" not in getattr(encoder, HEADS_NAME)
    assert trainer.data_collator.num_views == 2
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all("mlm_loss" not in e and e["loss"] == pytest.approx(e["contrastive_loss"], rel=1e-4) for e in logs)


@pytest.mark.slow
def test_views_change_between_epochs(tiny_bert_dir, tmp_path):
    """The trainer tells the collator each epoch's number, so an example's views differ from epoch to epoch."""
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, num_train_epochs=2)
    collator = trainer.data_collator
    seen: dict[tuple[int, int], list[list[int]]] = {}
    augment = collator.augment

    def recording(ids, index, view):
        out = augment(ids, index, view)
        seen.setdefault((collator.epoch, view), []).append(out)
        return out

    collator.augment = recording
    trainer.train()
    assert {epoch for epoch, _ in seen} == {0, 1}
    assert seen[(0, 1)] != seen[(1, 1)]
    callback = CollatorEpoch(collator)
    callback.on_epoch_begin(trainer.args, TrainerState(epoch=2.5), None)
    assert collator.epoch == 2


@pytest.mark.slow
def test_heads_file_restores_heads_on_resume(tiny_bert_dir, tmp_path):
    encoder, trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=1)
    trainer.train()
    checkpoint = tmp_path / "ckpt"
    trainer._save(str(checkpoint))
    heads = getattr(encoder, HEADS_NAME)
    saved = snapshot(heads)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(1.0)
    trainer._load_from_checkpoint(str(checkpoint))
    for key, value in heads.state_dict().items():
        torch.testing.assert_close(value, saved[key])


# ------------------------------------------------------------------------------------------ from scratch
@pytest.mark.slow
def test_from_scratch_builds_a_fresh_backbone_of_the_recipe_size(tiny_bert_dir, tmp_path, caplog):
    pretrained = AutoModel.from_pretrained(tiny_bert_dir)
    with caplog.at_level(logging.WARNING, logger="hf_sentcl"):
        encoder, trainer = make_trainer(
            tiny_bert_dir, tmp_path, from_scratch=True, scratch_num_hidden_layers=1, scratch_hidden_size=16,
            scratch_num_attention_heads=2, scratch_intermediate_size=24, max_steps=3,
        )
    assert "the fresh backbone" in caplog.text
    config = encoder.backbone.config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (1, 16, 24)
    assert encoder.config.backbone_config.num_hidden_layers == 1 and encoder.config.hidden_size == 16
    assert len(encoder.backbone.encoder.layer) == 1
    fresh, old = encoder.backbone.embeddings.word_embeddings.weight, pretrained.embeddings.word_embeddings.weight
    assert not torch.allclose(fresh[: old.shape[0], :16], old[:, :16])
    trainer.train()
    assert all(np.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    assert encoder.encode(["a man plays the guitar"]).shape == (1, 16)


def test_from_scratch_run_evaluates_the_fresh_backbone_before_training(
    tiny_bert_dir, senteval_dir, tmp_path, monkeypatch
):
    """The "before training" row of a from_scratch run scores the freshly built backbone, not the checkpoint."""

    class Stop(Exception):
        pass

    evaluated = []

    def record_and_stop(encoder, stage):
        evaluated.append(encoder.backbone.config.num_hidden_layers)
        raise Stop

    monkeypatch.setattr(run_module, "evaluate_suites", record_and_stop)
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(8, seed=3, min_words=8, max_words=14)) + "\n")
    recipe = tmp_path / "clear.yaml"
    recipe.write_text(
        f"method: clear\nmodel_name_or_path: {tiny_bert_dir}\npooling: cls\nhead: none\ntrain_file: {corpus}\n"
        f"sts_data_dir: {senteval_dir}\noutput_dir: {tmp_path / 'out'}\naugmentation: del_word\nuse_cpu: true\n"
        "from_scratch: true\nscratch_num_hidden_layers: 1\nper_device_train_batch_size: 4\n"
    )
    assert AutoModel.from_pretrained(tiny_bert_dir).config.num_hidden_layers != 1
    with pytest.raises(Stop):
        train_cli.main([str(recipe)])
    assert evaluated == [1]


# ------------------------------------------------------------------------------------------ config and errors
@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"augmentation": "del_word+crop"}, "key 'augmentation'.*crop"),
        ({"augment_level": "char"}, "augment_level"),
        ({"del_word_rate": 1.0}, "del_word_rate"),
        ({"subs_rate": 0.0}, "subs_rate"),
        ({"del_span_count": 0}, "del_span_count"),
        ({"reorder_pairs": -1}, "reorder_pairs"),
        ({"temperature": 0.0}, "temperature"),
        ({"mlm_probability": 1.0}, "mlm_probability"),
        ({"mlm_weight": -1.0}, "mlm_weight"),
        ({"cl_reduction": "max"}, "cl_reduction"),
        ({"scratch_num_hidden_layers": 2}, "from_scratch"),
        ({"perturbation": "p+", "margin": 0.0}, "margin"),
        ({"dataloader_num_workers": 2, "dataloader_persistent_workers": True}, "persistent_workers"),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        make_args(tmp_path, **overrides)


def test_config_defaults_are_the_papers():
    args = CLEARConfig(output_dir="x", use_cpu=True)
    assert (args.del_word_rate, args.del_span_count, args.del_span_fraction) == (0.7, 5, 0.05)
    assert (args.reorder_pairs, args.reorder_fraction, args.subs_rate) == (5, 0.05, 0.3)
    assert (args.mlm_probability, args.mlm_weight, args.cl_reduction) == (0.15, 1.0, "sum")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_cl_loss_reductions_match_a_hand_computation(reduction):
    """Eq. 1-2: l(i, j) = -log exp(sim(z_i, z_j)/tau) / sum_{k != i} exp(sim(z_i, z_k)/tau), L_CL the sum over all
    2N ordered positive pairs (i, j); 'mean' divides it by 2N. Computed here with plain loops over Python floats."""
    torch.manual_seed(0)
    n, tau = 5, 0.3
    z1, z2 = torch.randn(n, 7, dtype=torch.float64), torch.randn(n, 7, dtype=torch.float64)
    z = [v.tolist() for v in torch.cat([z1, z2])]

    def sim(u, v):
        dot = sum(a * b for a, b in zip(u, v))
        return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))

    total = 0.0
    for i in range(2 * n):
        j = (i + n) % (2 * n)  # m(i, j) = 1 only for the other view of the same sentence
        denominator = sum(math.exp(sim(z[i], z[k]) / tau) for k in range(2 * n) if k != i)
        total += -math.log(math.exp(sim(z[i], z[j]) / tau) / denominator)
    expected = total if reduction == "sum" else total / (2 * n)
    assert nt_xent(z1, z2, tau, reduction=reduction).item() == pytest.approx(expected, rel=1e-6)  # fp32 logits


@pytest.mark.parametrize("fsdp, zero_stage", [(True, None), (False, 3)])
def test_sharded_weights_are_refused(fsdp, zero_stage):
    """The heads run outside the encoder's forward: FSDP and ZeRO-3 are refused, DDP and ZeRO-2 are not."""
    plugin = None if zero_stage is None else type("Plugin", (), {"zero_stage": zero_stage})()
    stub = type("Stub", (), {"is_fsdp_enabled": fsdp})()
    stub.accelerator = type("Accelerator", (), {"state": type("State", (), {"deepspeed_plugin": plugin})()})()
    with pytest.raises(ValueError, match="method clear cannot run under FSDP or DeepSpeed ZeRO-3"):
        refuse_sharded_weights(stub, "clear")
    stub.is_fsdp_enabled = False
    if plugin is not None:
        plugin.zero_stage = 2
    refuse_sharded_weights(stub, "clear")


def test_subs_reads_the_configured_wordnet(tiny_bert_dir, tmp_path):
    wordnet_dir = write_wordnet(tmp_path / "wn")
    _, trainer = make_trainer(tiny_bert_dir, tmp_path, augmentation="subs", wordnet_dir=str(wordnet_dir))
    assert trainer.data_collator.augmenter.synonyms.wordnet.path == wordnet_dir
    with pytest.raises(WordNetError, match=r"wordnet_dir.*apt-get install wordnet-base"):
        make_trainer(tiny_bert_dir, tmp_path, augmentation="subs+del_span", wordnet_dir=str(tmp_path / "missing"))


def test_recipe_pad_to_multiple_of_reaches_the_clear_collator(tiny_bert_dir, tmp_path):
    """The generic collator run.py builds carries the data key pad_to_multiple_of; CLEAR's replacement keeps it."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="none")
    args = CLEARConfig(output_dir=str(tmp_path), use_cpu=True, augmentation="reorder", mlm_weight=0.0,
                       per_device_train_batch_size=2, report_to="none", eval_strategy="no", save_strategy="no",
                       load_best_model_at_end=False)
    texts = Dataset.from_dict({"view0": [encoder.tokenizer("a b c")["input_ids"],
                                         encoder.tokenizer("d e")["input_ids"]]})
    trainer = CLEARTrainer(model=encoder, args=args, train_dataset=texts,
                           data_collator=ViewCollator(encoder.tokenizer, pad_to_multiple_of=8))
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    assert batch["input_ids"].shape[-1] == 8


@pytest.mark.parametrize("name", ["clear_bert", "clear_roberta", "clear_minilm"])
def test_recipes_follow_eq2_and_sentevals_aggregation(repo_root, monkeypatch, name):
    """The CLEAR recipes sum L_CL over the 2N views (Eq. 2) and average STS12-16 per subset, as SentEval does."""
    from hf_sentcl.recipe.parser import parse_recipe

    monkeypatch.setenv("HF_SENTCL_DATA", "/data/senteval")
    recipe = parse_recipe(repo_root / "recipes" / f"{name}.yaml")
    assert recipe.training.cl_reduction == "sum" and recipe.data.sts_mode == "mean"
