"""This machine's fp32 GEMM rate at a BERT encoder's shapes, and a training step's share of it.

A BERT layer's training step is, in FLOPs, almost all GEMMs of (tokens x hidden) activations with the layer's
weights: Q, K, V and the attention output (hidden x hidden), the feed-forward in (hidden x intermediate) and out
(intermediate x hidden), each once forward and twice backward (input and weight gradients). `gemm_rate` times
exactly those products with `torch.matmul` at a given token count (threads as set by torch.set_num_threads) and
returns the FLOP-weighted rate. `step_tokens` counts the real and the padded token positions of the steps of a
trainer's own dataloader (its shuffling and padding), so that the step's GEMM work is 6 x non-embedding parameters
x tokens: with real tokens the useful work, with padded tokens the work a padded forward does. The attention
product itself (b x heads x L x L) is left out of both, as in the usual 6 x N x T estimate.
"""

from __future__ import annotations

import time

import torch


def layer_shapes(hidden: int, intermediate: int, tokens: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of every GEMM of one layer's forward and backward at `tokens` tokens."""
    forward = [(tokens, hidden, hidden)] * 4 + [(tokens, hidden, intermediate), (tokens, intermediate, hidden)]
    shapes = []
    for m, k, n in forward:
        shapes += [(m, k, n), (m, n, k), (k, m, n)]  # y = x W; dx = dy W^T; dW = x^T dy
    return shapes


def time_gemm(m: int, k: int, n: int, min_seconds: float = 0.3) -> float:
    """Seconds per (m x k) @ (k x n) fp32 product (median of repeated timings after a warm-up)."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    torch.matmul(a, b, out=out)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < min_seconds or len(times) < 5:
        t0 = time.perf_counter()
        torch.matmul(a, b, out=out)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def gemm_rate(hidden: int, intermediate: int, tokens: int, min_seconds: float = 0.3) -> dict:
    """FLOP-weighted fp32 GEMM rate (GFLOP/s) over one layer's training GEMMs at `tokens` tokens."""
    flops = seconds = 0.0
    for m, k, n in layer_shapes(hidden, intermediate, tokens):
        seconds += time_gemm(m, k, n, min_seconds)
        flops += 2.0 * m * k * n
    return {"gflops": flops / seconds / 1e9, "hidden": hidden, "intermediate": intermediate, "tokens": tokens,
            "threads": torch.get_num_threads()}


def step_tokens(trainer, copies: int = 2) -> dict:
    """Mean real and padded token positions per training step of `trainer`'s dataloader (times `copies`, the
    dropout copies of each view the forward runs: 2 for SimCSE)."""
    real = padded = steps = 0
    for batch in trainer.get_train_dataloader():
        mask = batch["attention_mask"]
        real += int(mask.sum()) * copies
        padded += mask.numel() * copies
        steps += 1
    return {"real": real / steps, "padded": padded / steps, "steps": steps}


def gemm_share(step_seconds: float | None, tokens: float, params: int, gflops: float) -> float | None:
    """GEMM-limit time of a step (6 x params x tokens at `gflops`) over its measured time."""
    if not step_seconds:
        return None
    return 6.0 * params * tokens / (gflops * 1e9) / step_seconds
