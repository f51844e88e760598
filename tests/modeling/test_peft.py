"""LoRA through a recipe's `peft:` section: settings validation, training only the adapters (SimCSE and SG-OPT),
SG's regularizer as the merged LoRA delta, checkpoints that reload, the merged export that AutoModel loads, the
adapter alone, and a whole recipe run."""

import copy
import json

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import loss_with_fixed_draws, random_sentences
from peft import PeftModel
from safetensors import safe_open
from torch import nn
from transformers import AutoModel

from hf_sentcl import SentenceEncoder
from hf_sentcl.cli.export import main as export_main
from hf_sentcl.cli.train import main as run_main
from hf_sentcl.configs.lora import check_lora_settings
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.export.writer import export_encoder
from hf_sentcl.methods.self_guided.config import SelfGuidedConfig
from hf_sentcl.methods.self_guided.trainer import SelfGuidedTrainer
from hf_sentcl.methods.simcse.config import SimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer
from hf_sentcl.modeling.peft import (
    lora_delta_squared_norm,
    merge_adapters,
    parameter_counts,
    save_adapter,
    weight_distance,
)
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

LORA = {"r": 4, "lora_alpha": 8}
SENTENCES = random_sentences(6, seed=11)


def encoder_with_lora(model_dir, **kwargs):
    torch.manual_seed(0)
    return SentenceEncoder.from_backbone(str(model_dir), peft=dict(LORA), **kwargs)


def make_trainer(encoder, tmp_path, trainer_class, config_class, steps=4, **overrides):
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(8, seed=3)}), encoder.tokenizer, ("text",), 32)
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=5e-3, max_steps=steps,
        eval_strategy="no", load_best_model_at_end=False, save_strategy="no", use_cpu=True, logging_steps=1,
        disable_tqdm=True, report_to="none", seed=0, temperature=0.1, **overrides,
    )
    return trainer_class(model=encoder, args=config_class(**settings), train_dataset=dataset,
                         data_collator=ViewCollator(encoder.tokenizer))


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ------------------------------------------------------------------------------------------ settings
def test_settings_are_validated_with_the_key_named():
    assert check_lora_settings({"r": 8, "target_modules": ["query", "value"]}) == {"r": 8,
                                                                                  "target_modules": ["query", "value"]}
    for bad, key in (({"r": 0}, "peft.r"), ({"r": "eight"}, "peft.r"), ({"lora_alpha": -1}, "peft.lora_alpha"),
                     ({"lora_dropout": 1.5}, "peft.lora_dropout"), ({"target_modules": 3}, "peft.target_modules"),
                     ({"rank": 8}, "unknown key.*rank"), ({"task_type": "CAUSAL_LM"}, "task_type is set by hf_sentcl"),
                     ({"bias": "some"}, "peft.bias"), ({"layers_pattern": "layer"}, "peft: When `layers_pattern`")):
        with pytest.raises(ValueError, match=key):
            check_lora_settings(bad)


def test_recipe_peft_section(tmp_path, tiny_bert_dir):
    """`peft:` is the one nested mapping a recipe may hold; bad values fail at parse time naming the key; the CLI can
    replace the mapping."""
    recipe = tmp_path / "lora.yaml"
    recipe.write_text(f"method: simcse\nmodel_name_or_path: {tiny_bert_dir}\noutput_dir: {tmp_path}\n"
                      f"train_file: {tmp_path / 'train.txt'}\n"
                      "peft:\n  r: 4\n  lora_alpha: 16\n  target_modules: [query, key, value]\n")
    assert parse_recipe(recipe).model.peft == {"r": 4, "lora_alpha": 16, "target_modules": ["query", "key", "value"]}
    assert parse_recipe(recipe, ["--peft", "{r: 2}"]).model.peft == {"r": 2}
    with pytest.raises(RecipeError, match="peft.r"):
        parse_recipe(recipe, ["--peft", "{r: 0}"])
    with pytest.raises(RecipeError, match="'export_adapter' needs a 'peft' section"):
        validate_recipe(parse_recipe(recipe, ["--peft", "", "--export_adapter"]))


def test_default_target_modules_per_architecture():
    """peft's defaults (BERT: query/value), ours where peft has none (DistilBERT: q_lin/v_lin), and a clear error
    naming peft.target_modules for an architecture nobody has defaults for."""
    from transformers import (
        BertConfig,
        BertModel,
        DistilBertConfig,
        DistilBertModel,
        SqueezeBertConfig,
        SqueezeBertModel,
    )

    from hf_sentcl.modeling.peft import wrap_backbone

    def adapted(model):
        return sorted({n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in wrap_backbone(model, {"r": 2})
                      .named_parameters() if "lora_A" in n})

    small = dict(vocab_size=60, num_hidden_layers=1, num_attention_heads=2)
    assert adapted(BertModel(BertConfig(hidden_size=32, intermediate_size=37, **small))) == ["query", "value"]
    distil = DistilBertModel(DistilBertConfig(vocab_size=60, dim=32, n_layers=1, n_heads=2, hidden_dim=37))
    assert adapted(distil) == ["q_lin", "v_lin"]
    squeeze = SqueezeBertModel(SqueezeBertConfig(hidden_size=32, embedding_size=32, intermediate_size=32, **small))
    with pytest.raises(ValueError, match="model type 'squeezebert'.*set peft.target_modules"):
        wrap_backbone(squeeze, {"r": 2})


# ------------------------------------------------------------------------------------------ SimCSE + LoRA
@pytest.mark.slow
def test_simcse_trains_only_the_adapters_and_head(tiny_bert_dir, tmp_path):
    """Defaults from peft for BERT: LoRA on query and value. Only lora_A/lora_B and the MLP head train; the loss
    falls; the base weights stay bit-identical; the trainable share is small."""
    encoder = encoder_with_lora(tiny_bert_dir, pooling="cls", head="mlp")
    trainable = {n for n, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all(("lora_" in n and (".query." in n or ".value." in n)) or n.startswith("head.")
                             for n in trainable)
    counts = parameter_counts(encoder)
    assert counts["trainable_parameters"] == sum(p.numel() for n, p in encoder.named_parameters() if n in trainable)
    assert 0 < counts["trainable_percent"] < 20
    before = snapshot(encoder)
    trainer = make_trainer(encoder, tmp_path, SimCSETrainer, SimCSEConfig, steps=6)
    loss_before = loss_with_fixed_draws(trainer, encoder)
    trainer.train()
    after = snapshot(encoder)
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all("lora_" in k or k.startswith("head.") for k in changed)
    assert any("lora_B" in k for k in changed)
    assert loss_with_fixed_draws(trainer, encoder) < loss_before


# ------------------------------------------------------------------------------------------ SG + LoRA
def merged_distance_float64(backbone, frozen) -> float:
    """Independent reference: merge a copy's adapters (W + s B A) and sum squared differences of every weight
    against the frozen copy's, by name, in float64."""
    merged = copy.deepcopy(backbone).merge_and_unload()
    reference = dict(frozen.named_parameters())
    total = 0.0
    for name, param in merged.named_parameters():
        total += float(((param.detach().double() - reference[name].detach().double()) ** 2).sum())
    return total


def test_lora_delta_norm_matches_the_product():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 7, generator=generator), torch.randn(5, 3, generator=generator)
    expected = float(((2.5 * b.double() @ a.double()) ** 2).sum())
    assert lora_delta_squared_norm(a, b, 2.5).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_self_guided_with_lora_regularizer_is_the_merged_delta(tiny_bert_dir, tmp_path):
    """SG-OPT with LoRA: BERT_F is the plain base model (no adapters); the regularizer is 0 at the start, nonzero
    after training, and equals sum ||W_merged - W_F||^2 computed independently in float64; its gradient reaches the
    adapters; the logged param_distance is that value; BERT_F stays untouched."""
    encoder = encoder_with_lora(tiny_bert_dir, pooling="cls", head="none")
    trainer = make_trainer(encoder, tmp_path, SelfGuidedTrainer, SelfGuidedConfig, projection_size=16,
                           regularizer_weight=1.0)
    frozen = trainer.frozen_backbone
    assert not isinstance(frozen, PeftModel) and not any("lora" in n for n, _ in frozen.named_parameters())
    assert weight_distance(encoder.backbone, frozen).item() == 0.0
    frozen_before = snapshot(frozen)
    trainer.train()
    distance = weight_distance(encoder.backbone, frozen)
    expected = merged_distance_float64(encoder.backbone, frozen)
    assert expected > 0 and distance.item() == pytest.approx(expected, rel=1e-4)
    logged = [h["param_distance"] for h in trainer.state.log_history if "param_distance" in h]
    assert logged[0] == 0.0 and logged[-1] > 0
    assert all(torch.equal(v, frozen_before[k]) for k, v in frozen.state_dict().items())
    encoder.zero_grad()
    weight_distance(encoder.backbone, frozen).backward()
    lora_b = [p for n, p in encoder.backbone.named_parameters() if "lora_B" in n]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)


def test_distance_refuses_unmatched_trainable_parameters(tiny_bert_dir, tmp_path):
    """A trained parameter with no counterpart in the frozen copy (renamed or resized) raises instead of adding 0."""
    encoder = encoder_with_lora(tiny_bert_dir, pooling="cls", head="none")
    encoder.backbone.base_model.model.pooler.dense.weight.requires_grad_(True)  # a trainable non-LoRA weight
    frozen = copy.deepcopy(encoder.backbone).merge_and_unload()
    assert weight_distance(encoder.backbone, frozen).item() == 0.0  # matched by its plain name
    frozen.pooler.dense = nn.Linear(32, 16)
    with pytest.raises(ValueError, match="pooler.dense.weight"):
        weight_distance(encoder.backbone, frozen)
    plain, other = nn.Sequential(nn.Linear(3, 3)), nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="0.weight"):
        weight_distance(plain, other)


def test_self_guided_refuses_nonzero_initial_adapters(tiny_bert_dir, tmp_path):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="none",
                                            peft={"r": 2, "init_lora_weights": False})
    with pytest.raises(ValueError, match="adapters must start at zero"):
        make_trainer(encoder, tmp_path, SelfGuidedTrainer, SelfGuidedConfig, projection_size=16)


# ------------------------------------------------------------------------------------------ saving and export
def trained_lora_encoder(model_dir):
    """A LoRA encoder whose adapters are not zero (as after training)."""
    encoder = encoder_with_lora(model_dir, pooling="cls", head="mlp")
    with torch.no_grad():
        for name, param in encoder.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    return encoder.eval()


def test_checkpoint_with_adapters_reloads(tiny_bert_dir, tmp_path):
    """A checkpoint saved while training (adapters beside the frozen base) reloads as the same LoRA encoder: the
    settings live in the encoder's config."""
    encoder = trained_lora_encoder(tiny_bert_dir)
    encoder.save_pretrained(tmp_path / "ckpt")
    reloaded = SentenceEncoder.from_pretrained(str(tmp_path / "ckpt"))
    assert reloaded.config.peft == LORA and isinstance(reloaded.backbone, PeftModel)
    np.testing.assert_allclose(reloaded.encode(SENTENCES), encoder.encode(SENTENCES), atol=1e-6)


@pytest.mark.slow
def test_merged_encoder_and_export_load_plainly(tiny_bert_dir, tmp_path):
    """Merging folds W + s B A into the weights: the encoder embeds as before, saves without any LoRA key or peft
    setting, and its export loads with plain AutoModel and gives the same embeddings ([CLS] of the last layer).
    Exporting the unmerged encoder (e.g. a mid-training checkpoint) gives the same weights."""
    encoder = trained_lora_encoder(tiny_bert_dir)
    expected = encoder.encode(SENTENCES)
    export_encoder(encoder, tmp_path / "export-unmerged")
    assert merge_adapters(encoder) and not merge_adapters(encoder)
    assert encoder.config.peft is None and not isinstance(encoder.backbone, PeftModel)
    np.testing.assert_allclose(encoder.encode(SENTENCES), expected, atol=1e-5)
    encoder.save_pretrained(tmp_path / "merged")
    with safe_open(str(tmp_path / "merged" / "model.safetensors"), "pt") as f:
        assert not any("lora" in k or "base_layer" in k for k in f.keys())
    assert "peft" not in json.loads((tmp_path / "merged" / "config.json").read_text()) or json.loads(
        (tmp_path / "merged" / "config.json").read_text())["peft"] is None
    export_encoder(encoder, tmp_path / "export")
    for folder in ("export", "export-unmerged"):
        model = AutoModel.from_pretrained(str(tmp_path / folder)).eval()
        batch = encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
        with torch.no_grad():
            cls = model(**batch).last_hidden_state[:, 0].numpy()
        np.testing.assert_allclose(cls, expected, atol=1e-5)


def test_adapter_alone(tiny_bert_dir, tmp_path):
    """save_adapter writes the adapter only; PeftModel.from_pretrained on the plain base reproduces the backbone."""
    encoder = trained_lora_encoder(tiny_bert_dir)
    folder = save_adapter(encoder, tmp_path / "adapter")
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    restored = PeftModel.from_pretrained(AutoModel.from_pretrained(str(tiny_bert_dir)), str(folder)).eval()
    batch = encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        np.testing.assert_allclose(restored(**batch).last_hidden_state.numpy(),
                                   encoder.backbone(**batch).last_hidden_state.numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="no LoRA adapter"):
        save_adapter(SentenceEncoder.from_backbone(str(tiny_bert_dir)), tmp_path / "none")


@pytest.mark.slow
def test_export_cli_of_a_lora_checkpoint(tiny_bert_dir, tmp_path, capsys):
    encoder = trained_lora_encoder(tiny_bert_dir)
    encoder.save_pretrained(tmp_path / "ckpt")
    code = export_main([str(tmp_path / "ckpt"), str(tmp_path / "out"), "--adapter", str(tmp_path / "adapter")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["BertModel"]


# ------------------------------------------------------------------------------------------ a recipe run
@pytest.mark.slow
def test_recipe_run_with_lora(tiny_bert_dir, senteval_dir, tmp_path):
    """python -m hf_sentcl.run with a peft section and --export_adapter: the saved encoder is merged (no LoRA keys),
    the adapter sits in output_dir/adapter, results.json carries the trainable share, the export loads with
    AutoModel."""
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(random_sentences(16, seed=3)) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join([
        "method: simcse", f"model_name_or_path: {tiny_bert_dir}", f"train_file: {corpus}",
        f"sts_data_dir: {senteval_dir}", f"output_dir: {tmp_path / 'out'}", "per_device_train_batch_size: 8",
        "max_seq_length: 16", "max_steps: 2", "eval_strategy: 'no'", "save_strategy: 'no'",
        "load_best_model_at_end: false", "use_cpu: true", "eval_before_training: false", "eval_tasks: []",
        "learning_rate: 1.0e-3", "peft:", "  r: 2", "  lora_alpha: 4",
    ]) + "\n")
    assert run_main([str(recipe), "--export_adapter"]) == 0
    out = tmp_path / "out"
    assert (out / "adapter" / "adapter_config.json").is_file()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert not any("lora" in k for k in f.keys())
    assert SentenceEncoder.from_pretrained(str(out)).config.peft is None
    results = json.loads((out / "results.json").read_text())
    assert 0 < results["train"]["trainable_percent"] < 20
    assert results["train"]["trainable_parameters"] < results["train"]["total_parameters"]
    AutoModel.from_pretrained(str(out / "export"))
