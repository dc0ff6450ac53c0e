"""What the model's tensors do not explain: cuBLAS workspaces, allocator slack, the CUDA context.

These are the only constants that are not derived from the model; each has its source and a low-high interval
that feeds the estimate's range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from ..data import DATA_DIR

from ..units import MiB  # noqa: E402

# cuBLAS workspaces are handed out by the caching allocator, so they are in max_memory_allocated. Default
# CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8 is 8.125 MiB per (handle, stream); the forward and the autograd thread
# each have a handle, so two. Hopper's cuBLASLt takes 32 MiB each. pytorch/pytorch#89027, #120925.
CUBLAS_WORKSPACE_BYTES = 2 * (4096 * 2 + 16 * 8) * 1024
CUBLAS_WORKSPACE_HIGH_BYTES = 2 * 32 * MiB + CUBLAS_WORKSPACE_BYTES

# Caching-allocator slack: reserved - allocated, from block rounding and segment splitting. Typically 5-20% of
# allocated (research/memory-physics.md §5, "reserved is typically 5-20% above allocated"); point: 10%.
RESERVED_OVER_ALLOCATED = 0.10
RESERVED_OVER_ALLOCATED_LOW = 0.05
RESERVED_OVER_ALLOCATED_HIGH = 0.20

# CUDA context + loaded kernels, seen by nvidia-smi only. 426 MiB measured on an RTX 6000 Ada with torch 2.10
# (unslothai/unsloth-zoo#1053); 0.3-0.6 GB on current stacks with lazy module loading (pytorch/pytorch#86509,
# #107667, #109888).
CUDA_CONTEXT_BYTES = 426 * MiB
CUDA_CONTEXT_LOW_BYTES = 300 * 10**6
CUDA_CONTEXT_HIGH_BYTES = 600 * 10**6


@dataclass(frozen=True)
class Overheads:
    reserved_slack: int
    cuda_context: int
    range_low: int
    range_high: int


@lru_cache(maxsize=1)
def _error_bands() -> dict:
    path = DATA_DIR / "error_bands.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def error_band(method: str) -> dict | None:
    """The measured error band of a method (data/error_bands.json, written by
    benchmarks/accuracy_vs_measured.py): signed error = predicted / measured - 1, 2.5th to 97.5th percentile."""
    return _error_bands().get(method)


def overheads(peak_allocated: int) -> Overheads:
    slack = int(peak_allocated * RESERVED_OVER_ALLOCATED)
    low = peak_allocated + int(peak_allocated * RESERVED_OVER_ALLOCATED_LOW) + CUDA_CONTEXT_LOW_BYTES
    high = (peak_allocated + (CUBLAS_WORKSPACE_HIGH_BYTES - CUBLAS_WORKSPACE_BYTES)
            + int(peak_allocated * RESERVED_OVER_ALLOCATED_HIGH) + CUDA_CONTEXT_HIGH_BYTES)
    return Overheads(reserved_slack=slack, cuda_context=CUDA_CONTEXT_BYTES, range_low=low, range_high=high)
