"""Two nodes, launched as users launch a multi-node job (one `accelerate launch --num_machines 2 --machine_rank R` per
node, 1 or 2 processes each), here both on this machine: with one shared output_dir, and with disks local to each node
(each launcher in a mount namespace of its own where a private folder is bind-mounted over the same output path).

Preempted (SIGTERM to both launchers mid-training) and requeued with `auto`, both nodes must resume from the same
step and end with the weights of a 1-process run at the same global batch (max |dW| <= 1e-5, training moved them
>= 1e-3), export once (node 0), and a further requeue finds the run finished on both. Node-local disks without
`save_on_each_node`, or a node that lost its checkpoints, are refused on both nodes before any work.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import tiny_simcse_recipe
from launching import CONFIGS, REPO, export_weights, free_port, launch_env, max_difference
from safetensors.torch import load_file

from hf_sentcl.common import exits
from hf_sentcl.common.layout import PREEMPTED_JSON, RUN_COMPLETE_JSON

pytestmark = pytest.mark.slow

PROBE = REPO / "tests" / "pipeline" / "phase_probe.py"
#: fp32, dropout 0, equal padding: what makes 1 and 2 processes agree to 1e-5 (tests/pipeline/test_launch_matrix.py)
FP32 = {"precision": "fp32", "dropout": 0, "learning_rate": "2e-3", "adam_epsilon": "1e-3", "pad_to_multiple_of": 32,
        "unpadded": "false"}


def can_unshare() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


def write_recipe(tmp_path: Path, tiny_bert_dir: Path, senteval_dir: Path, **changes) -> Path:
    return tiny_simcse_recipe(tmp_path, tiny_bert_dir, senteval_dir, max_steps=12, resume_from_checkpoint="auto",
                              **FP32, **changes)


def node_command(rank: int, port: int, recipe: Path, output: Path, private: Path | None, per_node: int = 1
                 ) -> list[str]:
    """Node `rank`'s launch line (`per_node` processes on each of the 2 nodes); with `private`, inside a mount
    namespace where it is mounted over `output`."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "multi_cpu.yaml"),
              "--num_machines", "2", "--machine_rank", str(rank), "--num_processes", str(2 * per_node),
              "--main_process_ip",
              "127.0.0.1", "--main_process_port", str(port), str(PROBE), str(recipe), "--output_dir", str(output)]
    if private is None:
        return launch
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"',
            "sh", str(private), str(output), *launch]


def launch_nodes(recipe: Path, output: Path, probes: Path, privates: list[Path | None], stop_at: str | None = None,
                 per_node: int = 1) -> list[tuple[int, str]]:
    """Both nodes' launches; with `stop_at` (a probe note), SIGTERM to both launchers once it exists."""
    for note in probes.glob("*"):
        note.unlink()
    port = free_port()
    env = launch_env(HF_SENTCL_PROBE_DIR=str(probes))
    nodes = [subprocess.Popen(node_command(rank, port, recipe, output, privates[rank], per_node),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                              start_new_session=True)
             for rank in (0, 1)]
    if not stop_at:
        return [(node.communicate(timeout=300)[0], node.returncode)[::-1] for node in nodes]
    deadline = time.monotonic() + 240
    while not (probes / stop_at).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    signalled = time.monotonic()
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    exits_at = {}
    while len(exits_at) < len(nodes) and time.monotonic() - signalled < 300:
        exits_at.update({rank: time.monotonic() - signalled for rank, node in enumerate(nodes)
                         if rank not in exits_at and node.poll() is not None})
        time.sleep(0.02)
    print("\nSIGTERM to both launchers; exits at " + ", ".join(f"node {r}: +{t:.2f} s" for r, t in exits_at.items()))
    return [(node.communicate(timeout=60)[0], node.returncode)[::-1] for node in nodes]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_bert_dir, senteval_dir):
    """The 1-process run at the same global batch: its exported weights."""
    tmp = tmp_path_factory.mktemp("one-process")
    output = tmp / "out"
    done = subprocess.run([sys.executable, "-m", "hf_sentcl.run", str(write_recipe(tmp, tiny_bert_dir, senteval_dir)),
                           "--output_dir", str(output)], capture_output=True, text=True, env=launch_env(), cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return export_weights(output)


@pytest.mark.parametrize("disks, per_node", [("shared", 1), ("node-local", 1), ("node-local", 2)],
                         ids=["shared-2x1", "node-local-2x1", "node-local-2x2"])
def test_two_nodes_preempted_and_requeued_train_as_one_process(disks, per_node, tmp_path, tiny_bert_dir,
                                                               senteval_dir, one_process):
    if disks == "node-local" and not can_unshare():
        pytest.skip("no mount namespaces here (unshare -m)")
    output, probes = tmp_path / "out", tmp_path / "probes"
    output.mkdir()
    probes.mkdir()
    privates = [None, None] if disks == "shared" else [tmp_path / "node0", tmp_path / "node1"]
    for private in filter(None, privates):
        private.mkdir()
    local = {"save_on_each_node": "true"} if disks == "node-local" else {}
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, **local)
    disk = [p or output for p in privates]

    stopped = launch_nodes(recipe, output, probes, privates, stop_at="step-5.0", per_node=per_node)
    assert all(status != 0 for status, _ in stopped), stopped
    notes = [json.loads((d / PREEMPTED_JSON).read_text()) for d in disk]
    print("checkpointed at step " + ", ".join(f"{n['step']} ({n['seconds_from_signal_to_note']} s)" for n in notes))
    steps = [int(note["step"]) for note in notes]
    assert len(set(steps)) == 1 and 5 <= steps[0] < 12, (steps, stopped[0][1][-3000:])

    finished = launch_nodes(recipe, output, probes, privates, per_node=per_node)
    assert [status for status, _ in finished] == [0, 0], finished[0][1][-3000:] + finished[1][1][-3000:]
    assert f"started_at_step\": {steps[0]}" in (disk[0] / "results.json").read_text()
    trained = export_weights(disk[0])
    initial = load_file(tiny_bert_dir / "model.safetensors")
    encoder = [k for k in trained if k in initial and not k.startswith("pooler.")]
    single, moved = max_difference(trained, one_process), max_difference(trained, initial, encoder)
    print(f"\n{disks} 2x{per_node}: 1-process max |dW| {single:.3g}; moved {moved:.3g}")
    assert single <= 1e-5 and moved >= 1e-3
    if disks == "node-local":
        assert not (disk[1] / "export").exists()  # exported once, by node 0
    assert all((d / RUN_COMPLETE_JSON).is_file() for d in disk)

    again = launch_nodes(recipe, output, probes, privates, per_node=per_node)
    assert [status for status, _ in again] == [exits.OK, exits.OK] and "nothing to do" in again[0][1], again


def node_local_folders(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """The shared output path, the probe folder and each node's private disk (skips without mount namespaces)."""
    if not can_unshare():
        pytest.skip("no mount namespaces here (unshare -m)")
    output, probes = tmp_path / "out", tmp_path / "probes"
    privates = [tmp_path / "node0", tmp_path / "node1"]
    for folder in (output, probes, *privates):
        folder.mkdir()
    return output, probes, privates


def test_node_local_disks_without_a_copy_on_each_node_are_refused(tmp_path, tiny_bert_dir, senteval_dir):
    output, probes, privates = node_local_folders(tmp_path)
    results = launch_nodes(write_recipe(tmp_path, tiny_bert_dir, senteval_dir), output, probes, privates)
    for status, out in results:
        assert status != 0 and "is not shared between the nodes" in out and "save_on_each_node: true" in out, out
    assert not list(privates[0].glob("checkpoint-*"))


def test_a_node_that_lost_its_checkpoints_is_named_and_both_refuse(tmp_path, tiny_bert_dir, senteval_dir):
    output, probes, privates = node_local_folders(tmp_path)
    recipe = write_recipe(tmp_path, tiny_bert_dir, senteval_dir, save_on_each_node="true")
    launch_nodes(recipe, output, probes, privates, stop_at="step-5.0")
    assert list(privates[1].glob("checkpoint-*"))
    for checkpoint in privates[1].glob("checkpoint-*"):  # the requeued job landed on a node with an empty disk
        shutil.rmtree(checkpoint)
    results = launch_nodes(recipe, output, probes, privates)
    for status, out in results:
        assert status != 0 and "no usable checkpoint in common" in out and "node 1" in out, out[-3000:]
