"""The padded route (the one GPUs take without a FlashAttention varlen kernel) traces as one graph in training, so
transformers' `torch_compile` with `torch_compile_mode: reduce-overhead` can capture the whole forward in CUDA
graphs: a host read or another graph break there splits the graph and gives back the launches CUDA graphs remove
(docs/benchmarks.md, "BERT-base at batch 64": 20.5 against 52.4 ms per step on an H200). transformers' SDPA mask
check, the one host read of the eager step, is traced away."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from hf_sentcl.modeling import SentenceEncoder


@pytest.mark.parametrize("pooling, head", [("mean", "none"), ("cls", "mlp")])
def test_the_padded_training_forward_is_one_graph(tiny_bert_dir, pooling, head):
    encoder = SentenceEncoder.from_backbone(str(tiny_bert_dir), pooling=pooling, head=head, unpadded=False).train()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    batch = tokenizer(["a short one", "a somewhat longer sentence with more words in it"] * 4, padding=True,
                      return_tensors="pt")
    assert not bool(batch["attention_mask"].all())  # padding present: the mask check has something to look at
    torch._dynamo.reset()
    explained = torch._dynamo.explain(encoder)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    reasons = [str(reason.reason).splitlines()[0] for reason in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons
