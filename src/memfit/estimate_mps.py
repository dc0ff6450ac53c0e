"""The estimate of a transformers/PEFT run on PyTorch's MPS backend (recipe ``mps``, an Apple-silicon Mac).

The step's tensors are the ``hf`` recipe's (the same Trainer, PEFT and autograd allocate them) with two
differences found in torch's source:
  - no cuBLAS workspace: Metal matmuls (MPSGraph / MPSMatrixMultiplication) take no workspace from torch's
    allocator, so the hf estimate's "cuBLAS workspace" is dropped; there is no CUDA context either;
  - attention: under autograd, SDPA on MPS takes the composite math path, which saves the s x s softmax.
    aten/src/ATen/native/transformers/attention.cpp (case SDPBackend::math) calls the fused
    ``_scaled_dot_product_attention_math_for_mps`` only when grad mode is off or no input requires grad; torch
    2.13 has no backward for it (no ``_scaled_dot_product_attention_math_for_mps_backward`` op in
    torch/include/ATen/ops). The estimate is the hf one for a model whose SDPA takes the math path
    (``ModelSpec.attn_kv_broadcast``, the flag physics/activations.py already models that path with).
Counters: ``torch.mps.current_allocated_memory()`` (the tensors' buffers) and
``torch.mps.driver_allocated_memory()`` (Metal heaps, cached ones included, plus MPS's own allocations); the
verdict judges the driver counter against the Mac's working-set limit. physics/mps_allocator.py is the heap
model.
"""

from __future__ import annotations

from .estimator import LOAD_PHASE, Component, Estimate, estimate
from .physics import mps_allocator as mps
from .physics.overhead import RESERVED_OVER_ALLOCATED, RESERVED_OVER_ALLOCATED_HIGH, RESERVED_OVER_ALLOCATED_LOW
from .setup import TrainingSetup
from .spec import ModelSpec

# Components of the hf estimate that exist only on CUDA (physics/overhead.py).
CUDA_ONLY = ("cuBLAS workspace", "allocator slack", "CUDA context")
HEAP_COMPONENT = "MPS heaps and cache"


def cuda_twin(spec: ModelSpec, setup: TrainingSetup) -> tuple[ModelSpec, TrainingSetup]:
    """The hf-recipe run whose tensors are this MPS run's: the same options, SDPA on its math path."""
    return spec.replace(attn_kv_broadcast=True), setup.replace(recipe="hf")


def estimate_mps(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    twin_spec, twin_setup = cuda_twin(spec, setup)
    cuda = estimate(twin_spec, twin_setup)
    load_parts = cuda.extra.get("load", {})
    cublas = cuda.component("cuBLAS workspace")
    phases = tuple((name, total - (0 if name == LOAD_PHASE and "cuBLAS workspace" not in load_parts else cublas))
                   for name, total in cuda.phases)
    peak_phase, current = max(phases, key=lambda p: p[1])
    if peak_phase == cuda.peak_phase:
        tensors = [(c.name, c.bytes, c.note) for c in cuda.components if c.name not in CUDA_ONLY]
    else:   # without the workspace, loading the model is the peak
        tensors = [(name, nbytes, "") for name, nbytes in load_parts.items() if nbytes > 0]
    components = [Component(name, nbytes, "mps-current", note) for name, nbytes, note in tensors]
    # MPSAllocator.h: "this implementation is based on CUDACachingAllocator": freed buffers stay cached in their
    # pools and heaps, so the same reserved-over-allocated band is assumed (not measured on a Mac).
    driver = mps.heap_span_bytes(current + int(current * RESERVED_OVER_ALLOCATED))
    low = mps.heap_span_bytes(current + int(current * RESERVED_OVER_ALLOCATED_LOW))
    bucketed = current + current // (1 << mps.LARGE_BUCKET_SHIFT)      # at most one granule (1/32) per buffer
    high = mps.heap_span_bytes(bucketed + int(bucketed * RESERVED_OVER_ALLOCATED_HIGH)) + mps.XLARGE_HEAP_BYTES
    band = cuda.extra.get("expected_error")
    if band:
        # the tensors' measured error band carries over (measured = predicted / (1 + error))
        low = min(low, int(driver / (1 + band["high"])))
        high = max(high, int(driver / (1 + band["low"])))
    components.append(Component(HEAP_COMPONENT, driver - current, "mps-driver",
                                "cached buffers and the unused part of Metal heaps (1 GiB heaps for buffers of "
                                "10-512 MiB: MPSAllocator.h)"))
    assumptions = [
        "PyTorch on MPS (recipe mps): the hf recipe's tensors (transformers Trainer + PEFT) without the terms only "
        "NVIDIA GPUs have (physics/overhead.py); torch.mps.current_allocated_memory() at the peak is the tensors, "
        "torch.mps.driver_allocated_memory() adds the MPS allocator's heaps and cache",
        "attention: SDPA on MPS under autograd runs the math path (attention.cpp, SDPBackend::math: the fused "
        "_scaled_dot_product_attention_math_for_mps only without grad), which keeps the s x s softmax per layer; "
        "flash attention has no MPS kernel",
        "optimizer: fused AdamW runs on MPS (torch 2.13 torch/utils/_foreach_utils.py "
        "_get_fused_kernels_supported_devices lists mps), the Trainer's default adamw_torch_fused",
        f"driver counter: the peak's tensors plus {RESERVED_OVER_ALLOCATED:.0%} cached (physics/overhead.py's "
        f"caching-allocator band, {RESERVED_OVER_ALLOCATED_LOW:.0%}-{RESERVED_OVER_ALLOCATED_HIGH:.0%}, assumed "
        "for MPS's), packed into 1 GiB Metal heaps (kXLargeHeap); each buffer page-aligned (16 KiB, the alignment "
        "Metal's heapBufferSizeAndAlignWithLength returns is assumed); newer allocators' 1/32 large-buffer "
        "bucketing is in the range's high end; MPSGraph's own allocations (compiled graphs, scratch) are not "
        "counted",
        "the Mac's working-set limit (recommendedMaxWorkingSetSize) is the budget; torch lets the MPS allocator "
        "go to 1.7x it (PYTORCH_MPS_HIGH_WATERMARK_RATIO) by swapping, far slower",
    ] + [a.replace("recipe hf:", "recipe mps (the hf recipe's stack):") for a in cuda.assumptions
         if "cuBLAS" not in a and "CUDA" not in a]
    return Estimate(
        model_name=cuda.model_name, params=cuda.params, trainable_params=cuda.trainable_params,
        model_source=cuda.model_source, setup=setup, precision=cuda.precision, components=tuple(components),
        peak_phase=peak_phase, phases=phases, peak_allocated_bytes=current, peak_reserved_bytes=driver,
        device_bytes=driver, range_low_bytes=min(low, driver), range_high_bytes=max(high, driver),
        paged_bytes=0, download_bytes=cuda.download_bytes, assumptions=tuple(assumptions), kind="mps",
        extra={**({"expected_error": band} if band else {}), "load": load_parts,
               "mps_current_allocated_bytes": current, "mps_driver_allocated_bytes": driver},
        host_bytes=cuda.host_bytes)
