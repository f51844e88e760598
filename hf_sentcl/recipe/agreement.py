"""Every process of a launch reaches one verdict on its recipe and run folder, and resumes from one checkpoint.

The checks before the model loads (`hf_sentcl.recipe.checks`) run on every process, each reading the files it sees.
On one shared file system they all see the same; on several nodes with their own disks (node-local scratch) they
may not: a node that lost its disk, a job requeued onto other nodes, a checkpoint one node finished and another did
not. A process that decided alone would refuse, finish or start afresh while its peers trained on, and the launch
would hang in its next collective or, worse, train with different optimizer states on different ranks. So after its
own checks every process shares its view (one all-gather on the CPU gloo group) and all act on the same decision:

- one process refused (exit 2): all refuse, with that process's message and its node;
- the run is finished on some nodes only: all refuse, naming the nodes without `run_complete.json`;
- output_dir is not shared between nodes (a node does not see the probe file process 0 writes there) and
  `save_on_each_node` is off: all refuse, since each node would hold only part of every checkpoint; a shared
  output_dir with `save_on_each_node: true` on several nodes is refused too (the nodes would write the same files);
- the processes would resume from different checkpoints: all take the newest step that every process holds whole;
  when there is none, all refuse, naming each node and the steps it holds.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.recipe.plan import RunPlan
from hf_sentcl.recipe.run_folder import RunComplete, checkpoint_problems

logger = logging.getLogger("hf_sentcl")

#: the file process 0 writes into output_dir for the others to look for (removed once they have)
PROBE_NAME = ".hf_sentcl-shared-probe"


@dataclass
class ProcessView:
    """What one process concluded from its own checks and the files it sees."""

    rank: int
    node: str
    outcome: str  # "ok", "refused" or "complete"
    message: str = ""
    failed: bool = False  # a finished run whose export or push failed (`RunComplete.failed`)
    resume: str | None = None  # the checkpoint it would resume from, relative to output_dir
    probe: str | None = None  # what it read from process 0's probe file (None: not there)
    usable: list[str] = field(default_factory=list)  # every usable checkpoint, relative to output_dir


def node_name() -> str:
    """'node R (host)': the launcher's node rank (torchrun's GROUP_RANK) and this machine's name."""
    return f"node {os.environ.get('GROUP_RANK', '0')} ({socket.gethostname()})"


def checked_by_every_process(recipe: Recipe, check: Callable[[Recipe], RunPlan]) -> RunPlan:
    """`check(recipe)` on every process, then the decision all processes share (module docstring): the checked run's
    plan, resuming from the one checkpoint every process resumes from; RecipeError or RunComplete on every
    process alike. Outside a process group, `check(recipe)` alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return check(recipe)
    view, result, error = own_view(recipe, check)
    output_dir = Path(recipe.training.output_dir).expanduser()
    token = uuid.uuid4().hex if dist.get_rank() == 0 else None
    if token is not None:
        write_probe(output_dir, token)
    from hf_sentcl.common.distributed import _long_wait_group

    group = _long_wait_group()  # a process may still be reading a large training file
    dist.barrier(group=group)
    view.probe = read_probe(output_dir)
    views: list[ProcessView] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(views, view, group=group)
    if token is not None:
        (output_dir / PROBE_NAME).unlink(missing_ok=True)
    decide_outcome(views, recipe, error)
    if len({v.resume for v in views}) > 1:  # rare: only then does every process list all its usable checkpoints
        view.usable = usable_checkpoints(output_dir)
        dist.all_gather_object(views, view, group=group)
        return with_resume(result, output_dir, agreed_resume(views))
    return result


def own_view(recipe: Recipe, check: Callable[[Recipe], RunPlan]
             ) -> tuple[ProcessView, RunPlan | None, Exception | None]:
    """This process's checks, caught: its view, the checked run's plan (None if refused or finished) and the error."""
    import torch.distributed as dist

    view = ProcessView(rank=dist.get_rank(), node=node_name(), outcome="ok")
    try:
        result = check(recipe)
    except RunComplete as done:
        view.outcome, view.message, view.failed = "complete", str(done), done.failed
        return view, None, done
    except (RecipeError, FileNotFoundError) as err:
        view.outcome, view.message = "refused", str(err)
        return view, None, err
    output_dir = Path(recipe.training.output_dir).expanduser()
    view.resume = relative_checkpoint(result.resume_from, output_dir)
    return view, result, None


def decide_outcome(views: list[ProcessView], recipe: Recipe, own_error: Exception | None) -> None:
    """Raise what every process must raise (a refusal, or the finished run), from all processes' views."""
    refused = [v for v in views if v.outcome == "refused"]
    if refused:
        if isinstance(own_error, RecipeError | FileNotFoundError) and len({v.message for v in refused}) == 1:
            raise own_error  # the same refusal everywhere: the message as one process gives it
        first = refused[0]
        raise RecipeError(f"{first.node}, process {first.rank}: {first.message}")
    complete = [v for v in views if v.outcome == "complete"]
    if complete and len(complete) < len(views):
        lacking = sorted({v.node for v in views if v.outcome != "complete"})
        raise RecipeError(
            f"{recipe.source}: key 'output_dir': the run in '{recipe.training.output_dir}' is finished "
            f"(run_complete.json) on {', '.join(sorted({v.node for v in complete}))} but not on "
            f"{', '.join(lacking)}: the nodes' disks disagree. Use the same disks as the run's first launch, or a "
            "file system every node mounts."
        )
    if complete:  # finished on every process: each says so with its own words
        raise own_error
    check_sharing(views, recipe)


def check_sharing(views: list[ProcessView], recipe: Recipe) -> None:
    """Refuse output_dir setups that lose checkpoints: node-local disks without `save_on_each_node`, or a shared one
    with it (several nodes writing the same files)."""
    blind = sorted({v.node for v in views if v.probe != views[0].probe or v.probe is None})
    nodes = {v.node for v in views}
    output_dir = recipe.training.output_dir
    if blind and not recipe.training.save_on_each_node:
        raise RecipeError(
            f"{recipe.source}: key 'output_dir': '{output_dir}' is not shared between the nodes: "
            f"{', '.join(blind)} do(es) not see the files {views[0].node} writes there, so each node would hold only "
            "its own part of every checkpoint and none could resume. Set 'save_on_each_node: true' (every node then "
            "keeps a whole copy on its own disk), or put output_dir on a file system every node mounts."
        )
    if not blind and recipe.training.save_on_each_node and len(nodes) > 1:
        raise RecipeError(
            f"{recipe.source}: key 'save_on_each_node' is true, but every node sees the same '{output_dir}': the "
            "nodes would write the same checkpoint files at once. Remove 'save_on_each_node' (it is for node-local "
            "disks)."
        )


def agreed_resume(views: list[ProcessView]) -> str | None:
    """The newest checkpoint (relative to output_dir) that every process holds whole; RecipeError naming each node's
    checkpoints when there is none although some process has one."""
    common = set.intersection(*(set(v.usable) for v in views))
    if common:
        agreed = max(common, key=checkpoint_order)
        newer = {v.node for v in views if v.resume and checkpoint_order(v.resume) > checkpoint_order(agreed)}
        if views and newer and os.environ.get("RANK", "0") == "0":
            logger.warning("Resuming every process from %s, the newest checkpoint every node holds whole (%s held "
                           "a newer one).", agreed, ", ".join(sorted(newer)))
        return agreed
    if not any(v.usable for v in views):
        return None
    held = "; ".join(f"{node}: {', '.join(node_checkpoints(views, node)) or 'none'}"
                     for node in sorted({v.node for v in views}))
    raise RecipeError(
        f"the processes hold no usable checkpoint in common ({held}), so they cannot resume from one step. With "
        "disks local to each node, a requeued job must run on the same nodes (or copy output_dir from a node that "
        "holds the checkpoint to the others); a file system every node mounts avoids this."
    )


def node_checkpoints(views: list[ProcessView], node: str) -> list[str]:
    """The checkpoints every process of `node` holds whole, oldest first."""
    held = set.intersection(*(set(v.usable) for v in views if v.node == node))
    return sorted(held, key=checkpoint_order)


def checkpoint_order(relative: str) -> tuple[int, int]:
    """Sort key of a checkpoint path relative to output_dir: the final stage's above a chained method's earlier
    stage, then the step."""
    path = Path(relative)
    return (0 if len(path.parts) > 1 else 1, int(path.name.rsplit("-", 1)[-1]))


def relative_checkpoint(resume: str | None, output_dir: Path) -> str | None:
    if not resume:
        return None
    path = Path(resume).resolve()
    return path.relative_to(output_dir.resolve()).as_posix() if path.is_relative_to(output_dir.resolve()) else str(path)


def usable_checkpoints(output_dir: Path) -> list[str]:
    """Every checkpoint-N of output_dir and of its stage folders that a resume can use, relative to output_dir."""
    found = []
    for folder in (output_dir, *(p for p in output_dir.glob("stage-*") if p.is_dir())):
        for path in folder.glob("checkpoint-*"):
            if path.is_dir() and path.name.rsplit("-", 1)[-1].isdigit() and not checkpoint_problems(path):
                found.append(path.relative_to(output_dir).as_posix())
    return found


def with_resume(plan: RunPlan | None, output_dir: Path, relative: str | None) -> RunPlan:
    """`plan` resuming from `relative` (a checkpoint relative to output_dir, or None for a fresh start)."""
    assert plan is not None  # decide_outcome raised for every other outcome
    return plan.resuming_from(str(output_dir / relative) if relative else None)


def write_probe(output_dir: Path, token: str) -> None:
    """Process 0's probe file (nothing when output_dir cannot be written: its own check has refused then)."""
    try:
        (output_dir / PROBE_NAME).write_text(token)
    except OSError:
        pass


def read_probe(output_dir: Path) -> str | None:
    try:
        return (output_dir / PROBE_NAME).read_text()
    except OSError:
        return None
