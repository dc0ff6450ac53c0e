"""`memfit config --engine megatron`: the Megatron-LM `pretrain_gpt.py` arguments of the estimated layout.

Flag names are Megatron-LM's (NVIDIA/Megatron-LM@d98e8a64): most are generated from dataclass fields by
megatron/training/argument_utils.py ArgumentGroupFactory (megatron/core/model_parallel_config.py:11,83,94,100,127
tensor/pipeline/sequence/context/expert parallel; megatron/core/transformer/transformer_config.py:65-256 the
architecture, :532-551 recompute), the rest written out in megatron/training/arguments.py (:3156
--use-distributed-optimizer, :2382 --group-query-attention, :2441 --make-vocab-size-divisible-by, :2450 --swiglu,
:2460 --untie-embeddings-and-output-weights). The model comes from memfit's spec, the layout and batch from the
setup; data, tokenizer, learning rate and checkpoint paths are the user's and left out.
"""

from __future__ import annotations

import shlex

from .errors import InvalidSetupError
from .physics import megatron
from .setup import TrainingSetup
from .spec import ModelSpec


def megatron_arguments(spec: ModelSpec, setup: TrainingSetup) -> list[str]:
    """The command-line words, flag and value pairs, for pretrain_gpt.py."""
    if setup.recipe != "megatron":
        raise InvalidSetupError("--engine megatron writes a Megatron layout: give --recipe megatron (or leave "
                                "--recipe out)")
    megatron.check_model(spec, setup)
    if spec.mlp_kind != "gated" or spec.norm_kind != "rmsnorm" or spec.position_embeddings:
        raise InvalidSetupError(f"{spec.name}: memfit writes Megatron arguments for Llama-style models (SwiGLU, "
                                "RMSNorm, rotary positions)")
    lay = megatron.layout(setup)
    words = ["--tensor-model-parallel-size", lay.tp, "--pipeline-model-parallel-size", lay.pp,
             "--context-parallel-size", lay.cp]
    if lay.vpp > 1:
        words += ["--num-virtual-stages-per-pipeline-rank", lay.vpp]     # arguments.py:3116
    if lay.ep > 1:
        words += ["--expert-model-parallel-size", lay.ep]
    if lay.sequence_parallel:
        words.append("--sequence-parallel")
    if lay.distributed_optimizer:
        words.append("--use-distributed-optimizer")
    if lay.recompute != "none":
        words += ["--recompute-granularity", lay.recompute]
        if lay.recompute == "full":
            # One layer per recompute unit, every layer: what physics/megatron.py prices.
            words += ["--recompute-method", "uniform", "--recompute-num-layers", 1]
    words += ["--num-layers", spec.num_layers, "--hidden-size", spec.hidden_size,
              "--ffn-hidden-size", spec.intermediate_size, "--num-attention-heads", spec.num_heads,
              "--kv-channels", spec.head_dim]
    if spec.num_kv_heads != spec.num_heads:
        words += ["--group-query-attention", "--num-query-groups", spec.num_kv_heads]
    if spec.is_moe:
        words += ["--num-experts", spec.num_experts, "--moe-ffn-hidden-size", spec.moe_intermediate_size,
                  "--moe-router-topk", spec.experts_per_token,
                  # the dispatcher physics/megatron_moe.py prices (transformer_config.py:891 defaults to allgather)
                  "--moe-token-dispatcher-type", "alltoall"]
        if lay.capacity_factor is not None:
            words += ["--moe-expert-capacity-factor", f"{lay.capacity_factor:g}"]
        if lay.pad_to_capacity:
            words.append("--moe-pad-expert-input-to-capacity")
    words += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
              "--disable-bias-linear"]
    if spec.qkv_bias:
        words.append("--add-qkv-bias")
    if not spec.tied_embeddings:
        words.append("--untie-embeddings-and-output-weights")
    words += ["--make-vocab-size-divisible-by", megatron.VOCAB_DIVISIBLE_BY,
              "--seq-length", setup.seq_len, "--max-position-embeddings", setup.seq_len,
              "--micro-batch-size", setup.batch_size,
              "--global-batch-size", setup.batch_size * setup.grad_accum * lay.dp,
              "--fp16" if setup.precision.startswith("fp16") else "--bf16"]
    return [str(w) for w in words]


def render_megatron(spec: ModelSpec, setup: TrainingSetup) -> str:
    """One flag per line, ready to paste after `torchrun --nproc-per-node G pretrain_gpt.py`."""
    words = megatron_arguments(spec, setup)
    lines, current = [], []
    for word in words:
        if word.startswith("--") and current:
            lines.append(" ".join(shlex.quote(w) for w in current))
            current = []
        current.append(word)
    lines.append(" ".join(shlex.quote(w) for w in current))
    head = f"# {setup.world_size} GPUs: torchrun --nproc-per-node {setup.gpus} --nnodes {setup.nodes} pretrain_gpt.py"
    return head + "\n" + " \\\n".join(lines)
