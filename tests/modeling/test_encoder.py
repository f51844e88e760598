"""SentenceEncoder: encode order/dedup, normalisation, bf16, persistence, construction errors (BERT and RoBERTa)."""

import numpy as np
import pytest
import torch
from helpers import bert_tokenizer_from_vocab_file, write_wordpiece_vocab
from transformers import AutoModel

from hf_sentcl import SentenceEncoder, SentenceEncoderConfig
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS

SENTENCES = [
    "the cat plays with a ball in the park",
    "a dog",
    "the cat plays with a ball in the park",  # duplicate
    "the man sings and the woman dances on the street",
    "a dog",  # duplicate
    "big red car",
    "the girl drinks water",
]


def test_from_backbone_keeps_pretrained_weights(tiny_backbone_dir):
    """Wrapping a backbone must not re-initialise its pretrained weights (post_init runs on the wrapper)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="cls", head="mlp")
    reference = AutoModel.from_pretrained(str(tiny_backbone_dir)).state_dict()
    for name, value in encoder.backbone.state_dict().items():
        assert torch.equal(value, reference[name]), name


def test_config_carries_the_tokenizers_special_tokens(tiny_backbone_dir, tmp_path):
    """Trainer aligns the model config's pad/bos/eos ids with the tokenizer's and warns when it has to; the encoder
    states them itself (BERT: pad only; RoBERTa: pad, bos, eos), also after a save and reload."""
    from transformers.trainer_utils import align_special_tokens

    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean")
    encoder.save_pretrained(tmp_path)
    for model in (encoder, SentenceEncoder.from_pretrained(tmp_path)):
        assert model.config.pad_token_id == model.tokenizer.pad_token_id is not None
        before = model.config.to_dict()
        align_special_tokens(model, model.tokenizer)
        assert model.config.to_dict() == before


def test_encode_input_order_with_duplicates(tiny_backbone_dir):
    """encode returns one row per input in input order; each row equals encoding that sentence alone."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean")
    together = encoder.encode(SENTENCES, batch_size=2)
    assert together.shape == (len(SENTENCES), 32) and together.dtype == np.float32
    for i, sentence in enumerate(SENTENCES):
        alone = encoder.encode([sentence])[0]
        np.testing.assert_allclose(together[i], alone, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(together[0], together[2])
    np.testing.assert_array_equal(together[1], together[4])
    assert not np.allclose(together[0], together[1])


def test_encode_is_deterministic_and_restores_mode(tiny_bert_dir):
    """encode runs in eval mode (no dropout noise) and leaves the training flag as it found it."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    encoder.train()
    first = encoder.encode(SENTENCES)
    second = encoder.encode(SENTENCES)
    np.testing.assert_array_equal(first, second)
    assert encoder.training
    encoder.eval()
    encoder.encode(SENTENCES[:2])
    assert not encoder.training


def test_encode_deduplicates_work(tiny_bert_dir):
    """Each distinct sentence goes through the backbone once."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    seen = []
    handle = encoder.backbone.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        encoder.encode(SENTENCES, batch_size=128)
    finally:
        handle.remove()
    assert sum(seen) == len(set(SENTENCES))


def test_encode_normalize_and_tensor_output(tiny_bert_dir):
    """normalize=True gives unit rows in the same directions; convert_to_numpy=False gives a float32 tensor."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    raw = encoder.encode(SENTENCES)
    unit = encoder.encode(SENTENCES, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    tensor = encoder.encode(SENTENCES, convert_to_numpy=False)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    np.testing.assert_array_equal(tensor.numpy(), raw)


def test_encode_edge_inputs(tiny_bert_dir):
    """An empty list gives a (0, d) array; a bare string is refused."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean")
    assert encoder.encode([]).shape == (0, 32)
    with pytest.raises(TypeError):
        encoder.encode("the cat")


def test_encode_bf16_close_to_fp32(tiny_backbone_dir):
    """bf16 autocast changes embeddings by rounding only (float32 output, small relative error)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean")
    fp32 = encoder.encode(SENTENCES)
    bf16 = encoder.encode(SENTENCES, bf16=True)
    assert bf16.dtype == np.float32
    assert not np.array_equal(fp32, bf16)  # autocast was really on
    relative = np.linalg.norm(bf16 - fp32, axis=1) / np.linalg.norm(fp32, axis=1)
    assert relative.max() < 0.05


def test_encode_truncates_to_position_table(tiny_backbone_dir):
    """A sentence longer than the model's position table is truncated, never an indexing error.

    RoBERTa's positions start at padding_idx + 1, so it fits max_position_embeddings - 2 tokens.
    """
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), pooling="mean")
    long_sentence = " ".join(["the cat plays with a ball in the park"] * 12)
    out = encoder.encode([long_sentence, "a dog"])
    assert out.shape == (2, 32) and np.isfinite(out).all()


@pytest.mark.parametrize(
    "settings",
    [
        dict(pooling="cls", head="mlp", head_at_inference=False),
        dict(pooling="cls", head="mlp", head_at_inference=True),
        dict(pooling="mean", head="none"),
        dict(pooling="cls", head="mlp", inference_pooling="last2_avg"),
    ],
    ids=["cls-mlp-train-only", "cls-mlp-kept", "mean", "cls-then-last2_avg"],
)
def test_save_and_reload_reproduces_embeddings(tiny_backbone_dir, tmp_path, settings):
    """save_pretrained + from_pretrained (and load) reproduce embeddings exactly, with the settings in config."""
    encoder = SentenceEncoder.from_backbone(str(tiny_backbone_dir), **settings)
    with torch.no_grad():  # make the head differ from its init so a lost head would show
        if encoder.head is not None:
            encoder.head.dense.weight.add_(torch.randn_like(encoder.head.dense.weight))
    before = encoder.encode(SENTENCES)
    encoder.save_pretrained(tmp_path / "saved")
    reloaded = SentenceEncoder.from_pretrained(tmp_path / "saved")
    for key, value in settings.items():
        assert getattr(reloaded.config, key) == value
    assert torch.equal(torch.from_numpy(reloaded.encode(SENTENCES)), torch.from_numpy(before))
    if encoder.head is not None:
        assert torch.equal(reloaded.head.dense.weight, encoder.head.dense.weight)
    again = SentenceEncoder.load(str(tmp_path / "saved"))
    assert torch.equal(torch.from_numpy(again.encode(SENTENCES)), torch.from_numpy(before))


def test_head_at_inference_changes_saved_embeddings(tiny_bert_dir, tmp_path):
    """With the same weights, keeping the head at inference gives different embeddings (the flag is live)."""
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp")
    without = encoder.encode(SENTENCES)
    encoder.config.head_at_inference = True
    with_head = encoder.encode(SENTENCES)
    assert not np.allclose(without, with_head)
    np.testing.assert_allclose(with_head, np.tanh(without @ encoder.head.dense.weight.detach().numpy().T
                                                  + encoder.head.dense.bias.detach().numpy()), rtol=1e-5, atol=1e-6)


def test_load_plain_backbone_with_pooling(tiny_backbone_dir):
    """SentenceEncoder.load on a plain backbone directory wraps it with the requested pooling."""
    encoder = SentenceEncoder.load(str(tiny_backbone_dir), pooling="mean")
    assert encoder.config.pooling == "mean" and encoder.head is None
    backbone = AutoModel.from_pretrained(str(tiny_backbone_dir)).eval()
    batch = encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = backbone(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = ((states * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(encoder.encode(SENTENCES), expected, rtol=1e-4, atol=1e-5)


def test_load_saved_encoder_rejects_head_change_and_bad_pooling(tiny_bert_dir, tmp_path):
    """Overrides on a saved encoder are validated: no head swap, no unknown pooling."""
    SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="cls", head="mlp").save_pretrained(tmp_path / "e")
    with pytest.raises(ValueError, match="head"):
        SentenceEncoder.load(str(tmp_path / "e"), head="none")
    with pytest.raises(ValueError, match="'bogus'"):
        SentenceEncoder.load(str(tmp_path / "e"), pooling="bogus")
    assert SentenceEncoder.load(str(tmp_path / "e"), pooling="mean").config.pooling == "mean"


@pytest.mark.parametrize("key, value", [("pooling", "median"), ("inference_pooling", "avg"), ("head", "linear")])
def test_config_rejects_unknown_values(tiny_bert_dir, key, value):
    """SentenceEncoderConfig rejects an unknown pooling / inference pooling / head, naming the value."""
    backbone = AutoModel.from_pretrained(str(tiny_bert_dir)).config.to_dict()
    with pytest.raises(ValueError, match=f"'{value}'"):
        SentenceEncoderConfig(backbone_config=backbone, **{key: value})
    with pytest.raises(ValueError, match=f"'{value}'"):
        SentenceEncoder.from_backbone(str(tiny_bert_dir), **{key: value})


def test_tokenizer_larger_than_vocab_rejected(tiny_bert_dir, tmp_path):
    """A tokenizer with more tokens than the backbone's embedding table is refused (from_backbone and attach)."""
    big = bert_tokenizer_from_vocab_file(write_wordpiece_vocab(tmp_path / "vocab.txt", extra_words=20))
    big.save_pretrained(tmp_path / "big-tokenizer")
    with pytest.raises(ValueError, match="tokens"):
        SentenceEncoder.from_backbone(str(tiny_bert_dir), tokenizer_name=str(tmp_path / "big-tokenizer"))
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir))
    with pytest.raises(ValueError, match=str(len(big))):
        encoder.attach_tokenizer(big)


def test_tokenizer_with_other_pad_id_rejected(tiny_bert_dir, tmp_path):
    """A same-size tokenizer whose pad id differs from the model's is refused."""
    other = bert_tokenizer_from_vocab_file(write_wordpiece_vocab(tmp_path / "vocab.txt", pad_index=3))
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir))
    assert len(other) == len(encoder.tokenizer)
    with pytest.raises(ValueError, match="pad"):
        encoder.attach_tokenizer(other)


def test_roberta_tokenizer_on_bert_rejected(tiny_bert_dir, tiny_roberta_dir):
    """Mixing the tiny RoBERTa tokenizer with the tiny BERT model fails early."""
    with pytest.raises(ValueError):
        SentenceEncoder.from_backbone(str(tiny_bert_dir), tokenizer_name=str(tiny_roberta_dir))


def test_embedded_model_alias_mean_pooling():
    """The embedded all-MiniLM-L6-v2 loads offline and ranks a paraphrase above an unrelated sentence."""
    encoder = SentenceEncoder.from_backbone(EMBEDDED_MODEL_ALIAS, pooling="mean")
    assert encoder.config.hidden_size == 384
    a, b, c = encoder.encode(
        ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply today."],
        normalize=True,
    )
    assert float(a @ b) > float(a @ c) + 0.2
