"""Time the full 7-task STS evaluation: hf_sentcl (fp32 and bf16) against `SentenceTransformer.encode`.

    python benchmarks/eval_speed.py [--rounds 3] [--model embedded:all-MiniLM-L6-v2] [--output speed.json]

The baseline is the usual peer code: `SentenceTransformer(path).encode(sentences1)` and `.encode(sentences2)`
for every task (subset) with the default batch size, then the same cosine/Spearman code hf_sentcl uses
(`cosine_rows`, `combine_subsets`, mode `all`). hf_sentcl is what `STSEvaluator(...)(encoder)` runs: one
`encode` over the distinct sentences of all 7 tasks, sorted by length, then the correlations. Both load the same weights
with mean pooling (the model card's pooling of all-MiniLM-L6-v2; its Normalize module does not change cosines). The
three variants run in alternation for `--rounds` rounds in one process, so machine drift hits all of them alike; the
median per variant is reported, with the speed-up over the baseline and the largest |difference| in any task's Spearman.
Data loading and model loading are not timed; a short warm-up runs first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from hf_sentcl import SentenceEncoder
from hf_sentcl.configs.choices import EMBEDDED_MODEL_ALIAS
from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator, combine_subsets, cosine_rows
from hf_sentcl.modeling.backbone import resolve_model_name

MODE = "all"


def sentence_transformers_sts(model: SentenceTransformer, evaluator: STSEvaluator) -> dict[str, float]:
    """The peer's evaluation: encode both sides of every subset with default settings, then correlate."""
    scores = {}
    for task, subsets in evaluator.data.items():
        per_subset = {}
        for name, pairs in subsets.items():
            first = model.encode(pairs.sentences1, show_progress_bar=False)
            second = model.encode(pairs.sentences2, show_progress_bar=False)
            per_subset[name] = (pairs.scores, cosine_rows(first, second))
        scores[task] = combine_subsets(per_subset, MODE)
    scores["Avg"] = float(np.mean([scores[t] for t in evaluator.tasks]))
    return scores


def hf_sentcl_sts(encoder: SentenceEncoder, evaluator: STSEvaluator, batch_size: int, bf16: bool) -> dict[str, float]:
    """`evaluator(encoder, batch_size, bf16)` (= `score(embed(...))`), with the progress bar off."""
    sentences = evaluator.sentences()
    return evaluator.score(encoder.encode(sentences, batch_size=batch_size, bf16=bf16, show_progress_bar=False))


def timed(fn) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED_MODEL_ALIAS, help="Model directory, Hub id or the embedded alias.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds of the three variants.")
    parser.add_argument("--batch-size", type=int, default=128, help="hf_sentcl's encode batch size.")
    parser.add_argument("--data-dir", default=None, help="SentEval-format directory (default: $HF_SENTCL_DATA).")
    parser.add_argument(
        "--sts-tasks", default=",".join(STS_TASKS), help="A subset of the 7 tasks, for a quick check of the script."
    )
    parser.add_argument("--unpadded", action=argparse.BooleanOptionalAction, default=True,
                        help="hf_sentcl's unpadded encode (default); --no-unpadded: the padded forward.")
    parser.add_argument("--output", default=None, help="Also write the measurements as JSON here.")
    args = parser.parse_args(argv)

    evaluator = STSEvaluator(args.data_dir, tasks=tuple(t for t in args.sts_tasks.split(",") if t), mode=MODE)
    path = resolve_model_name(args.model)
    st_model = SentenceTransformer(path, device="cpu")
    encoder = SentenceEncoder.from_backbone(path, pooling="mean", unpadded=args.unpadded)
    pairs = sum(len(p) for subsets in evaluator.data.values() for p in subsets.values())
    print(f"{pairs} pairs, {2 * pairs} sentences encoded by the baseline, {len(evaluator.sentences())} distinct; "
          f"torch threads: {torch.get_num_threads()}; CPU {torch.backends.cpu.get_cpu_capability()}, oneDNN bf16: "
          f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}", flush=True)

    variants = {
        "sentence-transformers (fp32, batch 32)": lambda: sentence_transformers_sts(st_model, evaluator),
        f"hf_sentcl fp32 (batch {args.batch_size})": lambda: hf_sentcl_sts(encoder, evaluator, args.batch_size, False),
        f"hf_sentcl bf16 (batch {args.batch_size})": lambda: hf_sentcl_sts(encoder, evaluator, args.batch_size, True),
    }
    warmup = evaluator.sentences()[:256]
    st_model.encode(warmup, show_progress_bar=False)
    encoder.encode(warmup, show_progress_bar=False)
    encoder.encode(warmup, bf16=True, show_progress_bar=False)

    times: dict[str, list[float]] = {name: [] for name in variants}
    scores: dict[str, dict[str, float]] = {}
    for round_ in range(1, args.rounds + 1):
        for name, fn in variants.items():
            seconds, scores[name] = timed(fn)
            times[name].append(seconds)
            print(f"round {round_}: {name}: {seconds:.1f} s", flush=True)

    baseline_name = next(iter(variants))
    baseline = statistics.median(times[baseline_name])
    print("\n| variant | median s | speed-up | max |ΔSpearman × 100| vs baseline |\n|---|---:|---:|---:|")
    summary = {}
    for name in variants:
        median = statistics.median(times[name])
        diff = max(abs(scores[name][t] - scores[baseline_name][t]) for t in evaluator.tasks)
        summary[name] = {"seconds": times[name], "median_s": median, "speedup": baseline / median,
                         "max_abs_spearman_diff": diff, "scores": scores[name]}
        print(f"| {name} | {median:.1f} | {baseline / median:.2f}x | {diff:.4f} |")
    fp32, bf16 = list(variants)[1:]
    tolerance = max(abs(scores[bf16][t] - scores[fp32][t]) for t in evaluator.tasks)
    summary["bf16_vs_fp32_max_abs_spearman_diff"] = tolerance
    print(f"\nbf16 against fp32 (hf_sentcl): largest |ΔSpearman × 100| over the tasks = {tolerance:.4f}")
    print("\nSpearman × 100 per task (mode all):")
    print("| variant | " + " | ".join(evaluator.tasks) + " | Avg |")
    for name in variants:
        print(f"| {name} | " + " | ".join(f"{scores[name][t]:.4f}" for t in (*evaluator.tasks, "Avg")) + " |")
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
