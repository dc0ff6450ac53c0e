"""Per-parameter state: weights, adapters, quantization storage, gradients, optimizer state and its transients.

Sources: research/memory-physics.md sections 2.3-2.6 (read from torch/optim/adam.py, bitsandbytes
optim/optimizer.py and functional.py, transformers optimization.py, peft tuners/lora).
"""

from __future__ import annotations

from ..params import count_params, layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import adapters, moe, optimizers
from .quantized_base import PREQUANTIZED, int4_storage_bytes
from .stack import Stack

# bitsandbytes 4-bit: blocksize 64 with one fp32 absmax each; double quant stores absmax as uint8 plus one fp32
# per 256 of those (bitsandbytes/functional.py::quantize_4bit; QLoRA paper arXiv 2305.14314, "0.127 bits").
NF4_DATA_BITS = 4
NF4_BLOCK = 64
DQ_BLOCK = 256
# LLM.int8: int8 weights + one fp32 scale per output row (bitsandbytes nn/modules.py Int8Params.SCB).
INT8_DATA_BITS = 8
# bnb 8-bit optimizers: uint8 states + fp32 absmax per 256-element block for tensors >= 4096 elements
# (bitsandbytes optim/optimizer.py Optimizer2State.init_state, min_8bit_size=4096; blocksize 256 since 0.44.0).
BNB_MIN_8BIT = 4096
BNB_BLOCK = 256
# Paged optimizers put states of tensors with >= 1e5 elements in cudaMallocManaged memory (functional.get_paged),
# which torch's allocator never sees.
BNB_PAGED_MIN = 100_000


def quant_storage_bytes(n_elements: int, quant: str, rows: int) -> tuple[int, int]:
    """(packed weight bytes, quantization-constant bytes) for one quantized weight matrix."""
    if quant == "int8":
        return n_elements * INT8_DATA_BITS // 8, 4 * rows
    if quant in PREQUANTIZED:
        return int4_storage_bytes(n_elements // rows, rows, quant)
    data = (n_elements + 1) // 2
    blocks = -(-n_elements // NF4_BLOCK)
    if quant == "nf4-dq":
        # uint8 absmax per block + fp32 absmax per 256 blocks + 256-entry fp32 code + fp32 offset
        consts = blocks + 4 * -(-blocks // DQ_BLOCK) + 4 * 256 + 4
    else:  # nf4 / fp4
        consts = 4 * blocks
    return data, consts


def base_weight_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, int]:
    """(frozen or trained model weights, quantization constants). Tied embeddings are counted once."""
    counts = count_params(spec)
    if not setup.quantized_base:
        return counts.total * stack.weight_bytes, 0
    data = consts = quantized = 0
    for lin in layer_linears(spec):
        if not moe.bnb_quantizes(lin):
            continue
        d, c = quant_storage_bytes(lin.d_in * lin.d_out, setup.quant, lin.d_out)
        data += d * lin.copies
        consts += c * lin.copies
        quantized += lin.weight_params
    unquantized = counts.total - spec.num_layers * quantized
    # Embeddings, norms, biases, routers, lm_head (transformers get_keys_to_not_convert) and v5's fused 3-D MoE
    # experts (physics/moe.py) stay unquantized, except a 4-bit lm_head (Lightning's plugin: physics/litgpt.py).
    head_data = head_consts = 0
    if stack.quantized_head and counts.lm_head:
        head_weight = spec.vocab_size * spec.hidden_size
        head_data, head_consts = quant_storage_bytes(head_weight, setup.quant, spec.vocab_size)
        unquantized -= head_weight
    return (spec.num_layers * data + head_data + unquantized * stack.weight_bytes,
            spec.num_layers * consts + head_consts)


def lora_params(stack: Stack) -> int:
    """Every adapter element, trainable or frozen (LoRA-FA's A, VeRA's shared projections)."""
    return stack.lora_layers * sum(m.params for m in stack.lora_modules) + stack.extra_frozen_params + \
        sum(n * k for n, k in stack.extra_trainable) + sum(m.params for m in stack.outer_lora)


def adapter_weight_bytes(stack: Stack) -> int:
    """The adapters' weights in the adapter dtype, and their buffers in their own (physics/adapters.py)."""
    buffers = sum(adapters.module_buffer_bytes(m.kind, m.linear.d_in, m.rank) for m in stack.lora_modules)
    return lora_params(stack) * stack.adapter_bytes + stack.lora_layers * buffers


def adapter_cast_bytes(spec: ModelSpec, stack: Stack) -> int:
    """16-bit casts of fp32 adapter weights under autocast, which autocast's cache keeps (leaf tensors that need
    grad) until the forward ends, checkpointing or not (physics/adapters.py autocast_cast_elements)."""
    if not (stack.autocast and stack.adapter_bytes == 4):
        return 0
    # A 3-D expert parameter's adapter is one pair per expert (Linear.copies).
    per_layer = sum(adapters.autocast_cast_elements(m.kind, m.linear.d_in, m.linear.d_out, m.rank) * m.linear.copies
                    for m in stack.lora_modules)
    return 2 * (stack.lora_layers * per_layer + adapters.extra_cast_elements(spec, stack.method))


def adapter_saved_weight_bytes(spec: ModelSpec, stack: Stack) -> int:
    """Weight-sized tensors the adapters save for backward inside the layers (delta weights, rotations, ...):
    like activations, under checkpointing only the recomputed layer's exist (physics/adapters.py
    saved_per_module)."""
    always = grad_only = 0
    for m in stack.lora_modules:
        a, g = adapters.saved_per_module(m.kind, m.linear.d_in, m.linear.d_out, m.rank, stack.autocast,
                                         stack.adapter_bytes, stack.residual_bytes, stack.lora_dropout)
        always, grad_only = always + a, grad_only + g
    # In the first layer (when it is adapted) the input comes from the frozen embedding and needs no gradient:
    # F.linear keeps the weight only to compute the input's gradient.
    grad_layers = stack.lora_layers - (1 if stack.lora_layers == spec.num_layers else 0)
    return stack.lora_layers * always + grad_layers * grad_only


def trainable_params(spec: ModelSpec, stack: Stack) -> int:
    if stack.base_trainable and stack.method != "lisa":
        return count_params(spec).total
    return sum(n * k for n, k in trainable_tensor_sizes(spec, stack))


def trainable_tensor_sizes(spec: ModelSpec, stack: Stack) -> list[tuple[int, int]]:
    """(elements, how many such tensors) for every trainable tensor: drives 8-bit and paged thresholds."""
    if not stack.base_trainable:
        out = [(n, stack.lora_layers) for m in stack.lora_modules for n in m.tensors]
        out += [(n, 1) for m in stack.outer_lora for n in m.tensors]    # embedding / lm_head LoRA: once
        return out + list(stack.extra_trainable)
    counts = count_params(spec)
    out = [(spec.vocab_size * spec.hidden_size, 1)]
    if spec.position_embeddings:
        out.append((spec.position_embeddings * spec.hidden_size, 1))
    if counts.lm_head >= spec.vocab_size * spec.hidden_size:
        out.append((spec.vocab_size * spec.hidden_size, 1))
    # LISA trains the embedding, the head, the final norm and `lisa_layers` whole layers at a time
    # (physics/adapters.py); full fine-tuning every layer.
    layers = stack.lora_layers if stack.method == "lisa" else spec.num_layers
    for lin in layer_linears(spec):
        out.append((lin.d_in * lin.d_out * lin.copies, layers))
        if lin.bias:
            out.append((lin.d_out * lin.copies, layers))
    norm_tensors = spec.norms_per_layer * (2 if spec.norm_bias else 1)
    out.append((spec.hidden_size, layers * norm_tensors))
    if spec.qk_norm != "none":
        q, k = (spec.head_dim, spec.head_dim) if spec.qk_norm == "head" else (spec.q_dim, spec.kv_dim)
        out += [(q, layers), (k, layers)]
    out.append((counts.final_norm, 1))
    return out


def gradient_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Gradients of trainable params, in the param dtype (HF/torch: .grad has the param's dtype)."""
    per = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    if setup.optimizer_in_backward:
        # Each parameter is stepped and its grad freed as soon as it is ready (torchtune optimizer_in_bwd):
        # at most about the largest tensor's grad is alive.
        return max(n for n, _ in trainable_tensor_sizes(spec, stack)) * per
    return trainable_params(spec, stack) * per


def optimizer_state_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, int, str]:
    """(device bytes of optimizer state, bytes in CUDA managed memory (paged), note)."""
    if setup.optimizer in optimizers.OPTIMIZER_FACTS:      # GaLore, APOLLO, Muon, Lion, CAME, LOMO, ...
        state, note = optimizers.state_bytes(spec, setup, stack)
        return state, 0, note
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    opt = setup.optimizer
    sizes = trainable_tensor_sizes(spec, stack)
    total = sum(n * k for n, k in sizes)
    if opt in ("adamw", "adamw-fused", "adamw-loop"):
        return 2 * p * total, 0, f"exp_avg + exp_avg_sq in the param dtype ({p} B each), torch/optim/adam.py"
    if opt == "sgd":
        return p * total, 0, "momentum_buffer in the param dtype, torch/optim/sgd.py"
    if opt in ("adamw-bnb", "paged-adamw"):
        paged = sum(8 * n * k for n, k in sizes if n >= BNB_PAGED_MIN) if opt == "paged-adamw" else 0
        return 8 * total - paged, paged, "bitsandbytes 32-bit states: fp32 even for 16-bit params"
    if opt in ("adamw-8bit", "paged-adamw-8bit"):
        device = paged = 0
        for n, k in sizes:
            b = 2 * n + 2 * 4 * -(-n // BNB_BLOCK) if n >= BNB_MIN_8BIT else 8 * n
            if opt == "paged-adamw-8bit" and n >= BNB_PAGED_MIN:
                paged += b * k
            else:
                device += b * k
        return device + 2 * 256 * 4, paged, "uint8 states + fp32 absmax per 256 (bitsandbytes >= 0.44)"
    if opt == "adafactor":
        return (_adafactor_bytes(spec, stack), 0,
                "factored second moment rows+cols in fp32, no first moment (transformers Adafactor)")
    raise AssertionError(f"unhandled optimizer {opt}")  # setup validation makes this unreachable


def _adafactor_bytes(spec: ModelSpec, stack: Stack) -> int:
    if not stack.base_trainable and all(m.kind in ("lora", "qlora") for m in stack.lora_modules) and \
            not stack.extra_trainable:
        return stack.lora_layers * sum(4 * (m.rank + m.linear.d_in) + 4 * (m.linear.d_out + m.rank)
                                       for m in stack.lora_modules)
    if not stack.base_trainable:
        # Other adapters: vectors keep a full fp32 second moment; matrices are treated as unfactored (an upper
        # bound: Adafactor factors 2-D tensors, which is rows + cols).
        return 4 * sum(n * k for n, k in trainable_tensor_sizes(spec, stack))
    h, v = spec.hidden_size, spec.vocab_size
    per_layer = sum(4 * (lin.d_in + lin.d_out) * lin.copies + (4 * lin.d_out if lin.bias else 0)
                    for lin in layer_linears(spec))
    counts = count_params(spec)
    norms = 4 * (counts.layer_other - sum(lin.d_out for lin in layer_linears(spec) if lin.bias))
    head = 4 * (v + h) * (1 if spec.tied_embeddings else 2)
    return spec.num_layers * (per_layer + norms) + head + 4 * counts.final_norm


def optimizer_step_transient(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, str]:
    """Temporaries alive inside optimizer.step() on top of weights, grads and states."""
    if setup.optimizer in optimizers.OPTIMIZER_FACTS:
        return optimizers.step_temp_bytes(spec, setup, stack)
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    sizes = trainable_tensor_sizes(spec, stack)
    largest = max(n for n, _ in sizes)
    opt = setup.optimizer
    if setup.optimizer_in_backward:
        if opt in ("adamw", "adamw-loop", "sgd"):
            return 2 * largest * p, "per-parameter step in backward: about 2x the largest tensor"
        return 0, "per-parameter step in backward with an in-place kernel: no step temporaries"
    if opt == "adamw":
        total = sum(n * k for n, k in sizes)
        return total * p, "foreach AdamW: torch._foreach_sqrt(exp_avg_sqs) is one param-sized intermediate"
    if opt == "adamw-loop":
        return 2 * largest * p, "for-loop AdamW: about 2x the largest single tensor"
    if opt == "adafactor":
        return 3 * 4 * largest, "Adafactor: fp32 grad, fp32 param and update copies of the largest tensor"
    return 0, "fused kernel: no step temporaries"
