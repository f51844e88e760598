"""`hf_sentcl.run` under the Trainer's FSDP2 path (accelerate's DistributedType.FSDP, fsdp.yaml's plugin) on gloo CPU
process groups, the way this CPU allows it:

    accelerate launch --config_file recipes/accelerate_configs/fsdp.yaml --num_processes 2 \\
        tests/pipeline/trainer_fsdp_cpu.py RECIPE [--key value ...]      # the user's launch line, this script for -m
    python tests/pipeline/trainer_fsdp_cpu.py RECIPE [--key value ...]   # 1 process, fsdp.yaml's environment

accelerate turns FSDP on only for accelerator devices (on CPUs `fsdp.yaml` would train plain gloo DDP, which the
run refuses), so this script makes accelerate take the gloo CPU group for a GPU group (backend gloo, device cpu):
AcceleratorState then selects FSDP, and the Trainer prepares the encoder with `fully_shard` per layer, saves FSDP
checkpoints, reloads the best one, and saves the full state dict, as on GPUs. Under `accelerate launch` everything
else (fsdp.yaml's settings, its mixed precision, the processes and their rendezvous) comes from the launcher; run
directly, it sets what `accelerate launch --config_file fsdp.yaml --num_processes 1 --mixed_precision no` gives a
worker and opens a 1-process group itself.
"""

from __future__ import annotations

import os
import sys

FSDP_YAML_ENV = {  # what accelerate launch exports for recipes/accelerate_configs/fsdp.yaml
    "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "false", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "false", "FSDP_ACTIVATION_CHECKPOINTING": "false",
    "FSDP_SYNC_MODULE_STATES": "true", "FSDP_USE_ORIG_PARAMS": "true", "FSDP_FORWARD_PREFETCH": "false",
    "FSDP_MIN_NUM_PARAMS": "0", "ACCELERATE_MIXED_PRECISION": "no",
}
WORKER_ENV = {  # a 1-process torchrun worker
    "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
}


def main(argv: list[str]) -> int:
    launched = "RANK" in os.environ  # by accelerate launch (torchrun): the group's rendezvous is in the environment
    if not launched:
        os.environ.update({**FSDP_YAML_ENV, **WORKER_ENV})
    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"  # the "GPU" group's device
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    import hf_sentcl.recipe.parallelism as parallelism
    from hf_sentcl.cli.train import main as train

    # a GPU worker's backend choice, with gloo on the CPU: AcceleratorState enables FSDP only for accelerator types
    PartialState._prepare_backend = lambda self, *args, **kwargs: ("gloo", DistributedType.MULTI_GPU)
    parallelism.has_accelerator = lambda: True  # the run refuses fsdp.yaml without one (it would be DDP there)
    # accelerate opens the group of a GPU worker only, and of a CPU worker only for MULTI_CPU: open it here
    if launched:
        dist.init_process_group("gloo")  # the launcher's rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one process: no rendezvous
    try:
        return train(argv)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
