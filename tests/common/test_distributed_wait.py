"""Process 0's solo work (the "before" evaluation, a chained stage's export) can outlast `ddp_timeout`: the other
processes wait for it in a long-timeout group, not in the default group's next collective. Two gloo processes whose
default group times out after 3 s, with process 0 busy for 6 s."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_sentcl.common.distributed import others_wait_for_main_process

SOLO_SECONDS = 6


def _worker(rank: int, init_file: str, results: str, use_long_wait: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=3))
    try:
        if use_long_wait:
            with others_wait_for_main_process() as main:
                if main:
                    time.sleep(SOLO_SECONDS)
        elif rank == 0:
            time.sleep(SOLO_SECONDS)
        total = torch.ones(1)
        dist.all_reduce(total)  # what DDP's preparation does next
        outcome = f"ok {int(total.item())}"
    except RuntimeError as err:
        outcome = f"error {type(err).__name__}"
    with open(f"{results}.{rank}", "w") as f:
        f.write(outcome)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("use_long_wait", [True, False])
def test_others_wait_for_process_0_beyond_the_group_timeout(tmp_path, use_long_wait):
    results = tmp_path / "result"
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(results), use_long_wait), nprocs=2, join=True)
    waited = (tmp_path / "result.1").read_text()
    if use_long_wait:
        assert waited == "ok 2" and (tmp_path / "result.0").read_text() == "ok 2"
    else:  # the failure the long wait prevents: process 1 gives up in the default group
        assert waited.startswith("error")
