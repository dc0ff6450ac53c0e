"""LitGPT: what its finetune loop, its model code and Lightning Fabric hold beyond the walk of an HF model.

Read from Lightning-AI/litgpt@e5493986 (0.4.5, the commit of the config_hub/finetune QLoRA table; the same code at
@00af8b0d, which added the Llama 3.2 rows) and lightning 2.3.0.dev20240428 (litgpt's pin, pyproject.toml:13):

- Fabric's fp32 outputs. fabric/wrappers.py:133-144 `_FabricModule.forward` returns
  `precision.convert_output(output)`; plugins/precision/half.py (bf16-true) and bitsandbytes.py convert_output
  cast every floating tensor to `torch.get_default_dtype()`, fp32 outside the forward. So the 128-token logit
  chunks reach `chunked_cross_entropy` in fp32: the loop keeps fp32 chunks (4 B a logit), each chunk's
  log-softmax is fp32 (4 B), and while the chunks convert the model's bf16 ones are still referenced (2 B).
- The loop's `logits` (finetune/lora.py:304 `logits = model(input_ids, lm_head_chunk_size=128)`) is rebound only
  when the next forward has returned: the previous step's fp32 logits live through the next forward. With
  bitsandbytes < 0.43.2 their graph also keeps each MatMul4Bit node's `ctx.tensors = (A, B)`
  (bitsandbytes@0.42.0 autograd/_functions.py:522-523): a ctx attribute is not a saved variable, backward does not
  free it, so the previous step's 4-bit linears' inputs stay alive as long as its logits.
- The quantized lm_head. `BitsandbytesPrecision.module_init_context` swaps `torch.nn.Linear` for the 4-bit class
  while the model is built (plugins/precision/bitsandbytes.py:129-145), lm_head included, and quantizes from
  fp16 (`weight.contiguous().to(device=device, dtype=torch.half)`, :312-322). dequantize_4bit returns the
  quant_state's dtype, fp16, and MatMul4Bit casts it to the input's dtype (_functions.py:516, :546): 4 B per
  weight while one linear multiplies, in forward and backward; lm_head's is the largest.
- Repeated k/v. model.py CausalSelfAttention.forward expands k and v to every query head and reshapes them (a
  copy) whenever n_query_groups != n_head: SDPA saves q-sized k and v, and no view keeps the fused qkv output
  (lit-gpt@8641822 did so for grouped-query attention only, recipe lit-gpt).
- LoRA's zero_pad. lora.py LoRAQKVLinear.zero_pad, with LoRA on some of q/k/v only, returns
  `result.index_copy_(dim=-1, index=self.lora_ind, source=x)`; index_copy's derivative is
  `grad.index_select(dim, index).expand_as(source)` (torch tools/autograd/derivatives.yaml), so autograd saves
  `source`, the LoRA output of the enabled parts.
- F.gelu. model.py GptNeoxMLP and GemmaMLP call `torch.nn.functional.gelu(x, approximate=...)`, which saves its
  input only (transformers' gelu_new, which the HF Phi model uses, saves four tensors).

tests/test_litgpt.py runs these code paths (copied small) under saved-tensor hooks and a storage tracker.
"""

from __future__ import annotations

from ..setup import TrainingSetup
from ..spec import ModelSpec

FP32_BYTES = 4
# What torch.nn.functional.gelu is called in memfit's activation table (one saved tensor, spec.ACT_SAVED_TENSORS).
FUSED_GELU = "gelu_pytorch_tanh"
# Elements of the dequantized fp16 weight and its cast to the compute dtype, alive together.
DEQUANT_BYTES_PER_WEIGHT = 2 + 2


def built_activation(activation: str) -> str:
    """The activation LitGPT's MLP runs for an HF model's `activation`: F.gelu for every GELU."""
    return FUSED_GELU if activation.startswith("gelu") else activation


def repeats_kv(spec: ModelSpec, stack) -> bool:
    """k and v are copied to every head before SDPA (grouped or multi-query attention in LitGPT)."""
    if not stack.repeats_kv or spec.num_kv_heads == spec.num_heads:
        return False
    return spec.num_kv_heads > 1 or stack.repeats_kv == "grouped+mqa"


def zero_pad_saved_per_token(spec: ModelSpec, setup: TrainingSetup, stack) -> int:
    """Bytes per token LoRAQKVLinear.zero_pad's index_copy saves: the LoRA output of the enabled parts of qkv,
    in the adapter dtype (nothing when LoRA is on all of q, k and v: zero_pad returns its input)."""
    if not (stack.lora_qkv_zero_pad and spec.fused_qkv and setup.method in ("lora", "qlora")):
        return 0
    widths = {"q": spec.q_dim, "k": spec.kv_dim, "v": spec.kv_dim}
    enabled = [part for part in widths if part in setup.lora_targets]
    if not enabled or len(enabled) == len(widths):
        return 0
    return sum(widths[part] for part in enabled) * stack.adapter_bytes


def head_dequant_bytes(spec: ModelSpec, stack) -> int:
    """The 4-bit lm_head's dequantized fp16 weight and its cast, while a chunk multiplies."""
    return DEQUANT_BYTES_PER_WEIGHT * spec.vocab_size * spec.hidden_size if stack.quantized_head else 0


def chunked_loss_bytes(spec: ModelSpec, tokens: int, chunk_tokens: int, stack) -> tuple[int, int, int]:
    """(saved, forward_extra, backward_extra) of LitGPT's chunked lm_head + chunked_cross_entropy behind Fabric.

    saved: the fp32 logit chunks the loop keeps and each chunk's fp32 log-softmax (the cross-entropy's end).
    The forward's own peak comes before: the last chunk's lm_head (its dequantized weight when 4-bit) or the fp32
    conversion, with all bf16 chunks alive; forward_extra is that minus `saved` (negative when smaller; the
    previous step's logits are a component of their own, estimator._phases).
    backward: the cross-entropy chunks run first (autograd's order: they were created last), one chunk's fp32
    nll grad and log_softmax_backward output on top of `saved`; then the lm_head chunks, with the fp32 logits,
    the bf16 logit grads and (4-bit head) the dequantized weight."""
    TV, V = tokens * spec.vocab_size, spec.vocab_size
    bf16 = stack.logits_bytes
    saved = 2 * FP32_BYTES * TV
    forward_peak = bf16 * TV + max(FP32_BYTES * TV, head_dequant_bytes(spec, stack))
    chunk = chunk_tokens * V
    backward_extra = max(2 * FP32_BYTES * chunk, bf16 * TV + head_dequant_bytes(spec, stack) - FP32_BYTES * TV)
    return saved, forward_peak - saved, backward_extra


def full_logits_loss_bytes(logits: int) -> tuple[int, int, int]:
    """(saved, forward_extra, backward_extra) of `chunked_cross_entropy(logits, targets)` on the whole fp32 logits
    (finetune/full.py:254-256, pretrain.py): `logits.reshape(-1, V).split(128)`, one fp32 log-softmax per chunk.
    The forward's peak is the conversion (bf16 and fp32 logits). In backward, SplitBackward concatenates the chunks'
    fp32 grads into one new tensor while they are alive (and the slice `[..., :-1, :]` of full.py scatters it into
    zeros of the full shape), beside the kept logits: 12 B a logit at the top, 8 of them `saved`."""
    saved = 2 * FP32_BYTES * logits
    return saved, 2 * logits + FP32_BYTES * logits - saved, FP32_BYTES * logits


def previous_step_bytes(spec: ModelSpec, setup: TrainingSetup, stack, bnb_saved_bytes: int) -> int:
    """What the previous step still holds while the next forward runs: its fp32 logits and, with bitsandbytes <
    0.43.2, the inputs its 4-bit linears' autograd nodes keep (`bnb_saved_bytes`, every layer's and lm_head's)."""
    if not stack.keeps_previous_logits:
        return 0
    tokens = setup.batch_size * setup.seq_len
    logit_bytes = FP32_BYTES if stack.fabric_fp32_output else stack.logits_bytes
    return logit_bytes * tokens * spec.vocab_size + bnb_saved_bytes
