"""LitGPT's LLaMA-Adapter (v1) and LLaMA-Adapter v2: what each keeps in memory, read from Lightning-AI/lit-gpt at
0f021f3a (the commit that published the adapter rows of tutorials/resource-tables.md): lit_gpt/adapter.py,
lit_gpt/adapter_v2.py, finetune/adapter.py, finetune/adapter_v2.py.

v1 (adapter.py:104-149): from layer `adapter_start_layer` (2) on, every attention gets a trainable prompt
`adapter_wte` (adapter_prompt_length = 10 rows of n_embd) and a gate `gating_factor` (1, 1, n_head, 1); the prompt
goes through the frozen qkv projection, and a second SDPA of the queries over the prompt's keys and values is added,
gated, to the attention output: `y + gating_factor * ay`. The layers before the first adapter have nothing that
needs a gradient and save nothing; the first adapted layer's input needs none either, so its attention saves only
what the prompt's SDPA keeps.

v2 (adapter_v2.py): v1 plus, in every layer and in lm_head, each Linear becomes AdapterV2Linear
`adapter_scale * (linear(x) + adapter_bias)` (scale and bias: out each, trainable), and every norm (norm_1, norm_2,
ln_f) trains (adapter_filter:24-33). The scale's gradient needs the pre-scale output, so each Linear keeps an
out-wide tensor per token, lm_head a vocabulary-wide one.

PEFT's `adaption_prompt` is LLaMA-Adapter for transformers models, but its forward differs (an eager matmul over the
prompt, scores kept in fp32): it is not what these records price.
"""

from __future__ import annotations

from ..params import layer_linears
from ..spec import ModelSpec

# lit_gpt/adapter.py:25-27 Config defaults (finetune/adapter.py does not change them).
PROMPT_LENGTH = 10
START_LAYER = 2


def adapted_layers(spec: ModelSpec) -> int:
    """Layers that carry a prompt and a gate (block_idx >= adapter_start_layer)."""
    return max(0, spec.num_layers - START_LAYER)


def extra_params(spec: ModelSpec, method: str) -> tuple[tuple[int, int], ...]:
    """(elements, count) of the trainable tensors. Checked against the published trainable-parameter counts:
    StableLM-Alpha 3B 573,888 (v1) / 2,125,248 (v2), Llama 2 7B 1,229,760 / 4,279,744."""
    n = adapted_layers(spec)
    out = [(PROMPT_LENGTH * spec.hidden_size, n), (spec.num_heads, n)]      # adapter_wte, gating_factor
    if method == "llama-adapter-v2":
        L = spec.num_layers
        out += [(lin.d_out * lin.copies, 2 * L) for lin in layer_linears(spec)]   # adapter_bias, adapter_scale
        out.append((spec.vocab_size, 2))                                        # lm_head's
        per_norm = spec.hidden_size * (2 if spec.norm_bias else 1)
        out.append((per_norm, L * spec.norms_per_layer + 1))                     # norm_1, norm_2, ln_f
    return tuple(out)


def prompt_attention_per_token(spec: ModelSpec, cmp: int) -> int:
    """What the prompt's SDPA adds per token in a layer whose queries are already saved: its output ay (which
    `gating_factor * ay` saves too, the same storage) and its fp32 logsumexp. The boolean (T, prompt) mask makes
    it a memory-efficient-attention call; the prompt's keys and values are 10 rows."""
    return cmp * spec.q_dim + 4 * spec.num_heads


def layer_coefficients(spec: ModelSpec, method: str, frozen: tuple[int, int], cmp: int,
                       attention_saved: int) -> tuple[int, int]:
    """Bytes per token (and per token per position) one layer saves, averaged over the layers that save any.
    `frozen`: a frozen layer whose input needs a gradient (the walk without adapters; with trainable norms for
    v2). `attention_saved`: what that walk counts for the input norm and the base SDPA, which v1's first adapted
    layer does not save (its input needs no gradient)."""
    per_token, per_position = frozen
    extra = prompt_attention_per_token(spec, cmp)
    if method == "llama-adapter-v2":
        # Every layer: each AdapterV2Linear's pre-scale output; layers with a prompt: its attention.
        outputs = cmp * sum(lin.d_out * lin.copies for lin in layer_linears(spec))
        n = adapted_layers(spec)
        return per_token + outputs + round(extra * n / spec.num_layers), per_position
    n = adapted_layers(spec)
    if n == 0:
        return 0, 0
    # The first adapted layer: the prompt's SDPA saves the queries (q_dim) it shares with nothing, the rest of the
    # layer (after `y + gating_factor * ay` needs a gradient) saves what a frozen layer does.
    first = per_token - attention_saved + cmp * spec.q_dim + extra
    return round(((n - 1) * (per_token + extra) + first) / n), per_position


def lm_head_per_token(spec: ModelSpec, method: str, cmp: int) -> int:
    """v2's lm_head is an AdapterV2Linear: its scale keeps the pre-scale logits (vocabulary-wide, 16-bit)."""
    return cmp * spec.vocab_size if method == "llama-adapter-v2" else 0
