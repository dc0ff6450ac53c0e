"""The estimate of a Megatron-Core run (recipe ``megatron``): physics/megatron.py's parts as an Estimate.

One phase per pipeline stage that can be the most loaded: the 1F1B steady state on the first stage (embedding,
the most micro-batches in flight; Megatron's own theoretical report sums model state and activations there) and
on the last (output layer, logits). `--pp-stage` picks one; by default the verdict is about the worse of the two.
The allocator slack and CUDA context are the estimator's (physics/overhead.py), so the three counters mean what
they mean for every other estimate.
"""

from __future__ import annotations

from .estimator import Component, Estimate, cuda_overhead_components
from .params import count_params
from .physics import megatron
from .physics.overhead import CUBLAS_WORKSPACE_BYTES, overheads
from .setup import TrainingSetup
from .spec import ModelSpec

_NOTES = {
    "weights": "bf16 parameters of this GPU's shard (1/pp of the layers, 1/tp of each matrix, the embedding on the "
               "first stage, the output layer on the last)",
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
    "MoE dispatch buffers": "router scores and routing map, routed tokens saved for the experts, one layer's "
                            "all-to-all buffers (physics/megatron_moe.py)",
    "cuBLAS workspace": "cuBLAS/cuBLASLt workspaces, allocated through the caching allocator",
}


def stage_parts(spec: ModelSpec, setup: TrainingSetup, lay: megatron.Layout, stage: str) -> dict[str, int]:
    parts = dict(megatron.model_state_bytes(spec, lay, stage))
    parts.update(megatron.activation_bytes(spec, setup, lay, stage))
    parts["context-parallel buffers"] = megatron.cp_buffer_bytes(spec, setup, lay)
    parts["cuBLAS workspace"] = CUBLAS_WORKSPACE_BYTES
    return parts


def estimate_megatron(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    megatron.check_model(spec, setup)
    lay = megatron.layout(setup)
    stages = megatron.STAGES if lay.pp > 1 else ("first",)
    by_stage = {stage: stage_parts(spec, setup, lay, stage) for stage in stages}
    totals = {stage: sum(parts.values()) for stage, parts in by_stage.items()}
    if setup.pp_stage in by_stage:
        stage = setup.pp_stage
    else:                       # worst (or pp 1, where first and last are one stage)
        stage = max(totals, key=totals.get)
    parts, allocated = by_stage[stage], totals[stage]
    over = overheads(allocated)
    components = [Component(name, nbytes, "allocated", _NOTES[name]) for name, nbytes in parts.items() if nbytes]
    components += cuda_overhead_components(over)
    reserved = allocated + over.reserved_slack
    device = reserved + over.cuda_context
    params = megatron.stage_params(spec, lay, stage)
    assumptions = [megatron.assumption(spec, setup, lay, stage)]
    if len(totals) > 1:
        assumptions.append("allocated per pipeline stage: " + ", ".join(
            f"{name} {nbytes / 2**30:.2f} GiB" for name, nbytes in totals.items())
            + ("" if setup.pp_stage in by_stage else f"; the verdict is about the {stage} (--pp-stage picks one)"))
    if spec.is_moe:
        from .physics import megatron_moe

        assumptions.append(megatron_moe.words(spec, setup, lay))
    if setup.cp > 1:
        from .physics.context_parallel import assumption

        assumptions.append(assumption(setup))
    assumptions.append("model state and activations match megatron/training/theoretical_memory_usage.py for the "
                       "layouts it covers (tests/test_megatron.py); it leaves out allocator slack and the CUDA "
                       "context, which this estimate adds")

    def phase_name(name: str) -> str:
        return f"1F1B steady state ({name} stage)" if lay.pp > 1 else "1F1B steady state (single stage)"

    phase = phase_name(stage)
    shown = (stage,) if setup.pp_stage in by_stage else tuple(by_stage)
    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=spec.params, model_source=spec.source,
        setup=setup, precision="fp16" if setup.precision.startswith("fp16") else "bf16",
        components=tuple(components), peak_phase=phase,
        phases=tuple((phase_name(name), totals[name]) for name in shown), peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        device_bytes=device, range_low_bytes=min(over.range_low, device),
        range_high_bytes=max(over.range_high, device), paged_bytes=0,
        download_bytes=count_params(spec).total * 2, assumptions=tuple(assumptions),
        extra={"megatron": {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "ep": lay.ep,
                            "expert_dp": lay.expert_dp, "params_on_gpu": params.total,
                            "in_flight_microbatches": lay.in_flight, "stage": stage,
                            "stage_allocated_bytes": totals}})
