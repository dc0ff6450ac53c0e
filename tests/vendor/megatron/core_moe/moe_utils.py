# Copyright (c) 2023, NVIDIA CORPORATION. All rights reserved.
# Vendored from NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/transformer/moe/moe_utils.py
# (test oracle only): get_capacity lines 248-266, permute lines 344-494, apply_router_token_dropping lines
# 1019-1082, copied unchanged. The module's imports need megatron.core (not on PyPI without its CUDA stack);
# the three functions need only torch and math, plus the names below for permute's fused and batch-invariant
# branches, which tests/test_megatron.py never takes (fused=False, return_batch_invariant_inverse_map=False).
import math
from typing import Optional, Tuple

import torch

HAVE_TE = False
fused_permute = fused_permute_with_probs = fused_permute_and_pad_with_probs = None


def build_batch_invariant_inverse_permutation_map(*args, **kwargs):  # not reached (see above)
    raise NotImplementedError


def get_capacity(
    num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: Optional[int] = None
) -> int:
    """
    Calculate the capacity of each expert.

    Args:
        num_tokens (int): num of the input tokens.
        num_experts (int): num of the experts.
        capacity_factor (float): Capacity factor.
        min_capacity (int, optional): Minimum capacity. Defaults to None.

    Returns:
        int: Capacity of each expert.
    """
    capacity = math.ceil((num_tokens / num_experts) * capacity_factor)
    if min_capacity is not None and capacity < min_capacity:
        capacity = min_capacity
    return capacity



def permute(
    tokens: torch.Tensor,
    routing_map: torch.Tensor,
    probs: Optional[torch.Tensor] = None,
    num_out_tokens: Optional[int] = None,
    fused: bool = False,
    drop_and_pad: bool = False,
    tokens_per_expert: Optional[torch.Tensor] = None,
    align_size: int = 0,
    return_batch_invariant_inverse_map: bool = False,
) -> Tuple[
    torch.Tensor,
    Optional[torch.Tensor],
    torch.Tensor,
    Optional[torch.Tensor],
    Optional[torch.Tensor],
]:
    """Permute the tokens and probs based on the mask.
    Tokens with the same designated expert will be grouped together.
    The shape of mask is [tokens, num_experts], it indicates which experts were selected
    by each token.

    When drop_and_pad=True, in routing_map, the number of non-zeros in each column equals to
    expert capacity. This function exploits this feature to use ops that support cuda graph.

    If the fused permute and pad kernel is available, it will pad the tokens to the align_size
    and return the padded permuted tokens, pad_offsets and padded tokens per expert.

    Args:
        tokens (torch.Tensor): The input token tensor, [num_tokens, hidden].
        routing_map (torch.Tensor): The sparse token to expert mapping, [num_tokens, num_experts].
        probs (torch.Tensor, optional): The probs tensor, [num_tokens, num_experts].
        num_out_tokens (int, optional): The number of output tokens. If None, it's set to
                                        the number of input tokens.
        fused (bool, optional): Whether use the fused permute function.
        drop_and_pad (bool, optional): Whether or not the token dispatcher uses token-drop
                                       and pads the number of tokens to the expert capacity.
                                       If set to true, routing_map has a fixed number of non-zeros
                                       in each column.
        tokens_per_expert (torch.Tensor, optional): Tensor of shape `[num_experts]` containing
                                                    actual token counts per expert.
        align_size (int, optional): The alignment size for the input tensor for fp8 or fp4.
        return_batch_invariant_inverse_map (bool, optional): Return a fixed-shape
            batch-invariant inverse map in the `pad_offsets` slot for graph-safe unpermute.

    Returns:
        Tuple[
            torch.Tensor,
            Optional[torch.Tensor],
            torch.Tensor,
            Optional[torch.Tensor],
            Optional[torch.Tensor],
        ]:
            The permuted tokens, (optional) permuted probs, sorted indices,
            (optional) pad_offsets, (optional) padded_tokens_per_expert.
    """
    if return_batch_invariant_inverse_map:
        assert not fused, "batch-invariant MoE permute requires the unfused path"
        assert not drop_and_pad, "batch-invariant MoE supports dynamic dropless routing only"

    if fused and probs is None:
        if not HAVE_TE or fused_permute is None:
            raise ValueError("fused_permute is not available. Please install TE >= 2.1.0.")
        permuted_input, sorted_indices = fused_permute(
            tokens, routing_map, num_out_tokens=num_out_tokens
        )
        return permuted_input, None, sorted_indices, None, tokens_per_expert

    if fused and probs is not None:
        if not HAVE_TE or (
            fused_permute_and_pad_with_probs is None and fused_permute_with_probs is None
        ):
            raise ValueError(
                "Transformer Engine (TE) fused kernel is not available. "
                "fused_permute_with_probs typically requires TE >= 2.1.0, and "
                "fused_permute_and_pad_with_probs` typically requires TE >= 2.12.0. "
            )
        if (
            fused_permute_and_pad_with_probs is not None
            and tokens_per_expert is not None
            and align_size > 0
        ):
            return fused_permute_and_pad_with_probs(
                tokens, probs, routing_map, tokens_per_expert, align_size
            )
        else:
            output, permuted_probs, row_id_map = fused_permute_with_probs(
                tokens, probs, routing_map, num_out_tokens=num_out_tokens
            )
            return output, permuted_probs, row_id_map, None, tokens_per_expert

    num_tokens, hidden = tokens.shape
    num_experts = routing_map.shape[1]
    permuted_probs = None
    batch_invariant_inverse_map = None
    if drop_and_pad and not (num_out_tokens is None):
        capacity = num_out_tokens // num_experts
        assert not routing_map.requires_grad
        # mask [num_tokens, num_experts] -> [num_experts, num_tokens]
        routing_map = routing_map.to(dtype=torch.int8).T.contiguous()
        # use argsort to put indices of all non-zeros in the beginning of list
        # and keep the first `capacity` number of indices
        sorted_indices = routing_map.argsort(dim=-1, descending=True, stable=True)[
            :, :capacity
        ].contiguous()
        # flatten from [num_experts, capacity] to 1D
        sorted_indices = sorted_indices.view(-1)

        if probs is not None:
            # [num_tokens, num_experts] -> num_experts * num_tokens
            probs_T_1D = probs.T.contiguous().view(-1)
            # get 1D indices of the probs selected by routing_map
            indices_dim0 = torch.arange(num_experts, device=routing_map.device).unsqueeze(-1)
            indices_dim1 = sorted_indices.view(num_experts, capacity)
            indices_1D = (indices_dim0 * num_tokens + indices_dim1).view(-1)
            # get probs from indices
            permuted_probs = probs_T_1D.index_select(0, indices_1D)
    else:
        assert (
            num_out_tokens is not None
        ), "num_out_tokens is required for the argsort-based permute"
        routing_map_for_inverse = routing_map

        # mask [num_tokens, num_experts] -> [num_experts, num_tokens]
        routing_map = routing_map.bool().T.contiguous()

        # Use argsort to get indices of non-zero entries in row-major order.
        # This is equivalent to masked_select but produces fixed-shape output,
        # making it compatible with CUDA graph capture.
        flat_sorted = routing_map.reshape(-1).argsort(descending=True, stable=True)
        flat_sorted = flat_sorted[:num_out_tokens]
        sorted_indices = flat_sorted % num_tokens

        if probs is not None:
            permuted_probs = probs.T.contiguous().reshape(-1)[flat_sorted]

        if return_batch_invariant_inverse_map:
            batch_invariant_inverse_map = build_batch_invariant_inverse_permutation_map(
                routing_map_for_inverse, flat_sorted, sorted_indices, num_out_tokens
            )

    # use the mapping to permute the tokens
    permuted_input = tokens.index_select(0, sorted_indices)

    return (
        permuted_input,
        permuted_probs,
        sorted_indices,
        batch_invariant_inverse_map,
        tokens_per_expert,
    )



def apply_router_token_dropping(
    routing_probs: torch.Tensor,
    routing_map: torch.Tensor,
    router_topk: int,
    capacity_factor: float,
    drop_policy: str = "probs",
    pad_to_capacity: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Apply token dropping to top-k expert selection.

    This function enforces expert capacity limits by dropping tokens that exceed
    the capacity and optionally padding to capacity.

    Args:
        routing_probs (torch.Tensor): Tensor of shape [num_tokens, num_experts]
            containing the routing probabilities for selected experts.
        routing_map (torch.Tensor): Boolean tensor of shape [num_tokens, num_experts]
            indicating which experts were selected for each token.
        router_topk (int): Number of experts selected per token.
        capacity_factor (float): The capacity factor of each expert.
        drop_policy (str, optional): Policy to drop tokens - "probs" or "position".
                                     Defaults to "probs".
        pad_to_capacity (bool, optional): Whether to pad to capacity. Defaults to False.

    Returns:
        Tuple[torch.Tensor, torch.Tensor]:
            - final_probs: Routing probabilities after applying capacity constraints
            - final_map: Boolean mask after applying capacity constraints
    """
    assert routing_probs.ndim == 2 and routing_map.ndim == 2
    num_tokens, num_experts = routing_probs.shape
    # Calculate expert capacity
    expert_capacity = get_capacity(
        num_tokens=num_tokens * router_topk,
        num_experts=num_experts,
        capacity_factor=capacity_factor,
    )

    # Create capacity mask based on drop policy
    if expert_capacity > num_tokens:
        # No need to drop tokens if capacity exceeds the number of tokens
        capacity_mask = torch.ones_like(routing_probs).bool()
    else:
        if drop_policy == "probs":
            _, capacity_indices = torch.topk(routing_probs, k=expert_capacity, dim=0, sorted=False)
            capacity_mask = torch.zeros_like(routing_probs).scatter(0, capacity_indices, 1).bool()
        elif drop_policy == "position":
            _, capacity_indices = torch.topk(
                routing_map.int(), k=expert_capacity, dim=0, sorted=False
            )
            capacity_mask = torch.zeros_like(routing_probs).scatter(0, capacity_indices, 1).bool()
        else:
            raise ValueError(f"Invalid drop_policy: {drop_policy}")

    # Apply capacity constraints
    if pad_to_capacity:
        final_map = capacity_mask
        final_probs = routing_probs * final_map
    else:
        # Get exceed mask and maskout exceeded probs and indices
        final_map = torch.logical_and(routing_map, capacity_mask)
        final_probs = routing_probs * final_map

    return final_probs, final_map

