"""Logits and loss: the V-sized tensors that are often the whole step's peak (research/memory-physics.md §4.1).

HF's ForCausalLMLoss does logits.float() then cross_entropy, which saves the fp32 log-softmax (4·bs·V). During
its backward three fp32 bs×V buffers are alive (saved log-softmax, nll grad, log_softmax_backward result):
12·bs·V. Chunked losses (torchtune, LitGPT) and fused linear-cross-entropy kernels (Liger, Unsloth) keep far less.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..setup import TrainingSetup
from ..spec import ModelSpec
from .stack import Stack

TORCHTUNE_CHUNKS = 8          # torchtune CEWithChunkedOutputLoss(num_output_chunks=8)
LITGPT_CHUNK_TOKENS = 128     # litgpt lm_head_chunk_size=128 (finetune/lora.py)


@dataclass(frozen=True)
class LossMemory:
    saved: int           # kept from the loss forward until its backward (log-softmax, kept logits, tanh output)
    forward_extra: int   # transient on top of `saved` at the end of the forward
    backward_extra: int  # transient on top of `saved` during the cross-entropy backward
    note: str


def loss_memory(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> LossMemory:
    T, V = setup.batch_size * setup.seq_len, spec.vocab_size
    TV = T * V
    logit = stack.logits_bytes
    softcap = logit * TV if spec.final_logit_softcap else 0   # Gemma 2: tanh(logits / cap) saves its output
    kind = stack.loss_kind
    if kind == "hf":
        upcast = 4 * TV if logit == 2 else 0          # logits.float(); a no-op when the logits are fp32
        fwd = logit * TV + upcast                     # logits + fp32 copy alive while log_softmax runs
        if stack.fp32_logits_copy and logit == 2:
            fwd = max(fwd, logit * TV + 4 * TV)       # accelerate convert_outputs_to_fp32 after forward
        return LossMemory(saved=4 * TV + softcap, forward_extra=fwd, backward_extra=8 * TV,
                          note="logits.float() + cross_entropy: fp32 log-softmax saved, 12·bs·V in its backward")
    if kind == "plain":
        # F.cross_entropy on the logits' own dtype; the loop keeps `logits` alive through backward (nanoGPT).
        return LossMemory(saved=2 * logit * TV + softcap, forward_extra=0, backward_extra=2 * logit * TV,
                          note="cross_entropy in the logits dtype; logits kept by the training loop")
    if kind == "chunked-fp32":
        chunk = TV // TORCHTUNE_CHUNKS
        return LossMemory(saved=4 * TV + softcap, forward_extra=logit * TV + 4 * chunk,
                          backward_extra=8 * chunk + logit * chunk,
                          note=f"chunked cross-entropy ({TORCHTUNE_CHUNKS} chunks, fp32 per chunk, logits freed "
                               "before backward)")
    if kind == "chunked-kept":
        chunk = setup.batch_size * min(LITGPT_CHUNK_TOKENS, setup.seq_len) * V
        return LossMemory(saved=2 * logit * TV + softcap, forward_extra=0, backward_extra=2 * logit * chunk,
                          note="LitGPT chunked lm_head + cross-entropy in the logits dtype; logit chunks stay "
                               "alive through backward")
    # fused linear cross-entropy: logits exist one chunk at a time; the hidden-state grad is kept.
    chunk_elems = T * spec.hidden_size
    return LossMemory(saved=stack.compute_bytes * T * spec.hidden_size, forward_extra=(logit + 8) * chunk_elems,
                      backward_extra=0,
                      note="fused linear + cross-entropy: chunks of about bs·h logits, gradient computed in forward")
