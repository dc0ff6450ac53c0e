"""mlx-lm and MLX releases whose training step allocates differently: what each published "Peak mem" ran.

Pure data, read against the sources (ml-explore/mlx-lm, ml-explore/mlx-examples ``llms/mlx_lm`` before the move,
ml-explore/mlx; commit and date per fact). ``physics/mlx.py`` takes the fields as arguments; an era fills them.

What changed, in date order:

* ml-explore/mlx-examples#528 (2024-03-12) to #1094 (2024-11-07): ``tuner/trainer.py`` printed
  ``mx.metal.get_peak_memory() / 2**30`` as "Peak mem ... GB" (GiB); from #1094 on, ``/ 1e9``.
* ``default_loss`` cast the logits to float32 before ``nn.losses.cross_entropy`` from the first mlx-lm trainer
  (mlx-examples#337, 2024-01-23) until ml-explore/mlx-lm#63 (2025-04-03), which moved the cast after the loss.
* The step became one ``mx.compile`` graph in ml-explore/mlx-lm#53 (2025-03-25); before, value_and_grad and
  the update ran eagerly, evaluated by ``mx.eval(state, ...)``.
* Attention under autodiff: mlx <= 0.23 ran the composite fallback for masked full-length attention (the fused
  kernel needed ``!mask``: mlx v0.22.0/v0.23.0 mlx/fast.cpp; mlx-lm always passes a causal mask array); mlx
  0.24.0 took the fused SDPA with an array mask (ml-explore/mlx#1924, head dims 64, 80, 128 after #1899), whose
  ``Custom::vjp`` recomputes the fallback in the backward; mlx 0.25.0 (#2054 "no sdpa in grad") returned to the
  composite under grad, and mlx 0.32's Metal backend keeps it ("faster for training on Metal to use the unfused
  SDPA", mlx/backend/metal/scaled_dot_product_attention.cpp use_fallback).
* The cross-entropy: composite (take_along_axis + logsumexp) through mlx 0.32.0; mlx 0.32.1 subtracts the max
  first (ml-explore/mlx#4188, 2026-08-12); the fused ``mx.fast.cross_entropy`` on the GPU came after 0.32.1
  (present in the mlx 0.32.4 installed here, absent from mlx@846d176).
* Default LoRA keys: q_proj and v_proj for llama, mistral, qwen2, gemma, gemma2, phi and others
  (``tuner/utils.py`` linear_to_lora_layers, model-type list) until ml-explore/mlx-lm#515 (2025-09-30, mlx-lm
  0.28.2): every Linear of the trained layers since.
"""

from __future__ import annotations

from dataclasses import dataclass

QV_MODEL_TYPES = frozenset({"mistral", "llama", "phi", "mixtral", "nemotron", "stablelm", "hunyuan", "qwen2",
                            "qwen2_moe", "phimoe", "gemma", "gemma2", "granite", "helium", "starcoder2", "cohere",
                            "cohere2", "minicpm", "deepseek", "olmo2", "olmoe", "internlm3"})  # mlx-lm 0.22.0
FUSED_SDPA_HEAD_DIMS = (64, 80, 128)   # mlx v0.24.0 mlx/fast.cpp sdpa_full_supported_head_dim


@dataclass(frozen=True)
class MlxEra:
    name: str
    span: str                     # the releases and dates it covers
    peak_unit_bytes: float        # what "Peak mem 1.000 GB" meant
    compiled: bool
    loss_kernel: str              # physics.mlx.LOSS_KERNELS on Metal
    fused_sdpa_in_grad: bool      # mlx 0.24: the fused kernel (recompute in the backward) where supported
    qv_default: bool              # LoRA keys q,v for QV_MODEL_TYPES when none are given

    def attention_grad(self, head_dim: int) -> str:
        return "recompute" if self.fused_sdpa_in_grad and head_dim in FUSED_SDPA_HEAD_DIMS else "composite"

    def default_targets(self, model_type: str, all_targets: tuple[str, ...]) -> tuple[str, ...]:
        return ("q", "v") if self.qv_default and model_type in QV_MODEL_TYPES else all_targets

    def estimate_kwargs(self, spec, all_targets) -> dict:
        """physics.mlx.mlx_estimate's arguments for this era (targets: the default keys)."""
        return dict(loss_kernel=self.loss_kernel, attention_grad=self.attention_grad(spec.head_dim),
                    compiled=self.compiled, targets=self.default_targets(spec.model_type, all_targets))


ERAS = {e.name: e for e in (
    MlxEra("mlx-lm-2024", "mlx-examples llms/mlx_lm, 2024-03-12..2024-11-06 (mlx <= 0.20)", 2 ** 30,
           compiled=False, loss_kernel="fp32-composite", fused_sdpa_in_grad=False, qv_default=True),
    MlxEra("mlx-lm-0.20", "mlx-lm 2024-11-07..2025-03-19 (mlx 0.20-0.23)", 1e9,
           compiled=False, loss_kernel="fp32-composite", fused_sdpa_in_grad=False, qv_default=True),
    MlxEra("mlx-lm-0.22", "mlx-lm 0.22 before #53, with mlx 0.24.x (2025-03-20..2025-03-24)", 1e9,
           compiled=False, loss_kernel="fp32-composite", fused_sdpa_in_grad=True, qv_default=True),
    MlxEra("mlx-lm-0.25", "mlx-lm 0.23-0.28.1 with mlx 0.25-0.29 (2025-04..2025-09-29)", 1e9,
           compiled=True, loss_kernel="composite", fused_sdpa_in_grad=False, qv_default=True),
    MlxEra("mlx-lm-0.28", "mlx-lm 0.28.2..0.31 with mlx 0.29..0.32.0 (2025-09-30..2026-08-11)", 1e9,
           compiled=True, loss_kernel="composite", fused_sdpa_in_grad=False, qv_default=False),
    MlxEra("current", "mlx-lm 0.32 with mlx 0.32.4 (installed here)", 1e9,
           compiled=True, loss_kernel="fused", fused_sdpa_in_grad=False, qv_default=False),
)}
