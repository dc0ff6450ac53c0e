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

v1 outside the LitGPT recipes is PEFT's `adaption_prompt` (peft 0.21.2 tuners/adaption_prompt/layer.py
AdaptedAttention.forward), the same method for transformers models, with LitGPT's prompt length and first layer
(adapter_len 10, adapter_layers = layers - 2). Its forward differs: it recomputes the rotary queries (q_proj and
rotary again, utils.py llama_compute_query_states), runs an eager matmul over the prompt with an fp32 softmax, and
gates the probabilities with one scalar per layer (adaption_gate) before the second matmul. PEFT implements it for
llama and mistral (and GPT-2's attention), config.py TRANSFORMERS_MODEL_CONFIG.
"""

from __future__ import annotations

from ..params import layer_linears
from ..spec import ModelSpec

# lit_gpt/adapter.py:25-27 Config defaults (finetune/adapter.py does not change them).
PROMPT_LENGTH = 10
START_LAYER = 2


# peft 0.21.2 tuners/adaption_prompt/config.py TRANSFORMERS_MODEL_CONFIG (GPT-2's wrapper is not modelled here).
PEFT_MODEL_TYPES = ("llama", "mistral")


def is_peft(setup) -> bool:
    """LLaMA-Adapter v1 outside the LitGPT recipes: PEFT's adaption_prompt."""
    return setup.method == "llama-adapter" and not setup.recipe.startswith("litgpt")


def adapted_layers(spec: ModelSpec) -> int:
    """Layers that carry a prompt and a gate (block_idx >= adapter_start_layer)."""
    return max(0, spec.num_layers - START_LAYER)


def extra_params(spec: ModelSpec, method: str, peft: bool = False) -> tuple[tuple[int, int], ...]:
    """(elements, count) of the trainable tensors. Checked against the published trainable-parameter counts:
    StableLM-Alpha 3B 573,888 (v1) / 2,125,248 (v2), Llama 2 7B 1,229,760 / 4,279,744. PEFT: adaption_prompt
    (1, adapter_len, hidden) and the scalar adaption_gate per adapted layer (layer.py _BaseAdaptedAttention)."""
    n = adapted_layers(spec)
    out = [(PROMPT_LENGTH * spec.hidden_size, n), (1 if peft else spec.num_heads, n)]   # prompt, gate
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


def peft_prompt_attention_per_token(spec: ModelSpec, cmp: int) -> int:
    """PEFT's adaption_prompt per token of an adapted layer: the recomputed rotary queries (saved by the matmul
    with the prompt's keys, which train), and per head and prompt position the fp32 softmax, its cast (saved by the
    gate's multiply) and the gated probabilities (saved by the matmul with the prompt's values)."""
    return cmp * spec.q_dim + (4 + 2 * cmp) * spec.num_heads * PROMPT_LENGTH


def peft_weight_cast_bytes(spec: ModelSpec, layers: int) -> int:
    """Under autocast with fp32 weights, the bf16 weight casts PEFT's adaption_prompt adds to a frozen layer's: k_proj
    and v_proj run again on the prompt, which trains (their casts saved in every adapted layer), and q_proj again
    on the layer input (saved where that input needs a gradient, not in the first adapted layer); that layer's
    o_proj reads an attention output that needs none either."""
    q, kv, o = _weights(spec, ("q",)), _weights(spec, ("k", "v")), _weights(spec, ("o",))
    return 2 * (layers * kv + max(layers - 1, 0) * q - (o if layers else 0))


def _weights(spec: ModelSpec, parts) -> int:
    return sum(lin.weight_params for lin in layer_linears(spec) if set(lin.parts) & set(parts))


def layer_coefficients(spec: ModelSpec, method: str, frozen: tuple[int, int], cmp: int,
                       attention_saved: int, peft: bool = False) -> tuple[int, int]:
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
    if peft:
        # Its queries are its own (recomputed), in the first adapted layer as in the others.
        extra = peft_prompt_attention_per_token(spec, cmp)
        return round(((n - 1) * (per_token + extra) + per_token - attention_saved + extra) / n), per_position
    # The first adapted layer: the prompt's SDPA saves the queries (q_dim) it shares with nothing, the rest of the
    # layer (after `y + gating_factor * ay` needs a gradient) saves what a frozen layer does.
    first = per_token - attention_saved + cmp * spec.q_dim + extra
    return round(((n - 1) * (per_token + extra) + first) / n), per_position


def lm_head_per_token(spec: ModelSpec, method: str, cmp: int) -> int:
    """v2's lm_head is an AdapterV2Linear: its scale keeps the pre-scale logits (vocabulary-wide, 16-bit)."""
    return cmp * spec.vocab_size if method == "llama-adapter-v2" else 0
