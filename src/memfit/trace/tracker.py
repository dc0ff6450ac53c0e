"""A live-storage tracker for fake-tensor training steps (research/memory-physics.md §8.3, made categorical).

Every storage an op creates is counted, rounded up to 512 bytes as the CUDA caching allocator rounds
(c10/cuda/CUDACachingAllocator.cpp kMinBlockSize), and released when Python frees it (weakref finalizer). Each
storage carries a category; the tracker keeps running totals per category and, at each new peak, a copy of
them with the phase and module it happened in.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from ..components import TRACKER_CATEGORIES

CUDA_BLOCK_BYTES = 512
CATEGORIES = TRACKER_CATEGORIES


class PeakTracker(TorchDispatchMode):
    def __init__(self, round_to: int = CUDA_BLOCK_BYTES):
        super().__init__()
        self.round_to = round_to
        self.live: dict[int, list] = {}          # storage key -> [bytes, category]
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.peak = 0
        self.peak_totals = dict(self.totals)
        self.peak_where = ""
        self.phase = "setup"                     # forward | loss | backward | optimizer step
        self.where = ""                          # the module being run
        self.default_category = "temporaries"

    # -- accounting ---------------------------------------------------------------------------------------------
    def rounded(self, nbytes: int) -> int:
        return math.ceil(nbytes / self.round_to) * self.round_to if nbytes else 0

    def add(self, tensor: torch.Tensor, category: str | None = None, nbytes: int | None = None) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        size = self.rounded(storage.nbytes() if nbytes is None else nbytes)
        cat = category or self.default_category
        entry = [size, cat]
        self.live[key] = entry
        self.totals[cat] += size
        self.current += size
        weakref.finalize(storage, self._release, key)
        if self.current > self.peak:
            self.peak = self.current
            self.peak_totals = dict(self.totals)
            self.peak_where = f"{self.phase}: {self.where}" if self.where else self.phase

    def add_virtual(self, nbytes: int, category: str) -> None:
        """Bytes that exist on a GPU but not in the traced program (bitsandbytes state, dequant buffers)."""
        self.totals[category] += nbytes
        self.current += nbytes
        if self.current > self.peak:
            self.peak, self.peak_totals = self.current, dict(self.totals)
            self.peak_where = f"{self.phase}: {self.where}" if self.where else self.phase

    def remove_virtual(self, nbytes: int, category: str) -> None:
        self.totals[category] -= nbytes
        self.current -= nbytes

    def _release(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.totals[entry[1]] -= entry[0]
            self.current -= entry[0]

    def retag(self, tensor: torch.Tensor, category: str) -> None:
        entry = self.live.get(tensor.untyped_storage()._cdata)
        if entry is not None and entry[1] != category:
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category

    def track(self, tensors, category: str) -> None:
        for t in tensors:
            self.add(t, category)

    # -- dispatch -----------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.add, out)
        return out
