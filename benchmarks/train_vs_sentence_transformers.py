"""Unsupervised SimCSE trained by hf_sentcl and by sentence-transformers' trainer: throughput, memory and STS.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/train_vs_sentence_transformers.py --rounds 3 [--threads N]
        [--precisions fp32,bf16] [--variant "grouped: --train_sampling_strategy group_by_length"] [--seeds 1,2,3]
        [--output out.json]
    ... --profile        # instead: where the time of one training step goes, per phase, for both trainers

hf_sentcl runs its default, unpadded encoder path (`unpadded: true`: token-wise work on real tokens only); a
`hf_sentcl+padded` row (`--unpadded false`) is measured beside it unless `--no-padded-row`.

`--gemm` (default on) first measures this machine's fp32 GEMM rate at the encoder's shapes (`gemm_rate.py`: one
layer's forward and backward GEMMs at the mean real token count of a step, torch.matmul, the benchmark's threads)
and counts the real and padded tokens of the steps of hf_sentcl's own dataloader; the table then gives each row's
share of the GEMM limit: 6 x non-embedding parameters x real tokens at the measured rate, over the measured step
time (the useful work; padding counts as waste). The same figure with padded tokens (the work a padded forward
does) is printed below the table.

Both sides train the embedded all-MiniLM-L6-v2 on the same first `--train-samples` (4,096) sentences of the
Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt` or `--train-file`) for one epoch: batch 64, max_len 32,
tau 0.05, lr 3e-5, the same seed, no evaluation or saving during training, in fp32 and in bf16 (CPU autocast; with
`--device cuda` both run on the first GPU, bf16 as CUDA autocast, peak memory as torch's peak allocation, and the
share column is the share of the card's dense bf16 peak, `--peak-tflops` or the data sheet's).

- hf_sentcl: `SimCSETrainer` built the way `hf_sentcl.run` builds it (recipe -> encoder, pre-tokenised dataset,
  collator), with `pooling: mean, head: none` (MiniLM's own pooling, no projection head).
- sentence-transformers: `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` (cosine, scale = 1/tau) on
  (s, s) pairs, which is SimCSE: dropout makes the two views (sentence-transformers 6.2 runs one forward per
  column here, two of the batch per step).

Like with like, checked before anything runs: same weights, dropout, pooling (mean), attention kernel,
optimizer (transformers' default, fused AdamW), scheduler (linear, no warm-up), weight decay, gradient clipping,
logging interval. Throughput is sentence pairs per second of the training steps alone, measured by the same
`TrainerCallback` in both trainers (`hf_sentcl.trainers.callbacks.TrainingCostCallback`: the interval between
optimizer-step ends, first step left out), plus the process CPU time of the same steps (the steadier figure on a
shared machine, with --threads 1); `train()`'s whole wall time and the first step's time (torch.compile's
compilation) are reported too. Peak memory is the process's resident-set high-water mark during training (reset
when training starts) minus the resident set before the run loaded its model: model, optimizer state,
activations. After training each model is scored on the 7 STS tasks by hf_sentcl's `STSEvaluator` in fp32 (mode
`all`), so that only training differs; that happens in the first round (training is seeded, later rounds only
time).

Runs alternate (hf, st, then st, hf, ...) for `--rounds` rounds; the median per configuration and the ratio of
medians (hf_sentcl / sentence-transformers) are printed. `--variant "NAME: --key value ..."` adds an hf_sentcl
configuration with recipe overrides (e.g. `--train_sampling_strategy group_by_length`, `--compile_layers true`,
`--pad_to_multiple_of 8`), measured and scored the same way. `--seeds 1,2,3` trains and scores every configuration
once per seed in the first round: the STS table then gives each side's mean over the seeds (the 7-task average with
its standard deviation), the comparison one seed's noise (about 0.2) cannot make. Timings mean something on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch
from datasets import Dataset
from gemm_rate import gemm_rate, gemm_share, step_tokens
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments
from training_cost import alternating, medians, profile_training_step, ratio, train_measured, trainer_from_recipe
from transformers import set_seed

from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.data import load_training_dataset
from hf_sentcl.evaluation.sts import STSEvaluator
from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.modeling.backbone import resolve_model_name
from hf_sentcl.modeling.fast_dropout import ATTENTION_NAME as FAST_DROPOUT_ATTENTION
from hf_sentcl.recipe.parser import Recipe, parse_cli_overrides, parse_recipe

HF, ST = "hf_sentcl", "sentence-transformers"
#: TrainingArguments that must agree between the two trainers for the comparison to be fair
SHARED_TRAINING_KEYS = (
    "optim", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "per_device_train_batch_size", "num_train_epochs", "seed", "bf16",
    "logging_steps", "eval_strategy", "save_strategy", "dataloader_num_workers", "dataloader_drop_last",
)


# ---------------------------------------------------------------------------------------------- the two trainers
def hf_recipe(args: argparse.Namespace, bf16: bool, overrides: dict, output_dir: str) -> Recipe:
    """The hf_sentcl recipe of the comparison (plus a variant's `overrides`)."""
    settings = dict(
        method="simcse", model_name_or_path=args.model, pooling="mean", head="none", train_file=args.train_file,
        max_train_samples=args.train_samples, max_seq_length=args.max_seq_length, temperature=args.temperature,
        output_dir=output_dir, per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        num_train_epochs=1, seed=args.seed, bf16=bf16, eval_strategy="no", save_strategy="no",
        load_best_model_at_end=False, logging_steps=args.logging_steps, disable_tqdm=True, eval_tasks=[],
        use_cpu=args.device == "cpu",
    )
    if args.mini_batch_size:  # the cached step: encode in mini-batches, back-propagate through cached gradients
        settings["mini_batch_size"] = args.mini_batch_size
    return parse_recipe(None, **{**settings, **overrides})


def build_hf(args: argparse.Namespace, bf16: bool, overrides: dict, output_dir: str):
    """(trainer, encoder) of hf_sentcl, built as `hf_sentcl.run` builds them (without the dev evaluator)."""
    return trainer_from_recipe(hf_recipe(args, bf16, overrides, output_dir))


def build_st(args: argparse.Namespace, bf16: bool, sentences: list[str], output_dir: str):
    """(trainer, model) of sentence-transformers: MultipleNegativesRankingLoss (cached with --mini-batch-size) on
    (s, s) pairs."""
    set_seed(args.seed)
    model = SentenceTransformer(resolve_model_name(args.model), device=args.device)
    model.max_seq_length = args.max_seq_length
    training_args = SentenceTransformerTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        num_train_epochs=1, seed=args.seed, bf16=bf16, eval_strategy="no", save_strategy="no",
        logging_steps=args.logging_steps, disable_tqdm=True, report_to="none", use_cpu=args.device == "cpu",
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=training_args, train_dataset=Dataset.from_dict({"anchor": sentences, "positive": sentences}),
        loss=st_loss(args, model),
    )
    return trainer, model


def st_loss(args: argparse.Namespace, model: SentenceTransformer):
    """MultipleNegativesRankingLoss, or with --mini-batch-size its GradCache form, CachedMultipleNegativesRankingLoss
    (mini-batches of that many examples; its token budget `mini_batch_num_tokens` stays off, as hf_sentcl's cached
    step splits by examples)."""
    if args.mini_batch_size:
        return CachedMultipleNegativesRankingLoss(model, scale=1 / args.temperature,
                                                  mini_batch_size=args.mini_batch_size)
    return MultipleNegativesRankingLoss(model, scale=1 / args.temperature)


def check_like_with_like(hf_trainer, hf_encoder, st_trainer, st_model) -> dict[str, object]:
    """Fail unless both runs use the same training settings, dropout, pooling and attention kernel; return them."""
    differences = [
        f"{key}: {getattr(hf_trainer.args, key)!r} vs {getattr(st_trainer.args, key)!r}"
        for key in SHARED_TRAINING_KEYS if getattr(hf_trainer.args, key) != getattr(st_trainer.args, key)
    ]
    hf_backbone, st_backbone = hf_encoder.backbone.config, st_model[0].auto_model.config
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if getattr(hf_backbone, key) != getattr(st_backbone, key):
            differences.append(f"{key}: {getattr(hf_backbone, key)!r} vs {getattr(st_backbone, key)!r}")
    if attention_kernel(hf_backbone) != attention_kernel(st_backbone):
        differences.append(f"attention: {hf_backbone._attn_implementation!r} vs {st_backbone._attn_implementation!r}")
    st_pooling = st_model[1].pooling_mode
    if (hf_encoder.config.pooling, hf_encoder.config.head) != ("mean", "none") or st_pooling != "mean":
        differences.append(f"pooling: {hf_encoder.config.pooling}+{hf_encoder.config.head} vs {st_pooling}")
    if differences:
        raise SystemExit("hf_sentcl and sentence-transformers are not set up alike: " + "; ".join(differences))
    shared = {key: str(getattr(hf_trainer.args, key)) for key in SHARED_TRAINING_KEYS}
    shared.update(dropout=hf_backbone.hidden_dropout_prob, attention=attention_kernel(hf_backbone), pooling="mean")
    shared["hf_sentcl_fast_dropout"] = str(hf_trainer.args.fast_dropout)
    return shared


def attention_kernel(config) -> str:
    """The attention kernel; hf_sentcl's `sdpa_fast_dropout` is SDPA (same attention, same dropout rate, masks drawn
    by `fast_dropout` while training on CPU)."""
    name = config._attn_implementation
    return "sdpa" if name == FAST_DROPOUT_ATTENTION else name


# ---------------------------------------------------------------------------------------------- STS after training
@dataclass
class SentenceTransformerEncoder:
    """A SentenceTransformer behind the `encode(sentences, batch_size, bf16)` that `STSEvaluator` calls (fp32 only)."""

    model: SentenceTransformer
    max_seq_length: int

    def encode(self, sentences, batch_size: int = 128, bf16: bool = False) -> np.ndarray:
        if bf16:
            raise ValueError("the comparison scores both models in fp32.")
        self.model.max_seq_length = self.max_seq_length
        return self.model.encode(list(sentences), batch_size=batch_size, convert_to_numpy=True,
                                 show_progress_bar=False)


@dataclass
class QuietEncoder:
    """hf_sentcl's encoder behind the same `encode` call, without the progress bar (keeps the log readable)."""

    encoder: object

    def encode(self, sentences, batch_size: int = 128, bf16: bool = False) -> np.ndarray:
        return self.encoder.encode(sentences, batch_size=batch_size, bf16=bf16, show_progress_bar=False)


# ---------------------------------------------------------------------------------------------- driver
def parse_variants(specs: list[str]) -> dict[str, dict]:
    """'NAME: --key value ...' -> {NAME: {key: value}} (values typed as on hf_sentcl.run's command line)."""
    variants = {}
    for spec in specs:
        name, sep, rest = spec.partition(":")
        if not sep or not name.strip() or not rest.strip():
            raise SystemExit(f"--variant {spec!r}: write 'NAME: --key value ...', e.g. 'grouped: "
                             "--train_sampling_strategy group_by_length'.")
        variants[f"{HF}+{name.strip()}"] = parse_cli_overrides(shlex.split(rest))
    return variants


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED_MODEL_ALIAS)
    parser.add_argument("--train-file", default=None, help="Default: $HF_SENTCL_DATA/../wiki1m_subset.txt")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--seeds", default=None,
                        help="Comma-separated training seeds (default: --seed): the first round trains and scores "
                             "every configuration once per seed, the STS table gives the mean over the seeds.")
    parser.add_argument("--logging-steps", type=int, default=10, help="Loss logging interval, the same in both.")
    parser.add_argument("--mini-batch-size", type=int, default=None,
                        help="Compare the cached steps: hf_sentcl's `mini_batch_size` against sentence-transformers' "
                        "CachedMultipleNegativesRankingLoss, both with mini-batches of this many examples.")
    parser.add_argument("--precisions", default="fp32,bf16", help="Comma-separated: fp32, bf16 (CPU autocast).")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds (hf, st, then st, hf, ...).")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch.set_num_threads for both trainers (default: every core this process may use).")
    parser.add_argument("--variant", action="append", default=[], metavar="'NAME: --key value ...'",
                        help="An extra hf_sentcl configuration (recipe overrides); repeatable.")
    parser.add_argument("--sts", action=argparse.BooleanOptionalAction, default=True,
                        help="Score the trained models on the 7 STS tasks (first round).")
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--padded-row", action=argparse.BooleanOptionalAction, default=True,
                        help="Also measure hf_sentcl with the padded encoder path "
                             "(variant 'padded: --unpadded false').")
    parser.add_argument("--gemm", action=argparse.BooleanOptionalAction, default=True,
                        help="Measure the fp32 GEMM rate at the encoder's shapes and report each step's share of it.")
    parser.add_argument("--profile", action="store_true",
                        help="Profile one training step of each configuration (per precision) instead of timing runs.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: both trainers on the first GPU (peak memory: torch's peak allocation; no GEMM "
                             "share; bf16 is CUDA autocast).")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="With --device cuda: the card's dense bf16 peak in TFLOP/s for the share column "
                             "(default: the data-sheet figure of H100/H200/A100/L40S/L4/A10 cards).")
    parser.add_argument("--output", default=None, help="Also write every measurement as JSON here.")
    args = parser.parse_args(argv)
    if args.train_file is None:
        args.train_file = str(resolve_data_dir(None).parent / "wiki1m_subset.txt")
    args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else [args.seed]
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in args.precisions if p not in ("fp32", "bf16")]
    if unknown or not args.precisions:
        raise SystemExit(f"--precisions: use fp32 and/or bf16, got {args.precisions}.")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here.")
        args.gemm = False  # the GEMM share is a CPU figure (fp32 GEMM rate of this machine's cores)
    if args.rounds < 1 or args.threads < 1:
        raise SystemExit("--rounds and --threads must be at least 1.")
    return args


def profile_all(args: argparse.Namespace, variants: dict[str, dict], sentences: list[str], workdir: str) -> dict:
    """One profiled step (after two warm-up steps) of each configuration per precision; prints the phase breakdown
    and the operator table. Under torch.compile the forward's operators run inside the compiled graph and count as
    `loss` (dynamo drops the forward's profiler label)."""
    out = {}
    for precision in args.precisions:
        bf16 = precision == "bf16"
        for name in (HF, ST, *variants):
            trainer, module = (build_st(args, bf16, sentences, workdir) if name == ST else
                               build_hf(args, bf16, variants.get(name, {}), workdir))
            step = profile_training_step(trainer, module)
            print("\n" + step.report(f"{name} {precision}"), flush=True)
            print(step.table, flush=True)
            out[f"{name} {precision}"] = {"wall_ms": step.wall_ms, "phase_ms": step.phase_ms,
                                          "untracked_ms": step.untracked_ms, "device_busy_ms": step.device_busy_ms,
                                          "device_kernels": step.device_kernels,
                                          "top_ops": {k: v[:10] for k, v in step.top_ops.items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf_sentcl_bench_") as workdir:  # the runs' output_dirs, then removed
        return benchmark(args, workdir)


def benchmark(args: argparse.Namespace, workdir: str) -> int:
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    variants = parse_variants(args.variant)
    if args.padded_row:
        variants = {f"{HF}+padded": {"unpadded": False}, **variants}
    probe = hf_recipe(args, False, {}, "unused")
    sentences = load_training_dataset(probe.data, ("text",))["text"]
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"{len(sentences)} training sentences from {args.train_file}; device {device}; torch threads "
          f"{torch.get_num_threads()}; CPU {torch.backends.cpu.get_cpu_capability()}; CPU bf16 kernels "
          f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}", flush=True)
    if args.profile:
        report = {"profile": profile_all(args, variants, sentences, workdir)}
        if args.output:
            Path(args.output).write_text(json.dumps(report, indent=2, default=str) + "\n")
        return 0

    hf_trainer, hf_encoder = build_hf(args, False, {}, workdir)
    st_trainer, st_model = build_st(args, False, sentences, workdir)
    shared = check_like_with_like(hf_trainer, hf_encoder, st_trainer, st_model)
    eval_max_len = hf_encoder.max_seq_length  # the sentence-transformers model is scored at the same truncation
    gemm = (measure_gemm(hf_trainer, hf_encoder) if args.gemm else
            device_peak(hf_trainer, hf_encoder, args.peak_tflops) if args.device == "cuda" else None)
    del hf_trainer, hf_encoder, st_trainer, st_model
    print("Shared settings: " + ", ".join(f"{k}={v}" for k, v in shared.items()), flush=True)

    evaluator = STSEvaluator(probe.data.sts_data_dir) if args.sts else None
    names = [HF, ST, *variants]
    runs: dict[str, list[dict]] = {f"{n} {p}": [] for p in args.precisions for n in names}
    sts_seeds: dict[str, dict[int, dict[str, float]]] = {key: {} for key in runs}
    for round_index, order in alternating(names, args.rounds):
        for precision in args.precisions:
            bf16 = precision == "bf16"
            # the first round trains (and scores) every seed; later rounds only time the first seed again
            for seed, name in [(seed, name) for seed in (args.seeds if round_index == 0 else args.seeds[:1])
                               for name in order]:
                key = f"{name} {precision}"
                seeded = argparse.Namespace(**{**vars(args), "seed": seed})
                if name == ST:
                    result, model = train_measured(lambda: build_st(seeded, bf16, sentences, workdir),
                                                   args.batch_size)
                else:
                    overrides = variants.get(name, {})
                    result, model = train_measured(lambda: build_hf(seeded, bf16, overrides, workdir),
                                                   args.batch_size)
                runs[key].append({**result, "seed": seed})
                line = (f"round {round_index} seed {seed} {key:34s} "
                        f"{_fmt(result['train_examples_per_second'], 1)} pairs/s, "
                        f"{_fmt(result['train_examples_per_cpu_second'], 1)} per CPU-s (step "
                        f"{_fmt(result['train_step_seconds'], 3)} s, first {_fmt(result['first_step_seconds'], 1)} s, "
                        f"train() {result['train_seconds']:.1f} s), peak {_fmt(result['run_peak_mb'], 0)} MiB, "
                        f"loss {result['train_loss']:.4f} (first logged {_fmt(result['first_logged_loss'], 4)})")
                if evaluator is not None and seed not in sts_seeds[key]:
                    trained = SentenceTransformerEncoder(model, eval_max_len) if name == ST else QuietEncoder(model)
                    sts_seeds[key][seed] = evaluator(trained, batch_size=args.eval_batch_size, bf16=False)
                    line += f", STS avg {sts_seeds[key][seed]['Avg']:.2f}"
                print(line, flush=True)
                del model

    sts = {key: seed_means(scores) for key, scores in sts_seeds.items() if scores}
    report = summarize(args, runs, sts, names, shared, gemm)
    report["sts_per_seed"] = sts_seeds
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


def seed_means(per_seed: dict[int, dict[str, float]]) -> dict[str, float]:
    """Each task's mean over the seeds, plus `Avg_sd` (the sample standard deviation of the 7-task averages; 0 for
    one seed) and `seeds`."""
    tasks = next(iter(per_seed.values()))
    means = {task: float(np.mean([scores[task] for scores in per_seed.values()])) for task in tasks}
    averages = [scores["Avg"] for scores in per_seed.values()]
    return {**means, "Avg_sd": float(np.std(averages, ddof=1)) if len(averages) > 1 else 0.0,
            "seeds": len(averages)}


def measure_gemm(trainer, encoder) -> dict:
    """The machine's fp32 GEMM rate at the encoder's shapes (at a step's mean real token count), the tokens per step
    of hf_sentcl's dataloader, and the layers' parameter count (the 6 x N x T work of a step)."""
    tokens = step_tokens(trainer, copies=2)
    config = encoder.backbone.config
    rate = gemm_rate(config.hidden_size, config.intermediate_size, int(round(tokens["real"])))
    params = sum(p.numel() for p in encoder.backbone.encoder.parameters())
    gemm = {**rate, "layer_parameters": params, "real_tokens_per_step": tokens["real"],
            "padded_tokens_per_step": tokens["padded"], "steps": tokens["steps"]}
    gemm["gemm_limit_step_seconds"] = 6.0 * params * tokens["real"] / (rate["gflops"] * 1e9)
    print(f"GEMM rate (fp32, {rate['threads']} thread(s), one layer's training GEMMs at {rate['tokens']} tokens): "
          f"{rate['gflops']:.1f} GFLOP/s. Per step: {tokens['real']:.0f} real tokens of {tokens['padded']:.0f} "
          f"padded positions ({100 * tokens['real'] / tokens['padded']:.0f}% real), {params / 1e6:.2f}M layer "
          f"parameters: GEMM limit {gemm['gemm_limit_step_seconds']:.3f} s per step.", flush=True)
    return gemm


#: dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, by a name fragment of `torch.cuda.get_device_name`
#: (first match wins): the vendors' data sheets
DENSE_BF16_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4),
                          ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0), ("A10", 125.0))


def dense_bf16_peak_tflops(device_name: str) -> float | None:
    """The card's dense bf16 peak from `DENSE_BF16_PEAK_TFLOPS`, None for a card not listed."""
    return next((peak for fragment, peak in DENSE_BF16_PEAK_TFLOPS if fragment in device_name), None)


def device_peak(trainer, encoder, peak_tflops: float | None) -> dict | None:
    """The GPU counterpart of `measure_gemm`: the tokens per step of hf_sentcl's dataloader, the layers' parameter
    count and the card's dense bf16 peak (`--peak-tflops`, or the data-sheet figure of a listed card), so that the
    GEMM-share column is the share of that peak: 6 x layer parameters x real tokens per step over the step time."""
    name = torch.cuda.get_device_name(0)
    peak = peak_tflops or dense_bf16_peak_tflops(name)
    if peak is None:
        print(f"No dense bf16 peak known for {name}: pass --peak-tflops for the share of the card's peak.")
        return None
    tokens = step_tokens(trainer, copies=2)
    params = sum(p.numel() for p in encoder.backbone.encoder.parameters())
    print(f"{name}: dense bf16 peak {peak:.1f} TFLOP/s; per step {tokens['real']:.0f} real tokens of "
          f"{tokens['padded']:.0f} padded positions, {params / 1e6:.2f}M layer parameters.", flush=True)
    return {"gflops": peak * 1000, "peak_of": name, "layer_parameters": params, "real_tokens_per_step": tokens["real"],
            "padded_tokens_per_step": tokens["padded"], "steps": tokens["steps"]}


def gemm_shares(summary: dict, gemm: dict | None) -> dict[str, dict[str, float | None]]:
    """Each row's share of the GEMM limit, for the useful (real-token) work and for the padded work."""
    if gemm is None:
        return {}
    return {  # the CPU's rate is an fp32 GEMM rate: no share for bf16 rows there (bf16 GEMMs run at another rate)
        key: {kind: gemm_share(row.get("train_step_seconds"), gemm[f"{kind}_tokens_per_step"],
                               gemm["layer_parameters"], gemm["gflops"]) for kind in ("real", "padded")}
        for key, row in summary.items() if "peak_of" in gemm or key.endswith(" fp32")
    }


def summarize(args, runs: dict[str, list[dict]], sts: dict, names: list[str], shared, gemm=None) -> dict:
    """Print the medians and the hf_sentcl / sentence-transformers ratios; return everything as a dict."""
    summary = {key: medians(values) for key, values in runs.items()}
    shares = gemm_shares(summary, gemm)
    print(f"\nMedians over {args.rounds} round(s); {args.threads} thread(s); batch {args.batch_size}, max_len "
          f"{args.max_seq_length}, {args.train_samples} sentences. Ratios are this row / sentence-transformers at the "
          "same precision; 'per CPU-s' divides by the process CPU time of the same steps.")
    print("| configuration | pairs/s | pairs per CPU-s | first step s | train() s | peak MiB | first loss | STS avg | "
          "x pairs/s | x pairs per CPU-s | x peak | STS - ST | GEMM share |\n|---|" + "---:|" * 12)
    ratios = {}
    for precision in args.precisions:
        base = summary[f"{ST} {precision}"]
        base_avg = sts.get(f"{ST} {precision}", {}).get("Avg")
        for name in names:
            key = f"{name} {precision}"
            row = summary[key]
            avg = sts.get(key, {}).get("Avg")
            ratios[key] = {
                "throughput_vs_st": ratio(row.get("train_examples_per_second"), base.get("train_examples_per_second")),
                "cpu_throughput_vs_st": ratio(row.get("train_examples_per_cpu_second"),
                                              base.get("train_examples_per_cpu_second")),
                "run_peak_vs_st": ratio(row.get("run_peak_mb"), base.get("run_peak_mb")),
                "sts_avg_minus_st": None if avg is None or base_avg is None else avg - base_avg,
            }
            r = ratios[key]
            print(f"| {key} | {_fmt(row.get('train_examples_per_second'), 1)} | "
                  f"{_fmt(row.get('train_examples_per_cpu_second'), 1)} | {_fmt(row.get('first_step_seconds'), 1)} | "
                  f"{_fmt(row.get('train_seconds'), 1)} | {_fmt(row.get('run_peak_mb'), 0)} | "
                  f"{_fmt(row.get('first_logged_loss'), 4)} | {_fmt(avg)} | "
                  f"{_fmt(r['throughput_vs_st'])}x | {_fmt(r['cpu_throughput_vs_st'])}x | "
                  f"{_fmt(r['run_peak_vs_st'])}x | {_fmt(r['sts_avg_minus_st'])} | "
                  f"{_pct(shares.get(key, {}).get('real'))} |")
    if shares:
        rate = (f"{gemm['gflops'] / 1000:.1f} TFLOP/s ({gemm['peak_of']}'s dense bf16 peak)" if "peak_of" in gemm
                else f"{gemm['gflops']:.1f} GFLOP/s (fp32)")
        print(f"GEMM share: 6 x {gemm['layer_parameters'] / 1e6:.2f}M parameters x {gemm['real_tokens_per_step']:.0f} "
              f"real tokens per step at {rate}, over the median step time. Counting the "
              f"{gemm['padded_tokens_per_step']:.0f} padded positions instead (the work a padded forward does): "
              + ", ".join(f"{key} {_pct(value['padded'])}" for key, value in shares.items()) + ".")
    if sts:
        tasks = [t for t in next(iter(sts.values())) if t not in ("Avg", "Avg_sd", "seeds")]
        print("\nSTS (Spearman x 100, mode all, fp32 evaluation; the mean over the seeds, Avg with its standard "
              "deviation):\n| configuration | seeds | " + " | ".join(tasks) + " | Avg |")
        print("|---|---:|" + "---:|" * (len(tasks) + 1))
        for key, scores in sts.items():
            print(f"| {key} | {scores['seeds']} | " + " | ".join(f"{scores[t]:.2f}" for t in tasks)
                  + f" | {scores['Avg']:.2f} ± {scores['Avg_sd']:.2f} |")
    return {"settings": {**vars(args), "shared_training_settings": shared}, "runs": runs, "medians": summary,
            "ratios": ratios, "sts": sts, "gemm": gemm, "gemm_shares": shares}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
