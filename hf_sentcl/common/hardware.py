"""What this machine's hardware and toolchain can do for a run: which numeric precision `precision: auto` picks
(docs/precision.md), and whether inductor can compile for the CPU (`compile_layers`).

- bf16 where the hardware computes it natively: a CUDA GPU with native bf16 (Ampere and later; not the emulated
  bf16 that `torch.cuda.is_bf16_supported()` also counts), or a CPU with AVX512-BF16 or AMX;
- fp16 on a CUDA GPU without native bf16 (V100, T4), with a gradient scaler;
- fp32 on any other CPU (bf16 is emulated there, ~100x slower per GEMM; fp16 autocast runs but is no faster).

Evaluation with mixed precision follows the same rule (`mixed_eval_dtype`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

#: the values of the `precision` recipe key
PRECISIONS = ("auto", "fp32", "bf16", "fp16")

#: /proc/cpuinfo flags of CPUs with native bf16 arithmetic
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's feature flags (empty when /proc/cpuinfo is unreadable, e.g. not Linux)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX; oneDNN's own check where flags are unknown)."""
    flags = cpu_flags()
    if flags:
        return any(flag in flags for flag in CPU_BF16_FLAGS)
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cuda_has_native_bf16() -> bool:
    """Whether the current CUDA GPU computes bf16 natively (not counting emulation)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_precision(requested: str, device_type: str) -> str:
    """fp32, bf16 or fp16 for `requested` (one of `PRECISIONS`) on a `device_type` ('cuda', 'cpu', ...) device."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got '{requested}'.")
    if requested != "auto":
        return requested
    if device_type == "cuda":
        return "bf16" if cuda_has_native_bf16() else "fp16"
    if device_type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "fp32"
    return "bf16"  # other accelerators (XPU, ...) have native bf16


def mixed_eval_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype of mixed-precision evaluation on `device`: bf16 where native, fp16 on a CUDA GPU without
    it, bf16 on a CPU (asked for explicitly there: `eval_bf16: true`; auto never asks for it on such a CPU)."""
    if device.type == "cuda" and not cuda_has_native_bf16():
        return torch.float16
    return torch.bfloat16


def cpu_compiler_problem() -> str | None:
    """Why inductor cannot compile for the CPU here (it builds C++ with $CXX, g++, c++ or clang++), or None."""
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if any(name and shutil.which(name) for name in candidates):
        return None
    return ("compile_layers on the CPU needs a C++ compiler (torch.compile's inductor builds C++ kernels) and none "
            "is on PATH ($CXX, g++, c++, clang++): install one (Debian/Ubuntu: apt install g++) or set "
            "compile_layers: false.")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def has_tf32() -> bool:
    """Whether TF32 matmuls exist here (a CUDA GPU of compute capability 8.0 or newer)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def has_accelerator() -> bool:
    """Whether a CUDA or XPU device is here (otherwise a run trains on the CPU)."""
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
