"""Mixture-of-experts facts that change memory in transformers 5.x, where one `experts` module per layer holds
every expert as stacked 3-D parameters (gate_up_proj [E, 2i, h], down_proj [E, h, i]) instead of nn.Linear.

Sources (transformers 5.24.0): models/qwen3_moe/modeling_qwen3_moe.py:210-247 (Qwen3MoeExperts: nn.Parameter
tensors, not modules), integrations/bitsandbytes.py:162-230 (replace_with_bnb_linear swaps only `nn.Linear`
and `Conv1D`), conversion_mapping.py:1386-1400 and core_model_loading.py:270-292 (a checkpoint's per-expert
tensors are stacked into the 3-D parameters at load).
"""

from __future__ import annotations

from ..params import Linear, layer_linears
from ..spec import ModelSpec

EXPERTS = ("experts",)


def is_expert(lin: Linear) -> bool:
    return lin.parts == EXPERTS


def bnb_quantizes(lin: Linear) -> bool:
    """Whether transformers' bitsandbytes integration stores this linear in 4 (or 8) bits. Routers are kept in
    16 bits (get_keys_to_not_convert); fused experts are 3-D nn.Parameters, which replace_with_bnb_linear never
    visits, so QLoRA of a v5 MoE keeps every expert in the 16-bit load dtype (unslothai/unsloth#4040: 153 GiB at
    load for an 80B MoE 'QLoRA')."""
    return lin.parts != ("router",) and not is_expert(lin)


def expert_weight_params(spec: ModelSpec) -> int:
    """Elements of one layer's expert parameters (all experts)."""
    return sum(lin.weight_params for lin in layer_linears(spec) if is_expert(lin))


def expert_stack_transient_params(spec: ModelSpec) -> int:
    """Elements alive beyond the final parameters while one layer's experts are stacked at load.

    The checkpoint stores experts.{j}.gate_proj / up_proj / down_proj per expert; the qwen2_moe/mixtral
    WeightConverter stacks each list (MergeModulelist: torch.stack) and concatenates gate and up (Concatenate,
    dim=1). At the concatenation the stacked gate and up halves ([E, i, h] each) and the result [E, 2i, h] are
    alive: one gate_up_proj beyond the parameter itself. down_proj's stack needs one down_proj (half as large)."""
    if not spec.is_moe:
        return 0
    return max((lin.weight_params for lin in layer_linears(spec) if is_expert(lin)), default=0)


def assumptions(spec: ModelSpec, setup) -> list[str]:
    out = []
    if spec.is_moe and setup.method == "qlora":
        out.append("QLoRA of a transformers v5 MoE: bitsandbytes quantizes nn.Linear only, so the fused 3-D "
                   f"experts ({expert_weight_params(spec) * spec.num_layers / 1e9:.2f}B params) stay in 16 bits "
                   "(transformers 5.24 integrations/bitsandbytes.py:189)")
    return out
