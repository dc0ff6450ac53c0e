"""Every component an estimate can name: the counter that first includes it, what it is, and the group of the
fake-tensor trace that measures it.

The README's "What is counted" table (tools/readme_flags.py), the trace's comparison groups (trace/measure.py)
and the tracker's storage categories (trace/tracker.py) are generated from this table; a test checks that every
component an estimate names is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Kind:
    name: str
    counter: str              # "allocated" | "reserved" | "device" | "mlx" | "mps-driver": the first counter that includes it
    what: str                 # one line for the README table
    trace_group: str | None   # the trace's group that measures it; None: a one-GPU CPU trace cannot see it


KINDS: tuple[Kind, ...] = (
    Kind("weights", "allocated", "the model's weights as loaded (QLoRA: 4-bit packed linears + 16-bit embeddings, "
         "norms, lm_head)", "weights"),
    Kind("quantization constants", "allocated", "NF4 absmax (fp32 per 64) or double-quantized constants "
         "(bitsandbytes `quantize_4bit`)", "weights"),
    Kind("adapter weights", "allocated", "LoRA A and B, r·(d_in + d_out) per adapted module, fp32 under PEFT's "
         "default", "weights"),
    Kind("vision tower weights", "allocated", "a VLM's vision tower and projector as loaded (frozen: no gradient "
         "or optimizer state)", "weights"),
    Kind("pixel values", "allocated", "a VLM batch's patch pixels (the processor's flattened patches)", "weights"),
    Kind("master weights", "allocated", "fp32 master copy of the trainable weights (DeepSpeed ZeRO's partition, "
         "Megatron's main parameters)", None),
    Kind("gradients", "allocated", "trainable parameters × their dtype (after the first micro-batch with gradient "
         "accumulation)", "gradients"),
    Kind("optimizer state", "allocated", "AdamW moments in the parameter's dtype (torch), 8-bit blockwise "
         "(bitsandbytes), factored (Adafactor)", "optimizer state"),
    Kind("optimizer step temporaries", "allocated", "foreach AdamW's parameter-sized intermediate; none for fused "
         "kernels", "temporaries"),
    Kind("autocast weight copies", "allocated", "bf16 casts of fp32 weights (or fp32 adapters) saved for backward "
         "under autocast", "activations"),
    Kind("activations", "allocated", "what autograd saves per layer (op-level walk)", "activations"),
    Kind("checkpoints", "allocated", "with gradient checkpointing: each layer's input hidden states",
         "activations"),
    Kind("recomputed layer", "allocated", "with gradient checkpointing: one layer's activations rebuilt in "
         "backward", "activations"),
    Kind("vision tower checkpoints", "allocated", "a VLM under gradient checkpointing: the frozen tower's blocks "
         "join the graph (enable_input_require_grads hooks the patch embedding) and keep their inputs (Llama 3.2 "
         "Vision's layers are not checkpointed: all they save)",
         "activations"),
    Kind("cross-attention activations", "allocated", "Llama 3.2 Vision: what its cross-attention layers keep "
         "beyond a Llama layer (vision-length k/v repeated per head, their LoRA inputs, the cross-attention mask)",
         "activations"),
    Kind("vision outputs", "allocated", "Llama 3.2 Vision: the tower's output, held by the model's outputs until "
         "the loss", "activations"),
    Kind("vision tower forward", "allocated", "Llama 3.2 Vision: the frozen tower's layer outputs and attention "
         "mask while it runs (its own phase, before the language model)", "activations"),
    Kind("embedding and head activations", "allocated", "embedding indices, final norm, lm_head input, labels",
         "activations"),
    Kind("logits and loss", "allocated", "the loss kernel's logits and cross-entropy buffers (HF: `logits.float()` "
         "and, in its backward, 12·bs·V bytes)", "logits and loss"),
    Kind("previous step's outputs", "allocated", "LitGPT: the previous step's fp32 logits, which the loop holds "
         "until the next forward returns, and with bitsandbytes < 0.43.2 the 4-bit linears' inputs their graph "
         "keeps", "logits and loss"),
    Kind("backward temporaries", "allocated", "one layer's backward: grads of its output and MLP intermediates",
         "temporaries"),
    Kind("dequantization transient", "allocated", "bitsandbytes' 16-bit copy of one 4-bit weight while it "
         "multiplies", "temporaries"),
    Kind("gathered parameters", "allocated", "unsharded parameters in flight while a GPU computes (ZeRO-3 / FSDP "
         "all-gather)", None),
    Kind("FSDP1 root view gradients", "allocated", "FSDP1 full fine-tuning: the root unit's gradients, unsharded, "
         "held by autograd's split backward from the lm_head's to the embedding's, then concatenated", None),
    Kind("communication buffers", "allocated", "DDP gradient buckets, ZeRO reduce buckets, or one layer's "
         "unsharded gradient for reduce-scatter", None),
    Kind("context-parallel buffers", "allocated", "with `--cp`: attention's K/V all-gather, all-to-all or ring "
         "chunks across the GPUs of one sequence, one layer at a time", None),
    Kind("activation temporaries", "allocated", "Megatron: the 5% its theoretical memory report adds for "
         "optimizer and miscellaneous temporaries", None),
    Kind("MoE dispatch buffers", "allocated", "Megatron MoE: router scores and routing map, the routed tokens "
         "each expert GEMM saves (padded to capacity with a capacity factor), one layer's all-to-all buffers",
         "activations"),
    Kind("reference model", "allocated", "preference/RL trainers: a second copy of the frozen weights (TRL's "
         "ref_model when the reference is not the adapter switched off)", "reference model"),
    Kind("reference forward", "allocated", "the reference's no-grad forward: one layer's working set and its "
         "log-probs", "activations"),
    Kind("reward model", "allocated", "PPO: the frozen reward model's weights", None),
    Kind("value model", "allocated", "PPO: the value model trained with the policy (weights, adapter, gradients, "
         "optimizer state)", None),
    Kind("teacher model", "allocated", "GKD: the teacher's weights in its checkpoint dtype", "teacher model"),
    Kind("teacher logits and JSD", "allocated", "GKD: the teacher's logits and the generalized JSD loss on full "
         "logits", None),
    Kind("generation KV cache", "allocated", "online RL / GKD with HF generate: K and V of every layer for the "
         "prompts and completions", None),
    Kind("generation prefill", "allocated", "HF generate's no-grad working set over the prompts at the prefill",
         None),
    Kind("vLLM reservation", "allocated", "vLLM co-located on the training GPU: vllm_gpu_memory_utilization of the "
         "card (released in sleep mode while the trainer runs)", None),
    Kind("load temporaries", "allocated", "model load only: a module's 16-bit copy while bitsandbytes quantizes "
         "it, an MoE layer's experts being stacked, or one FSDP/ZeRO-3 unit unsharded", None),
    Kind("cuBLAS workspace", "allocated", "cuBLAS/cuBLASLt workspaces, which torch's allocator hands out",
         "cuBLAS workspace"),
    Kind("allocator slack", "reserved", "reserved − allocated (rounding, fragmentation)", None),
    Kind("FSDP1 unshard pool", "reserved", "FSDP1 (fsdp_qlora, LitGPT, HF Trainer HSDP): all-gather blocks in "
         "the unshard stream's pool that hold no tensor at the peak (a free pending under record_stream)", None),
    Kind("CUDA context", "device", "driver context and kernels; seen by nvidia-smi, never by torch", None),
    Kind("MPS heaps and cache", "mps-driver", "PyTorch on MPS: cached buffers and the unused part of Metal heaps, "
         "seen by `torch.mps.driver_allocated_memory()` (estimate_mps.py)", None),
    Kind("quantization scales and biases", "mlx", "MLX affine quantization: a 16-bit scale and bias per 64 weights "
         "(`mx.quantize`)", None),
)
BY_NAME = MappingProxyType({k.name: k for k in KINDS})

# Groups the trace adds from the same formula as the estimate, because a CPU cannot run them.
ACCOUNTED_GROUPS = ("cuBLAS workspace",)
TRACE_GROUPS = MappingProxyType({group: tuple(k.name for k in KINDS if k.trace_group == group)
                                 for group in dict.fromkeys(k.trace_group for k in KINDS if k.trace_group)})
# What the tracker tags each live storage with: the traced groups, and the batch's input tensors.
TRACKER_CATEGORIES = tuple(g for g in TRACE_GROUPS if g not in ACCOUNTED_GROUPS) + ("inputs",)


def readme_table() -> str:
    """The README's "What is counted" table."""
    rows = ["| component | counter | what it is |", "|---|---|---|"]
    rows += [f"| {k.name} | {k.counter} | {k.what} |" for k in KINDS]
    return "\n".join(rows)
