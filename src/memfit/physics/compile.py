"""torch.compile (inductor) on the training step: what the compiled forward saves for backward.

AOTAutograd traces forward and backward into one joint graph and splits it with the min-cut partitioner
(torch 2.x torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``, the default for inductor):
every tensor the backward needs is either saved or recomputed from saved ones, and the cut minimises the bytes
saved. Pointwise ops (norm scaling, SiLU/GELU, the gated product, rotary, dropout with inductor's philox RNG
seeds) are recomputable; matmuls, attention kernels and reductions are not (``ban_recompute_reductions`` and the
partitioner's ``is_compute_intensive`` list). For a decoder layer that leaves:

- each norm: its input (already alive as the residual stream) and the fp32 rstd, as a fused kernel saves
  (the walk's fused-norm rule); the normalized output, the fp32 copy and the output the weight multiplies are
  recomputed;
- linears whose input is a norm output: nothing beyond that norm input;
- the MLP: the gate and up matmul outputs (gated) or fc1's output (plain); the activation, the product and
  down_proj's input are recomputed from them;
- attention: what the kernel saves (q, k, v, out, logsumexp), unchanged;
- dropout: no mask (the RNG state is replayed in backward).

That is the partitioner's ideal. Real compiled steps keep more: the one published pair that toggles only
compile on a long-sequence run, torchtune's memory-optimisation table (docs/source/tutorials/
memory_optimizations.rst, Llama 3.2 3B full fine-tuning, 2 x 4096 packed tokens, A100; calibration rows TT-10 and
TT-11), drops from 60.0 to 51.0 GiB where the rules above would drop 15 GiB, and LLMs-from-scratch's GPT-2
(RB-04 to RB-05, reserved) does not drop at all. So the estimate takes the eager saved set less
COMPILE_REALIZED_SHARE of the difference to the ideal -- a measured share, not a derived one, and said so in the
assumptions. The trace runs eager code and does not cover a
compiled step.

The loss is priced in physics/loss.py: torchtune compiles its chunked cross-entropy on its own, which the
partitioner reduces to the logits in their own dtype and two fp32 row reductions (COMPILED_CE_ROW_BYTES there).
"""

from __future__ import annotations

from ..spec import ModelSpec


# Share of the partitioner's ideal saving that published compiled runs realise. TT-11 vs TT-10 (compile the only
# change): 9.0 of the 15.2 GiB the rules above remove, 0.6; RB-05 vs RB-04 (the same): none (reserved rose by
# 0.3 GiB). 0.5 stays below the larger one so the rows that gained little are not under-counted by much
# (benchmarks/accuracy_vs_measured.py: TT-11 -1%, RB-05 -9%). Refit by hand when compiled rows are added.
COMPILE_REALIZED_SHARE = 0.5


def compiled_coefficients(eager: tuple[int, int], ideal: tuple[int, int]) -> tuple[int, int]:
    """The compiled layer's (per token, per token per position) bytes: eager less the realised share of the gap."""
    return tuple(round(e - COMPILE_REALIZED_SHARE * (e - i)) for e, i in zip(eager, ideal))


def compiled_mlp_bytes_per_token(spec: ModelSpec, compute_bytes: int) -> int:
    """Bytes per token a compiled dense MLP saves: the matmul outputs its pointwise tail is recomputed from."""
    if spec.is_moe:
        # Routed experts: per routed token the gate_up output (2 x expert width); the router's fp32 softmax.
        return spec.experts_per_token * 2 * spec.moe_intermediate_size * compute_bytes + 4 * spec.num_experts
    width = spec.intermediate_size
    return (2 if spec.mlp_kind == "gated" else 1) * width * compute_bytes


ASSUMPTION = (f"torch.compile: the min-cut partitioner would recompute pointwise ops (norms, activations, gated "
              f"product, dropout) instead of saving them; published compiled runs realise part of that, so the "
              f"estimate takes {COMPILE_REALIZED_SHARE:.0%} of the saving (measured on torchtune's and "
              f"LLMs-from-scratch's published runs, physics/compile.py); not traced")
