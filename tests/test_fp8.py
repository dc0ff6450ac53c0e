"""`--precision fp8` (torchao float8 training): what shrinks and what does not (physics/fp8.py)."""

from __future__ import annotations

import pytest

from memfit import TrainingSetup, estimate
from memfit.errors import InvalidSetupError
from memfit.params import layer_linears
from memfit.physics import fp8

from conftest import small_llama

SAME = ("weights", "gradients", "optimizer state", "activations", "checkpoints", "logits and loss",
        "embedding and head activations")


def pair(**kw):
    spec = small_llama()
    base = dict(method="full", batch_size=2, seq_len=512, **kw)
    return (spec, estimate(spec, TrainingSetup.from_recipe("torchtune", precision="bf16", **base)),
            estimate(spec, TrainingSetup.from_recipe("torchtune", precision="fp8", **base)))


def test_fp8_keeps_bf16_weights_states_and_activations():
    spec, bf16, f8 = pair()
    for name in SAME:
        assert f8.component(name) == bf16.component(name), name
    # Only the float8 copies of one linear's backward are added (the largest linear here is gate/up/down).
    setup = TrainingSetup.from_recipe("torchtune", precision="fp8", method="full", batch_size=2, seq_len=512)
    temp = fp8.matmul_temp_bytes(spec, setup)
    tokens = 2 * 512
    assert temp == max(tokens * (lin.d_in + lin.d_out) + lin.d_in * lin.d_out for lin in layer_linears(spec))
    phases_bf16, phases_f8 = dict(bf16.phases), dict(f8.phases)
    assert phases_f8["layer backward (top)"] - phases_bf16["layer backward (top)"] == temp
    assert phases_f8["optimizer step"] == phases_bf16["optimizer step"]


def test_fp8_halves_the_fsdp_all_gather_of_linear_weights():
    spec, bf16, f8 = pair(gpus=8, shard="fsdp")
    linear = sum(lin.weight_params for lin in layer_linears(spec))
    # Between layers one layer is gathered: its linear weights go from 2 B to 1 B per element.
    assert dict(bf16.phases)["optimizer step"] - dict(f8.phases)["optimizer step"] == linear
    assert f8.component("weights") == bf16.component("weights")


def test_fp8_is_refused_where_it_is_not_modelled():
    with pytest.raises(InvalidSetupError, match="fp8"):
        TrainingSetup.from_recipe("hf", method="lora", precision="fp8")


def test_torchao_float8_linear_saves_the_high_precision_input():
    """torchao's Float8Linear saves what a bf16 nn.Linear saves (its bf16 input and weight): no activation
    saving. Runs where torchao is installed (it is not in the test extra: importing it prints warnings about
    its CUDA-only extensions on CPU machines)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from torch import nn
    from torchao.float8 import convert_to_float8_training

    def saved(model, x):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.untyped_storage().nbytes()) or t,
                                                      lambda t: t):
            model(x).sum().backward()
        return sorted(sizes)

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False)).to(torch.bfloat16)

    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    assert saved(convert_to_float8_training(make()), x) == saved(make(), x)
