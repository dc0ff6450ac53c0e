"""bitsandbytes < 0.43.2 (LitGPT <= 0.5.4 pins 0.42.0): MatMul4Bit keeps each 4-bit linear's input for backward.

bitsandbytes@0.42.0 autograd/_functions.py:522-523 ``ctx.tensors = (A, B)``; 0.43.2 keeps ``(None, B)``
(bitsandbytes@9e753741). The count below is read from LitGPT's LLaMA block (litgpt@e5493986 litgpt/model.py:
norm_1 -> qkv, attention output reshaped -> proj, norm_2 -> fc_1 and fc_2, silu(fc_1) * fc_2 -> mlp.proj): four
distinct linear inputs per layer, three of width hidden and one of width intermediate, each a new bf16 tensor no
other op saves when LoRA dropout is on (lora_A then saves the dropout's output, not the input)."""

import dataclasses

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.recipes import RECIPES

BF16_BYTES = 2


def _setup(recipe, **kw):
    base = dict(recipe=recipe, method="qlora", batch_size=2, seq_len=512, lora_rank=16, lora_targets=("q", "v"))
    base.update(kw)
    return TrainingSetup(**base)


def _activations(spec, recipe, **kw):
    return estimate(spec, _setup(recipe, **kw)).component("activations")


@pytest.mark.parametrize("model", ["llama-2-7b", "tinyllama-1.1b"])
def test_each_layer_keeps_its_linear_inputs(model):
    spec = load_model(model)
    tokens = 2 * 512
    h, ffn = spec.hidden_size, spec.intermediate_size
    extra = _activations(spec, "litgpt-0.4") - _activations(spec, "litgpt")
    assert extra == spec.num_layers * tokens * (3 * h + ffn) * BF16_BYTES


def test_without_dropout_lora_a_already_saves_the_attention_input():
    """LoRA on q and v with dropout 0: lora_A saves norm_1's output itself (litgpt/lora.py LoRAQKVLinear), the
    tensor MatMul4Bit keeps for qkv: only proj, fc and mlp.proj inputs are new."""
    spec = load_model("llama-2-7b")
    h, ffn = spec.hidden_size, spec.intermediate_size
    extra = _activations(spec, "litgpt-0.4", lora_dropout=0.0) - _activations(spec, "litgpt", lora_dropout=0.0)
    assert extra == spec.num_layers * 2 * 512 * (2 * h + ffn) * BF16_BYTES


def test_only_bitsandbytes_4bit_qlora_pays():
    spec = load_model("llama-2-7b")
    assert _activations(spec, "litgpt-0.4", method="lora") == _activations(spec, "litgpt", method="lora")
    for quant in ("gptq-int4", "int8"):
        assert _activations(spec, "litgpt-0.4", quant=quant) == _activations(spec, "litgpt", quant=quant)
    old = estimate(spec, _setup("litgpt-0.4"))
    assert any("bitsandbytes 0.42" in a for a in old.assumptions)
    assert not any("bitsandbytes 0.42" in a for a in estimate(spec, _setup("litgpt")).assumptions)


def test_litgpt_0_4_differs_from_litgpt_only_in_the_bitsandbytes_fact():
    """The versioned recipe must track the current one in every other default (a fact written once each)."""
    old, new = RECIPES["litgpt-0.4"], RECIPES["litgpt"]
    differing = {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}
    assert differing == {"name", "description", "sources", "bnb4_saves_input"}
    assert old.bnb4_saves_input and not new.bnb4_saves_input


def test_parallel_block_keeps_its_one_normed_input_once():
    """Phi-2's block feeds qkv and fc from one layernorm output (litgpt@e5493986 config.py:1514
    shared_attention_norm=True; model.py:193-198 reuses x_normed): three distinct inputs (hidden, hidden, ffn)."""
    spec = load_model("phi-2")
    assert spec.parallel_attn_mlp
    h, ffn = spec.hidden_size, spec.intermediate_size
    extra = _activations(spec, "litgpt-0.4") - _activations(spec, "litgpt")
    assert extra == spec.num_layers * 2 * 512 * (2 * h + ffn) * BF16_BYTES


def test_parallel_block_with_two_norms_keeps_both_inputs():
    """GPT-NeoX (stablelm-base-alpha) runs attention and MLP in parallel from two norms (litgpt@e5493986
    model.py:198 norm_2(x) when shared_attention_norm is False): four distinct inputs, as in a sequential block."""
    spec = load_model("pythia-1b")
    assert spec.parallel_attn_mlp and spec.norms_per_layer == 2
    h, ffn = spec.hidden_size, spec.intermediate_size
    extra = _activations(spec, "litgpt-0.4") - _activations(spec, "litgpt")
    assert extra == spec.num_layers * 2 * 512 * (3 * h + ffn) * BF16_BYTES
