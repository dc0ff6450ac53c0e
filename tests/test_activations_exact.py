"""Per-layer saved bytes equal the byte-exact autograd measurements of research/memory-physics.md §9.1.

Those numbers were measured with saved_tensors_hooks on a real HF Llama layer (h=512, i=1408, a=8, k=2, d=64,
b=2, s=256). The op-level walk in physics/activations.py must reproduce each one to the byte.
"""

import pytest

from memfit.physics.activations import layer_activation_bytes
from memfit.physics.stack import resolve_stack
from memfit.setup import TrainingSetup
from memfit.estimator import _static_parts

from conftest import ALL7, small_llama

B, S = 2, 256
CASES = [
    # (label, setup overrides, checkpoint dtype, expected bytes from §9.1)
    ("full bf16 sdpa", dict(method="full", precision="bf16"), 11_292_672),
    ("full bf16 sdpa padding", dict(method="full", precision="bf16", padding=True), 12_341_248),
    ("full bf16 eager", dict(method="full", precision="bf16", attn="eager"), 18_354_176),
    ("full fp32+autocast sdpa", dict(method="full", precision="bf16-mixed"), 13_914_112),
    ("full pure fp32 sdpa", dict(method="full", precision="fp32"), 20_467_712),
    ("lora r16 all-7 bf16 no autocast", dict(method="lora", precision="bf16", lora_rank=16, lora_targets=ALL7),
     17_158_144),
    ("qlora no prepare", dict(method="qlora", precision="bf16", lora_rank=16, lora_targets=ALL7), 17_158_144),
    ("qlora + prepare, no autocast", dict(method="qlora", precision="bf16", lora_rank=16, lora_targets=ALL7,
                                          kbit_upcast=True), 18_599_936),
]


@pytest.mark.parametrize("label,overrides,expected", CASES, ids=[c[0] for c in CASES])
def test_layer_saved_bytes_match_autograd(label, overrides, expected):
    spec = small_llama()
    setup = TrainingSetup(batch_size=B, seq_len=S, **overrides)   # explicit precision: no autocast
    stack = resolve_stack(spec, setup)
    assert layer_activation_bytes(spec, setup, stack) == expected


def test_lora_autocast_includes_adapter_casts():
    # §9.1: "LoRA, autocast: 12,746,752 (incl. 290,816 adapter casts)": HF Trainer bf16=True on a bf16 model.
    spec = small_llama()
    setup = TrainingSetup(batch_size=B, seq_len=S, method="lora", lora_rank=16, lora_targets=ALL7)  # hf, auto
    stack = resolve_stack(spec, setup)
    assert stack.autocast
    casts = _static_parts(spec, setup)["casts"] // spec.num_layers
    assert casts == 290_816
    assert layer_activation_bytes(spec, setup, stack) + casts == 12_746_752


def test_qlora_prepare_autocast():
    spec = small_llama()
    setup = TrainingSetup(batch_size=B, seq_len=S, method="qlora", lora_rank=16, lora_targets=ALL7,
                          kbit_upcast=True)
    stack = resolve_stack(spec, setup)
    casts = _static_parts(spec, setup)["casts"]
    adapter_casts = casts - 2 * spec.vocab_size * spec.hidden_size
    assert layer_activation_bytes(spec, setup, stack) + adapter_casts // spec.num_layers == 17_072_128


def test_mixed_precision_weight_casts_per_layer():
    # §9.1: fp32 + autocast saves 5,636,096 B of bf16 weight casts per layer (2 B x the layer's matmul weights).
    spec = small_llama()
    setup = TrainingSetup(batch_size=B, seq_len=S, method="full", precision="bf16-mixed")
    parts = _static_parts(spec, setup)
    assert parts["layer_casts"] == 5_636_096
