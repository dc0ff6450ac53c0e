"""The estimate of an mlx-lm run (recipe ``mlx``): physics/mlx.py's step model as an Estimate.

MLX has one counter, ``mx.get_peak_memory()`` (active memory at the peak; mlx-lm prints it / 1e9 as
"Peak mem"), so an MLX estimate has no allocated/reserved split, no allocator slack and no CUDA context: every
component is counted by "mlx", and ``device_bytes`` (what the verdict compares with the Metal working-set limit)
is that peak. MLX's buffer cache comes on top in Activity Monitor; MLX gives it back before it would pass its
memory limit (mlx/backend/metal/allocator.cpp), so the verdict judges the active peak.
"""

from __future__ import annotations

import json
from functools import lru_cache

from .data import DATA_DIR
from .estimator import Component, Estimate
from .params import count_params
from .physics.mlx import ALL_TARGETS, mlx_estimate
from .physics.mlx_eras import ERAS
from .setup import TrainingSetup
from .spec import ModelSpec

_NAMES = (  # MlxEstimate field -> component name, note
    ("weights", "weights", "the model's weights as loaded (MLX affine packing when quantized)"),
    ("quant_constants", "quantization scales and biases", "one 16-bit scale and bias per 64 weights (mx.quantize)"),
    ("adapters", "adapter weights", "LoRA A/B in float32 (mlx_lm/tuner/lora.py)"),
    ("gradients", "gradients", "gradients alive at the peak"),
    ("optimizer_state", "optimizer state", "Adam m and v in the parameter's dtype (mlx/optimizers)"),
    ("saved_activations", "activations", "what MLX's autodiff keeps for the backward, trained layers"),
    ("logits_and_loss", "logits and loss", "the (batch, length, vocab) logits and their gradient"),
    ("backward_workspace", "backward temporaries", "one layer's cotangents while its backward runs"),
)


@lru_cache(maxsize=1)
def mlx_band() -> dict | None:
    """The spread of the step model against real mlx-lm steps (benchmarks/mlx_measure.py writes it)."""
    path = DATA_DIR / "mlx_band.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _dtype(spec: ModelSpec, setup: TrainingSetup) -> str:
    if setup.precision != "auto":
        return setup.precision
    return spec.checkpoint_dtype


def estimate_mlx(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    dtype = _dtype(spec, setup)
    train_layers = min(setup.train_layers or spec.num_layers, spec.num_layers)
    # mlx-lm trains on batch[:, :-1] (tuner/trainer.py default_loss): the model sees max length - 1 tokens.
    seq = max(setup.seq_len - 1, 1)
    era = ERAS[setup.mlx_release]
    release = era.estimate_kwargs(spec, ALL_TARGETS)
    if "lora_targets" in setup.explicit or setup.mlx_release == "current":
        release["targets"] = setup.lora_targets
    m = mlx_estimate(spec, method=setup.method, batch_size=setup.batch_size, seq_len=seq,
                     train_layers=train_layers, lora_rank=setup.lora_rank,
                     quant_bits=8 if setup.quant == "mlx-8bit" else 4, grad_ckpt=setup.grad_ckpt, dtype=dtype,
                     backend="metal", **release)
    components = []
    for field, name, note in _NAMES:
        nbytes = getattr(m, field)
        if field == "saved_activations" and setup.grad_ckpt:
            name, note = "checkpoints", "each trained layer's input (mx.checkpoint), plus one layer recomputed"
        if nbytes > 0:
            components.append(Component(name, nbytes, "mlx", note))
    peak = m.mlx_peak_bytes
    low = high = peak
    band = mlx_band()
    if band:
        # measured = predicted / (1 + error): the measured spread of the step model widens the range.
        low, high = int(peak / (1 + band["high"])), int(peak / (1 + band["low"]))
    trainable = (m.adapters // 4 if setup.method != "full"
                 else train_layers * count_params(spec).per_layer)
    step = ("value_and_grad and the Adam update compiled into one graph" if era.compiled else
            "value_and_grad and the Adam update run eagerly (before mlx-lm#53)")
    assumptions = [
        f"mlx-lm release {era.name} ({era.span}; physics/mlx_eras.py): {step}; loss kernel {release['loss_kernel']}, "
        f"attention under autodiff {release['attention_grad']}; "
        f"{dtype} weights, {setup.method} on the last {train_layers} of {spec.num_layers} layers"
        + (f", LoRA rank {setup.lora_rank} on {','.join(release['targets'])}" if setup.method != "full" else ""),
        "the peak is mx.get_peak_memory() (active memory); MLX's buffer cache shows on top in Activity Monitor "
        "and is released before MLX passes its memory limit",
        "Metal: fused RMSNorm (and, from mlx 0.32.2, cross-entropy) kernels; unfused attention under autodiff "
        "except mlx 0.24 (mlx/backend/metal/scaled_dot_product_attention.cpp); the step model is measured on "
        "MLX's CPU backend (benchmarks/mlx_measure.py), not on a Mac",
        "no padding: every sequence is max length long (mlx-lm pads a batch to its longest row)",
    ]
    if band:
        assumptions.append(f"measured error of the step model: {band['low']:+.0%} to {band['high']:+.0%} over "
                           f"{band['n']} real mlx-lm steps (CPU backend); the range includes it")
    assumptions.append("published mlx-lm 'Peak mem' lines, each estimated as its release ran it: docs/accuracy.md "
                       "(MLX); most give only the maximum length, where the estimate is an upper bound"
                       + ("; this release printed 'Peak mem' in GiB (bytes / 2**30)" if era.peak_unit_bytes != 1e9
                          else ""))
    assumptions += list(m.notes)
    phases = (("loss backward" if m.peak_phase == "loss backward" else "layer backward", peak),)
    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=trainable, model_source=spec.source,
        setup=setup, precision=dtype, components=tuple(components), peak_phase=m.peak_phase, phases=phases,
        peak_allocated_bytes=peak, peak_reserved_bytes=peak, device_bytes=peak, range_low_bytes=min(low, peak),
        range_high_bytes=max(high, peak), paged_bytes=0, download_bytes=count_params(spec).total * 2,
        assumptions=tuple(assumptions), kind="mlx",
        # what this release's "Peak mem ... GB" line reads (GiB before mlx-examples#1094)
        extra={"mlx_peak_bytes": peak, "mlx_peak_mem_printed": round(peak / era.peak_unit_bytes, 3)})
