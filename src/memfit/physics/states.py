"""Per-parameter state: weights, adapters, quantization storage, gradients, optimizer state and its transients.

Sources: research/memory-physics.md sections 2.3-2.6 (read from torch/optim/adam.py, bitsandbytes
optim/optimizer.py and functional.py, transformers optimization.py, peft tuners/lora).
"""

from __future__ import annotations

from ..params import count_params, layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec
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
    if setup.method != "qlora":
        return counts.total * stack.weight_bytes, 0
    data = consts = 0
    for lin in layer_linears(spec):
        if lin.parts == ("router",):
            continue
        d, c = quant_storage_bytes(lin.d_in * lin.d_out, setup.quant, lin.d_out)
        data += d * lin.copies
        consts += c * lin.copies
    unquantized = counts.total - spec.num_layers * counts.layer_linear_weights
    # Embeddings, norms, biases, routers and lm_head stay unquantized (transformers get_keys_to_not_convert).
    return spec.num_layers * data + unquantized * stack.weight_bytes, spec.num_layers * consts


def lora_params(stack: Stack) -> int:
    return stack.lora_layers * sum(m.params for m in stack.lora_modules) + sum(m.params for m in stack.outer_lora)


def trainable_params(spec: ModelSpec, stack: Stack) -> int:
    return count_params(spec).total if stack.base_trainable else lora_params(stack)


def trainable_tensor_sizes(spec: ModelSpec, stack: Stack) -> list[tuple[int, int]]:
    """(elements, how many such tensors) for every trainable tensor: drives 8-bit and paged thresholds."""
    if not stack.base_trainable:
        out = []
        for m in stack.lora_modules:
            out += [(m.rank * m.linear.d_in, stack.lora_layers), (m.rank * m.linear.d_out, stack.lora_layers)]
        for m in stack.outer_lora:
            out += [(m.rank * m.linear.d_in, 1), (m.rank * m.linear.d_out, 1)]
        return out
    counts = count_params(spec)
    out = [(spec.vocab_size * spec.hidden_size, 1)]
    if spec.position_embeddings:
        out.append((spec.position_embeddings * spec.hidden_size, 1))
    if counts.lm_head >= spec.vocab_size * spec.hidden_size:
        out.append((spec.vocab_size * spec.hidden_size, 1))
    for lin in layer_linears(spec):
        out.append((lin.d_in * lin.d_out * lin.copies, spec.num_layers))
        if lin.bias:
            out.append((lin.d_out * lin.copies, spec.num_layers))
    norm_tensors = spec.norms_per_layer * (2 if spec.norm_bias else 1)
    out.append((spec.hidden_size, spec.num_layers * norm_tensors))
    if spec.qk_norm != "none":
        q, k = (spec.head_dim, spec.head_dim) if spec.qk_norm == "head" else (spec.q_dim, spec.kv_dim)
        out += [(q, spec.num_layers), (k, spec.num_layers)]
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
    if not stack.base_trainable:
        return stack.lora_layers * sum(4 * (m.rank + m.linear.d_in) + 4 * (m.linear.d_out + m.rank)
                                       for m in stack.lora_modules)
    h, v = spec.hidden_size, spec.vocab_size
    per_layer = sum(4 * (lin.d_in + lin.d_out) * lin.copies + (4 * lin.d_out if lin.bias else 0)
                    for lin in layer_linears(spec))
    counts = count_params(spec)
    norms = 4 * (counts.layer_other - sum(lin.d_out for lin in layer_linears(spec) if lin.bias))
    head = 4 * (v + h) * (1 if spec.tied_embeddings else 2)
    return spec.num_layers * (per_layer + norms) + head + 4 * counts.final_norm


def optimizer_step_transient(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, str]:
    """Temporaries alive inside optimizer.step() on top of weights, grads and states."""
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
