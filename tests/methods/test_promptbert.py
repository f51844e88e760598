"""PromptBERT as a method: the [MASK] embedding and template denoising checked by hand against the raw transformers
model (on tiny BERT and RoBERTa), a training run (the loss on fixed data fell and the weights changed), save/reload
and the export (AutoModel plus the card's snippet, no sentence-transformers files), the plug-ins that work (margin,
false-negative mask, the cached step) and the refusals (templates, a tokenizer without a mask token, pooling, head,
length buckets)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from helpers import assert_same, build_tiny_bert, random_sentences, reference_step, step, write_yaml_recipe
from transformers import AutoModel, AutoTokenizer

from hf_sentcl import SentenceEncoder
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.export.bundle import export_mteb_results
from hf_sentcl.export.card import write_model_card
from hf_sentcl.export.snippets import transformers_snippet
from hf_sentcl.export.writer import export_encoder
from hf_sentcl.hub.upload import push_folder
from hf_sentcl.losses import info_nce
from hf_sentcl.methods.promptbert.config import BERT_SECOND_TEMPLATE, BERT_TEMPLATE, PromptBERTConfig
from hf_sentcl.methods.promptbert.trainer import PromptBERTTrainer
from hf_sentcl.modeling.encoder import load_encoder
from hf_sentcl.modeling.prompt import TemplateTokens, tokenize_with_template, wrap_ids
from hf_sentcl.recipe.checks import checked
from hf_sentcl.recipe.parser import RecipeError, parse_recipe

BATCH = 8
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TEXTS = random_sentences(BATCH, seed=5)  # the training texts of `make_trainer`, in order
SENTENCES = ["a man sings", "the big red dog plays with a blue ball", "the cat runs in the park"]


def make_trainer(model_dir, tmp_path, dropout=False, n=BATCH, **overrides) -> PromptBERTTrainer:
    encoder = SentenceEncoder.from_backbone(str(model_dir), pooling="prompt", head="none",
                                            **({} if dropout else NO_DROPOUT))
    dataset = tokenize_views(Dataset.from_dict({"text": random_sentences(n, seed=5)}), encoder.tokenizer, ("text",), 32)
    assert random_sentences(n, seed=5)[: len(TEXTS)] == TEXTS[:n]
    settings = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, learning_rate=1e-3, eval_strategy="no",
        save_strategy="no", load_best_model_at_end=False, use_cpu=True, report_to="none", disable_tqdm=True,
        logging_steps=1, seed=0,
    )
    settings.update(overrides)
    trainer = PromptBERTTrainer(model=encoder, args=PromptBERTConfig(**settings), train_dataset=dataset,
                                data_collator=ViewCollator(encoder.tokenizer, num_views=1))
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def close(first, second, atol: float = 1e-5) -> None:
    torch.testing.assert_close(torch.as_tensor(first).float(), torch.as_tensor(second).float(), atol=atol, rtol=1e-4)


def batch_of(trainer, size=BATCH):
    return trainer.data_collator([trainer.train_dataset[i] for i in range(size)])


def raw_mask_state(raw, ids: list[int], mask_id: int, position_ids: list[int] | None = None) -> torch.Tensor:
    """The raw transformers model's last-layer state at the first mask token of one unpadded row."""
    kwargs = {} if position_ids is None else {"position_ids": torch.tensor([position_ids])}
    with torch.no_grad():
        states = raw(input_ids=torch.tensor([ids]), **kwargs).last_hidden_state[0]
    return states[ids.index(mask_id)]


# ---------------------------------------------------------------------------------------------- the [MASK] embedding
def test_template_tokens_frame_the_sentence_with_the_special_tokens(tiny_bert_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    parts = TemplateTokens.of(tokenizer, BERT_TEMPLATE)
    assert parts.prefix[0] == tokenizer.cls_token_id and parts.suffix[-1] == tokenizer.sep_token_id
    assert tokenizer.mask_token_id in parts.suffix
    # for WordPiece the template's text tokenised whole gives the same ids (punctuation splits), so this is by hand
    for sentence in SENTENCES:
        whole = tokenizer(BERT_TEMPLATE.replace("[X]", sentence))["input_ids"]
        assert tokenize_with_template(tokenizer, [sentence], BERT_TEMPLATE)[0] == whole


def test_wrapping_a_collated_batch_equals_tokenizing_into_the_template(tiny_backbone_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_backbone_dir)
    parts = TemplateTokens.of(tokenizer, BERT_SECOND_TEMPLATE)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    frame = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id])
    ids, mask, lengths = wrap_ids(batch["input_ids"], batch["attention_mask"], parts, frame, tokenizer.pad_token_id)
    expected = tokenize_with_template(tokenizer, SENTENCES, BERT_SECOND_TEMPLATE)
    for row, want in enumerate(expected):
        assert ids[row][mask[row].bool()].tolist() == want
        assert int(lengths[row]) == len(want) - len(parts)
        assert (ids[row][~mask[row].bool()] == tokenizer.pad_token_id).all()


def test_encode_is_the_mask_state_of_the_template_by_hand(tiny_backbone_dir):
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="prompt", head="none")
    encoder.use_prompt(BERT_TEMPLATE)
    raw = AutoModel.from_pretrained(tiny_backbone_dir).eval()
    tokenizer = encoder.tokenizer
    parts = TemplateTokens.of(tokenizer, BERT_TEMPLATE)
    got = encoder.encode(SENTENCES, convert_to_numpy=False)
    for row, sentence in enumerate(SENTENCES):
        ids = [*parts.prefix, *tokenizer(sentence, add_special_tokens=False)["input_ids"], *parts.suffix]
        close(got[row], raw_mask_state(raw, ids, tokenizer.mask_token_id))


# ---------------------------------------------------------------------------------------------- template denoising
def test_template_denoising_by_hand(tiny_backbone_dir, tmp_path):
    """views = [MASK] state in each template minus the template alone with the suffix's positions shifted by the
    sentence's length, all computed here with the raw transformers model (no dropout)."""
    trainer = make_trainer(tiny_backbone_dir, tmp_path)
    inputs = batch_of(trainer, 4)
    views = trainer.embed_views(trainer.model, inputs).detach()
    raw = AutoModel.from_pretrained(tiny_backbone_dir, **NO_DROPOUT).eval()
    tokenizer = trainer.model.tokenizer
    mask_id = tokenizer.mask_token_id
    start = raw.embeddings.padding_idx + 1 if hasattr(raw.embeddings, "padding_idx") else 0  # RoBERTa: 2
    for row in range(4):
        text_ids = tokenizer(TEXTS[row], add_special_tokens=False)["input_ids"][:30]
        for view, template in enumerate((BERT_TEMPLATE, BERT_SECOND_TEMPLATE)):
            parts = TemplateTokens.of(tokenizer, template)
            full = raw_mask_state(raw, [*parts.prefix, *text_ids, *parts.suffix], mask_id)
            positions = [start + p for p in range(len(parts.prefix))]
            positions += [start + len(parts.prefix) + len(text_ids) + s for s in range(len(parts.suffix))]
            alone = raw_mask_state(raw, [*parts.prefix, *parts.suffix], mask_id, positions)
            close(views[view, row], full - alone)


def test_without_denoising_the_views_are_the_plain_mask_states(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, template_denoising=False)
    inputs = batch_of(trainer, 3)
    views = trainer.embed_views(trainer.model, inputs).detach()
    close(views[0], trainer.model.encode(TEXTS[:3], convert_to_numpy=False))  # template 1: what evaluation reads


# ---------------------------------------------------------------------------------------------- training
def fixed_loss(trainer) -> float:
    with torch.no_grad():
        return float(trainer.compute_loss(trainer.model, batch_of(trainer, 16)))


def test_training_lowers_the_loss_and_changes_the_weights(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, n=16, max_steps=12, learning_rate=3e-3)
    before_loss = fixed_loss(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    trainer.model.train()
    assert fixed_loss(trainer) < before_loss - 0.1
    changed = [n for n, p in trainer.model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert any("layer.1." in n for n in changed) and any("embeddings" in n for n in changed)


def test_the_loss_is_info_nce_of_the_two_templates(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path)
    views = torch.randn(2, BATCH, 32)
    loss, _ = trainer.contrastive_loss(views)
    close(loss, info_nce(views[0], views[1], 0.05))


# ---------------------------------------------------------------------------------------------- save, reload, export
def test_save_and_reload_embed_with_the_template(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=2)
    trainer.train()
    encoder = trainer.model.eval()
    encoder.save_pretrained(tmp_path / "saved")
    reloaded = load_encoder(tmp_path / "saved")
    assert reloaded.config.prompt_template == BERT_TEMPLATE and reloaded.config.pooling == "prompt"
    close(reloaded.encode(SENTENCES), encoder.encode(SENTENCES))


class OfflineHub:
    """Stands in for `huggingface_hub.HfApi` in a push: takes the repository and the folder, contacts nothing."""

    def create_repo(self, repo_id, **_):
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kwargs):
        return SimpleNamespace(commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/0123456", oid="0" * 40)


def test_export_loads_with_automodel_and_the_card_code_reproduces_encode(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, max_steps=2)
    trainer.train()
    encoder = trainer.model.eval()
    out = tmp_path / "export"
    plan = export_encoder(encoder, out)  # checks AutoModel + the template against encode itself
    assert not (out / "modules.json").exists() and not (out / "1_Pooling").exists()
    assert plan.prompt_template == BERT_TEMPLATE and not plan.sentence_transformers
    AutoModel.from_pretrained(out)
    scope: dict = {}
    exec(transformers_snippet(plan, str(out)).replace("print(", "(lambda *a: None)("), scope)  # noqa: S102
    close(scope["embed"](SENTENCES), encoder.encode(SENTENCES, convert_to_numpy=False))
    card = write_model_card(out, plan, {}).read_text()
    assert BERT_TEMPLATE in card and "SentenceTransformer(" not in card and "no sentence-transformers files" in card
    assert "library_name: transformers" in card and "tags:\n- feature-extraction" in card
    pushed = push_folder(out, "my-org/promptbert", api=OfflineHub())  # an AutoModel-only export is pushed too
    assert {"config.json", "model.safetensors", "README.md"} <= {f.path for f in pushed.files}
    assert not {"modules.json", "hf_sentcl_card.json"} & {f.path for f in pushed.files}
    export_encoder(encoder, out, overwrite=True)  # an earlier prompt export (no modules.json) may be replaced
    scores = {"mteb_sts": {"STS12": 50.0, "STSBenchmark": 60.0}}  # their ModelMeta would load it with ST: none
    assert export_mteb_results(tmp_path / "mteb", scores, out, plan, None) is None
    assert not (tmp_path / "mteb").exists()


# ---------------------------------------------------------------------------------------------- plug-ins
def test_margin_and_false_negative_mask_act_on_the_loss(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, perturbation="p-n+", margin=0.1, false_negatives="mask")
    views = torch.randn(2, 4, 32)
    groups = torch.tensor([[0, 1, 0, 2]])  # sentences 0 and 2 are the same text
    loss, _ = trainer.contrastive_loss(views, groups)
    plain, _ = make_trainer(tiny_bert_dir, tmp_path / "plain").contrastive_loss(views)
    assert float(loss) != pytest.approx(float(plain))
    step_loss = trainer.training_step(trainer.model, batch_of(trainer))
    assert torch.isfinite(step_loss)


def test_cached_step_equals_the_plain_step_with_the_same_draws(tiny_bert_dir, tmp_path):
    trainer = make_trainer(tiny_bert_dir, tmp_path, dropout=True)
    inputs = batch_of(trainer)
    # gradients reach ~500 here (tau 0.05 on a random tiny model): 1e-4 is fp32 rounding at that scale
    assert_same(step(trainer, inputs, 3), reference_step(trainer, inputs, 3), atol=1e-4)


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("key, template, missing", [
    ("template", 'This sentence : "" means [MASK] .', r"\[X\]"),
    ("second_template", 'This sentence : "[X]" means .', r"\[MASK\]"),
    ("template", "[X] [X] [MASK]", r"\[X\].*exactly once, found 2"),
])
def test_templates_without_their_slots_are_refused(tmp_path, key, template, missing):
    with pytest.raises(ValueError, match=rf"key '{key}'.*{missing}"):
        PromptBERTConfig(output_dir=str(tmp_path), use_cpu=True, **{key: template})


def promptbert_recipe(tmp_path, model_dir, senteval_dir, **values):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(random_sentences(16, seed=3)) + "\n")
    return write_yaml_recipe(tmp_path, **{
        "method": "promptbert", "model_name_or_path": str(model_dir), "sts_data_dir": str(senteval_dir),
        "output_dir": str(tmp_path / "out"), "train_file": str(text), "pooling": "prompt", "head": "none",
        "global_train_batch_size": 8, "max_steps": 2, "use_cpu": True, **values})


@pytest.mark.parametrize("values, message", [
    ({"pooling": "cls"}, "pooling: method promptbert embeds with the \\[MASK\\] state"),
    ({"head": "mlp"}, "head: method promptbert trains the plain \\[MASK\\] state"),
    ({"inference_pooling": "mean"}, "inference_pooling: method promptbert evaluates and saves the \\[MASK\\] state"),
    ({"length_buckets": 2}, "length_buckets: PromptBERTTrainer encodes its views in its own way"),
    ({"template": "'no slots here'"}, "key 'template'"),
])
def test_the_recipe_check_refuses_what_promptbert_cannot_honour(tmp_path, tiny_bert_dir, senteval_dir, values,
                                                                 message):
    with pytest.raises(RecipeError, match=message):
        checked(parse_recipe(str(promptbert_recipe(tmp_path, tiny_bert_dir, senteval_dir, **values)), ()))


def test_a_tokenizer_without_a_mask_token_is_refused_before_the_model_loads(tmp_path, senteval_dir):
    model_dir = build_tiny_bert(tmp_path / "no-mask")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**config, "mask_token": None}))
    assert AutoTokenizer.from_pretrained(model_dir).mask_token_id is None
    with pytest.raises(RecipeError, match="has no mask token"):
        checked(parse_recipe(str(promptbert_recipe(tmp_path, model_dir, senteval_dir)), ()))
