"""Kill-and-resume on a tiny random BERT (SimCSE, 30 steps, checkpoints every 4): an uninterrupted run, then a
run SIGKILLed once checkpoint-8 is complete (1 process: the process; 2 processes: one worker of the launch), resumed
with `--resume_from_checkpoint latest`; prints the max abs weight difference of the two final models.

    PYTHONPATH=$PWD python benchmarks/kill_resume.py PROCESSES DROPOUT [WORK_DIR]   # e.g. 2 0.1
"""
import os, shutil, signal, subprocess, sys, time
from pathlib import Path

from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import build_tiny_bert, random_sentences, write_full_senteval  # noqa: E402

root = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/kill_resume")
py = sys.executable
if not (root / "bert").is_dir():
    build_tiny_bert(root / "bert")
    write_full_senteval(root / "se")
    (root / "train.txt").write_text("\n".join(random_sentences(24, seed=5)) + "\n")
procs, dropout = int(sys.argv[1]), sys.argv[2]
tag = f"p{procs}-d{dropout}"
vals = dict(method="simcse", model_name_or_path=root / "bert", train_file=root / "train.txt", sts_data_dir=root / "se",
            per_device_train_batch_size=4 if procs == 1 else 2, max_seq_length=16, max_steps=30, save_steps=4,
            eval_steps=4, logging_steps=1, learning_rate="1e-3", use_cpu="true", seed=0, dropout=dropout,
            save_total_limit="null", eval_before_training="false", eval_tasks="[]", load_best_model_at_end="false")
recipe = root / f"kr-{tag}.yaml"
recipe.write_text("".join(f"{k}: {v}\n" for k, v in vals.items()))
if procs == 1:
    cmd = [py, "-m", "hf_sentcl.run", str(recipe)]
else:
    cmd = [py, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate_configs/multi_cpu.yaml",
           "-m", "hf_sentcl.run", str(recipe)]
def go(out, extra=(), kill_at=None):
    shutil.rmtree(out, ignore_errors=True) if not extra else None
    p = subprocess.Popen(cmd + ["--output_dir", str(out), *extra], stdout=subprocess.DEVNULL,
                         stderr=open(f"{out}.log", "w"),
                         start_new_session=True)
    if kill_at is None:
        return p.wait()
    mark = out / f"checkpoint-{kill_at}" / "checkpoint_complete.json"
    while not mark.exists() and p.poll() is None:
        time.sleep(0.02)
    if procs == 1:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(); return ("killed", p.returncode)
    # 2 processes: kill one worker (rank 1), time how long the whole launch takes to end
    kids = subprocess.run(["pgrep", "-f", f"output_dir {out}"], capture_output=True, text=True).stdout.split()
    workers = [k for k in kids if int(k) != p.pid]
    t0 = time.time(); os.kill(int(workers[-1]), signal.SIGKILL)
    try:
        rc = p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); rc = "HUNG"
    return ("launch ended", rc, f"{time.time() - t0:.1f}s after killing pid {workers[-1]}")
full, crash = root / f"full-{tag}", root / f"crash-{tag}"
print(tag, "uninterrupted exit", go(full))
print(tag, go(crash, kill_at=8))
print(tag, "checkpoints left", sorted(p.name for p in crash.glob("checkpoint-*")))
print(tag, "resume exit", go(crash, ["--resume_from_checkpoint", "latest"]))
a, b = load_file(full / "model.safetensors"), load_file(crash / "model.safetensors")
print(tag, "max abs weight diff", max((a[k] - b[k]).abs().max().item() for k in a))
