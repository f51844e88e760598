"""Pooling: the pure `pool` function against loops over real tokens, and the encoder's head / pooling switches."""

import pytest
import torch

from hf_sentcl import SentenceEncoder
from hf_sentcl.modeling.pooling import pool

PAD_VALUE = 1.0e4  # padding positions hold huge values: any leak shows up immediately


@pytest.fixture
def padded_batch():
    """Three layers (embeddings + 2) of a (3, 5, 4) batch; rows have 5, 3 and 1 real tokens."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    states = []
    for _ in range(3):
        h = torch.randn(3, 5, 4, generator=generator)
        h = torch.where(mask.unsqueeze(-1).bool(), h, torch.full_like(h, PAD_VALUE))
        states.append(h)
    return tuple(states), mask


def loop_mean(h, mask):
    out = torch.zeros(h.shape[0], h.shape[2])
    for i in range(h.shape[0]):
        n = 0
        for t in range(h.shape[1]):
            if mask[i, t]:
                out[i] += h[i, t]
                n += 1
        out[i] /= n
    return out


def loop_max(h, mask):
    out = torch.empty(h.shape[0], h.shape[2])
    for i in range(h.shape[0]):
        for k in range(h.shape[2]):
            out[i, k] = max(float(h[i, t, k]) for t in range(h.shape[1]) if mask[i, t])
    return out


def test_cls(padded_batch):
    """cls and cls_before_pooler take token 0 of the chosen layer."""
    hs, mask = padded_batch
    for mode in ("cls", "cls_before_pooler"):
        assert torch.equal(pool(hs, mask, mode), hs[-1][:, 0])
        assert torch.equal(pool(hs, mask, mode, layer=0), hs[0][:, 0])


def test_mean_ignores_padding(padded_batch):
    """mean averages real tokens of the last layer only."""
    hs, mask = padded_batch
    result = pool(hs, mask, "mean")
    torch.testing.assert_close(result, loop_mean(hs[-1], mask))
    assert result.abs().max() < 100  # no PAD_VALUE leaked


def test_max_ignores_padding(padded_batch):
    """max takes the element-wise maximum over real tokens; huge padding values never win."""
    hs, mask = padded_batch
    result = pool(hs, mask, "max")
    torch.testing.assert_close(result, loop_max(hs[-1], mask))
    assert result.abs().max() < 100


def test_max_with_negative_states_and_padding_zero():
    """Padding filled with 0 must not beat all-negative real states either."""
    h = -1.0 - torch.rand(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    h = h.masked_fill(mask.unsqueeze(-1) == 0, 0.0)
    result = pool((h,), mask, "max")
    torch.testing.assert_close(result, loop_max(h, mask))
    assert (result < 0).all()


def test_first_last_avg(padded_batch):
    """first_last_avg mean-pools (hidden_states[1] + hidden_states[-1]) / 2 over real tokens."""
    hs, mask = padded_batch
    expected = loop_mean((hs[1] + hs[-1]) / 2, mask)
    torch.testing.assert_close(pool(hs, mask, "first_last_avg"), expected)


def test_last2_avg(padded_batch):
    """last2_avg mean-pools (hidden_states[-2] + hidden_states[-1]) / 2 over real tokens."""
    hs, mask = padded_batch
    expected = loop_mean((hs[-2] + hs[-1]) / 2, mask)
    torch.testing.assert_close(pool(hs, mask, "last2_avg"), expected)


@pytest.mark.parametrize("layer", [0, 1, -2])
def test_single_non_last_layer(padded_batch, layer):
    """cls / mean / max read the requested hidden state, not the last one."""
    hs, mask = padded_batch
    torch.testing.assert_close(pool(hs, mask, "mean", layer=layer), loop_mean(hs[layer], mask))
    torch.testing.assert_close(pool(hs, mask, "max", layer=layer), loop_max(hs[layer], mask))
    assert torch.equal(pool(hs, mask, "cls", layer=layer), hs[layer][:, 0])
    assert not torch.allclose(pool(hs, mask, "mean", layer=layer), pool(hs, mask, "mean"))


def test_unknown_mode(padded_batch):
    """An unknown pooling mode is a ValueError naming it."""
    hs, mask = padded_batch
    with pytest.raises(ValueError, match="'median'"):
        pool(hs, mask, "median")


# ------------------------------------------------------------------------------------------ through the encoder
def no_dropout_encoder(path, **kwargs) -> SentenceEncoder:
    """Encoder on the tiny BERT with dropout switched off, so train-mode outputs are deterministic."""
    return SentenceEncoder.from_backbone(
        str(path), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kwargs
    )


def batch_for(encoder, sentences):
    return encoder.tokenizer(sentences, padding=True, return_tensors="pt")


def backbone_states(encoder, batch):
    with torch.no_grad():
        return encoder.backbone(**batch, output_hidden_states=True).hidden_states


SENTENCES = ["the cat plays with a ball", "a dog runs", "the man sings in the park with a small girl"]


def test_head_only_in_training_when_not_kept(tiny_bert_dir):
    """pooling=cls, head=mlp, head_at_inference=False: head(cls) in train mode, raw cls in eval mode."""
    encoder = no_dropout_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=False)
    batch = batch_for(encoder, SENTENCES)
    hs = backbone_states(encoder, batch)
    raw = hs[-1][:, 0]
    encoder.train()
    with torch.no_grad():
        trained = encoder(**batch).embeddings
        torch.testing.assert_close(trained, encoder.head(raw))
    encoder.eval()
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, raw)
    assert not torch.allclose(trained, raw)


def test_head_kept_at_inference(tiny_bert_dir):
    """head_at_inference=True applies the head in eval mode too."""
    encoder = no_dropout_encoder(tiny_bert_dir, pooling="cls", head="mlp", head_at_inference=True).eval()
    batch = batch_for(encoder, SENTENCES)
    hs = backbone_states(encoder, batch)
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, encoder.head(hs[-1][:, 0]))


@pytest.mark.parametrize("training", [True, False])
def test_cls_before_pooler_never_uses_head(tiny_bert_dir, training):
    """cls_before_pooler returns the raw [CLS] vector even with an mlp head kept at inference."""
    encoder = no_dropout_encoder(tiny_bert_dir, pooling="cls_before_pooler", head="mlp", head_at_inference=True)
    encoder.train(training)
    batch = batch_for(encoder, SENTENCES)
    hs = backbone_states(encoder, batch)
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, hs[-1][:, 0])


def test_inference_pooling_switches_in_eval(tiny_bert_dir):
    """pooling=cls (+head) in training, inference_pooling=mean in eval mode (without the head)."""
    encoder = no_dropout_encoder(tiny_bert_dir, pooling="cls", head="mlp", inference_pooling="mean")
    batch = batch_for(encoder, SENTENCES)
    hs = backbone_states(encoder, batch)
    encoder.train()
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, encoder.head(hs[-1][:, 0]))
    encoder.eval()
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, loop_mean(hs[-1], batch["attention_mask"]))


@pytest.mark.parametrize(
    "pooling, layer, expected",
    [
        ("mean", 1, lambda hs, m: loop_mean(hs[1], m)),
        ("max", 0, lambda hs, m: loop_max(hs[0], m)),
        ("cls", -2, lambda hs, m: hs[-2][:, 0]),
        ("first_last_avg", -1, lambda hs, m: loop_mean((hs[1] + hs[-1]) / 2, m)),
        ("last2_avg", -1, lambda hs, m: loop_mean((hs[-2] + hs[-1]) / 2, m)),
    ],
)
def test_encoder_pooling_layers(tiny_bert_dir, pooling, layer, expected):
    """The encoder feeds the right hidden states to each pooling mode (layers other than the last included)."""
    encoder = no_dropout_encoder(tiny_bert_dir, pooling=pooling, pooling_layer=layer).eval()
    batch = batch_for(encoder, SENTENCES)
    hs = backbone_states(encoder, batch)
    with torch.no_grad():
        torch.testing.assert_close(encoder(**batch).embeddings, expected(hs, batch["attention_mask"]))


def test_pooling_layer_out_of_range(tiny_bert_dir):
    """pooling_layer beyond the backbone's depth is rejected when the config is built."""
    with pytest.raises(ValueError, match="pooling_layer"):
        SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling="mean", pooling_layer=3)
