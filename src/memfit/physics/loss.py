"""Logits and loss: the V-sized tensors that are often the whole step's peak (research/memory-physics.md §4.1).

Each loss kernel (options.LOSSES) is priced from its source. Notation: T = batch x length tokens (all labelled:
memfit assumes no padding), V the vocabulary, H the hidden size.

- hf: transformers' ForCausalLMLoss does logits.float() then cross_entropy, which saves the fp32 log-softmax
  (4·T·V); during its backward three fp32 T×V buffers are alive (saved log-softmax, nll grad,
  log_softmax_backward result): 12·T·V.
- plain: F.cross_entropy on the logits as the model returns them (a plain loop); only log_softmax's output is saved.
- chunked: torchtune's LinearCrossEntropyLoss (fp32 log-probs of every chunk saved) or LitGPT's chunked lm_head
  (logit chunks kept in the model dtype).
- liger, unsloth, trl-fused-head: the lm_head and the loss fused; the logits exist one tile at a time.
- trl-chunked-nll: 256-token chunks of h.float() @ w.float().t() under checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import litgpt
from .stack import Stack

TORCHTUNE_CHUNKS = 8          # torchtune 0.7.0 LinearCrossEntropyLoss(num_output_chunks=8), cross_entropy_loss.py:31
# torchtune compiles the chunked loss's per-chunk cross-entropy in place whenever compile=True:
# training/_compile.py compile_loss (pytorch/torchtune@1814feb17 :74-77 `loss.compute_cross_entropy =
# torch.compile(...)` for CEWithChunkedOutputLoss; @bd2a0fc7c (0.7.0) :70-71 apply_compile_strategy,
# modules/loss/cross_entropy_loss.py:54-70, compiling compute_cross_entropy :87-115, logits.float() ->
# F.cross_entropy). In place, so it holds even where a recipe drops compile_loss's return value
# (full_finetune_single_device.py @1814feb17:291-292), which leaves a plain nn.CrossEntropyLoss eager.
# Inductor decomposes log_softmax into pointwise ops around two row reductions (max and log-sum-exp), and the
# min-cut partitioner (torch/_functorch/partitioners.py, compiler="inductor") recomputes the pointwise ops in
# backward: it saves the chunk's logits in their own dtype and the two fp32 row reductions instead of the fp32
# log-softmax (tests/test_stacks_losses.py runs the partitioner on that function).
COMPILED_CE_ROW_BYTES = 2 * 4
LITGPT_CHUNK_TOKENS = 128     # litgpt lm_head_chunk_size=128 (finetune/lora.py)
# TRL 1.7-1.14 chunked_nll: huggingface/trl@f2cd577 trl/trainer/sft_trainer.py:86.
TRL_NLL_CHUNK_TOKENS = 256
# fp32 [chunk, V] tensors alive at once in one chunk of TRL's chunked_nll (sft_trainer.py:99-114 `_chunk`). Forward:
# logits, log_p, log_p.exp() and their product for the entropy (4). Backward of the recomputed chunk: the saved
# log_p and p, the grads of the entropy product and of log_p, and log_softmax_backward's result (5).
TRL_NLL_FWD_CHUNK_TENSORS = 4
TRL_NLL_BWD_CHUNK_TENSORS = 5
# TRL >= 1.15 fused LM head: trl 1.16.0 trl/kernels/chunked_logprob.py:31 TOKEN_CHUNK_SIZE and
# trl/trainer/utils.py:1506 _CHUNKED_LOGPROB_CHUNK_SIZE (vocabulary columns per tile).
TRL_TILE_TOKENS = 4096
TRL_TILE_VOCAB = 32768
# fp32 per-token vectors of TRL's fused head: 7 running statistics in forward (chunked_logprob.py:336-345), of which
# log_z and the entropy are saved (:394), plus the returned log-probs, entropy and is_top1.
TRL_TOKEN_STATS = 7
TRL_TOKEN_SAVED = 5
# unsloth-zoo 2026.10.9: one chunk of rows holds about UNSLOTH_LOGPROB_CHUNK_GB (default 2.0,
# fused_losses/fused_linear.py:69) at 8 bytes per logit (fused_losses/chunked_logprob.py:47,62-72).
UNSLOTH_CHUNK_BYTES = 2 * 2**30
UNSLOTH_BYTES_PER_LOGIT = 8


@dataclass(frozen=True)
class LossMemory:
    saved: int           # kept from the loss forward until its backward (log-softmax, kept logits, grads)
    forward_extra: int   # transient on top of `saved` at the forward's peak (negative when that peak is lower)
    backward_extra: int  # transient on top of `saved` during the cross-entropy backward
    note: str
    kept: int = 0        # the part of `saved` the loop holds until the whole backward is over (its logits)


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of Liger's fused linear cross-entropy (liger-kernel 0.8.5
    ops/fused_linear_cross_entropy.py:84-87): inc_factor = ceil(V / H), chunk = next_pow2(ceil(BT / inc_factor)),
    at most BT."""
    inc_factor = -(-vocab // hidden)
    rows = -(-tokens // inc_factor)
    return min(1 << (rows - 1).bit_length(), tokens)


def unsloth_chunk_tokens(tokens: int, vocab: int) -> int:
    """Rows per chunk of unsloth-zoo's fused loss: chunked_logprob_rows() sizes one chunk to 2 GiB at 8 bytes a
    logit (fused_losses/chunked_logprob.py:62-72; at least 2 rows)."""
    return min(tokens, max(2, UNSLOTH_CHUNK_BYTES // (vocab * UNSLOTH_BYTES_PER_LOGIT)))


def loss_memory(spec: ModelSpec, setup: TrainingSetup, stack: Stack, tokens: int | None = None) -> LossMemory:
    """`tokens`: the labelled positions a fused head projects (preference/RL trainers score only completions);
    by default every token of the batch."""
    T, V, H = setup.batch_size * setup.seq_len, spec.vocab_size, spec.hidden_size
    if tokens is not None and stack.loss_kind == "trl-fused-head":
        T = tokens
    TV = T * V
    logit = stack.logits_bytes
    softcap = logit * TV if spec.final_logit_softcap else 0   # Gemma 2: tanh(logits / cap) saves its output
    kind = stack.loss_kind
    hidden_b = stack.residual_bytes               # dtype of the final hidden states the head reads
    head_w = stack.weight_bytes                   # lm_head weight dtype (QLoRA keeps it 16-bit)
    head_grad = V * H * head_w if stack.base_trainable else 0
    if kind == "hf":
        upcast = 4 * TV if logit == 2 else 0          # logits.float(); a no-op when the logits are fp32
        fwd = logit * TV + upcast                     # logits + fp32 copy alive while log_softmax runs
        if stack.fp32_logits_copy and logit == 2:
            fwd = max(fwd, logit * TV + 4 * TV)       # accelerate convert_outputs_to_fp32 after forward
        if stack.keeps_logits:
            # A loop that holds the model's output through backward (Answer.AI fsdp_qlora train.py), with the
            # model's own `logits = logits.float()` (transformers' Llama of early 2024): the fp32 logits stay; the
            # loss reads `logits[..., :-1, :].contiguous()`, a second fp32 copy alive while log_softmax runs.
            return LossMemory(saved=8 * TV + softcap, forward_extra=4 * TV, backward_extra=8 * TV, kept=4 * TV,
                              note="the model's fp32 logits, held by the loop through backward, + cross_entropy: "
                                   "fp32 log-softmax saved, 12·bs·V in its backward")
        return LossMemory(saved=4 * TV + softcap, forward_extra=fwd, backward_extra=8 * TV,
                          note="logits.float() + cross_entropy: fp32 log-softmax saved, 12·bs·V in its backward")
    if kind == "plain" and stack.fabric_fp32_output:
        saved, fwd, bwd = litgpt.full_logits_loss_bytes(TV)
        return LossMemory(saved=saved, forward_extra=fwd, backward_extra=bwd, kept=saved // 2,
                          note="LitGPT full logits behind Fabric: fp32 logits (kept by the loop), 128-row chunks of "
                               "fp32 cross-entropy (physics/litgpt.py)")
    if kind == "plain":
        # cross_entropy = log_softmax + nll_loss. log_softmax saves only its output; nothing saves the logits, and a
        # loop like `loss = F.cross_entropy(model(x).flatten(0, 1), y)` drops them, so they die after the forward.
        # Under autocast cross_entropy runs in fp32 (torch autocast's fp32 op list), on a cast of the logits.
        # LitGPT's and nanoGPT's loops keep `logits` in scope through backward: one more T x V tensor saved.
        ce = 4 if stack.autocast else logit
        cast = 4 * TV if ce != logit else 0
        kept = logit * TV if stack.keeps_logits else 0
        return LossMemory(saved=ce * TV + kept + softcap, forward_extra=(0 if kept else logit * TV) + cast, kept=kept,
                          backward_extra=2 * ce * TV + (logit * TV if cast else 0),
                          note="cross_entropy on the logits as they are: log-softmax saved, logits freed by the loop")
    if kind == "chunked-fp32":
        # torchtune LinearCrossEntropyLoss: ignored tokens masked out (a copy of the hidden states, saved by the
        # output projection), then per chunk output(hidden).float() -> cross_entropy, whose fp32 log-softmax is saved.
        chunk = TV // TORCHTUNE_CHUNKS
        if stack.compiled:
            # With compile=True every torchtune recipe compiles each chunk's cross-entropy in place (see
            # COMPILED_CE_ROW_BYTES): the chunk's logits are saved in their own dtype with two fp32 numbers per row,
            # and its backward is one fused kernel that writes the chunk's gradient in the logits' dtype.
            return LossMemory(saved=logit * TV + COMPILED_CE_ROW_BYTES * T + T * H * hidden_b + softcap,
                              forward_extra=0, backward_extra=logit * chunk,
                              note=f"torchtune chunked cross-entropy ({TORCHTUNE_CHUNKS} chunks) compiled: each "
                                   "chunk's logits kept in their dtype, no fp32 log-softmax")
        return LossMemory(saved=4 * TV + T * H * hidden_b + softcap, forward_extra=(logit + 4) * chunk,
                          backward_extra=8 * chunk + logit * chunk,
                          note=f"torchtune LinearCrossEntropyLoss ({TORCHTUNE_CHUNKS} chunks, fp32 log-softmax of "
                               "each kept for backward)")
    if kind == "chunked-kept" and stack.fabric_fp32_output:
        saved, fwd, bwd = litgpt.chunked_loss_bytes(spec, T, setup.batch_size * min(LITGPT_CHUNK_TOKENS, setup.seq_len),
                                                    stack)
        return LossMemory(saved=saved, forward_extra=fwd, backward_extra=bwd, kept=saved // 2,
                          note="LitGPT chunked lm_head + cross-entropy behind Fabric: fp32 logit chunks (kept by "
                               "the loop) and fp32 log-softmax (physics/litgpt.py)")
    if kind == "chunked-kept":
        chunk = setup.batch_size * min(LITGPT_CHUNK_TOKENS, setup.seq_len) * V
        return LossMemory(saved=2 * logit * TV + softcap, forward_extra=0, backward_extra=2 * logit * chunk,
                          kept=logit * TV,
                          note="LitGPT chunked lm_head + cross-entropy in the logits dtype; logit chunks stay "
                               "alive through backward")
    if kind == "liger":
        # liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py: grad_input (zeros_like the input, :89) and, when the
        # head trains, grad_weight (zeros_like the weight, :93) are filled in the forward and saved (:574-578); each
        # chunk's logits come from `_input_chunk @ weight.t()` (:163) and the previous chunk's are still referenced
        # when the next is computed; grad_input's slice is `grad_logits_chunk @ weight` (:323). The caller's shifted
        # hidden states are a .contiguous() copy (transformers/model/loss_utils.py LigerForCausalLMLoss).
        chunk = liger_chunk_tokens(T, V, H)
        cb = stack.compute_bytes
        return LossMemory(saved=T * H * hidden_b + head_grad + 4 * T,
                          forward_extra=T * H * hidden_b + 2 * chunk * V * cb + chunk * H * cb, backward_extra=0,
                          note=f"Liger fused linear cross-entropy: {chunk}-token logit chunks, the gradients computed "
                               "in the forward and kept")
    if kind == "unsloth":
        # unsloth-zoo fused linear cross-entropy: grad_hidden (empty_like the hidden states) and the head's gradient
        # are computed chunk by chunk in the forward and saved (chunked_logprob.py:366-393).
        chunk = unsloth_chunk_tokens(T, V)
        return LossMemory(saved=T * H * hidden_b + head_grad,
                          forward_extra=UNSLOTH_BYTES_PER_LOGIT * chunk * V, backward_extra=0,
                          note=f"unsloth fused cross-entropy: {chunk}-token chunks (at most 2 GiB of logits), "
                               "gradients computed in the forward")
    if kind == "trl-chunked-nll":
        # huggingface/trl@f2cd577 sft_trainer.py:117-240: the labelled hidden states are reordered (a copy, :203)
        # and each 256-token chunk runs `_chunk` under torch.utils.checkpoint, so only the copy is saved. `_chunk`
        # makes w.float(): a transient fp32 copy of lm_head unless it already is fp32, alive during the chunk's
        # matmul in the forward and saved by it during the recomputed chunk's backward. Each chunk's slice
        # backward returns a full-size zero-filled grad that autograd adds into the copy's grad (2·T·H). A trained
        # head also gets w.float()'s fp32 grad, its cast back and the accumulated .grad.
        w32 = V * H * 4 if head_w != 4 else 0
        chunk = min(T, TRL_NLL_CHUNK_TOKENS) * V * 4
        head = V * H * (4 + 2 * head_w) if stack.base_trainable else 0
        return LossMemory(saved=T * H * hidden_b,
                          forward_extra=max(w32 + chunk, TRL_NLL_FWD_CHUNK_TENSORS * chunk),
                          backward_extra=w32 + TRL_NLL_BWD_CHUNK_TENSORS * chunk + 2 * T * H * hidden_b + head,
                          note=f"TRL chunked_nll: {TRL_NLL_CHUNK_TOKENS}-token chunks of h.float() @ w.float().t() "
                               "under checkpointing; a transient fp32 copy of lm_head")
    if kind == "trl-fused-head":
        # trl 1.16.0 trl/trainer/utils.py:1548-1640 add_fused_lm_head and trl/kernels/chunked_logprob.py:300-460:
        # the labelled hidden states (hidden_states[mask], a copy) are saved; one [4096, 32768] tile buffer in the
        # compute dtype (:347, :413); the backward accumulates grad_hidden (and grad_weight when the head trains)
        # in fp32 (:406-412) and casts them back at the end (:456-457) while the fp32 ones are alive.
        cb = stack.compute_bytes
        tile = min(T, TRL_TILE_TOKENS) * TRL_TILE_VOCAB * cb
        # The casts back are no-ops when the weight or the hidden states already are fp32 (Tensor.to, same dtype).
        head = V * H * (4 + (head_w if head_w != 4 else 0)) if stack.base_trainable else 0
        # When lm_head or the hidden states are not in the compute dtype (fp32 or fp16 weights under bf16
        # autocast), each vocabulary chunk of lm_head and each token chunk of the hidden states is cast while it is
        # used (chunked_logprob.py:354-357 inline in forward). In backward the loop variables w_chunk and
        # hidden_chunk (:416-419) still hold the previous chunk's cast while the next one is made: two at once.
        compute = stack.autocast_dtype if stack.autocast else stack.weight_dtype
        hidden_dtype = "fp32" if hidden_b == 4 else stack.weight_dtype
        w_cast, h_cast = stack.weight_dtype != compute, hidden_dtype != compute
        casts = (min(V, TRL_TILE_VOCAB) * H * cb if w_cast else 0) + (min(T, TRL_TILE_TOKENS) * H * cb if h_cast else 0)
        bwd_casts = (min(V, 2 * TRL_TILE_VOCAB) * H * cb if w_cast else 0) + \
            (min(T, 2 * TRL_TILE_TOKENS) * H * cb if h_cast else 0)
        return LossMemory(saved=T * H * hidden_b + 4 * TRL_TOKEN_SAVED * T,
                          forward_extra=tile + 4 * TRL_TOKEN_STATS * T + casts,
                          backward_extra=tile + T * H * (4 + (hidden_b if hidden_b != 4 else 0)) + head + 8 * T
                          + bwd_casts,
                          note="TRL fused LM head: 4096 x 32768 logit tiles, fp32 gradient accumulators")
    raise ValueError(f"unknown loss kind {kind!r}")
