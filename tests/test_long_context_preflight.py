"""`memfit check` reads the long-context keys of axolotl, TRL and torchtune configs (preflight/long_context.py)."""

import json

import yaml

from memfit import estimate, load_model
from memfit.preflight import check_config
from memfit.preflight.edits import edits_for


def _yaml(tmp_path, data, name="config.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


AXOLOTL = {"base_model": "meta-llama/Llama-3.1-8B", "adapter": "lora", "lora_r": 16, "lora_target_linear": True,
           "sequence_len": 65536, "micro_batch_size": 1, "gradient_checkpointing": True, "flash_attention": True,
           "bf16": "auto", "optimizer": "adamw_bnb_8bit", "context_parallel_size": 4, "activation_offloading": True}


def test_axolotl_context_parallel_and_offload_are_estimated(tmp_path):
    result = check_config(_yaml(tmp_path, AXOLOTL), gpus=8)
    s = result.setup
    assert (s.cp, s.activation_offload, s.ckpt_offload, s.recipe) == (4, True, True, "axolotl")
    assert result.estimate.device_bytes == estimate(load_model("meta-llama/Llama-3.1-8B"), s).device_bytes
    old = dict(AXOLOTL, sequence_parallel_degree=2)
    del old["context_parallel_size"]
    assert check_config(_yaml(tmp_path, old, "old.yml"), gpus=8).setup.cp == 2


def test_trl_and_torchtune_activation_offload(tmp_path):
    trl = {"model_name_or_path": "Qwen/Qwen2.5-7B", "per_device_train_batch_size": 1, "max_length": 32768,
           "gradient_checkpointing": False, "activation_offloading": True, "bf16": True}
    path = tmp_path / "trl.json"
    path.write_text(json.dumps(trl))
    assert check_config(str(path)).setup.activation_offload is True
    tt = {"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_rank": 8},
          "tokenizer": {"max_seq_len": 16384}, "optimizer": {"_component_": "torch.optim.AdamW", "fused": True},
          "loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"}, "batch_size": 1,
          "enable_activation_checkpointing": True, "enable_activation_offloading": True, "dtype": "bf16"}
    s = check_config(_yaml(tmp_path, tt, "tt.yaml")).setup
    assert s.activation_offload and s.ckpt_offload


def test_an_offload_suggestion_is_written_in_the_tools_key():
    assert edits_for("torchtune", {"activation_offload": True}, {})[0] == {"enable_activation_offloading": True}
    assert edits_for("axolotl", {"cp": 2}, {})[0] == {"context_parallel_size": 2}
