"""Shared machinery of the training-cost benchmarks (`train_vs_sentence_transformers.py`, `method_cost.py`).

- `train_measured` / `RunCost`: `TrainingCostCallback` (throughput of the training steps alone, first step left
  out) plus their process CPU time, the first step's time, the whole `train()` wall time, and the peak resident set
  as an increase over the resident set before the run built its model. Both benchmarks train several models in one
  process, so the absolute high-water mark would also hold heap the allocator kept from earlier runs; freed memory
  is handed back (gc, malloc_trim) before the baseline is read.
- `alternating`: the run order of the rounds (A B C, C B A, A B C, ...) so that machine drift hits every
  configuration alike; `medians`: the per-configuration median of every numeric measurement.
- `trainer_from_recipe`: the trainer `hf_sentcl.run` builds for a recipe (without its STS-B dev evaluator).
- `profile_training_step`: torch.profiler over exactly one optimizer step of a `Trainer` (the interval
  `TrainingCostCallback` times), with every operator's self CPU time put into a phase: data, forward, loss,
  backward, optimizer (including gradient clipping and zero_grad) or other; on a GPU also the time the GPU was busy
  (the union of its kernels' and copies' intervals) and their number, which tell a launch-bound step (busy far
  below the wall time) from a GPU-bound one.

Run the scripts from the repository root (`python benchmarks/...`); this directory is then on the import path.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from cached_memory import current_rss_bytes, release_freed_memory
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import Trainer, TrainerCallback, set_seed

from hf_sentcl.modeling import SentenceEncoder
from hf_sentcl.pipeline.build import build_encoder, build_train_dataset
from hf_sentcl.recipe.parser import Recipe
from hf_sentcl.registry import get_method
from hf_sentcl.trainers.callbacks import TrainingCostCallback

MIB = 2**20
PHASES = ("data", "forward", "loss", "backward", "optimizer", "other")
_LABEL = "bench::"


def settled_rss_bytes() -> int:
    """The resident set after freed memory went back to the OS: the baseline taken before a run builds its model."""
    release_freed_memory()
    return current_rss_bytes()


class RunCost(TrainingCostCallback):
    """`TrainingCostCallback` plus the process CPU time of the same step intervals, the first step's time, and the
    peak resident set during training as an increase over the resident set before the run built its model
    (`rss_before_build`: model, method modules, optimizer state, activations) and over the one when training
    starts. On CUDA the parent's peak allocation is the figure.

    CPU time per step is the steadier figure on a shared machine: with one intra-op thread it hardly depends on how
    many other processes compete for the cores, whereas wall time does."""

    def __init__(self, rss_before_build: int | None = None) -> None:
        super().__init__()
        self.rss_before_build = rss_before_build
        self.rss_at_begin: int | None = None
        self.step_cpu_seconds: list[float] = []
        self._last_cpu: float | None = None
        self._begin = 0.0
        self.first_step_seconds: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        release_freed_memory()
        super().on_train_begin(args, state, control, **kwargs)
        self.rss_at_begin = current_rss_bytes() if self._rss_reset else None
        self._begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        cpu = time.process_time()
        if self.first_step_seconds is None:  # warm-up: allocations, torch.compile's first compilation
            self.first_step_seconds = time.perf_counter() - self._begin
        measured = len(self.step_seconds)
        super().on_step_end(args, state, control, **kwargs)
        if len(self.step_seconds) > measured:  # the parent kept this interval (not the first, no eval/save inside)
            self.step_cpu_seconds.append(cpu - self._last_cpu)
        self._last_cpu = cpu

    def result(self, examples_per_step: int) -> dict[str, float | int | str | None]:
        """`summary(...)` plus `train_step_cpu_seconds` (median), `train_examples_per_cpu_second`,
        `first_step_seconds`, `train_peak_increase_mb` (over the start of training) and `run_peak_mb` (over the
        resident set before the model was built)."""
        out = self.summary(examples_per_step)
        out["first_step_seconds"] = self.first_step_seconds
        cpu = self.step_cpu_seconds
        out["train_step_cpu_seconds"] = statistics.median(cpu) if cpu else None
        out["train_examples_per_cpu_second"] = examples_per_step * len(cpu) / sum(cpu) if sum(cpu) > 0 else None
        out["train_peak_increase_mb"] = out["run_peak_mb"] = None
        if self.peak_memory_kind == "process_peak_rss":
            if self.rss_at_begin is not None:
                out["train_peak_increase_mb"] = (self.peak_memory_bytes - self.rss_at_begin) / MIB
            if self.rss_before_build is not None:
                out["run_peak_mb"] = (self.peak_memory_bytes - self.rss_before_build) / MIB
        elif self.peak_memory_kind == "cuda_max_allocated":
            out["train_peak_increase_mb"] = out["run_peak_mb"] = out["train_peak_memory_mb"]
        return out


def trainer_from_recipe(recipe: Recipe) -> tuple[Trainer, SentenceEncoder]:
    """The method's trainer and the encoder, built as `hf_sentcl.run` builds them (seed, encoder, pre-tokenised data,
    collator), without the STS-B dev evaluator: benchmarks neither evaluate nor save during training."""
    set_seed(recipe.training.seed)
    encoder = build_encoder(recipe)
    dataset, _, collator = build_train_dataset(recipe, encoder.tokenizer)
    trainer = get_method(recipe.method).trainer_class(
        model=encoder, args=recipe.training, train_dataset=dataset, data_collator=collator,
        processing_class=encoder.tokenizer,
    )
    return trainer, encoder


def train_measured(build: Callable[[], tuple[Trainer, object]], examples_per_step: int) -> tuple[dict, object]:
    """Build a run with `build()` -> (trainer, model), train it with a fresh `RunCost` and return (its figures plus
    `train_seconds` (the whole `train()` call), the mean training loss and the steps, the trained model)."""
    before = settled_rss_bytes()
    trainer, model = build()
    cost = RunCost(before)
    trainer.add_callback(cost)
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    result = {**cost.result(examples_per_step), "train_seconds": seconds, "train_loss": output.training_loss,
              "first_logged_loss": logged[0] if logged else None, "steps": trainer.state.global_step}
    return result, model


def alternating(names: Sequence[str], rounds: int) -> Iterator[tuple[int, list[str]]]:
    """(round, order) with the order reversed every other round: A B, B A, A B, ..."""
    for index in range(rounds):
        yield index, list(names) if index % 2 == 0 else list(names)[::-1]


def medians(runs: list[dict]) -> dict[str, float]:
    """The median of every numeric (non-bool) value over the `runs` that have one."""

    def numeric(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    keys = dict.fromkeys(k for run in runs for k, v in run.items() if numeric(v))
    return {k: statistics.median(run[k] for run in runs if numeric(run.get(k))) for k in keys}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if not numerator or not denominator else numerator / denominator


# ---------------------------------------------------------------------------------------------- one-step profile
@dataclass
class StepProfile:
    """Where one training step's time went: per-phase self CPU time, the step's wall time, per-phase top ops."""

    wall_ms: float
    phase_ms: dict[str, float]
    top_ops: dict[str, list[tuple[str, float]]]
    table: str = field(repr=False)
    #: on a GPU: the milliseconds it was busy in the step (union of kernel and copy intervals) and their number
    device_busy_ms: float | None = None
    device_kernels: int | None = None

    @property
    def untracked_ms(self) -> float:
        """Wall time outside every profiled operator: Python between ops (trainer, callbacks, collation glue)."""
        return max(self.wall_ms - sum(self.phase_ms.values()), 0.0)

    def report(self, title: str) -> str:
        lines = [f"{title}: one step, {self.wall_ms:.0f} ms wall"]
        for phase in PHASES:
            ms = self.phase_ms.get(phase, 0.0)
            ops = ", ".join(f"{name} {t:.1f}" for name, t in self.top_ops.get(phase, [])[:5])
            lines.append(f"  {phase:9s} {ms:8.1f} ms {100 * ms / self.wall_ms:5.1f}%   {ops}")
        untracked = self.untracked_ms
        lines.append(f"  {'python':9s} {untracked:8.1f} ms {100 * untracked / self.wall_ms:5.1f}%   "
                     "(wall time outside any operator)")
        if self.device_busy_ms is not None:
            busy = self.device_busy_ms
            lines.append(f"  {'GPU busy':9s} {busy:8.1f} ms {100 * busy / self.wall_ms:5.1f}%   "
                         f"({self.device_kernels} kernels and copies; the profiler lengthens the wall time)")
        return "\n".join(lines)


class _LabelledRegion:
    """Enter/exit a `record_function` label from hooks, so operators inside a module's forward get a phase."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack: list = []

    def enter(self, *args, **kwargs) -> None:
        region = record_function(self.name)
        region.__enter__()
        self.stack.append(region)

    def exit(self, *args, **kwargs) -> None:
        self.stack.pop().__exit__(None, None, None)


def _labelled(fn, name: str):
    def wrapper(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper


def _phase_of(event) -> str:
    """The phase of a profiler event, from the innermost labelled region among its ancestors."""
    node = event
    while node is not None:
        name = node.name
        if name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        if name.startswith(_LABEL):
            return name.removeprefix(_LABEL)
        if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
            return "optimizer"
        if "DataLoader" in name:
            return "data"
        node = node.cpu_parent
    return "other"


class _OneStepProfiler(TrainerCallback):
    """Profiles the interval between the end of step `skip` and the end of step `skip + 1`."""

    def __init__(self, skip: int, cuda: bool = False) -> None:
        self.skip = skip
        self.cuda = cuda
        self.profiler: profile | None = None
        self.wall_ms = 0.0
        self._start = 0.0

    def _synchronize(self) -> None:
        if self.cuda:  # the interval holds the step's GPU work, not only its launches
            torch.cuda.synchronize()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.skip:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._synchronize()
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self._start = time.perf_counter()
        elif self.profiler is not None and state.global_step == self.skip + 1:
            self._synchronize()
            self.wall_ms = (time.perf_counter() - self._start) * 1000
            self.profiler.__exit__(None, None, None)
            control.should_training_stop = True


def profile_training_step(
    trainer: Trainer, encoder: torch.nn.Module, skip: int = 2, row_limit: int = 30
) -> StepProfile:
    """Train `skip + 1` steps and profile the last one. `encoder` is the module whose forward is the model
    forward (its operators count as `forward`); the rest of `compute_loss` counts as `loss`. The trainer is
    modified (wrapped methods, hooks) and should not be used for measurements afterwards."""
    forward = _LabelledRegion(f"{_LABEL}forward")
    handles = [encoder.register_forward_pre_hook(forward.enter), encoder.register_forward_hook(forward.exit)]
    trainer.compute_loss = _labelled(trainer.compute_loss, f"{_LABEL}loss")
    trainer.accelerator.clip_grad_norm_ = _labelled(trainer.accelerator.clip_grad_norm_, f"{_LABEL}optimizer")
    stepper = _OneStepProfiler(skip, cuda=trainer.args.device.type == "cuda")
    trainer.add_callback(stepper)
    try:
        trainer.train()
    finally:
        for handle in handles:
            handle.remove()
    if stepper.profiler is None or not stepper.wall_ms:
        raise RuntimeError(f"training stopped before step {skip + 1}; give it more data (steps) to profile.")
    events = stepper.profiler.events()
    phase_ms: dict[str, float] = defaultdict(float)
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in events:  # a label's own self time is the Python inside its region (e.g. module-call overhead)
        if event.device_type != DeviceType.CPU:
            continue
        ms = event.self_cpu_time_total / 1000
        phase = _phase_of(event)
        phase_ms[phase] += ms
        per_op[phase][event.name] += ms
    top = {phase: sorted(ops.items(), key=lambda item: -item[1]) for phase, ops in per_op.items()}
    table = stepper.profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit)
    busy, count = device_activity(events) if stepper.cuda else (None, None)
    return StepProfile(stepper.wall_ms, dict(phase_ms), top, table, busy, count)


def device_activity(events) -> tuple[float, int]:
    """(milliseconds the GPU was busy, number of its kernels, copies and memsets) among profiler `events`: the union
    of their intervals, so that overlapping kernels of several streams count once. A record_function label also
    appears on the GPU's timeline, as a user annotation spanning its region's kernels; it is no GPU work."""
    intervals = sorted((event.time_range.start, event.time_range.end) for event in events
                       if event.device_type != DeviceType.CPU and not event.is_user_annotation)
    total, reach = 0.0, float("-inf")
    for start, end in intervals:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1000, len(intervals)
