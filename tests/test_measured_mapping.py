"""How benchmarks/accuracy_vs_measured.py maps a published LitGPT row to a setup: gradient accumulation comes from
the config that produced the row (the CSV has no column for it), and with it full fine-tuning holds the previous
micro-batch's gradients through the next forward, as litgpt@26857050 finetune/full.py:280-291 does (optimizer.step()
and zero_grad() only when not is_accumulating)."""

import importlib.util
from pathlib import Path

from memfit import TrainingSetup, estimate
from memfit.spec import ModelSpec

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("accuracy_vs_measured", ROOT / "benchmarks" / "accuracy_vs_measured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_single_device_litgpt_full_row_takes_its_configs_accumulation():
    bench = _bench()
    # config_hub/finetune/tiny-llama/full.yaml@26857050: global_batch_size 32, micro_batch_size 4, devices 1
    row = {"id": "LGC-36", "group": "LGC", "framework": "litgpt", "shard": "none", "micro_batch": "4"}
    assert bench.litgpt_grad_accum(row) == 8
    assert bench.litgpt_grad_accum(dict(row, framework="hf")) == 1
    # LG FSDP rows: lit-gpt@0cc02afa finetune/lora.py batch_size 128 // micro_batch_size
    assert bench.litgpt_grad_accum({"id": "LG-31", "group": "LG", "framework": "litgpt", "shard": "fsdp",
                                    "micro_batch": "1"}) == 128


def test_accumulating_full_finetune_holds_the_gradients_through_the_forward():
    config = dict(model_type="llama", hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=32, vocab_size=1000,
                  torch_dtype="bfloat16", tie_word_embeddings=False)
    spec = ModelSpec.from_hf_config(config, name="tiny", source="test")
    one, eight = (estimate(spec, TrainingSetup.from_recipe("litgpt-0.4", method="full", batch_size=4, seq_len=64,
                                                           precision="bf16", grad_accum=n)) for n in (1, 8))
    forward = lambda est: dict(est.phases)["forward (end)"]  # noqa: E731
    assert forward(eight) - forward(one) == spec.params * 2   # bf16-true gradients, one per parameter
