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


def adapted_experts(spec: ModelSpec, setup) -> tuple[Linear, ...]:
    """The 3-D expert parameters LoRA adapts with `experts` among the targets (PEFT 0.21.2 target_parameters:
    one ParamWrapper per parameter, tuners/lora/layer.py:2335-2440; lora_A Linear(in, r*E), lora_B Linear(r*E,
    out), in/out swapped for a non-transposed [E, out, in] parameter)."""
    if setup.method not in ("lora", "qlora") or "experts" not in (setup.lora_targets or ()):
        return ()
    if not spec.is_moe:
        from ..errors import InvalidSetupError, Problem

        raise InvalidSetupError(Problem("lora_targets", f"{{lora_targets}} experts: {spec.name} is a dense model "
                                                        "(no MoE experts to adapt)"))
    return tuple(lin for lin in layer_linears(spec) if is_expert(lin))


def expert_delta_weight_bytes(spec: ModelSpec, stack) -> int:
    """One layer's folded expert weights W' = W + s * B @ A while LoRA on experts is active.

    PEFT 0.21.2 ParamWrapper._activate_lora registers a parametrization (_LoraFactorsProxy,
    tuners/lora/layer.py:2305-2323): `torch.baddbmm(W, lhs, rhs)` builds a new tensor the size of the whole expert
    stack, in W's dtype, cached for the forward (parametrize.cached()). The experts' matmuls read slices of it, and
    autograd keeps it (they save their weight operand for the input gradient) until the layer's backward: like a
    weight copy saved for backward, one per adapted layer (one, recomputed, under checkpointing)."""
    adapted = [m for m in stack.lora_modules if is_expert(m.linear)]
    return sum(m.linear.weight_params for m in adapted) * stack.weight_bytes


def first_layer_gate_up_unsaved(spec: ModelSpec, stack) -> bool:
    """Whether the first adapted layer keeps no folded gate_up_proj: a matmul saves its weight operand only to
    compute its input's gradient, and the experts' input needs none when nothing before them trains (no LoRA
    on that layer's attention, a frozen base). down_proj's input always needs one (it depends on gate_up)."""
    if stack.base_trainable:
        return False
    return not any(set(m.linear.parts) & {"q", "k", "v", "o"} for m in stack.lora_modules)


def expert_saved_delta_bytes(spec: ModelSpec, stack) -> int:
    """The folded expert weights saved for backward across all adapted layers (expert_delta_weight_bytes)."""
    total = stack.lora_layers * expert_delta_weight_bytes(spec, stack)
    if total and first_layer_gate_up_unsaved(spec, stack):
        total -= _adapted_bytes(stack, "experts.gate_up_proj")
    return total


def _adapted_bytes(stack, name: str) -> int:
    return sum(m.linear.weight_params for m in stack.lora_modules if m.linear.name == name) * stack.weight_bytes
