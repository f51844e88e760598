"""GPU check (issue 25): everything that only a GPU can show, in one command, in a few minutes on one GPU.

    python benchmarks/gpu_check.py [--steps 30] [--only fp16,resume] [--wheels .whl]

A bare GPU machine has PyTorch with CUDA but maybe not the rest (`datasets`, `deepspeed`, ...), or an older
transformers than hf_sentcl needs. Carry the rest as a bundle of wheels (benchmarks/gpu_bundle.py says what it holds)
prepared on a machine with PyPI access, for the GPU machine's Python version:

    make gpu-bundle GPU_PYTHON=3.12        # into .whl/ (git ignores it); GPU_PYTHON: `python3 --version` there

Copy the repository with its `.whl/` folder to the GPU machine (e.g. `rsync -a --exclude .venv ./ gpu:hf_sentcl/`)
and run `python benchmarks/gpu_check.py` there. Before any work the check makes sure every package it and its
workers import is there (`gpu_bundle.ensure_packages`): when one is missing or too old it installs the bundle
(`--wheels`, default `.whl/`) offline into a scratch site folder, first on sys.path and PYTHONPATH, and starts again;
when something is still missing it prints one message naming every missing package and the command that prepares
the bundle, and exits with status 2.

On a BERT-base-sized random encoder (12 layers, hidden 768, vocab 30522; SimCSE, batch 64, 32 tokens) it runs:

- one training per precision: fp32, tf32 (fp32 with TF32 matmuls), bf16, fp16 (with the gradient scaler);
- `single`, `ddp2`, `fsdp`, `zero3`: the same training (fp32, TF32 off, dropout 0, batches padded to 32 tokens, the
  same seed, data order and global batch 64) once with 1 process and once each under DDP (2 processes), FSDP
  (recipes/accelerate_configs/fsdp.yaml) and DeepSpeed ZeRO-3 (deepspeed_zero3.yaml), with as many processes as
  the machine has GPUs, at most 2, each of the N processes taking 64/N sentences a step. Each writes its final
  weights; the note gives the max |difference| from the 1-process run's (pass: at most `WEIGHT_TOLERANCE`). With
  2 GPUs or more DDP runs NCCL on 2 GPUs and FSDP / ZeRO-3 shard over 2 processes; with 1 GPU DDP runs 2 gloo ranks
  sharing it (NCCL refuses two ranks on one device) and FSDP / ZeRO-3 run 1 process (not sharded across
  processes); the notes say which;
- a resume after a kill: a run killed (SIGKILL) once a checkpoint is complete, resumed from it to the end;
- a host-sync count: `torch.cuda.set_sync_debug_mode("warn")` around the training steps (the step itself makes no
  host read, tests/test_host_syncs.py; transformers' SDPA mask check makes one per forward);
- whole runs, `fsdp_run` and `zero3_run`: `accelerate launch --config_file fsdp.yaml` (deepspeed_zero3.yaml)
  `--num_processes N -m hf_sentcl.run recipes/simcse_bert.yaml` with the shipped recipe's defaults (the "before"
  evaluation, the best checkpoint reloaded at the end, the config's bf16), overriding only the model (a random
  MiniLM-shaped BERT: 6 layers, hidden 384), the data (a random corpus of 1,280 sentences and a SentEval layout of
  SentEval's sizes made of random sentences) and the step counts (20 steps, dev evaluation and checkpoint every 10),
  through the final evaluation and the export. The check reads results.json: bf16, "before" and "after" STS scores,
  a best step. `HF_SENTCL_HANG_DUMP_S` is armed in the run: one still going after `RUN_DUMP_S` seconds prints its
  stacks and ends, and the note names where it was.
- `perf` (issue 37): the GPU step's speed, with benchmarks/train_vs_sentence_transformers.py on CUDA (BERT-base
  shape, batch 64, max_len 32, bf16, 100 steps, two alternating rounds): hf_sentcl's CUDA route (padded SDPA; one
  host read per step, transformers' SDPA mask check), the same with `compile_layers: true`, the same with
  `pooling: cls, head: mlp` (the paper's own pooling: the last layer on first positions only), the whole model
  compiled with CUDA graphs (`torch_compile_mode: reduce-overhead`, `pad_to_multiple_of: 8`), FlashAttention's
  varlen route (compiled and not) where `flash_attn` is installed, and sentence-transformers' trainer. The note
  gives each one's examples/s, step time, first step (compilation), share of the card's dense bf16 peak (6 x layer
  parameters x real tokens per step) and ratio to sentence-transformers; the benchmark's own table is printed
  above the check's.
- `profile`: the same benchmark's `--profile` (hf_sentcl's default route and sentence-transformers, one profiled
  step each): the GPU's busy time (union of its kernels', copies' and memsets' intervals) and their number beside
  the profiled step's wall time; busy far below the wall time is a host-bound step (on an H200: 12.9 ms busy in a
  108 ms profiled step, 52.4 ms unprofiled).

and prints one table: check, result (pass or FAIL), median step time in ms, note. Each check runs in its own
process(es) (a failure or hang in one does not stop the others). On one H200 (Python 3.12, torch 2.11, CUDA 13.0,
transformers 5.17 replaced by the bundle's 5.24; 44 of the 3.12 bundle's 63 wheels carried, the image having the
rest) every check passed in 383 s after a few seconds of installation; 1 vs N processes (1 GPU): DDP 7.6e-7, FSDP
4.2e-7, ZeRO-3 1.1e-6, the weights having moved up to 2.7e-3. Exit status: 0 when every check passes, 1 otherwise,
2 when there is no CUDA device (the check refuses to run on a CPU) or a package is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# benchmarks/gpu_bundle.py (standard library only): its folder is on sys.path when this runs as a script (the check
# and its workers), not when a test loads this file by its path
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
import gpu_bundle

REPO = Path(__file__).resolve().parents[1]
CHECKS = ("fp32", "tf32", "bf16", "fp16", "single", "ddp2", "fsdp", "zero3", "resume", "host_syncs", "fsdp_run",
          "zero3_run", "perf", "profile")
#: checks compared with the 1-process run `single` (it runs first when any of them is asked for)
COMPARED = ("ddp2", "fsdp", "zero3")
#: seconds one check may take (the worker checks; perf and profile have PERF_TIMEOUT)
CHECK_TIMEOUT = 150
#: seconds after which a whole run (fsdp_run, zero3_run) prints its stacks and ends (such a run took 23 s with plain
#: `python -m hf_sentcl.run` and 49 s under deepspeed_zero3.yaml on an H200, without the "before" evaluation)
RUN_DUMP_S = 120
REFUSAL = ("gpu_check: no CUDA device here. This check measures the GPU paths (precisions, DDP, FSDP, ZeRO-3, "
           "resume, host syncs) and needs an NVIDIA GPU; run it on a GPU machine: python benchmarks/gpu_check.py")
VOCAB = 30522
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: BertConfig keys of the checks' encoder (empty: BertConfig's defaults, BERT-base)
MODEL_CONFIG: dict = {}
GLOBAL_BATCH = 64
MAX_TOKENS = 32
#: the comparisons' training: fp32 without TF32 (and dropout 0, batches padded alike: `build_trainer(exact=True)`).
#: Adam's epsilon at 1e-6 rather than 1e-8: Adam turns a gradient element that is only rounding noise (an
#: analytically zero gradient, e.g. of the attention key bias, ~1e-10) into a step of up to the learning rate with a
#: random sign; at 1e-6 such an element moves its weight by about lr * 1e-4, while real gradients (>= 1e-5) keep
#: their Adam steps. The (constant) learning rate moves the weights by up to about lr * steps = 3e-3 in 30 steps.
COMPARISON = {"precision": "fp32", "tf32": False, "learning_rate": 1e-4, "lr_scheduler_type": "constant",
              "adam_epsilon": 1e-6}
#: max |final weight difference| between 1 and N processes that passes. fp32 on a GPU (TF32 off) rounds differently
#: for other matrix shapes (per-process batch 32 against 64) and other reduction orders (all-reduce, reduce-scatter),
#: ~1e-7 relative per operation; carried through 30 Adam steps such differences stay around 1e-6 (the CPU
#: comparisons of tests/pipeline/test_scaling.py end within 1e-5). A wrong global batch, data order, gradient
#: average or lost update changes the weights by the order of their movement (>= 1e-3, `MIN_MOVED`): 1e-4 lies
#: between the two, ten times below the movement and about a hundred times above the rounding.
WEIGHT_TOLERANCE = 1e-4
#: the 1-process run must move its weights at least this much (else the comparison would show nothing)
MIN_MOVED = 10 * WEIGHT_TOLERANCE
SHIPPED_RECIPE = REPO / "recipes" / "simcse_bert.yaml"
ACCELERATE_CONFIGS = REPO / "recipes" / "accelerate_configs"
WHOLE_RUN_STEPS = 20


# ---------------------------------------------------------------------------------------------- the model and data
def write_model(folder: Path, **config) -> Path:
    """A random BERT (BertConfig's defaults: BERT-base, or `config`) and a WordPiece tokenizer over `VOCAB` made-up
    words."""
    import torch
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
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 30, (n,), generator=generator).tolist()
    return [" ".join(f"w{i}" for i in torch.randint(0, VOCAB - 5, (k,), generator=generator).tolist()) for k in lengths]


def build_trainer(workdir: Path, steps: int, output: Path, exact: bool = False, **settings):
    """SimCSE (batch 64, max 32 tokens) on the random BERT-base; `settings` are SimCSEConfig keys. `exact`: dropout
    0, the padded forward and every batch padded to 32 tokens (for the comparisons between 1 and N processes)."""
    from datasets import Dataset
    from transformers import set_seed

    from hf_sentcl import SentenceEncoder
    from hf_sentcl.data import ViewCollator, tokenize_views
    from hf_sentcl.methods.simcse.config import SimCSEConfig
    from hf_sentcl.methods.simcse.trainer import SimCSETrainer

    set_seed(0)  # the projection head starts alike in every run
    backbone = {"unpadded": False, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if exact else {}
    encoder = SentenceEncoder.from_backbone(str(write_model(workdir / "model", **MODEL_CONFIG)), pooling="cls",
                                            head="mlp", **backbone)
    dataset = tokenize_views(Dataset.from_dict({"text": sentences(GLOBAL_BATCH * steps)}), encoder.tokenizer,
                             ("text",), MAX_TOKENS)
    values = {
        "output_dir": str(output), "per_device_train_batch_size": GLOBAL_BATCH, "learning_rate": 3e-5,
        "max_steps": steps, "eval_strategy": "no", "save_strategy": "no", "load_best_model_at_end": False,
        "logging_steps": 5, "report_to": "none", "disable_tqdm": True, "seed": 0, "temperature": 0.05,
        "warmup_steps": 0,
    }
    values.update(settings)
    collator = ViewCollator(encoder.tokenizer, pad_to_multiple_of=MAX_TOKENS if exact else None)
    return SimCSETrainer(model=encoder, args=SimCSEConfig(**values), train_dataset=dataset, data_collator=collator)


def outcome(trainer, steps: int, note: str = "") -> dict:
    """pass when every logged loss is finite and the run reached `steps`; the median step time in ms."""
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    ok = trainer.state.global_step == steps and bool(losses) and all(math.isfinite(x) for x in losses)
    seconds = trainer.training_cost().get("train_step_seconds")
    last = f"last loss {losses[-1]:.4f}" if losses else "no loss logged"
    step_ms = None if seconds is None else 1000 * seconds
    return {"ok": ok, "step_ms": step_ms, "note": "; ".join(filter(None, [last, note]))}


# ---------------------------------------------------------------------------------------------- 1 and N processes
def plan(gpus: int) -> dict:
    """How the comparisons and whole runs use `gpus` GPUs: `sharded`, the processes of FSDP and ZeRO-3 (one per GPU,
    at most 2); DDP always 2 processes, over NCCL on 2 GPUs, or as 2 gloo ranks sharing the one GPU."""
    if gpus < 1:
        raise ValueError("no CUDA device: the check refuses to run")
    sharded = min(2, gpus)
    shared = gpus < 2
    return {
        "sharded": sharded, "ddp_processes": 2, "ddp_backend": "gloo" if shared else "nccl", "ddp_shares_gpu": shared,
        "sharded_note": "1 GPU: not sharded across processes" if sharded == 1 else f"sharded over {sharded} GPUs",
        "ddp_note": "1 GPU: 2 gloo ranks sharing it" if shared else "2 GPUs, NCCL",
    }


def save_final_weights(trainer, path: Path):
    """Every process takes part (FSDP and ZeRO-3 gather the full weights); process 0 writes them to `path` (fp32,
    safetensors) and returns them, the others None."""
    import torch
    from safetensors.torch import save_file

    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    if not trainer.is_world_process_zero():
        return None
    weights = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(weights, str(path))
    return weights


def max_difference(reference: dict, other: dict) -> tuple[float, str | None]:
    """max |reference - other| over the reference's tensors, or (inf, why) when `other` lacks one or its shape
    differs."""
    lacking = sorted(reference.keys() - other.keys())
    if lacking:
        return math.inf, f"{len(lacking)} weights missing ({', '.join(lacking[:2])})"
    reshaped = sorted(k for k in reference if tuple(reference[k].shape) != tuple(other[k].shape))
    if reshaped:
        return math.inf, f"other shapes: {', '.join(reshaped[:2])}"
    if not reference:
        return math.inf, "no weights"
    return max((reference[k].double() - other[k].double()).abs().max().item() for k in reference), None


def compare_weights(reference: Path, other: Path) -> tuple[float, str | None]:
    from safetensors.torch import load_file

    return max_difference(load_file(str(reference)), load_file(str(other)))


def comparison_verdict(result: dict, difference: float, problem: str | None, note: str) -> dict:
    """A compared run's row: its own outcome, and pass only when its final weights are within `WEIGHT_TOLERANCE` of
    the 1-process run's."""
    said = problem or f"max |dW| vs 1 process {difference:.2g} (tolerance {WEIGHT_TOLERANCE:g})"
    ok = bool(result["ok"]) and problem is None and difference <= WEIGHT_TOLERANCE
    return {"ok": ok, "step_ms": result.get("step_ms"), "note": "; ".join(filter(None, [said, note, result["note"]]))}


# ---------------------------------------------------------------------------------------------- whole runs
def write_senteval(root: Path) -> Path:
    """The 7 STS tasks in SentEval's layout and sizes (hf_sentcl.evaluation.sts.KNOWN_PAIRS), random sentences: the
    final evaluation scores as many pairs as on the real data (18,850)."""
    import torch

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


def whole_run_inputs(workdir: Path) -> dict[str, Path]:
    """What the whole runs override in the shipped recipe: a random MiniLM-shaped BERT, a random corpus of 20
    batches of 64 sentences, and the SentEval layout."""
    corpus = workdir / "run-train.txt"
    if not corpus.is_file():
        corpus.write_text("\n".join(sentences(GLOBAL_BATCH * WHOLE_RUN_STEPS, seed=0)) + "\n")
    model = write_model(workdir / "minilm", hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536)  # MiniLM's shape
    return {"model_name_or_path": model, "train_file": corpus, "sts_data_dir": write_senteval(workdir / "senteval")}


def whole_run_command(check: str, inputs: dict, output: Path, processes: int) -> list[str]:
    """`accelerate launch --config_file <fsdp.yaml|deepspeed_zero3.yaml> --num_processes N -m hf_sentcl.run
    recipes/simcse_bert.yaml` with the shipped recipe's defaults (precision from the config, "before" evaluation,
    best checkpoint reloaded), overriding only the model, the data and the step counts."""
    config = ACCELERATE_CONFIGS / ("fsdp.yaml" if check == "fsdp_run" else "deepspeed_zero3.yaml")
    overrides = [arg for key, value in inputs.items() for arg in (f"--{key}", str(value))]
    steps = ["--max_steps", str(WHOLE_RUN_STEPS), "--eval_steps", str(WHOLE_RUN_STEPS // 2),
             "--save_steps", str(WHOLE_RUN_STEPS // 2)]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes",
            str(processes), "-m", "hf_sentcl.run", str(SHIPPED_RECIPE), *overrides, *steps,
            "--output_dir", str(output)]


def whole_run_problems(results: dict, exported: bool, processes: int) -> list[str]:
    """What a whole run's results.json (and export) lack of the shipped recipe's defaults under the config."""
    train, parallelism, sts = results.get("train", {}), results.get("parallelism", {}), results.get("sts", {})
    problems = []
    if train.get("global_step") != WHOLE_RUN_STEPS:
        problems.append(f"trained {train.get('global_step')} steps, not {WHOLE_RUN_STEPS}")
    if parallelism.get("precision") != "bf16":
        problems.append(f"precision {parallelism.get('precision')}, not the config's bf16")
    if parallelism.get("processes") != processes:
        problems.append(f"{parallelism.get('processes')} processes, not {processes}")
    problems += [f'no "{when}" STS scores' for when in ("before", "after") if not sts.get(when)]
    if train.get("best_step") is None:
        problems.append("no best_step (load_best_model_at_end)")
    if not exported:
        problems.append("no export")
    return problems


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
    """`whole_run_command` to its end (final evaluation, export); pass when results.json holds what the shipped
    recipe and config ask for."""
    layout = plan(args.gpus)
    processes = layout["sharded"]
    output = args.workdir / f"out-{check}"
    command = whole_run_command(check, whole_run_inputs(args.workdir), output, processes)
    env = {**os.environ, "HF_SENTCL_HANG_DUMP_S": str(RUN_DUMP_S), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log_path = args.workdir / f"log-{check}.txt"
    start = time.time()
    # its own session: a timeout ends the launcher and its workers together
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
    results_path = output / "results.json"
    if process.returncode != 0 or not results_path.is_file():
        lines = (log or "").strip().splitlines()
        # the run's own `error: ...` line, else the last exception line (not the launcher's summary)
        said = next((line for line in lines if line.startswith("error: ")), None) or next(
            (line for line in reversed(lines) if "Error:" in line and "ChildFailedError" not in line),
            " | ".join(lines[-3:]))
        return {**failed, "note": f"exit {process.returncode}: {said[-300:]} (log: {log_path})"}
    results = json.loads(results_path.read_text())
    problems = whole_run_problems(results, (output / "export").is_dir(), processes)
    device = next((line.rsplit(" onto ", 1)[1].rstrip(".") for line in log.splitlines()
                   if "Final encoder reloaded whole" in line), "?")
    sts, train = results.get("sts", {}), results.get("train", {})
    scores = ", ".join(f"{when} {sts[when]['Avg']:.1f}" for when in ("before", "after")
                       if isinstance(sts.get(when), dict) and "Avg" in sts[when])
    step = train.get("train_step_seconds")
    return {"ok": not problems, "step_ms": None if step is None else 1000 * step,
            "note": "; ".join(filter(None, [
                "; ".join(problems), f"{seconds:.0f} s to the export",
                f"{processes} process(es), {layout['sharded_note']}",
                f"{results.get('parallelism', {}).get('precision')}",
                f"STS Avg {scores}" if scores else "", f"best step {train.get('best_step')}",
                f"final encoder evaluated on {device}"]))}


# ---------------------------------------------------------------------------------------------- workers (one check)
PRECISION_SETTINGS = {
    "fp32": {"precision": "fp32", "tf32": False}, "tf32": {"precision": "fp32", "tf32": True},
    "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"},
}


def count_host_syncs(trainer) -> list[list[str]]:
    """Wrap `trainer.training_step` in CUDA's sync debug mode; per step, where each synchronising operation was
    called from (file:line of the Python frame that issued it)."""
    import torch

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


def compared_worker(check: str, workdir: Path, steps: int, extra: dict) -> dict:
    """The comparisons' training (`COMPARISON`, `exact`) at global batch 64 over this run's processes; writes the
    final weights to weights-<check>.safetensors (process 0). `single` also measures how far they moved."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    settings = dict(COMPARISON, per_device_train_batch_size=GLOBAL_BATCH // processes)
    if extra.get("ddp_shares_gpu"):  # both ranks on cuda:0 (TrainingArguments picks cuda:LOCAL_RANK), over gloo
        os.environ["LOCAL_RANK"] = "0"
        settings["ddp_backend"] = "gloo"
    trainer = build_trainer(workdir, steps, workdir / f"out-{check}", exact=True, **settings)
    initial = ({k: v.detach().to("cpu").clone() for k, v in trainer.model.state_dict().items()}
               if check == "single" else None)
    trainer.train()
    result = outcome(trainer, steps, extra.get("note", ""))
    path = workdir / f"weights-{check}.safetensors"
    final = save_final_weights(trainer, path)
    result["weights"] = str(path)
    if initial is not None and final is not None:
        moved, problem = max_difference(initial, final)
        result["moved"] = moved
        result["ok"] = result["ok"] and problem is None and moved >= MIN_MOVED
        said = (f"1 process, fp32, TF32 off, dropout 0, batch {GLOBAL_BATCH}: weights moved up to {moved:.2g} "
                f"(must be >= {MIN_MOVED:g})")
        result["note"] = "; ".join(filter(None, [said, problem, result["note"]]))
    return result


def worker(check: str, workdir: Path, steps: int, extra: dict) -> dict:
    """Run one check in this process; returns its outcome."""
    output = workdir / f"out-{check}"
    if check in PRECISION_SETTINGS:
        trainer = build_trainer(workdir, steps, output, **PRECISION_SETTINGS[check])
        trainer.train()
        return outcome(trainer, steps)
    if check == "single" or check in COMPARED:
        return compared_worker(check, workdir, steps, extra)
    if check == "host_syncs":
        trainer = build_trainer(workdir, steps, output, precision="auto")
        syncs = count_host_syncs(trainer)
        trainer.train()
        return host_sync_outcome(trainer, steps, syncs)
    # the two halves of resume
    settings = {k: v for k, v in extra.items() if k not in ("note", "resume_from_checkpoint")}
    trainer = build_trainer(workdir, steps, output, **{"precision": "auto", **settings})
    trainer.train(resume_from_checkpoint=extra.get("resume_from_checkpoint"))
    return outcome(trainer, steps, extra.get("note", ""))


# ---------------------------------------------------------------------------------------------- the driver
def worker_command(check: str, args, extra: dict) -> list[str]:
    """The command of `check`'s worker: torchrun for DDP, accelerate launch (with its config, in fp32) for FSDP and
    ZeRO-3, plain python otherwise."""
    script = [str(Path(__file__).resolve()), "--worker", check, "--workdir", str(args.workdir), "--steps",
              str(args.steps), "--extra", json.dumps(extra)]
    layout = plan(args.gpus)
    if check == "ddp2":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(layout["ddp_processes"]), *script]
    if check in ("fsdp", "zero3"):
        config = ACCELERATE_CONFIGS / ("fsdp.yaml" if check == "fsdp" else "deepspeed_zero3.yaml")
        # the configs say bf16: the comparison trains in fp32 (`COMPARISON`), which the launcher must leave alone
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                "--num_processes", str(layout["sharded"]), "--mixed_precision", "no", *script]
    return [sys.executable, *script]


def launch(check: str, args, extra: dict | None = None, wait: bool = True):
    """Start the worker of `check` in its own process(es)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(worker_command(check, args, extra or {}), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return process if not wait else finish(process, check, args)


def finish(process, check: str, args) -> dict:
    """Wait for a worker; its result file, or a failure with the end of its output."""
    try:
        log, _ = process.communicate(timeout=CHECK_TIMEOUT)
    except BaseException as error:  # a timeout, or ^C: end the launcher and its workers (their own session)
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        if not isinstance(error, subprocess.TimeoutExpired):
            raise
        return {"ok": False, "step_ms": None, "note": f"timed out after {CHECK_TIMEOUT} s"}
    (args.workdir / f"log-{check}.txt").write_text(log or "")
    result = args.workdir / f"result-{check}.json"
    if process.returncode == 0 and result.is_file():
        return json.loads(result.read_text())
    lines = (log or "").strip().splitlines()
    said = next((line for line in reversed(lines) if "Error:" in line and "ChildFailedError" not in line),
                " | ".join(lines[-3:]))
    return {"ok": False, "step_ms": None,
            "note": f"exit {process.returncode}: {said[-300:]} (log: {args.workdir / f'log-{check}.txt'})"}


def complete_checkpoints(folder: Path) -> list[Path]:
    """The checkpoints of `folder` whose completion mark is written, oldest first."""
    marks = folder.glob("checkpoint-*/checkpoint_complete.json")
    return sorted((m.parent for m in marks), key=lambda p: int(p.name.split("-")[1]))


def resume_check(args) -> dict:
    """Kill a run (SIGKILL) as soon as it has a complete checkpoint, then resume from its latest one to the end."""
    # the first half would run on for 1000 steps: the kill comes while it trains
    first = launch("resume-first", args, {"save_strategy": "steps", "save_steps": 10, "max_steps": 1000}, wait=False)
    folder = args.workdir / "out-resume-first"
    deadline = time.time() + CHECK_TIMEOUT
    while not complete_checkpoints(folder) and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    checkpoints = complete_checkpoints(folder)
    if not checkpoints:
        return {"ok": False, "step_ms": None, "note": "no checkpoint was completed before the kill"}
    extra = {"output_dir": str(folder), "resume_from_checkpoint": str(checkpoints[-1]),
             "note": f"killed, resumed from {checkpoints[-1].name}"}
    return launch("resume-second", args, extra)


def compared_check(check: str, args, reference: dict) -> dict:
    """`check` (DDP, FSDP, ZeRO-3) trained as `single` was, its final weights compared with `single`'s."""
    layout = plan(args.gpus)
    note = layout["ddp_note"] if check == "ddp2" else f"{layout['sharded']} process(es), {layout['sharded_note']}"
    if not reference.get("ok") or "weights" not in reference:
        return {"ok": False, "step_ms": None, "note": f"no 1-process run to compare with (single failed); {note}"}
    result = launch(check, args, {"ddp_shares_gpu": layout["ddp_shares_gpu"]})
    if "weights" not in result or not Path(result["weights"]).is_file():
        return {**result, "ok": False, "note": "; ".join(filter(None, [note, result.get("note")]))}
    difference, problem = compare_weights(Path(reference["weights"]), Path(result["weights"]))
    Path(result["weights"]).unlink()
    return comparison_verdict(result, difference, problem, note)


# ---------------------------------------------------------------------------------------------- the GPU step's speed
#: steps of each configuration in `perf` (the first, with any compilation, is left out of the step time)
PERF_STEPS = 100
#: seconds the whole `perf` comparison may take (one round of 100 steps with the CUDA-graph compilation took 132 s
#: on an H200; the second round finds inductor's cache)
PERF_TIMEOUT = 540
#: batches of the `profile` run (the profiler stops after its third step)
PROFILE_STEPS = 8
#: the lines of a `--profile` run's per-phase report (training_cost.StepProfile.report)
PROFILE_REPORT_LINE = re.compile(r"^\S.*: one step, |^  (data|forward|loss|backward|optimizer|other|python|GPU busy) ")


def benchmark_command(args, corpus: Path, output: Path, steps: int, *options: str) -> list[str]:
    """benchmarks/train_vs_sentence_transformers.py on the GPU in bf16 at the checks' shape (batch 64, max_len 32),
    without STS or the padded row, over `steps` batches of `corpus`, its report in `output`, plus `options`."""
    return [sys.executable, str(Path(__file__).resolve().parent / "train_vs_sentence_transformers.py"),
            "--device", "cuda", "--precisions", "bf16", *options, "--no-sts", "--no-padded-row",
            "--model", str(args.workdir / "model"), "--train-file", str(corpus),
            "--train-samples", str(GLOBAL_BATCH * steps), "--batch-size", str(GLOBAL_BATCH),
            "--max-seq-length", str(MAX_TOKENS), "--output", str(output)]


def perf_command(args, corpus: Path, output: Path, flash: bool) -> list[str]:
    """benchmarks/train_vs_sentence_transformers.py on the GPU, bf16, two alternating rounds (the configuration that
    runs first in a process pays its CUDA warm-up: a first step of up to 4.6 s on an H200): hf_sentcl's default
    route (padded SDPA on CUDA), with `compile_layers`, with unsupervised SimCSE's own [CLS] pooling and MLP head
    (the last layer on first positions only), the whole model compiled with CUDA graphs (its padded lengths bounded
    by `pad_to_multiple_of`), FlashAttention's varlen route when `flash`, and sentence-transformers."""
    variants = ["compiled: --compile_layers true", "cls: --pooling cls --head mlp",
                "graphs: --torch_compile true --torch_compile_mode reduce-overhead --pad_to_multiple_of 8"]
    if flash:
        variants += ["varlen: --attn_implementation flash_attention_2",
                     "varlen+compiled: --attn_implementation flash_attention_2 --compile_layers true"]
    return benchmark_command(args, corpus, output, PERF_STEPS, "--rounds", "2",
                             *(part for variant in variants for part in ("--variant", variant)))


def perf_summary(report: dict) -> dict:
    """The `perf` row from the benchmark's JSON: pass when every configuration trained; the note gives each one's
    examples/s, step time, first step (compilation), share of the card's dense bf16 peak and ratio to
    sentence-transformers."""
    medians, ratios, shares = report["medians"], report["ratios"], report.get("gemm_shares") or {}
    parts, ok = [], True
    for key, row in medians.items():
        step = row.get("train_step_seconds")
        ok = ok and step is not None
        share = shares.get(key, {}).get("real")
        parts.append(f"{key.removesuffix(' bf16')}: {row.get('train_examples_per_second', 0):.0f} ex/s, "
                     f"step {1000 * (step or 0):.1f} ms, first {row.get('first_step_seconds') or 0:.1f} s"
                     + (f", {100 * share:.1f}% of peak" if share is not None else "")
                     + (f", {ratios[key]['throughput_vs_st']:.2f}x ST" if ratios.get(key, {}).get("throughput_vs_st")
                        else ""))
    hf = medians.get("hf_sentcl bf16", {}).get("train_step_seconds")
    return {"ok": ok, "step_ms": None if hf is None else 1000 * hf, "note": "; ".join(parts)}


def profile_command(args, corpus: Path, output: Path) -> list[str]:
    """The benchmark's `--profile` on the GPU, bf16: one profiled step (after two) of hf_sentcl's default route and
    of sentence-transformers, with the GPU's busy time and kernel count."""
    return benchmark_command(args, corpus, output, PROFILE_STEPS, "--profile")


def profile_summary(report: dict) -> dict:
    """The `profile` row: pass when every configuration's step has a GPU-busy time; the note gives it beside the
    profiled step's wall time (which the profiler lengthens) and the number of kernels, copies and memsets. Busy far
    below the wall time is a host-bound step."""
    steps = report["profile"]
    # a profile without CUDA activity (no CUPTI, or the step not on the GPU) has no busy time or no kernels
    ok = bool(steps) and all((step.get("device_busy_ms") or 0) > 0 and (step.get("device_kernels") or 0) > 0
                             for step in steps.values())
    note = "; ".join(f"{key.removesuffix(' bf16')}: GPU busy {step.get('device_busy_ms') or 0:.1f} of "
                     f"{step['wall_ms']:.1f} ms ({step.get('device_kernels') or 0} kernels)"
                     for key, step in steps.items())
    return {"ok": ok, "step_ms": None, "note": note + " (the profiler lengthens the wall time)"}


def profile_lines(stdout: str) -> str:
    """The per-phase reports of a `--profile` run, without torch's operator tables."""
    return "\n".join(line for line in stdout.splitlines() if PROFILE_REPORT_LINE.match(line))


def benchmark_check(args, check: str, command: Callable[[Path, Path], list[str]], steps: int,
                    summary: Callable[[dict], dict], shown: Callable[[str], str] = lambda out: out[-4000:]) -> dict:
    """Run the training benchmark `command(corpus, output)` on `steps` batches of made-up sentences (its log in the
    work folder, `shown(stdout)` printed: by default the end, its table) and summarise its JSON report."""
    corpus = args.workdir / f"{check}_corpus.txt"
    corpus.write_text("\n".join(sentences(GLOBAL_BATCH * steps, seed=7)) + "\n")
    output = args.workdir / f"{check}.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_SENTCL_DATA": str(write_senteval(args.workdir / "senteval"))}
    try:
        done = subprocess.run(command(corpus, output), env=env, capture_output=True, text=True, timeout=PERF_TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "step_ms": None, "note": f"timed out after {PERF_TIMEOUT} s"}
    (args.workdir / f"log-{check}.txt").write_text(done.stdout + done.stderr)
    print(shown(done.stdout), flush=True)
    if done.returncode != 0 or not output.is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"ok": False, "step_ms": None, "note": f"exit {done.returncode}: {' | '.join(tail)[-300:]}"}
    return summary(json.loads(output.read_text()))


def perf_check(args) -> dict:
    """The GPU step (issue 37): BERT-base shape, batch 64, max_len 32, bf16; hf_sentcl compiled and not (and
    FlashAttention's varlen route where `flash_attn` is installed) against sentence-transformers."""
    import importlib.util

    flash = importlib.util.find_spec("flash_attn") is not None
    return benchmark_check(args, "perf", lambda corpus, output: perf_command(args, corpus, output, flash),
                           PERF_STEPS, perf_summary)


def profile_check(args) -> dict:
    """Where the GPU step's time goes: the GPU's busy time in one profiled step of each side."""
    return benchmark_check(args, "profile", lambda corpus, output: profile_command(args, corpus, output),
                           PROFILE_STEPS, profile_summary, shown=profile_lines)


def run_check(check: str, args, rows: dict) -> dict:
    if check == "perf":
        return perf_check(args)
    if check == "profile":
        return profile_check(args)
    if check in ("fsdp_run", "zero3_run"):
        return whole_run(check, args)
    if check in COMPARED:
        return compared_check(check, args, rows["single"])
    return resume_check(args) if check == "resume" else launch(check, args)


def table(rows: dict[str, dict]) -> str:
    lines = [f"{'check':<12} {'result':<6} {'step ms':>8}  note", "-" * 80]
    for check, row in rows.items():
        result = "skip" if row["ok"] is None else "pass" if row["ok"] else "FAIL"
        step = "" if row["step_ms"] is None else f"{row['step_ms']:.1f}"
        lines.append(f"{check:<12} {result:<6} {step:>8}  {row['note']}")
    return "\n".join(lines)


def refuse_without_cuda() -> int | None:
    """2 (after printing `REFUSAL`) on a machine without a CUDA device, else None."""
    import torch

    if torch.cuda.is_available():
        return None
    print(REFUSAL, file=sys.stderr)
    return 2


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (resume: at least 20)")
    parser.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {', '.join(CHECKS)}")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl",
                        help="the bundle of wheels for packages this machine lacks (default: .whl/ in the repo; "
                             "make gpu-bundle GPU_PYTHON=X.Y prepares it)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--extra", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only.split(",")) - set(CHECKS))
    if unknown:
        parser.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        if (refused := refuse_without_cuda()) is not None:
            return refused
        check = args.worker.removesuffix("-first").removesuffix("-second")
        result = worker(check if check != "resume" else args.worker, args.workdir, args.steps, json.loads(args.extra))
        if int(os.environ.get("RANK", "0")) == 0:
            (args.workdir / f"result-{args.worker}.json").write_text(json.dumps(result))
        return 0
    refused = gpu_bundle.ensure_packages(args.only.split(","), args.wheels, Path(__file__).resolve(), argv,
                                         refuse=refuse_without_cuda)
    if refused is not None:
        return refused
    import torch

    args.gpus = torch.cuda.device_count()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    args.steps = max(args.steps, 20)
    write_model(args.workdir / "model", **MODEL_CONFIG)
    layout = plan(args.gpus)
    print(f"gpu_check on {torch.cuda.get_device_name(0)} ({args.gpus} GPU(s): FSDP/ZeRO-3 {layout['sharded']} "
          f"process(es), DDP {layout['ddp_note']}), torch {torch.__version__}, {args.steps} steps per run", flush=True)
    start = time.time()
    selected = args.only.split(",")
    rows: dict[str, dict] = {}
    for check in [c for c in CHECKS if c in selected or (c == "single" and set(COMPARED) & set(selected))]:
        rows[check] = run_check(check, args, rows)
        print(f"  {check}: {'pass' if rows[check]['ok'] else 'FAIL'} ({time.time() - start:.0f} s)", flush=True)
    print(table(rows))
    print(f"{time.time() - start:.0f} s in all; work folder {args.workdir}")
    return 0 if all(row["ok"] is not False for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
