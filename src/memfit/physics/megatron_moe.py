"""Megatron-Core MoE layers: router, token dispatch (alltoall dispatcher) and the expert capacity factor.

Read at NVIDIA/Megatron-LM@d98e8a64 (megatron/core/transformer/moe/). Megatron's theoretical memory report prices
no MoE activations (it uses ffn_hidden_size for every layer); physics/megatron.py prices a routed token as
Korthikanti's MLP of width top-k x expert width, with its input counted once (2 s b h / t: the sequence-parallel
shard the router and dispatcher read). What a Megatron MoE layer keeps on top of that, per micro-batch in flight:

- router.py:106-111: the gating linear's logits [tokens, experts] in the input dtype (moe_router_dtype None,
  transformer_config.py:811); top-k runs on them and a softmax over the k chosen (moe_utils.py:913-914, probs cast
  back to the input dtype :936). The default load balancing "aux_loss" (transformer_config.py:743) takes a full
  fp32 softmax of the logits, saved for its backward (moe_utils.py:997); the boolean routing map [tokens, experts]
  (moe_utils.py:955) is kept by the dispatcher for unpermute (token_dispatcher.py:643).
- With a capacity factor, moe_utils.py:1074-1079 apply_router_token_dropping: probs * mask saves the boolean mask.
- token_dispatcher.py:375-791 (MoEAlltoAllTokenDispatcher): the permuted tokens go through the expert-parallel
  all-to-all, are all-gathered over the expert-tensor-parallel ranks (= tp) and sorted by local expert; the sorted
  copy [received tokens, h] is what the experts' first GEMM saves (experts.py), with the permuted probs it applies
  in the activation (experts.py:881). Send buffer, received buffer and sorted copy coexist in one layer's forward.
- Capacity (moe_utils.py:248-266 get_capacity): ceil(tokens x top-k / experts x factor), tokens being the layer's
  input on this GPU. With --moe-pad-expert-input-to-capacity every local expert receives exactly that many tokens
  from each of the tp x ep ranks (token_dispatcher.py:516-531), E x capacity x tp in all; with a factor but no
  padding, the most a step can receive: tp x min(E x capacity, ep x tokens x top-k) (tokens over capacity are
  dropped, none added; with ep 1 that is the balanced count, as no expert can take more than it is sent); dropless
  (no factor) Megatron receives whatever the router sends, priced here at the balanced average tokens x top-k x tp
  (an imbalanced step receives more, unbounded).
"""

from __future__ import annotations

import math

from ..spec import ModelSpec

ROUTER_BYTES = 2          # permuted probs in the bf16 input dtype
SCORE_BYTES = 4           # the aux-loss softmax over all experts, fp32
MAP_BYTES = 1             # torch.bool routing map and capacity mask
TOKEN_BYTES = 2           # bf16 hidden states


def layer_input_tokens(setup, lay) -> float:
    """Tokens entering one MoE layer on one GPU per micro-batch: the sequence-parallel shard (MoE with tp > 1
    trains only with sequence parallelism, moe_layer.py:636-640) of this GPU's context-parallel chunk."""
    return setup.batch_size * setup.seq_len / lay.cp / (lay.tp if lay.sequence_parallel else 1)


def capacity(spec: ModelSpec, setup, lay) -> int | None:
    """Tokens per expert from each rank (moe_utils.py:263 get_capacity), None when dropless."""
    if lay.capacity_factor is None:
        return None
    tokens = layer_input_tokens(setup, lay)
    return math.ceil(tokens * spec.experts_per_token / spec.num_experts * lay.capacity_factor)


def expert_tokens(spec: ModelSpec, setup, lay) -> float:
    """Token copies this GPU's local experts process in one MoE layer per micro-batch (see the module doc)."""
    tokens = layer_input_tokens(setup, lay)
    cap = capacity(spec, setup, lay)
    if cap is None:
        return tokens * spec.experts_per_token * lay.tp
    if lay.pad_to_capacity:
        return spec.num_experts * cap * lay.tp
    # Dropping without padding: each local expert takes at most `capacity` tokens from each of the tp x ep ranks
    # (a rank sends an expert each token at most once, moe_utils.py:1058-1060), and no rank receives more than
    # the ep ranks' tokens x top-k: the worst step routes everything it can to this rank's experts.
    per_expert = min(cap, math.ceil(tokens))
    return lay.tp * min(spec.num_experts * per_expert, lay.ep * tokens * spec.experts_per_token)


def saved_bytes_per_layer(spec: ModelSpec, setup, lay) -> float:
    """What one MoE layer keeps for backward per micro-batch beyond Korthikanti's balanced, dropless MLP term."""
    tokens = layer_input_tokens(setup, lay)
    routed = expert_tokens(spec, setup, lay)
    balanced = tokens * spec.experts_per_token * lay.tp
    router = tokens * spec.num_experts * (SCORE_BYTES + MAP_BYTES
                                          + (MAP_BYTES if lay.capacity_factor is not None else 0))
    expert_input = routed * spec.hidden_size * TOKEN_BYTES + routed * ROUTER_BYTES
    # Korthikanti prices 4 bytes per unit of MLP width per token (2 B x fc1 output and activation output); padded
    # or capacity-bound tokens beyond the balanced count cost the same per expert, split over expert tp = tp.
    padding = (routed - balanced) * 4 * spec.moe_intermediate_size / lay.tp
    return router + expert_input + padding


def transient_bytes(spec: ModelSpec, setup, lay) -> float:
    """One layer's dispatch in flight: the permuted send buffer, the received buffer and, with more than one
    local expert, the sorted copy (token_dispatcher.py:661-672 permute, 705-711 all_to_all, 757-791 sort)."""
    tokens = layer_input_tokens(setup, lay)
    cap = capacity(spec, setup, lay)
    sent = spec.num_experts * cap if (cap is not None and lay.pad_to_capacity) else tokens * spec.experts_per_token
    received = expert_tokens(spec, setup, lay)
    local_experts = spec.num_experts // lay.ep
    return TOKEN_BYTES * spec.hidden_size * (sent + (received if local_experts > 1 else 0))


def dispatch_bytes(spec: ModelSpec, setup, lay, layers_held: float, recompute_full: bool) -> int:
    """The MoE component on one GPU: saved buffers of every layer held (one layer under full recompute, which
    rebuilds one layer at a time) plus one layer's dispatch in flight."""
    if not spec.is_moe:
        return 0
    per_layer = saved_bytes_per_layer(spec, setup, lay)
    saved = per_layer * (1 if recompute_full else layers_held)
    return round(saved + transient_bytes(spec, setup, lay))


def words(spec: ModelSpec, setup, lay) -> str:
    cap = capacity(spec, setup, lay)
    if cap is None:
        how = "dropless (balanced routing assumed: an imbalanced step receives more)"
    elif lay.pad_to_capacity:
        how = f"capacity factor {lay.capacity_factor:g}, padded: every expert gets {cap} tokens from each rank"
    else:
        how = f"capacity factor {lay.capacity_factor:g}: at most {cap} tokens per expert from each rank"
    return (f"MoE alltoall dispatch, {how}; {expert_tokens(spec, setup, lay):,.0f} routed tokens per layer on "
            "this GPU's experts")
