"""Peak memory of one SimCSE training step, plain vs cached (`mini_batch_size`), at the same large batch.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/cached_memory.py [--batch-size 512] [--mini-batch-size 64]

Both steps run in one process, alternating (plain, cached, plain, cached, ...), on the embedded all-MiniLM-L6-v2
with the first sentences of the Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt`, or --train-file).
Memory is the accelerator's peak allocation on CUDA; on a CPU it is the process's peak resident set during the
step minus the resident set before it (Linux; `hf_sentcl.trainers.callbacks` resets the high-water mark, and freed
heap is handed back to the OS with malloc_trim before each step so that one step's leftovers do not hide the
next one's peak). Step times are printed too; they mean something only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch
from datasets import Dataset

from hf_sentcl import SentenceEncoder
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.data import ViewCollator, tokenize_views
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.methods.simcse.config import SimCSEConfig
from hf_sentcl.methods.simcse.trainer import SimCSETrainer
from hf_sentcl.trainers.callbacks import _peak_rss_bytes, _reset_peak_rss

MIB = 2**20


def current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS line (Linux only).")


def release_freed_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: freed heap may stay resident and hide later peaks
        pass


def build_trainer(args: argparse.Namespace, output_dir: str) -> tuple[SimCSETrainer, torch.nn.Module, dict]:
    encoder = SentenceEncoder.from_backbone(args.model, pooling="cls", head="mlp")
    lines = Path(args.train_file).read_text(encoding="utf-8").splitlines()
    sentences = [line.strip() for line in lines if line.strip()][: args.batch_size]
    if len(sentences) < args.batch_size:
        raise SystemExit(f"{args.train_file} has only {len(sentences)} sentences; need --batch-size {args.batch_size}.")
    dataset = tokenize_views(Dataset.from_dict({"text": sentences}), encoder.tokenizer, ("text",), args.max_seq_length)
    config = SimCSEConfig(
        output_dir=output_dir, per_device_train_batch_size=args.batch_size, bf16=args.bf16, report_to="none",
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True, eval_strategy="no", save_strategy="no",
        load_best_model_at_end=False,
    )
    trainer = SimCSETrainer(
        model=encoder, args=config, train_dataset=dataset, data_collator=ViewCollator(encoder.tokenizer)
    )
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.accelerator.prepare(trainer.model)  # device placement and the bf16 autocast forward wrapper
    inputs = trainer.data_collator([dataset[i] for i in range(args.batch_size)])
    return trainer, model, inputs


def measure(trainer, model, inputs, mini_batch_size: int | None) -> dict[str, float]:
    trainer.args.mini_batch_size = mini_batch_size
    model.zero_grad(set_to_none=True)
    release_freed_memory()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = current_rss_bytes()
        if not _reset_peak_rss():
            raise SystemExit("Cannot reset the peak RSS (/proc/self/clear_refs); run on Linux >= 4.0.")
    start = time.perf_counter()
    loss = trainer.training_step(model, inputs)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss_bytes()
    return {"loss": float(loss), "peak_increase_mib": (peak - before) / MIB, "peak_mib": peak / MIB,
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED_MODEL_ALIAS)
    parser.add_argument("--train-file", default=None, help="Default: $HF_SENTCL_DATA/../wiki1m_subset.txt")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--mini-batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="Alternating plain/cached pairs (first pair: warm-up).")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast.")
    parser.add_argument("--output", default=None, help="Write the measurements as JSON here.")
    args = parser.parse_args()
    if args.train_file is None:
        args.train_file = str(resolve_data_dir(None).parent / "wiki1m_subset.txt")
    torch.manual_seed(0)
    trainer, model, inputs = build_trainer(args, output_dir=os.environ.get("TMPDIR", "/tmp") + "/cached_memory")
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "cached": []}
    for round_index in range(args.rounds):
        for name, size in (("plain", None), ("cached", args.mini_batch_size)):
            torch.manual_seed(round_index)
            result = measure(trainer, model, inputs, size)
            runs[name].append(result)
            print(f"round {round_index} {name:6s} loss {result['loss']:.4f}  "
                  f"peak +{result['peak_increase_mib']:.0f} MiB (peak {result['peak_mib']:.0f} MiB)  "
                  f"{result['seconds']:.1f} s", flush=True)
    kept = {name: values[1:] or values for name, values in runs.items()}  # the first round warms up
    summary = {name: {key: statistics.median(r[key] for r in values) for key in values[0]}
               for name, values in kept.items()}
    ratio = summary["cached"]["peak_increase_mib"] / summary["plain"]["peak_increase_mib"]
    report = {
        "model": args.model, "batch_size": args.batch_size, "mini_batch_size": args.mini_batch_size,
        "max_seq_length": args.max_seq_length, "bf16": args.bf16,
        "memory": "cuda_max_allocated" if torch.cuda.is_available() else "process_peak_rss_increase",
        "median": summary, "cached_over_plain_peak_increase": ratio, "runs": runs,
    }
    print(f"\nbatch {args.batch_size}: plain step +{summary['plain']['peak_increase_mib']:.0f} MiB, cached step "
          f"(mini-batches of {args.mini_batch_size}) +{summary['cached']['peak_increase_mib']:.0f} MiB: "
          f"ratio {ratio:.3f}; median step {summary['plain']['seconds']:.1f} s vs {summary['cached']['seconds']:.1f} s")
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
