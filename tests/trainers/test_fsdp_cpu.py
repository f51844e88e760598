"""FSDP2 on a 2-process gloo group on this CPU (accelerate runs FSDP only on accelerators, so the Trainer-level FSDP
run is a GPU check): the encoder is prepared by accelerate's own `fsdp2_prepare_model` (`fully_shard` per BertLayer,
the token-embedding table as a unit of its own, never inside a BertEmbeddings unit too), trains a few contrastive
steps with gathered negatives, and its full state dict, saved and reloaded, equals a 1-process run's weights."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_sentcl.common.distributed import gather_with_grad, world_size
from hf_sentcl.losses import info_nce
from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.trainers.base import scale_gradient

pytestmark = pytest.mark.slow
WORLD, LOCAL, STEPS = 2, 3, 3
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def encoder(path):
    torch.manual_seed(0)
    return SentenceEncoder.from_backbone(path, head="mlp", **NO_DROPOUT)


def batches():
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(5, 40, (WORLD * LOCAL, 8), generator=generator) for _ in range(STEPS)]


def train(model, rows):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                                  eps=1e-6)  # see test_scaling.py's adam_epsilon
    model.train()
    for ids in batches():
        z = model(input_ids=ids[rows]).embeddings
        loss = scale_gradient(info_nce(gather_with_grad(z), gather_with_grad(z.flip(-1)), 0.05), world_size())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _worker(rank, init_file, path, out):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
            state_dict_type="FULL_STATE_DICT",
        )
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                      is_main_process=rank == 0, device=torch.device("cpu"), torch_device_mesh=None)
        model = encoder(path)
        table = model.get_input_embeddings()
        model = fsdp2_prepare_model(accelerator, model)
        units = sorted({type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)})
        train(model, slice(rank * LOCAL, (rank + 1) * LOCAL))
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save({"units": units, "table_shape": tuple(table.weight.to_local().shape), "state": full}, out)
    finally:
        dist.destroy_process_group()


def test_fsdp2_per_layer_trains_and_full_state_dict_reloads(tmp_path, tiny_bert_dir):
    out = tmp_path / "fsdp.pt"
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tiny_bert_dir), str(out)), nprocs=WORLD, join=True)
    saved = torch.load(out, weights_only=False)
    assert {"FSDPBertLayer", "FSDPEmbedding"} <= set(saved["units"]) and "FSDPBertEmbeddings" not in saved["units"]
    reference = encoder(str(tiny_bert_dir))
    start = {k: v.clone() for k, v in reference.state_dict().items()}
    assert saved["table_shape"][0] == -(-start["backbone.embeddings.word_embeddings.weight"].shape[0] // WORLD)
    train(reference, slice(None))  # one process, the whole global batch
    reloaded = encoder(str(tiny_bert_dir))
    reloaded.load_state_dict(saved["state"], strict=True)
    expected = reference.state_dict()
    diff = max((reloaded.state_dict()[k] - expected[k]).abs().max().item() for k in expected)
    moved = max((expected[k] - start[k]).abs().max().item() for k in expected)
    print(f"\nFSDP2 (2 gloo processes) vs 1 process: max diff {diff:.3g}, training moved weights by {moved:.3g}")
    assert moved >= 1e-3 and diff <= 1e-5
