"""The model-load phase: what the GPU holds while the checkpoint is read, before the first step.

A step's estimate starts with the weights already in place; loading can hold more, and a run that fits its
steps can die before the first one (unslothai/unsloth#4040: 153 GiB "at model load"). The phase is one more
candidate peak in estimator._phases, so the verdict, the advice and `memfit max` use max(load, step).

transformers 5.24 from_pretrained (core_model_loading.py:1748-2010, convert_and_load_state_dict_in_model):
- the model is built on the meta device; each checkpoint tensor (a safetensors mmap slice: nothing on the GPU
  until read) is materialized on its target device in the load dtype (`_materialize_copy`, :1461-1466). A
  blocking CPU->GPU `.to(device, dtype)` converts on the CPU (aten Copy.cu, copy_kernel_cuda: "for blocking
  transfers conversions are performed on CPU to avoid allocating extra GPU memory"), so a dtype change costs
  the GPU nothing;
- without quantization, up to 4 threads (GLOBAL_WORKERS, :1458) read ahead, but every tensor read is one the
  model keeps: the GPU holds the final weights plus what a WeightConverter builds beside them (MoE expert
  stacking, physics/moe.py);
- quantizing at load (bitsandbytes, not pre-quantized) turns the read-ahead off (:1862-1873): one tensor at a
  time is read in the 16-bit compute dtype and handed to Bnb4bitQuantize (integrations/bitsandbytes.py:30-60),
  whose Params4bit.to(device) quantizes it (bitsandbytes 0.50 nn/modules.py:381-395; the CUDA kernel allocates
  only the packed output and absmax, backends/cuda/ops.py:384-420) and drops the 16-bit tensor.
Sharded layouts load one unit at a time: FSDP wraps (or, LitGPT on >1 device, builds on the meta device with
`fabric.init_module(empty_init=True)`, lit-gpt@0cc02afa finetune/lora.py:128, and loads a full state dict under
FSDP's unshard context, lit_gpt/utils.py:305-307 -> fabric.load_raw) and ZeRO-3's zero.Init gathers one module
to load it: the sharded weights plus one gathered unit.
"""

from __future__ import annotations

import dataclasses

from ..params import layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import moe, states
from .stack import Stack

# Layouts whose weights reach the GPU already sharded, one unit unsharded at a time.
SHARDED_AT_LOAD = ("fsdp", "fsdp-shard-grad-op", "hsdp", "zero3")
# The dtype the non-quantized weights are read in under QLoRA (bnb_4bit_compute_dtype), before
# prepare_model_for_kbit_training upcasts them.
QLORA_LOAD_BYTES = 2


def load_parts(spec: ModelSpec, setup: TrainingSetup, stack: Stack, p: dict) -> dict[str, int]:
    """The load phase's components (allocated bytes). `p` is the estimator's sharded per-GPU parts."""
    if setup.shard in SHARDED_AT_LOAD:
        # The weights arrive sharded (or offloaded); the unit being loaded or sharded is whole for a moment.
        return {"weights": p["weights"], "quantization constants": p["quant"], "load temporaries": p["gathered"]}
    weights, quant = p["weights"], p["quant"]
    temps = 0
    if setup.method == "qlora":
        # Read in 16 bits, quantized one module at a time; the kbit upcast to fp32 comes after loading.
        weights, quant = states.base_weight_bytes(spec, setup, dataclasses.replace(stack, weight_bytes=QLORA_LOAD_BYTES))
        temps = quantize_transient_bytes(spec, setup)
        # Quantized loading places every tensor on the GPU (device_map), so MoE stacking happens there too.
        temps = max(temps, moe.expert_stack_transient_params(spec) * QLORA_LOAD_BYTES)
    return {"weights": weights, "quantization constants": quant, "load temporaries": temps}


def quantize_transient_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Beyond the final model: the 16-bit copy of the largest module being quantized. Its packed output and
    absmax are its final storage (already in the weights). bitsandbytes' int8 path also reads a 16-bit copy
    (Int8Params._quantize casts to fp16 before int8_vectorwise_quant)."""
    largest = max((lin.d_in * lin.d_out for lin in layer_linears(spec) if moe.bnb_quantizes(lin)), default=0)
    return QLORA_LOAD_BYTES * largest


def note(setup: TrainingSetup) -> str:
    if setup.shard in SHARDED_AT_LOAD:
        return "one unit's parameters unsharded while it is loaded and sharded (FSDP wrap / ZeRO-3 gather)"
    if setup.method == "qlora":
        return "the 16-bit copy of the largest module being quantized at load (bitsandbytes), or an MoE " \
               "layer's experts being stacked, whichever is larger"
    return "nothing beyond the weights: from_pretrained reads each tensor into the parameter that keeps it"


def assumption(spec: ModelSpec, setup: TrainingSetup, load_bytes: int, step_bytes: int) -> str:
    where = "sharded, one unit at a time" if setup.shard in SHARDED_AT_LOAD else \
        ("quantized at load on the GPU (device_map)" if setup.method == "qlora" else
         "read into the final parameters (from_pretrained on CPU then moved, or device_map)")
    which = "the load is the larger" if load_bytes > step_bytes else "the step is the larger"
    return (f"model load ({where}): {load_bytes / 2**30:.2f} GiB allocated vs {step_bytes / 2**30:.2f} GiB in "
            f"the step; {which}, and the verdict uses the larger (transformers 5.24 core_model_loading.py)")
