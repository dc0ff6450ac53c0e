"""LoRA on a pre-quantized or 8-bit frozen base: what each kernel stores, saves for backward and allocates.

`--method qlora --quant Q` trains LoRA adapters over frozen linears held by one of these kernels. They differ in
three ways that matter for memory, each read from the kernel's source:

- **int8** -- bitsandbytes LLM.int8 (`Linear8bitLt`, has_fp16_weights=False). Storage: int8 weights plus one fp32
  scale per output row (Int8Params.SCB; physics/states.py). Forward (bitsandbytes 0.45+
  bitsandbytes/autograd/_functions.py MatMul8bitLt.forward) quantizes the input on the fly (transients) and,
  whenever the input needs a gradient, keeps ``ctx.tensors = (CAt, subA, A)``: CAt is None on the fast path
  (frozen weight: ``needs_input_grad[1]`` is False), subA holds the few outlier columns (threshold 6.0), and A is
  the layer input itself, the same storage LoRA's lora_A saves when its dropout is 0. Backward dequantizes the
  whole weight, ``CB = state.CB.to(dtype_A, copy=True).mul_(SCB ...)``: one 16-bit copy of the weight as a
  transient.
- **gptq-int4** -- GPTQModel's TorchQuantLinear, the one GPTQ kernel that declares SUPPORTS_TRAINING
  (ModelCloud/GPTQModel@011c00a6 gptqmodel/nn_modules/qlinear/torch.py ``_forward``: ``weights =
  self.dequantize_weight(...).to(x.dtype); out = torch.matmul(x, weights)``); transformers routes GPTQ through
  it for training, and the older auto-gptq cuda kernels Qwen's finetune.py ran (GPTQConfig(disable_exllama=True))
  dequantize and matmul the same way. The matmul's input needs a gradient, so autograd saves the *dequantized
  16-bit weight* (mm saves mat2 to compute the input's gradient) and not the input: every quantized layer keeps a
  16-bit copy of its linears until its backward. Without checkpointing that is the whole model in 16 bits; with
  it, one layer's worth while that layer is recomputed. Storage: qweight int32 [d_in/8, d_out] (4 bits a weight),
  qzeros int32 [d_in/g, d_out/8], scales fp16 [d_in/g, d_out], g_idx int32 [d_in] (nn_modules/qlinear/__init__.py
  BaseQuantLinear buffers), group size g = 128 (the Qwen/Llama -Int4 checkpoints' quantize_config).
- **awq-int4** -- AutoAWQ's WQLinear_GEMM training path (casper-hansen/AutoAWQ@d9dc8e56 awq/modules/linear/gemm.py
  WQLinearMMFunction): forward ``ctx.save_for_backward(x, qweight, qzeros, scales, bias)`` on the input after
  ``x.half()`` (so a bf16 input is saved as a new fp16 copy; an fp16 one is the input itself), backward
  dequantizes the weight (``dequantize_weights_cuda(...).to(grad_output.dtype)``) and multiplies it by
  ``weights.transpose(0, 1).unsqueeze(0).repeat(batch_size, 1, 1)``: the 16-bit weight plus one more copy per
  sequence in the micro-batch, as transients. Storage: qweight int32 [d_in, d_out/8], qzeros int32
  [d_in/g, d_out/8], scales fp16 [d_in/g, d_out], g = 128.

- **bitsandbytes < 0.43.2 nf4/fp4** (the recipe's ``bnb4_saves_input``; LitGPT <= 0.5.4 pins 0.42.0) --
  bitsandbytes@0.42.0 autograd/_functions.py:522-523 MatMul4Bit.forward keeps ``ctx.tensors = (A, B)``: the
  layer's input A stays alive until the layer's backward although backward never reads it (0.43.2 keeps
  ``(None, B)``, bitsandbytes@9e753741). Every 4-bit linear whose input or weight needs a gradient keeps one
  16-bit tensor per distinct input (q/k/v share one, gate/up another). A frozen nn.Linear saves only its weight,
  so for a base-model linear that is new memory unless lora_A saves the same tensor (dropout 0 on a LoRA target).

All of them return the input's dtype (``output.to(A.dtype)`` / ``out.to(x_dtype)`` / ``out.to(input_dtype)``), as
bitsandbytes' 4-bit layers do, so the layer walk in physics/activations.py is the QLoRA one.
"""

from __future__ import annotations

from ..options import LITGPT_METHODS
from ..params import layer_linears
from ..recipes import RECIPES
from ..setup import TrainingSetup
from ..spec import ModelSpec
from .stack import Stack

# Group size of the published GPTQ and AWQ int4 checkpoints (quantize_config.json / quant_config "group_size").
INT4_GROUP = 128
INT4_BITS = 4
INT32_BYTES = 4
FP16_BYTES = 2
# The kernels memfit prices for LoRA on a pre-quantized base (bitsandbytes NF4/FP4 live in physics/states.py).
PREQUANTIZED = ("gptq-int4", "awq-int4")
# Which kernel runs each quantization, for the estimate's assumptions.
KERNEL = {
    "int8": "bitsandbytes Linear8bitLt (LLM.int8, threshold 6.0): int8 weights + fp32 row scales; saves its input "
            "(shared with lora_A) and dequantizes the weight in backward",
    "gptq-int4": "GPTQModel TorchQuantLinear (the GPTQ kernel that trains): packed int4 + fp16 scales, int4 zeros "
                 "per 128-column group; its matmul saves the dequantized 16-bit weight of every quantized linear "
                 "for backward",
    "awq-int4": "AutoAWQ WQLinear_GEMM: packed int4 + fp16 scales, int4 zeros per 128-column group; saves its fp16 "
                "input, dequantizes in backward (the weight plus one copy per sequence)",
}


def int4_storage_bytes(d_in: int, d_out: int, quant: str) -> tuple[int, int]:
    """(packed weight bytes, scales + zeros + index bytes) of one d_in x d_out matrix in a GPTQ or AWQ layer."""
    groups = -(-d_in // INT4_GROUP)
    data = d_in * d_out * INT4_BITS // 8
    zeros = groups * -(-d_out * INT4_BITS // 32) * INT32_BYTES
    consts = groups * d_out * FP16_BYTES + zeros
    if quant == "gptq-int4":
        consts += d_in * INT32_BYTES               # g_idx: the group of each input column
    return data, consts


def _quantized(spec: ModelSpec):
    return [lin for lin in layer_linears(spec) if lin.parts != ("router",)]


def saved_per_layer_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Bytes one quantized layer keeps for backward independent of the tokens: GPTQ's dequantized weights."""
    if setup.method != "qlora" or setup.quant != "gptq-int4":
        return 0
    return sum(lin.weight_params for lin in _quantized(spec)) * FP16_BYTES


def saved_per_token_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Bytes per token one quantized layer saves beyond what LoRA already saves of the same inputs.

    AWQ saves ``x.half()``: a new fp16 tensor per linear when the input is not fp16. (int8's saved input is
    walked with the adapters that may share it: int8_keeps_input.)"""
    if setup.method != "qlora" and not bnb4_saves_input(setup):
        return 0
    linears = _quantized(spec)
    if bnb4_saves_input(setup):
        # Attention and MLP read one normed tensor in parallel blocks with one norm (Phi, Falcon-7B; the
        # walk's own test, physics/activations.py): one saved input for both.
        shared = spec.parallel_attn_mlp and spec.norms_per_layer == 1
        key = (lambda lin: "attn" if _input_key(lin) == "mlp" else _input_key(lin)) if shared else _input_key
        widths = {key(lin): lin.d_in * lin.copies for lin in linears}
        # Inputs lora_A already saves: the same tensor when dropout is 0 (the walk counts it there).
        lora_read = {key(lin) for lin in linears if set(lin.parts) & set(setup.lora_targets)} \
            if setup.lora_dropout == 0 and setup.method == "qlora" else set()
        return sum(width for k, width in widths.items() if k not in lora_read) * stack.compute_bytes
    input_fp16 = stack.weight_dtype == "fp16" and stack.autocast_dtype in ("", "fp16")
    if setup.quant == "awq-int4" and not input_fp16:
        return sum(lin.d_in * lin.copies for lin in linears) * FP16_BYTES
    return 0


_SHARED_INPUT = {"q": "attn", "k": "attn", "v": "attn", "gate": "mlp", "up": "mlp"}


def _input_key(lin) -> str:
    return _SHARED_INPUT.get(lin.parts[0], lin.name)


def head_saved_per_token_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """A 4-bit lm_head (LitGPT under Lightning's bitsandbytes plugin, physics/litgpt.py) whose kernel keeps its
    input: the final norm's output, unless lora_A on the head saves that very tensor (dropout 0)."""
    if not (stack.quantized_head and bnb4_saves_input(setup)):
        return 0
    if "head" in setup.lora_targets and setup.lora_dropout == 0:
        return 0
    return spec.hidden_size * stack.residual_bytes


def int8_keeps_input(setup: TrainingSetup, stack: Stack) -> bool:
    """LLM.int8 linears under a frozen base (every PEFT method given --quant int8): bitsandbytes 0.50.2
    autograd/_functions.py:186-187 MatMul8bitLt.forward keeps ``ctx.tensors = (CAt, subA, A)`` whenever
    ``any(ctx.needs_input_grad[:2])``: each int8 linear whose input needs a gradient (every one above the first
    trainable parameter) keeps that input. The walk (physics/activations.py _Walk.lora) adds it per distinct
    input unless another op already saves that storage (lora_A with dropout 0, SDPA's output read by o_proj)."""
    return setup.quantized_base and setup.quant == "int8" and not stack.base_trainable


def bnb4_saves_input(setup: TrainingSetup) -> bool:
    """Whether the setup's stack runs a bitsandbytes 4-bit kernel that keeps its input (< 0.43.2)."""
    # LitGPT's LLaMA-Adapter on a --quantize bnb.* base runs the same kernel (its frozen Linears are bnb Linear4bit).
    return ((setup.method == "qlora" or setup.method in LITGPT_METHODS) and setup.quant in ("nf4", "nf4-dq", "fp4")
            and RECIPES[setup.recipe or "hf"].bnb4_saves_input)


def backward_transient_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The largest transient one quantized linear allocates in backward: the dequantized 16-bit weight (int8,
    AWQ), AWQ's batch-repeated copy of it. GPTQ's backward multiplies by the weight it saved: nothing new."""
    if setup.method != "qlora" or setup.quant not in ("int8", "awq-int4"):
        return 0
    largest = max((lin.d_in * lin.d_out for lin in _quantized(spec) if lin.copies == 1), default=0)
    copies = 1 + (setup.batch_size if setup.quant == "awq-int4" else 0)
    return largest * FP16_BYTES * copies


def assumption(setup: TrainingSetup) -> str | None:
    if bnb4_saves_input(setup):
        return (f"bitsandbytes 0.42 {setup.quant} base (recipe {setup.recipe}): each 4-bit linear keeps its 16-bit "
                "input until its backward (MatMul4Bit ctx.tensors = (A, B); physics/quantized_base.py)")
    if setup.method != "qlora" or setup.quant not in KERNEL:
        return None
    return f"{setup.quant} base: {KERNEL[setup.quant]} (physics/quantized_base.py)"
