"""LoRA on the token embedding and on lm_head (`--lora-targets ...,embed,head`): PEFT's lora.Embedding and its
lora.Linear on the output projection, outside the decoder layers.

- **embed** -- peft 0.21 tuners/lora/layer.py ``Embedding``: ``lora_embedding_A`` [r, V] and ``lora_embedding_B``
  [h, r]; forward ``after_A = F.embedding(x, lora_embedding_A.T)`` then ``result + (after_A @ lora_embedding_B.T) *
  scaling``. Saved: the int64 indices (F.embedding's backward needs them) and after_A, r values a token, for B's
  gradient. No dropout is applied to embedding adapters. The embedding output now needs a gradient, so the first
  layer's input norm saves its input as every other layer's does (physics/activations.py head_coefficient).
- **head** -- ``Linear.forward`` on lm_head: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``,
  ``result = result + lora_B(lora_A(dropout(x))) * scaling``, ``result.to(torch_result_dtype)``. Saved as for any
  adapted linear (the walk's LoRA rule on the final norm output); under autocast the 16-bit copies of its A and B
  stay saved even with checkpointing (the head is outside the checkpointed layers). Its vocabulary-sized
  transients (lora_B's output, the scaled copy, the promoted sum) come and go in the forward and in the head's
  backward, after the cross-entropy backward's larger buffers are freed: the trace (tests/test_lora_outer.py)
  puts the peak in the cross-entropy backward with them, so no term is added for them.
"""

from __future__ import annotations

from ..params import Linear
from ..setup import TrainingSetup
from ..spec import ModelSpec

OUTER_TARGETS = ("embed", "head")


def outer_linears(spec: ModelSpec, setup: TrainingSetup) -> tuple[Linear, ...]:
    """The embedding and lm_head as LoRA sees them (d_in x d_out: params r * (d_in + d_out) either way)."""
    targets = set(setup.lora_targets or ())
    out = []
    if "embed" in targets:
        out.append(Linear("embed_tokens", spec.vocab_size, spec.hidden_size, False, ("embed",)))
    if "head" in targets:
        out.append(Linear("lm_head", spec.hidden_size, spec.vocab_size, False, ("head",)))
    return tuple(out)


def embed_saved_per_token(rank: int, adapter_bytes: int, autocast: bool) -> int:
    """int64 indices + after_A as the matmul with lora_embedding_B saves it (its bf16 cast under autocast)."""
    return 8 + rank * (2 if autocast else adapter_bytes)


def uncast_params(outer_lora) -> int:
    """Adapter parameters autocast never casts: lora_embedding_A is read by F.embedding, not a matmul."""
    return sum(m.rank * m.linear.d_in for m in outer_lora if m.linear.parts == ("embed",))


def cast_params(outer_lora) -> int:
    """Adapter parameters outside the layers that autocast casts for a matmul (lm_head's A and B, the embedding's
    B): their 16-bit copies are saved for backward outside any checkpointed layer."""
    return sum(m.params for m in outer_lora) - uncast_params(outer_lora)
