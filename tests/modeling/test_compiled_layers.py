"""`compile_layers`: training forwards of the transformer layers run through torch.compile and equal the eager
step, dropout masks included (forward and gradients, the unpadded path's tolerance), on both routes and for batches
of other lengths; evaluation stays eager; the recipe key switches a trainer's layers; a model without a layer stack
is refused."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_unpadded import TOLERANCE, counted, embeddings_and_grads, method_stage, mixed_batch

from hf_sentcl.common import hardware
from hf_sentcl.modeling import SentenceEncoder, backbone_forward, compiled, unpadded
from hf_sentcl.modeling.compiled import CompiledTrainingLayer, compile_layers, transformer_layers, uncompile_layers
from hf_sentcl.modeling.fast_dropout import use_fast_dropout

needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor needs a C++ compiler"
)


def encoder_without_dropout(directory) -> SentenceEncoder:
    return SentenceEncoder.from_backbone(str(directory), pooling="mean", hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0).train()


def calls_of_compiled_functions(monkeypatch) -> list:
    """Records the key of every compiled function called (the real compiled function still runs)."""
    keys = []
    original = compiled.compiled

    def recording(key, function):
        keys.append(key)
        return original(key, function)

    monkeypatch.setattr(compiled, "compiled", recording)
    monkeypatch.setattr(unpadded, "compiled", recording)
    return keys


def seeded_embeddings_and_grads(encoder: SentenceEncoder, batch: dict, unpadded: bool, seed: int = 3):
    torch.manual_seed(seed)  # the same dropout masks: compiled layers draw them from torch's generator too
    return embeddings_and_grads(encoder, batch, unpadded=unpadded)


# CI time (each case compiles for ~15 s): BERT on the unpadded route, RoBERTa (position ids from padding_idx) padded
@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("backbone, route", [("bert", "unpadded"), ("roberta", "padded")])
def test_compiled_training_step_equals_the_eager_step_dropout_included(backbone, route, request, monkeypatch):
    directory = request.getfixturevalue(f"tiny_{backbone}_dir")
    encoder = SentenceEncoder.from_backbone(str(directory), pooling="mean", hidden_dropout_prob=0.2,
                                            attention_probs_dropout_prob=0.2).train()
    use_fast_dropout(encoder)  # as every trainer does on a CPU
    batch = mixed_batch(encoder)
    use_unpadded = route == "unpadded"
    eager, eager_grads = seeded_embeddings_and_grads(encoder, batch, use_unpadded)
    assert compile_layers(encoder) == encoder.config.backbone_config.num_hidden_layers
    keys = calls_of_compiled_functions(monkeypatch)
    with counted(backbone_forward, "unpadded_forward") as unpadded_calls:
        compiled_out, compiled_grads = seeded_embeddings_and_grads(encoder, batch, use_unpadded)
    layers = encoder.config.backbone_config.num_hidden_layers
    if use_unpadded:  # the token-wise rest of each layer after attention
        assert len(unpadded_calls) == 1 and keys == ["layer_tail"] * layers
    else:  # each layer's own forward
        assert not unpadded_calls and len(keys) == layers and "layer_tail" not in keys
    assert compiled_grads.keys() == eager_grads.keys() and eager_grads
    forward = (compiled_out - eager).abs().max().item()
    gradient = max((compiled_grads[k] - eager_grads[k]).abs().max().item() for k in eager_grads)
    print(f"{directory.name} {route}: forward {forward:.2e}, gradient {gradient:.2e}")
    assert forward <= TOLERANCE and gradient <= TOLERANCE

    # dropout drops: another seed gives other embeddings, and both differ from evaluation's
    other_seed, _ = seeded_embeddings_and_grads(encoder, batch, use_unpadded, seed=4)
    with torch.no_grad():
        clean = encoder.eval()(**batch).embeddings
    encoder.train()
    assert (other_seed - compiled_out).abs().max() > 1e-2 and (compiled_out - clean).abs().max() > 1e-2

    # a batch of other lengths reuses the dynamic-shape graph and still equals the eager step
    other = mixed_batch(encoder, n=5)
    compiled_other, _ = seeded_embeddings_and_grads(encoder, other, use_unpadded)
    uncompile_layers(encoder)
    eager_other, _ = seeded_embeddings_and_grads(encoder, other, use_unpadded)
    assert (compiled_other - eager_other).abs().max().item() <= TOLERANCE


def test_evaluation_and_no_grad_forwards_stay_eager(tiny_bert_dir, monkeypatch):
    encoder = encoder_without_dropout(tiny_bert_dir)
    compile_layers(encoder)
    keys = calls_of_compiled_functions(monkeypatch)
    batch = mixed_batch(encoder)
    encoder.eval()
    encoder(**batch)
    encoder.encode(["a short sentence", "and another, somewhat longer, sentence to pad"])
    encoder.train()
    with torch.no_grad():
        encoder(**batch)
    assert keys == []


def test_switching_keeps_weights_and_state_dict_and_can_be_undone(tiny_bert_dir):
    encoder = encoder_without_dropout(tiny_bert_dir)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    layers = transformer_layers(encoder)
    assert len(layers) == 2 and compile_layers(encoder) == 2
    assert all(isinstance(layer, CompiledTrainingLayer) for layer in layers)
    assert compile_layers(encoder) == 0  # already switched
    after = encoder.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    uncompile_layers(encoder)
    assert not any(isinstance(m, CompiledTrainingLayer) for m in encoder.modules())


def test_a_model_without_a_layer_stack_is_refused():
    with pytest.raises(ValueError, match="compile_layers: Sequential has no transformer layer stack"):
        compile_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_the_recipe_key_switches_the_trainers_layers(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    from hf_sentcl.configs import arguments

    monkeypatch.setattr(arguments, "cpu_compiler_problem", lambda: None)  # nothing compiles here (CI may lack g++)
    (tmp_path / "plain").mkdir()
    (tmp_path / "compiled").mkdir()
    plain = method_stage("simcse", tmp_path / "plain", tiny_bert_dir, senteval_dir)
    assert not any(isinstance(m, CompiledTrainingLayer) for m in plain.encoder.modules())
    stage = method_stage("simcse", tmp_path / "compiled", tiny_bert_dir, senteval_dir, compile_layers="true")
    assert stage.trainer.args.compile_layers
    assert all(isinstance(layer, CompiledTrainingLayer) for layer in transformer_layers(stage.encoder))



def test_a_cpu_run_without_a_cxx_compiler_is_refused_before_work(tmp_path, tiny_bert_dir, senteval_dir, monkeypatch):
    """Inductor builds C++ for the CPU: without a compiler the recipe is refused when parsed, naming the fix."""
    (tmp_path / "run").mkdir()
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler.*apt install g\\+\\+.*compile_layers: false"):
        method_stage("simcse", tmp_path / "run", tiny_bert_dir, senteval_dir, compile_layers="true")
    assert hardware.cpu_compiler_problem() is not None
    monkeypatch.setenv("CXX", "my-cxx")
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/opt/bin/my-cxx" if name == "my-cxx" else None)
    assert hardware.cpu_compiler_problem() is None
