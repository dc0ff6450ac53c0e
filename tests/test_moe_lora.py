"""LoRA on transformers v5's fused 3-D MoE experts (`--lora-targets experts`, PEFT target_parameters), traced
with the real PEFT ParamWrapper on a tiny Qwen3-MoE config (fake tensors) against the analytic estimate."""

from __future__ import annotations

import statistics

import pytest

from memfit import TrainingSetup, estimate
from memfit.errors import InvalidSetupError
from memfit.options import parse_targets
from memfit.spec import ModelSpec

from conftest import small_llama

TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
            "num_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}
CELLS = [dict(method="lora", batch_size=2, seq_len=256, grad_ckpt=False),
         dict(method="lora", batch_size=2, seq_len=256, grad_ckpt=True),
         dict(method="lora", batch_size=1, seq_len=128, grad_ckpt=False, lora_targets=("experts",)),
         dict(method="qlora", batch_size=2, seq_len=256, grad_ckpt=True)]


def moe_spec() -> ModelSpec:
    return ModelSpec.from_hf_config(TINY_MOE, name="tiny-moe", source="test")


def test_experts_is_a_target_outside_all_linear():
    assert "experts" not in parse_targets("all-linear")
    assert parse_targets("all-linear,experts")[-1] == "experts"
    assert parse_targets("q,v,experts") == ("q", "v", "experts")


def test_expert_adapters_count_one_pair_per_expert():
    spec = moe_spec()
    without = estimate(spec, TrainingSetup.from_recipe("hf", method="lora", lora_targets=("q", "v")))
    with_experts = estimate(spec, TrainingSetup.from_recipe("hf", method="lora", lora_targets=("q", "v", "experts")))
    h, i, e, r, layers = 256, 256, 16, 8, 2
    # gate_up_proj [E, 2i, h] and down_proj [E, h, i]: r*E*(in + out) each (PEFT ParamWrapper).
    expected = layers * r * e * ((h + 2 * i) + (i + h))
    assert with_experts.trainable_params - without.trainable_params == expected


def test_expert_targets_rejected_where_they_cannot_apply():
    with pytest.raises(InvalidSetupError, match="dense"):
        estimate(small_llama(), TrainingSetup.from_recipe("hf", method="lora", lora_targets=("q", "experts")))
    with pytest.raises(InvalidSetupError, match="dropout"):
        TrainingSetup.from_recipe("hf", method="lora", lora_targets=("experts",), lora_dropout=0.05)


def test_expert_lora_estimate_matches_peft_trace():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec = moe_spec()
    errors = []
    for cell in CELLS:
        kw = {"lora_targets": ("q", "v", "experts"), **cell}
        setup = TrainingSetup.from_recipe("hf", **kw)
        est, measured = estimate(spec, setup), trace(spec, setup)
        assert est.trainable_params == measured.trainable_params
        errors.append(abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1))
    assert statistics.median(errors) <= 0.01, errors
    assert max(errors) <= 0.05, errors


def test_qlora_of_a_v5_moe_keeps_experts_16bit_as_the_trace_does():
    # The trace replaces only nn.Linear with 4-bit storage, as transformers' bitsandbytes integration does; the
    # estimate used to quantize the experts too and came out 23% low on this config.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec = moe_spec()
    setup = TrainingSetup.from_recipe("hf", method="qlora", batch_size=2, seq_len=256)
    est, measured = estimate(spec, setup), trace(spec, setup)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.02
