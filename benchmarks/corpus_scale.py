"""Corpus scale: time to the first training step and peak memory for corpora of growing size, on a first run (empty
`datasets` cache: read, scan, clean and tokenise the file) and on a rerun that hits the tokenisation cache.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/corpus_scale.py --lines 10000,100000,1000000 \\
        [--format txt|csv] [--workdir /tmp/corpus_scale] [--recipe recipes/quickstart.yaml] [--output scale.json]

Each corpus is built from the shared Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt`), its sentences
repeated in order with " (i)" appended to line i, so every line is distinct (as in SimCSE's own million-line file,
where duplicates are rare); `--format csv` writes the same sentences as a one-column CSV (header `text`, every field
quoted), the form of a corpus exported from a table. Every measurement runs in a fresh Python process, which builds the
run as `hf_sentcl.run` does (`pipeline.train.build_stage`: the recipe's model, the whole corpus as training data) and
trains one step; it reports the seconds from its start to the end of that first step, split into the phases before it,
and its peak resident set: the larger of the building phase's (read before training starts: the corpus scan, loading and
tokenising happen there) and the training step's (training restarts the high-water mark to measure its own peak,
`hf_sentcl.trainers.callbacks.TrainingCostCallback`, so `ru_maxrss` at the end holds the step's only). The first run of
a corpus uses an empty `HF_DATASETS_CACHE`; the rerun keeps it. Figures depend on the machine: quote them with the
CPU, and compare sizes within one sitting.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_corpus(source: Path, lines: int, path: Path) -> Path:
    """`lines` distinct lines: the source's sentences in order, repeated, line i ending with " (i)"; a .csv `path`
    gets them as the column `text`, every field quoted."""
    if path.is_file():
        return path
    sentences = [s.strip() for s in source.read_text(encoding="utf-8").splitlines() if s.strip()]
    texts = (f"{sentences[i % len(sentences)]} ({i})" for i in range(lines))
    with path.open("w", encoding="utf-8", newline="") as out:
        if path.suffix == ".csv":
            writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
            writer.writerow(["text"])
            writer.writerows([text] for text in texts)
        else:
            out.writelines(f"{text}\n" for text in texts)
    return path


def child(recipe_path: str, train_file: str, output_dir: str, streaming: str = "0", steps: str = "1") -> dict:
    """In this process: build the run on `train_file` (streamed with `streaming` "1") and train `steps` steps; phases
    in seconds since the start, and the seconds at the end of every step."""
    started = time.perf_counter()
    from hf_sentcl.pipeline import train as pipeline_train
    from hf_sentcl.recipe.parser import parse_recipe
    from hf_sentcl.recipe.plan import plan_run

    data_seconds = []
    build_train_data = pipeline_train.build_train_data

    def timed_build_train_data(*args, **kwargs):  # the data's share of the build: scan, load, clean, tokenise
        start = time.perf_counter()
        try:
            return build_train_data(*args, **kwargs)
        finally:
            data_seconds.append(time.perf_counter() - start)

    pipeline_train.build_train_data = timed_build_train_data

    recipe = parse_recipe(
        recipe_path, train_file=train_file, max_train_samples=None, max_steps=int(steps), eval_strategy="no",
        save_strategy="no", load_best_model_at_end=False, eval_before_training=False, output_dir=output_dir,
        report_to="none", disable_tqdm=True, logging_steps=1,
        **({"streaming": True} if streaming == "1" else {}),
    )
    imported = time.perf_counter() - started
    stage = pipeline_train.build_stage(plan_run(recipe))
    built = time.perf_counter() - started
    build_peak = high_water_mib()
    step_ends = StepEnds(started)
    stage.trainer.add_callback(step_ends)
    stage.trainer.train()
    train_peak = high_water_mib()
    return {
        "step_done_s": step_ends.seconds,
        "imports_and_recipe_s": round(imported, 2),
        "build_s": round(built - imported, 2),  # model, corpus scan, loading, cleaning, tokenising, trainer
        "data_s": round(sum(data_seconds), 2),  # of which the training data
        "first_step_done_s": round(time.perf_counter() - started, 2),
        "examples": stage.num_examples,
        "peak_rss_mib": round(max(build_peak, train_peak), 1),
        "build_peak_rss_mib": round(build_peak, 1),
        "train_peak_rss_mib": round(train_peak, 1),
    }


class StepEnds:
    """A Trainer callback noting the seconds since `started` at the end of every step (data loading included)."""

    def __init__(self, started: float) -> None:
        self.started, self.seconds = started, []

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_end(self, *args, **kwargs) -> None:
        self.seconds.append(round(time.perf_counter() - self.started, 3))


def peaks(run: dict) -> str:
    return f"{run['peak_rss_mib']:,.0f} ({run['build_peak_rss_mib']:,.0f} / {run['train_peak_rss_mib']:,.0f})"


def high_water_mib() -> float:
    """The resident set's high-water mark since the process started or it was last restarted (Linux's VmHWM, read
    as the training-cost callback reads it), in MiB; `ru_maxrss` where /proc does not say."""
    from hf_sentcl.trainers.callbacks import _peak_rss_bytes  # the child has imported the pipeline by now

    peak = _peak_rss_bytes()
    return peak / 2**20 if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(recipe: str, corpus: Path, cache: Path, output_dir: Path, streaming: bool = False, steps: int = 1) -> dict:
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, __file__, "--child", recipe, str(corpus), str(output_dir), "1" if streaming else "0",
               str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{corpus.name}: the run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", default="10000,100000,1000000", help="Corpus sizes, comma-separated.")
    parser.add_argument("--format", choices=("txt", "csv"), default="txt", help="The corpus file's format.")
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "quickstart.yaml"))
    parser.add_argument("--workdir", default="/tmp/hf_sentcl_corpus_scale")
    parser.add_argument("--output", default=None, help="Also write the measurements as JSON here.")
    parser.add_argument("--streaming", action="store_true",
                        help="Measure `streaming: true`: seconds to 4 steps and peak memory per size, and steady-state "
                        "throughput against the pre-tokenised path on the smallest corpus (--throughput-steps).")
    parser.add_argument("--steps", type=int, default=1, help="Training steps of each measured run (not --streaming).")
    parser.add_argument("--throughput-steps", type=int, default=24,
                        help="--streaming: steps of the throughput runs (<= 4: none).")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    from hf_sentcl.hub.download import resolve_data_dir

    source = resolve_data_dir(None).parent / "wiki1m_subset.txt"
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.streaming:
        return streaming_main(args, source, workdir)
    rows = []
    for lines in (int(n) for n in args.lines.split(",")):
        corpus = build_corpus(source, lines, workdir / f"wiki_{lines}.{args.format}")
        cache = workdir / f"cache_{lines}_{args.format}"
        shutil.rmtree(cache, ignore_errors=True)
        first = measure(args.recipe, corpus, cache, workdir / "run", steps=args.steps)
        rerun = measure(args.recipe, corpus, cache, workdir / "run", steps=args.steps)
        rows.append({"lines": lines, "first": first, "rerun": rerun})
        print(f"{lines:>9,} lines: first run {first['first_step_done_s']:.1f} s to step {args.steps} "
              f"(data {first['data_s']:.1f} s), peak {first['peak_rss_mib']:,.0f} MiB; rerun "
              f"{rerun['first_step_done_s']:.1f} s (data {rerun['data_s']:.1f} s), "
              f"peak {rerun['peak_rss_mib']:,.0f} MiB",
              flush=True)
    print("\n| lines | first run: s to first step | of which data s | peak MiB (building / step) | rerun: s to first "
          "step | of which data s | peak MiB (building / step) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f, g = r["first"], r["rerun"]
        print(f"| {r['lines']:,} | {f['first_step_done_s']:.1f} | {f['data_s']:.1f} | {peaks(f)} | "
              f"{g['first_step_done_s']:.1f} | {g['data_s']:.1f} | {peaks(g)} |")
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def throughput(run: dict, after: int = 4) -> float:
    """Examples per second from the end of step `after` to the last step (data loading included), batch 64."""
    ends = run["step_done_s"]
    return 64 * (len(ends) - after) / (ends[-1] - ends[after - 1])


def steady_state(args, corpus: Path, workdir: Path) -> dict[str, float]:
    """Examples/s after step 4 of the pre-tokenised path (its tokenised cache made first) and of the stream."""
    cache = workdir / f"cache_throughput_{args.format}"
    shutil.rmtree(cache, ignore_errors=True)
    measure(args.recipe, corpus, cache, workdir / "run", steps=1)  # tokenised into the cache first
    tokenised = measure(args.recipe, corpus, cache, workdir / "run", steps=args.throughput_steps)
    streamed = measure(args.recipe, corpus, cache, workdir / "run", streaming=True, steps=args.throughput_steps)
    speeds = {"pre_tokenised": throughput(tokenised), "streaming": throughput(streamed)}
    print(f"steady state (steps 5-{args.throughput_steps}, {corpus.name}): pre-tokenised "
          f"{speeds['pre_tokenised']:.1f} examples/s, streamed {speeds['streaming']:.1f} examples/s, ratio "
          f"{speeds['streaming'] / speeds['pre_tokenised']:.3f}")
    return speeds


def streaming_main(args, source: Path, workdir: Path) -> int:
    """`--streaming`: the streamed path's seconds to 4 steps and peak per size; then both paths' steady state."""
    rows, corpora = [], []
    for lines in (int(n) for n in args.lines.split(",")):
        corpus = build_corpus(source, lines, workdir / f"wiki_{lines}.{args.format}")
        corpora.append(corpus)
        run = measure(args.recipe, corpus, workdir / "cache_streaming", workdir / "run", streaming=True, steps=4)
        rows.append({"lines": lines, "streaming": run})
        print(f"{lines:>9,} lines streamed: 4 steps done at {run['step_done_s'][-1]:.1f} s (build {run['build_s']:.1f}"
              f" s, data {run['data_s']:.2f} s), peak {peaks(run)} MiB", flush=True)
    speeds = steady_state(args, corpora[0], workdir) if args.throughput_steps > 4 else None
    print("\n| lines | streamed: s to 4 steps | build s | of which data s | peak MiB (building / steps) |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        run = r["streaming"]
        print(f"| {r['lines']:,} | {run['step_done_s'][-1]:.1f} | {run['build_s']:.1f} | {run['data_s']:.2f} | "
              f"{peaks(run)} |")
    if args.output:
        Path(args.output).write_text(json.dumps({"sizes": rows, "throughput": speeds}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
