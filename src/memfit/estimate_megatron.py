"""The estimate of a Megatron-Core run (recipe ``megatron``): physics/megatron.py's parts as an Estimate.

One phase: the 1F1B steady state on the first pipeline stage, where the model state and the most activations
coincide (Megatron's own theoretical report sums the same two). The allocator slack and CUDA context are the
estimator's (physics/overhead.py), so the three counters mean what they mean for every other estimate.
"""

from __future__ import annotations

from .estimator import Component, Estimate, cuda_overhead_components
from .params import count_params
from .physics import megatron
from .physics.overhead import CUBLAS_WORKSPACE_BYTES, overheads
from .setup import TrainingSetup
from .spec import ModelSpec

_NOTES = {
    "weights": "bf16 parameters of this GPU's shard (1/pp of the layers, 1/tp of each matrix, the embedding)",
    "gradients": "fp32 main-gradient buffer (bf16 training accumulates and all-reduces gradients in fp32)",
    "master weights": "fp32 main parameters (sharded by the distributed optimizer)",
    "optimizer state": "Adam exp_avg and exp_avg_sq in fp32 (sharded by the distributed optimizer)",
    "activations": "Korthikanti et al. 2022 per layer, 1/pp of the layers, micro-batches in flight under 1F1B",
    "checkpoints": "full recompute: each layer's input per micro-batch in flight",
    "recomputed layer": "one layer's activations rebuilt during backward",
    "embedding and head activations": "token ids and the embedding dropout mask per micro-batch in flight",
    "logits and loss": "the output layer's input and the logits (vocabulary split over tp)",
    "activation temporaries": "Megatron's report adds 5% for optimizer and miscellaneous temporaries",
    "context-parallel buffers": "ring attention's K/V chunks in flight (Transformer Engine p2p)",
    "cuBLAS workspace": "cuBLAS/cuBLASLt workspaces, allocated through the caching allocator",
}


def estimate_megatron(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    megatron.check_model(spec, setup)
    lay = megatron.layout(setup)
    parts = dict(megatron.model_state_bytes(spec, lay))
    parts.update(megatron.activation_bytes(spec, setup, lay))
    parts["context-parallel buffers"] = megatron.cp_buffer_bytes(spec, setup, lay)
    parts["cuBLAS workspace"] = CUBLAS_WORKSPACE_BYTES
    allocated = sum(parts.values())
    over = overheads(allocated)
    components = [Component(name, nbytes, "allocated", _NOTES[name]) for name, nbytes in parts.items() if nbytes]
    components += cuda_overhead_components(over)
    reserved = allocated + over.reserved_slack
    device = reserved + over.cuda_context
    params = megatron.stage_params(spec, lay)
    assumptions = [megatron.assumption(spec, setup, lay)]
    if setup.cp > 1:
        from .physics.context_parallel import assumption

        assumptions.append(assumption(setup))
    assumptions.append("model state and activations match megatron/training/theoretical_memory_usage.py for the "
                       "layouts it covers (tests/test_megatron.py); it leaves out allocator slack and the CUDA "
                       "context, which this estimate adds")
    phase = "1F1B steady state (first stage)"
    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=spec.params, model_source=spec.source,
        setup=setup, precision="fp16" if setup.precision.startswith("fp16") else "bf16", components=tuple(components), peak_phase=phase,
        phases=((phase, allocated),), peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
        device_bytes=device, range_low_bytes=min(over.range_low, device),
        range_high_bytes=max(over.range_high, device), paged_bytes=0,
        download_bytes=count_params(spec).total * 2, assumptions=tuple(assumptions),
        extra={"megatron": {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "ep": lay.ep,
                            "expert_dp": lay.expert_dp, "params_on_gpu": params.total,
                            "in_flight_microbatches": lay.in_flight}})
