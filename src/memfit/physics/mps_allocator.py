"""PyTorch's MPS heap allocator: how a tensor's bytes become buffers, and buffers become Metal heaps.

Source: pytorch/pytorch aten/src/ATen/mps/MPSAllocator.h (commit 01f98b3, the version the code index holds; the
constants below have not changed since the allocator's 2022 rewrite) and MPSAllocator.mm:
  - ``kMaxSmallAlloc = MB(1)``: buffers up to 1 MiB are "small" and packed into ``kSmallHeap = MB(8)`` heaps;
  - ``kMinLargeAlloc = MB(10)``: larger buffers under 10 MiB go into ``kLargeHeap = MB(32)`` heaps;
  - under ``kXLargeHeap / 2`` (512 MiB) and with no memory pressure, a new heap is ``kXLargeHeap = MB(1024)``;
  - anything else gets a heap of its own, ``kRoundLarge * ceil(size / kRoundLarge)`` (2 MiB rounding), not split
    (``HeapBlock::createHeapBlock``).
Each buffer's own size is ``get_allocation_size``: Metal's ``heapBufferSizeAndAlignWithLength`` rounded up to
its alignment. That call is the driver's, not in torch's source; its alignment is modelled as the page size
(16 KiB on Apple silicon, the ``vm_page_size`` the heap code aligns to in ``heapAvailableSize``) - a stated
assumption, not read from source. Newer MPSAllocator.mm versions also round buffers over 1 MiB up to 32 buckets
per power of two (``kLargeBucketShift = 5``); the index holds versions with and without it and none can be tied
to torch 2.13's commit (cf30153), so the range's high end includes it (``bucketed_bytes``).

Counters (torch/mps/__init__.py): ``torch.mps.current_allocated_memory()`` is m_current_allocated_memory, the
sum of the in-use buffers' aligned sizes; ``torch.mps.driver_allocated_memory()`` is the MTLDevice's
currentAllocatedSize: every heap (in use or cached in the pools) plus what MPS/MPSGraph allocate themselves.
"""

from __future__ import annotations

from ..units import MiB

MAX_SMALL_ALLOC_BYTES = 1 * MiB     # kMaxSmallAlloc
MIN_LARGE_ALLOC_BYTES = 10 * MiB    # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * MiB         # kRoundLarge
SMALL_HEAP_BYTES = 8 * MiB          # kSmallHeap
LARGE_HEAP_BYTES = 32 * MiB         # kLargeHeap
XLARGE_HEAP_BYTES = 1024 * MiB      # kXLargeHeap
APPLE_PAGE_BYTES = 16 * 1024        # vm_page_size on Apple silicon (arm64 macOS)
LARGE_BUCKET_SHIFT = 5              # newer MPSAllocator.mm: 32 buckets per power-of-two magnitude


def _align_up(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment        # BufferBlock::alignUp


def buffer_bytes(requested_bytes: int, page_bytes: int = APPLE_PAGE_BYTES) -> int:
    """One buffer's size as the allocator books it (get_allocation_size, alignment assumed = page)."""
    return _align_up(max(requested_bytes, 1), page_bytes)


def bucketed_bytes(requested_bytes: int, page_bytes: int = APPLE_PAGE_BYTES) -> int:
    """The same under the newer large-buffer bucketing: granule = highest power of two <= size, / 32."""
    aligned = buffer_bytes(requested_bytes, page_bytes)
    if aligned <= MAX_SMALL_ALLOC_BYTES:
        return aligned
    granule = max((1 << (aligned.bit_length() - 1)) >> LARGE_BUCKET_SHIFT, page_bytes)
    return _align_up(aligned, granule)


def new_heap_bytes(buffer_size_bytes: int, memory_pressure: bool = False) -> int:
    """The heap HeapBlock::createHeapBlock makes when no existing heap has room for this buffer."""
    if buffer_size_bytes <= MAX_SMALL_ALLOC_BYTES:
        return SMALL_HEAP_BYTES
    if buffer_size_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_HEAP_BYTES
    if buffer_size_bytes < XLARGE_HEAP_BYTES // 2 and not memory_pressure:
        return XLARGE_HEAP_BYTES
    return _align_up(buffer_size_bytes, ROUND_LARGE_BYTES)


def heap_span_bytes(live_bytes: int) -> int:
    """The heaps that hold `live_bytes` of large buffers at the least: packed into 1 GiB heaps, the last one
    whole (a heap is created at its full size and is only given back when empty)."""
    return _align_up(max(live_bytes, 0), XLARGE_HEAP_BYTES)
