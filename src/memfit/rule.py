"""The seed's rule of thumb, for a bare size like "7B" (no architecture known). GB = 1e9 bytes.

Each rule is GB per billion parameters plus a flat GB overhead (RULES below; `memfit rule` prints them). Activations
are inside the flat overhead, which is why the rule ignores batch size and length: use a real model (catalog
name, config.json) for an architecture-aware estimate.
"""

from __future__ import annotations

from .estimator import Component, Estimate
from .setup import TrainingSetup
from .spec import ModelSpec

from .units import GB  # noqa: E402
# (bytes per parameter, flat overhead bytes, what the bytes per parameter are)
RULES = {
    "lora": (2.0, 3 * GB, "16-bit frozen weights"),
    "full": (12.0, 4 * GB, "weight 2 + gradient 2 + Adam moments 4 + 4"),
    "full-master": (16.0, 4 * GB, "weight 2 + gradient 2 + Adam moments 4 + 4 + fp32 master copy 4"),
    "qlora": (0.7, 3 * GB, "4-bit weights with quantization constants, adapter and 16-bit embeddings"),
}
RULE_TABLE_SIZES_B = (0.5, 1.5, 3, 7, 14)


def rule_key(setup: TrainingSetup) -> str:
    if setup.method == "full" and setup.precision.endswith("-mixed"):
        return "full-master"
    return setup.method


def rule_bytes(params: int, setup: TrainingSetup) -> tuple[int, int]:
    """(per-parameter part, overhead) in bytes."""
    per_param, overhead, _ = RULES[rule_key(setup)]
    return int(round(per_param * params)), overhead


def estimate_rule(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    per_param, overhead, what = RULES[rule_key(setup)]
    model_bytes, flat = rule_bytes(spec.params, setup)
    total = model_bytes + flat
    components = (
        Component(f"model states ({per_param:g} B/param)", model_bytes, "device", what),
        Component("overhead (activations, CUDA context, slack)", flat, "device",
                  "flat allowance of the rule of thumb; ignores batch size and length"),
    )
    assumptions = (
        f"rule of thumb for a bare size: {per_param:g} GB per billion parameters + {flat // GB} GB",
        "no architecture known: batch size, length, optimizer and checkpointing are not taken into account",
        "GB = 1e9 bytes",
    )
    return Estimate(
        model_name=spec.name, params=spec.params,
        trainable_params=spec.params if setup.method == "full" else 0, model_source=spec.source, setup=setup,
        precision=setup.precision, components=components, peak_phase="whole step (rule of thumb)",
        phases=(("whole step (rule of thumb)", total),), peak_allocated_bytes=total, peak_reserved_bytes=total,
        device_bytes=total, range_low_bytes=total, range_high_bytes=total, paged_bytes=0,
        download_bytes=spec.params * 2, assumptions=assumptions, kind="rule-of-thumb",
    )
