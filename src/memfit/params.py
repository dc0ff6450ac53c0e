"""Exact parameter counts from a ModelSpec: per linear module, per layer, per model.

The counts mirror the modules transformers builds (tests check them against ``numel()`` of the real model on
the meta device): tied embeddings counted once, q/k/v biases, GQA-sized k/v, fused qkv and gate_up, MoE
experts and routers, QK-norms, learned positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .spec import ModelSpec


@dataclass(frozen=True)
class Linear:
    """One nn.Linear (or Conv1D) per layer. ``parts`` are the canonical targets it serves (q, k, v, ...)."""

    name: str
    d_in: int
    d_out: int
    bias: bool
    parts: tuple[str, ...]
    copies: int = 1          # MoE: one per expert

    @property
    def weight_params(self) -> int:
        return self.d_in * self.d_out * self.copies

    @property
    def params(self) -> int:
        return (self.d_in * self.d_out + (self.d_out if self.bias else 0)) * self.copies


@dataclass(frozen=True)
class ParamCounts:
    embedding: int           # token (+ learned position) embeddings
    per_layer: int           # one decoder layer, all of it
    layer_linear_weights: int  # the quantizable matmul weights of one layer (what NF4 stores)
    layer_other: int         # biases, norms, routers kept in 16 bit under QLoRA
    final_norm: int          # the norms outside the layers: the final one (and BLOOM's embedding LayerNorm)
    lm_head: int             # 0 when tied
    total: int
    largest_linear: int      # elements of the largest single weight matrix (dequantization transient)


@lru_cache(maxsize=4096)
def layer_linears(spec: ModelSpec) -> tuple[Linear, ...]:
    """The linear modules of one decoder layer, as transformers names and shapes them."""
    h, qd, kvd, i = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    name = spec.module_name
    out: list[Linear] = []
    if spec.fused_qkv:
        out.append(Linear(name("q"), h, qd + 2 * kvd, spec.qkv_bias, ("q", "k", "v")))
    else:
        out += [Linear(name("q"), h, qd, spec.qkv_bias, ("q",)),
                Linear(name("k"), h, kvd, spec.qkv_bias, ("k",)),
                Linear(name("v"), h, kvd, spec.qkv_bias, ("v",))]
    out.append(Linear(name("o"), qd, h, spec.o_bias, ("o",)))
    if spec.is_moe:
        e_i = spec.moe_intermediate_size
        # transformers v5 keeps experts as stacked 3-D parameters (gate_up_proj [E, 2i, h], down_proj [E, h, i]).
        out += [Linear("experts.gate_up_proj", h, 2 * e_i, False, ("experts",), copies=spec.num_experts),
                Linear("experts.down_proj", e_i, h, False, ("experts",), copies=spec.num_experts),
                Linear("gate", h, spec.num_experts, False, ("router",))]
        if spec.shared_expert_intermediate_size:
            s_i = spec.shared_expert_intermediate_size
            out += [Linear("shared_expert.gate_proj", h, s_i, False, ("gate",)),
                    Linear("shared_expert.up_proj", h, s_i, False, ("up",)),
                    Linear("shared_expert.down_proj", s_i, h, False, ("down",)),
                    Linear("shared_expert_gate", h, 1, False, ("router",))]
    elif spec.mlp_kind == "gated":
        if spec.fused_gate_up:
            out.append(Linear(name("gate"), h, 2 * i, spec.mlp_bias, ("gate", "up")))
        else:
            out += [Linear(name("gate"), h, i, spec.mlp_bias, ("gate",)),
                    Linear(name("up"), h, i, spec.mlp_bias, ("up",))]
        out.append(Linear(name("down"), i, h, spec.mlp_bias, ("down",)))
    else:
        out += [Linear(name("up"), h, i, spec.mlp_bias, ("up",)),
                Linear(name("down"), i, h, spec.mlp_bias, ("down",))]
    return tuple(out)


def _norm_params(spec: ModelSpec, dim: int) -> int:
    return dim * (2 if spec.norm_bias else 1)


@lru_cache(maxsize=4096)
def count_params(spec: ModelSpec) -> ParamCounts:
    h = spec.hidden_size
    linears = layer_linears(spec)
    linear_weights = sum(lin.weight_params for lin in linears if lin.parts != ("router",))
    linear_total = sum(lin.params for lin in linears)
    norms = spec.norms_per_layer * _norm_params(spec, h)
    if spec.qk_norm == "head":
        norms += 2 * _norm_params(spec, spec.head_dim)
    elif spec.qk_norm == "full":
        norms += _norm_params(spec, spec.q_dim) + _norm_params(spec, spec.kv_dim)
    per_layer = linear_total + norms
    embedding = spec.vocab_size * h + spec.position_embeddings * h
    final_norm = _norm_params(spec, h) * (2 if spec.embed_norm else 1)
    lm_head = 0 if spec.tied_embeddings else spec.vocab_size * h + (spec.vocab_size if spec.lm_head_bias else 0)
    if spec.tied_embeddings and spec.lm_head_bias:
        lm_head = spec.vocab_size
    total = embedding + spec.num_layers * per_layer + final_norm + lm_head
    largest = max([lin.d_in * lin.d_out for lin in linears] + [spec.vocab_size * h])
    return ParamCounts(embedding=embedding, per_layer=per_layer, layer_linear_weights=linear_weights,
                       layer_other=per_layer - linear_weights, final_norm=final_norm, lm_head=lm_head,
                       total=total, largest_linear=largest)
