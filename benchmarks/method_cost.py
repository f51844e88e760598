"""Training cost of IFM, BYOP-C/D, SG, SG-OPT, ConSERT and CLEAR relative to SimCSE: steps per second, peak memory.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/method_cost.py --rounds 3 [--steps 20] [--threads N]
        [--methods simcse,ifm,byop-c,byop-d,sg,sg-opt,consert,clear] [--precision bf16] [--output cost.json]

Every method trains from its own MiniLM recipe (SimCSE: recipes/quickstart.yaml, mean pooling, no head; IFM (p-n+,
m 0.1, multi-task), BYOP-C (n-, m 0.01) and BYOP-D (n-, dynamic margin): recipes/byop_minilm.yaml; SG and SG-OPT:
recipes/sg_opt_minilm.yaml with `objective: sg` / `sg-opt`, frozen copy, 4096-wide projection head; ConSERT:
recipes/consert_minilm.yaml, shuffle + feature cutoff, no encoder dropout; CLEAR: recipes/clear_minilm.yaml,
del_span+reorder views plus the MLM loss on the original, three texts per sentence in one forward), with what sets the
cost made equal: the same first sentences of the Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt` or
--train-file), batch size, max_len, precision, seed and number of optimizer steps, and no evaluation or saving.
Throughput and memory are measured as in `train_vs_sentence_transformers.py` (`training_cost.RunCost`: steps per second
of the training steps alone, first step left out; process CPU time of the same steps; peak memory = the resident-set
high-water mark during training minus the resident set before the run built its model, so it holds the model, the
method's own modules (SG's frozen copy and 4096-wide head), the optimizer state and the activations). Methods run
alternately (A B C D, D C B A, ...) for --rounds rounds; medians and the ratios to SimCSE are printed. Timings mean
something on an otherwise idle machine; CPU time per step is steadier on a shared one (--threads 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import datasets
import torch
from training_cost import alternating, medians, ratio, train_measured, trainer_from_recipe

from hf_sentcl.hub.download import resolve_data_dir
from hf_sentcl.recipe.parser import Recipe, parse_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
#: method label -> (recipe file, the method's own overrides)
METHODS: dict[str, tuple[str, dict]] = {
    "simcse": ("quickstart.yaml", {}),
    "ifm": ("byop_minilm.yaml", {"perturbation": "p-n+", "margin": 0.1, "multi_task": True}),
    "byop-c": ("byop_minilm.yaml", {}),
    "byop-d": ("byop_minilm.yaml", {"margin_type": "dynamic", "margin": 0.0}),
    "sg": ("sg_opt_minilm.yaml", {"objective": "sg", "early_stopping_patience": None}),
    "sg-opt": ("sg_opt_minilm.yaml", {"objective": "sg-opt", "early_stopping_patience": None}),
    "consert": ("consert_minilm.yaml", {}),
    "clear": ("clear_minilm.yaml", {}),
}
BASELINE = "simcse"
#: SimCSE with a plug-in, measured only when --methods names them
PLUGINS: dict[str, tuple[str, dict]] = {
    "simcse+mask": ("quickstart.yaml", {"false_negatives": "mask"}),
    # the guide (all-MiniLM-L6-v2, mean-pooled) embeds the batch's sentences once per step, without gradient
    "simcse+guide": ("quickstart.yaml", {"false_negatives": "guide", "guide_model": "embedded:all-MiniLM-L6-v2"}),
    "simcse+matryoshka": ("quickstart.yaml", {"matryoshka_dims": [384, 256, 128, 64]}),
}


def method_recipe(name: str, args: argparse.Namespace, output_dir: str) -> Recipe:
    """The method's recipe with the cost-setting keys made equal across methods."""
    recipe_file, own = {**METHODS, **PLUGINS}[name]
    common = dict(
        unlabeled_sts=None, train_file=args.train_file, max_train_samples=args.steps * args.batch_size,
        max_seq_length=args.max_seq_length, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        bf16=args.precision == "bf16", seed=args.seed, eval_strategy="no", save_strategy="no",
        load_best_model_at_end=False, logging_steps=10, disable_tqdm=True, eval_tasks=[], output_dir=output_dir,
        unpadded=args.unpadded,
    )
    return parse_recipe(RECIPES / recipe_file, **common, **own)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"Comma-separated, from: {', '.join([*METHODS, *PLUGINS])} (default: every method).")
    parser.add_argument("--train-file", default=None, help="Default: $HF_SENTCL_DATA/../wiki1m_subset.txt")
    parser.add_argument("--steps", type=int, default=20, help="Optimizer steps per run (the first is warm-up).")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch.set_num_threads (default: every core this process may use).")
    parser.add_argument("--unpadded", action=argparse.BooleanOptionalAction, default=True,
                        help="The encoder's unpadded path (default); --no-unpadded measures the padded forward.")
    parser.add_argument("--output", default=None, help="Also write every measurement as JSON here.")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS and m not in PLUGINS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join([*METHODS, *PLUGINS])}.")
    if BASELINE not in args.methods:
        args.methods.insert(0, BASELINE)
    if args.steps < 2 or args.rounds < 1 or args.threads < 1:
        raise SystemExit("--steps must be at least 2 (the first step is not timed); --rounds and --threads >= 1.")
    if args.train_file is None:
        args.train_file = str(resolve_data_dir(None).parent / "wiki1m_subset.txt")
    return args


def measure(recipes: dict[str, Recipe], args: argparse.Namespace) -> dict[str, list[dict]]:
    """Train every recipe once per round, in alternating order; each run's cost measurements."""
    runs: dict[str, list[dict]] = {name: [] for name in recipes}
    for round_index, order in alternating(list(recipes), args.rounds):
        for name in order:
            result, _ = train_measured(lambda: trainer_from_recipe(recipes[name]), args.batch_size)
            result["steps_per_second"] = 1 / result["train_step_seconds"] if result["train_step_seconds"] else None
            runs[name].append(result)
            print(f"round {round_index} {name:8s} step {result['train_step_seconds']:.3f} s "
                  f"(CPU {result['train_step_cpu_seconds']:.3f} s), peak {result['run_peak_mb']:.0f} MiB, "
                  f"loss {result['train_loss']:.4f}", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="hf_sentcl_method_cost_") as workdir:
        recipes = {name: method_recipe(name, args, workdir) for name in args.methods}  # recipe errors before training
        runs = measure(recipes, args)
    names = list(recipes)
    summary = {name: medians(values) for name, values in runs.items()}
    base = summary[BASELINE]
    print(f"\nMedians over {args.rounds} round(s), {args.steps} steps each; {args.precision}, batch {args.batch_size}, "
          f"max_len {args.max_seq_length}, {args.threads} thread(s). Ratios are method / SimCSE.")
    print("| method | steps/s | step s | CPU s/step | peak MiB | x steps/s | x CPU s/step | x peak |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {}
    for name in names:
        row = summary[name]
        ratios[name] = {
            "steps_per_second_vs_simcse": ratio(base["train_step_seconds"], row["train_step_seconds"]),
            "cpu_seconds_per_step_vs_simcse": ratio(row["train_step_cpu_seconds"], base["train_step_cpu_seconds"]),
            "run_peak_vs_simcse": ratio(row.get("run_peak_mb"), base.get("run_peak_mb")),
        }
        r = ratios[name]
        print(f"| {name} | {1 / row['train_step_seconds']:.2f} | {row['train_step_seconds']:.3f} | "
              f"{row['train_step_cpu_seconds']:.3f} | {row.get('run_peak_mb', float('nan')):.0f} | "
              f"{r['steps_per_second_vs_simcse']:.2f}x | {r['cpu_seconds_per_step_vs_simcse']:.2f}x | "
              f"{r['run_peak_vs_simcse'] or float('nan'):.2f}x |")
    if args.output:
        Path(args.output).write_text(json.dumps({"settings": vars(args), "runs": runs, "medians": summary,
                                                 "ratios": ratios}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
