"""Bulk-drawn CPU dropout (`hf_sentcl.modeling.fast_dropout`) is dropout: the right rate and scale, the same
gradient rule, reproducible from the seed, and every dropout site of a backbone uses it while eval is untouched."""

import json
import shutil

import pytest
import torch
from torch import nn
from transformers import AutoModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hf_sentcl.modeling.fast_dropout import (
    ATTENTION_NAME,
    FastDropout,
    attention_probabilities,
    fast_dropout,
    restore_native_dropout,
    sdpa_fast_dropout,
    use_fast_dropout,
)


@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rate_and_scale(p, dtype):
    torch.manual_seed(0)
    n = 1_000_000
    y = fast_dropout(torch.ones(n, dtype=dtype), p)
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5  # within 5 binomial standard deviations
    survivors = y[y != 0].float()
    q = round(p * 65536) / 65536
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert torch.allclose(survivors, torch.full_like(survivors, 1 / (1 - q)), rtol=tolerance)


def test_masks_are_independent_of_position():
    torch.manual_seed(1)
    dropped = fast_dropout(torch.ones(4000, 256), 0.5) == 0
    # each column and each row drops about half (a stuck bit in the 16-bit split would show as a skewed column)
    assert dropped.float().mean(0).sub(0.5).abs().max() < 0.05
    assert dropped.float().mean(1).sub(0.5).abs().max() < 0.15


def test_gradient_is_mask_times_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = fast_dropout(x, 0.2)
    weights = torch.randn_like(y)
    (y * weights).sum().backward()
    keep = y != 0
    scale = 65536 / (65536 - round(0.2 * 65536))
    assert torch.allclose(x.grad, weights * keep * scale)
    assert torch.allclose(y, x.detach() * keep * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_survivors_are_scaled_once_in_full_precision(dtype):
    """Forward and backward give `x * scale` computed in fp32 and rounded once to the input's dtype, as native
    dropout does: a bf16 mask holding the scale would round 1 / 0.9 to 1.109375 first (0.16% off every survivor)."""
    torch.manual_seed(7)
    x = torch.randn(257, 129).to(dtype).requires_grad_()
    y = fast_dropout(x, 0.1)
    weights = torch.randn(x.shape).to(dtype)
    y.backward(weights)
    scale = 65536 / (65536 - round(0.1 * 65536))
    keep = y.detach() != 0
    assert keep.any() and not keep.all() and y.dtype == dtype
    assert torch.equal(y.detach(), (x.detach().float() * scale).to(dtype) * keep)
    assert torch.equal(x.grad, (weights.float() * scale).to(dtype) * keep)


def test_seed_reproduces_masks_and_edge_rates():
    x = torch.randn(10, 10)
    torch.manual_seed(3)
    a = fast_dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, fast_dropout(x, 0.1))
    assert not torch.equal(fast_dropout(x, 0.1), fast_dropout(x, 0.1))  # each mask has its own seed
    assert fast_dropout(x, 0.0) is x and fast_dropout(x, 0.5, training=False) is x
    assert torch.equal(fast_dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        fast_dropout(x, 1.5)


def test_explicit_attention_equals_sdpa():
    """With a rate that rounds to zero dropped levels the explicit path keeps everything: it must then be SDPA."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(3, 4, 7, 8) for _ in range(3))
    mask = torch.ones(3, 1, 7, 7, dtype=torch.bool)
    mask[0, :, :, 5:] = False
    module = nn.Module()
    module.is_causal = False
    explicit, _ = sdpa_fast_dropout(module, q, k, v, mask, dropout=1e-9, scaling=0.3)
    reference, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=0.3)
    assert torch.allclose(explicit, reference, atol=1e-6)


def test_training_forwards_run_explicitly_and_equal_sdpa(tiny_bert_dir):
    """SDPA's CPU backward is slow (7x the explicit product's in bf16): training forwards without dropout
    (ConSERT's encoder) run the explicit product too, with SDPA's values and gradients."""
    torch.manual_seed(5)
    ids = torch.randint(5, 50, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    results = []
    for swap in (False, True):
        model = AutoModel.from_pretrained(str(tiny_bert_dir), attn_implementation="sdpa", hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0).train()
        if swap:
            use_fast_dropout(model)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            (out * mask[..., None]).square().sum().backward()
        sdpa_ops = {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}
        assert bool(sdpa_ops) != swap, sdpa_ops
        results.append((out.detach(), model.encoder.layer[0].attention.self.query.weight.grad))
    (sdpa_out, sdpa_grad), (explicit_out, explicit_grad) = results
    assert torch.allclose(explicit_out, sdpa_out, atol=1e-5)
    assert torch.allclose(explicit_grad, sdpa_grad, atol=1e-5)


def test_backbone_uses_it_everywhere_and_eval_is_unchanged(tiny_bert_dir, tmp_path):
    model = AutoModel.from_pretrained(str(tiny_bert_dir), attn_implementation="sdpa")
    ids = torch.randint(5, 50, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    model.eval()
    before = model(input_ids=ids, attention_mask=mask).last_hidden_state

    swapped = use_fast_dropout(model)
    native = sum(type(m) is nn.Dropout for m in model.modules())
    assert swapped > 0 and native == 0 and model.config._attn_implementation == ATTENTION_NAME
    assert torch.equal(model(input_ids=ids, attention_mask=mask).last_hidden_state, before)

    model.train()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        noisy = model(input_ids=ids, attention_mask=mask).last_hidden_state
    ops = {event.key for event in prof.key_averages()}
    assert "aten::bernoulli_" not in ops and "aten::native_dropout" not in ops  # no site left on torch's sampler
    assert not torch.allclose(noisy, before)

    model.save_pretrained(tmp_path)
    assert ATTENTION_NAME not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    reloaded = AutoModel.from_pretrained(str(tmp_path)).eval()
    assert torch.allclose(reloaded(input_ids=ids, attention_mask=mask).last_hidden_state, before, atol=1e-6)

    restore_native_dropout(model)
    assert not any(isinstance(m, FastDropout) for m in model.modules()) and model.config._attn_implementation == "sdpa"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor needs a C++ compiler")
def test_rate_under_torch_compile():
    """`torch_compile: true` traces the bulk draw (inductor replaces torch's generator by its own): every 16-bit
    lane of the 64-bit draws still drops at rate p, survivors are scaled by 1 / (1 - p), and calls differ."""
    compiled = torch.compile(lambda x: fast_dropout(x, 0.1, True))
    torch.manual_seed(0)
    ones = torch.ones(4096, 256)
    out = compiled(ones)
    dropped = (out == 0).flatten().double()
    n = dropped.numel() // 4
    for lane in range(4):  # the four int16 numbers of each int64 draw
        assert abs(dropped[lane::4].mean().item() - 0.1) < 5 * (0.1 * 0.9 / n) ** 0.5
    assert torch.allclose(out[out != 0], torch.tensor(65536 / (65536 - round(0.1 * 65536))))
    assert not torch.equal(compiled(ones), out)


def test_bf16_probabilities_equal_the_fp32_softmax_rounded():
    """The bf16 softmax skips two casts each way and must give the values of softmax in fp32 rounded to bf16."""
    torch.manual_seed(6)
    scores = (torch.randn(5, 7, 9) * 4).bfloat16()
    expected = torch.softmax(scores.float(), dim=-1).bfloat16()
    assert torch.equal(attention_probabilities(scores, torch.bfloat16), expected)
    assert torch.equal(attention_probabilities(scores.float(), torch.float32), torch.softmax(scores.float(), -1))
