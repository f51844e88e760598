"""The padded route (the one GPUs take without a FlashAttention varlen kernel) traces as one graph in training, so
transformers' `torch_compile` with `torch_compile_mode: reduce-overhead` can capture the whole forward in CUDA
graphs: a host read or another graph break there splits the graph and gives back the launches CUDA graphs remove
(docs/benchmarks.md, "BERT-base at batch 64": 20.5 against 52.4 ms per step on an H200). transformers' SDPA mask
check, the one host read of the eager step, is traced away."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from hf_sentcl.modeling import SentenceEncoder, routes
from hf_sentcl.modeling.fast_dropout import use_fast_dropout


@pytest.mark.parametrize("pooling, head, route", [("mean", "none", "unpadded: false"),
                                                  ("cls", "mlp", "chosen as on a GPU")])
def test_the_padded_training_forward_is_one_graph(tiny_bert_dir, pooling, head, route, monkeypatch):
    """Both ways to the padded route: `unpadded: false`, and the default `unpadded: true` on a GPU without a varlen
    kernel (the route chosen, and its one-time log line kept out of the trace). The trainer's dropout modules are in
    place (`fast_dropout`, at rate 0: their CPU-only random draw runs outside the graph by design)."""
    if route == "chosen as on a GPU":
        real_choice = routes.choose_route
        monkeypatch.setattr(routes, "choose_route", lambda reason, device, attention: real_choice(
            reason, "cuda", attention))
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling=pooling, head=head,
                                            unpadded=route != "unpadded: false", hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0).train()
    use_fast_dropout(encoder)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    batch = tokenizer(["a short one", "a somewhat longer sentence with more words in it"] * 4, padding=True,
                      return_tensors="pt")
    assert not bool(batch["attention_mask"].all())  # padding present: the mask check has something to look at
    torch._dynamo.reset()
    explained = torch._dynamo.explain(encoder)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    reasons = [str(reason.reason).splitlines()[0] for reason in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons
