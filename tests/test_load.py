"""The model-load phase against a real transformers from_pretrained of a small random-weight checkpoint, and
against bitsandbytes' quantize-at-load (tests/load_measure_helper.py measures malloc's live bytes in a fresh
process; see its docstring for why that is what the GPU would hold)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit import TrainingSetup, estimate
from memfit.estimator import LOAD_PHASE
from memfit.physics import moe
from memfit.spec import ModelSpec

HELPER = Path(__file__).with_name("load_measure_helper.py")
DENSE = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 8000, "tie_word_embeddings": False}
MOE = {"model_type": "qwen3_moe", "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 384,
       "num_experts": 32, "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_attention_heads": 8,
       "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 8000, "tie_word_embeddings": False}


def measure(config: dict, save_dtype: str, load_dtype: str, quant: str | None = None) -> dict:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if quant:
        pytest.importorskip("bitsandbytes")
    if not sys.platform.startswith("linux"):
        pytest.skip("the measurement reads glibc's mallinfo2")
    job = {"config": config, "save_dtype": save_dtype, "load_dtype": load_dtype, "quant": quant}
    # mallinfo2 reports the main arena only (glibc malloc(3)): with one arena, allocations from transformers' loader
    # threads are counted too, instead of a share that depends on scheduling (a CI run read 2% low without it).
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1", MALLOC_ARENA_MAX="1")
    done = subprocess.run([sys.executable, str(HELPER), json.dumps(job)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_phase(config: dict, **setup) -> tuple[int, dict]:
    spec = ModelSpec.from_hf_config(dict(config, torch_dtype="bfloat16"), name="tiny", source="test")
    est = estimate(spec, TrainingSetup.from_recipe("hf", **setup))
    return dict(est.phases)[LOAD_PHASE], est


def test_full_precision_load_holds_the_weights_and_nothing_more():
    # A bf16 checkpoint read into fp32: every tensor is copied once into the parameter that keeps it.
    measured = measure(DENSE, "bfloat16", "float32")
    predicted, _ = load_phase(DENSE, method="full", precision="fp32")
    assert measured["state_dict_bytes"] == predicted       # the weights, exactly
    assert abs(measured["peak_bytes"] / predicted - 1) < 0.02


def test_moe_expert_stacking_transient():
    # Per-expert checkpoint tensors stacked into v5's 3-D parameters: one gate_up_proj beyond the weights.
    measured = measure(MOE, "bfloat16", "float32")
    spec = ModelSpec.from_hf_config(dict(MOE, torch_dtype="bfloat16"), name="tiny-moe", source="test")
    transient = moe.expert_stack_transient_params(spec) * 4
    assert abs((measured["peak_bytes"] - measured["state_dict_bytes"]) / transient - 1) < 0.1


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_qlora_quantize_at_load(config):
    # bitsandbytes NF4 at load: 16-bit reads quantized one module at a time; fused MoE experts are not nn.Linear
    # and stay in 16 bits.
    measured = measure(config, "float32", "bfloat16", quant="nf4")
    predicted, est = load_phase(config, method="qlora", quant="nf4", kbit_upcast=False)
    load = est.extra["load"]
    assert abs(measured["state_dict_bytes"] / (load["weights"] + load["quantization constants"]) - 1) < 0.02
    assert abs(measured["peak_bytes"] / predicted - 1) < 0.05


def test_verdict_uses_the_load_when_it_is_the_peak(capsys):
    # Mixtral "QLoRA" at a short length: the experts stay in bf16 and one layer's experts are stacked at load,
    # more than the step ever holds. The one fits rule then judges the load: 95 GiB would hold the step (94.2 GiB
    # on the device) but not the load (96.0 GiB).
    from memfit import load_model
    from memfit.cli import main

    setup = TrainingSetup.from_recipe("hf", method="qlora", seq_len=128)
    est = estimate(load_model("mixtral-8x7b"), setup)
    phases = dict(est.phases)
    assert est.peak_phase == LOAD_PHASE
    assert phases[LOAD_PHASE] == est.peak_allocated_bytes == sum(est.extra["load"].values())
    assert phases[LOAD_PHASE] > max(v for k, v in phases.items() if k != LOAD_PHASE)
    assert est.component("load temporaries") == moe.expert_stack_transient_params(load_model("mixtral-8x7b")) * 2
    assert main(["estimate", "mixtral-8x7b", "--method", "qlora", "--seq-len", "128", "--load-peak",
                 "--memory", "95GiB"]) == 0
    out = capsys.readouterr().out
    assert "the load is the peak" in out and "DOES NOT FIT" in out
    assert main(["estimate", "mixtral-8x7b", "--method", "qlora", "--seq-len", "128", "--format", "json"]) == 0
    load = json.loads(capsys.readouterr().out)["load"]
    assert load["allocated_bytes"] == phases[LOAD_PHASE]


def test_sharded_layouts_load_one_unit_at_a_time():
    spec = ModelSpec.from_hf_config(dict(DENSE, torch_dtype="bfloat16"), name="tiny", source="test")
    one = estimate(spec, TrainingSetup.from_recipe("hf", method="full", precision="bf16"))
    sharded = estimate(spec, TrainingSetup.from_recipe("hf", method="full", precision="bf16", gpus=4, shard="fsdp"))
    load = sharded.extra["load"]
    assert load["weights"] == one.extra["load"]["weights"] // 4
    assert 0 < load["load temporaries"] < one.extra["load"]["weights"]
