"""`memfit check`: configs of five tools read key by key, estimated, and fixed by edits in their own keys."""

import json

import pytest
import yaml

from memfit import estimate, load_hardware, load_model
from memfit.cli import main
from memfit.errors import InvalidSetupError, SourceError, UnknownModelError
from memfit.preflight import check_config
from memfit.preflight.check import write_suggested

# Modelled on each tool's published examples (axolotl examples/llama-3/lora-8b.yml, LLaMA-Factory
# examples/train_lora/llama3_lora_sft.yaml, torchtune recipes/configs/llama3_1/8B_lora_single_device.yaml,
# TRL's sft.py arguments, mlx-lm lora_config.yaml).
CONFIGS = {
    "axolotl": ("yml", {
        "base_model": "meta-llama/Llama-3.1-8B", "load_in_8bit": False, "load_in_4bit": False, "adapter": "lora",
        "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05, "lora_target_linear": True, "sequence_len": 4096,
        "sample_packing": True, "micro_batch_size": 2, "gradient_accumulation_steps": 4, "num_epochs": 1,
        "optimizer": "adamw_bnb_8bit", "learning_rate": 0.0002, "bf16": "auto", "gradient_checkpointing": False,
        "flash_attention": True, "output_dir": "./out"}),
    "llamafactory": ("yaml", {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B", "stage": "sft", "do_train": True,
        "finetuning_type": "lora", "lora_target": "all", "lora_rank": 16, "dataset": "alpaca_en_demo",
        "template": "llama3", "cutoff_len": 4096, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4, "num_train_epochs": 3.0, "bf16": True,
        "disable_gradient_checkpointing": True, "output_dir": "saves/llama3-8b/lora/sft"}),
    "torchtune": ("yaml", {
        "model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b",
                  "lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
                  "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0},
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "/tmp/tokenizer.model",
                      "max_seq_len": 8192},
        "optimizer": {"_component_": "torch.optim.AdamW", "fused": True, "lr": 3e-4},
        "loss": {"_component_": "torch.nn.CrossEntropyLoss"}, "batch_size": 8, "gradient_accumulation_steps": 4,
        "enable_activation_checkpointing": False, "dtype": "bf16", "epochs": 1}),
    "trl": ("json", {
        "model_name_or_path": "Qwen/Qwen2.5-7B", "dataset_name": "trl-lib/Capybara", "learning_rate": 2e-4,
        "num_train_epochs": 1, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
        "gradient_checkpointing": False, "max_length": 4096, "use_peft": True, "lora_r": 32, "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "bf16": True, "output_dir": "out"}),
    "mlx": ("yaml", {
        "model": "mistralai/Mistral-7B-v0.1", "train": True, "fine_tune_type": "lora", "data": "data",
        "num_layers": 16, "batch_size": 8, "iters": 1000, "learning_rate": 1e-5, "max_seq_length": 4096,
        "grad_checkpoint": False, "lora_parameters": {"rank": 16, "scale": 20.0, "dropout": 0.0}}),
}
EXPECTED = {   # the setup each config describes, field by field
    "axolotl": dict(method="lora", batch_size=2, seq_len=4096, grad_accum=4, grad_ckpt=False,
                    optimizer="adamw-8bit", lora_rank=32, lora_dropout=0.05, attn="flash", recipe="axolotl",
                    lora_targets=("q", "k", "v", "o", "gate", "up", "down")),
    "llamafactory": dict(method="lora", batch_size=4, seq_len=4096, grad_accum=8, grad_ckpt=False, optimizer="adamw",
                         lora_rank=16, lora_targets=("q", "k", "v", "o", "gate", "up", "down")),
    "torchtune": dict(method="lora", batch_size=8, seq_len=8192, grad_accum=4, grad_ckpt=False,
                      optimizer="adamw-fused", lora_rank=8, chunked_ce=False, precision="bf16", recipe="torchtune",
                      lora_targets=("q", "v", "o", "gate", "up", "down")),
    "trl": dict(method="lora", batch_size=8, seq_len=4096, grad_accum=2, grad_ckpt=False, optimizer="adamw-fused",
                lora_rank=32, lora_targets=("q", "k", "v", "o")),
    "mlx": dict(method="lora", batch_size=8, seq_len=4096, grad_ckpt=False, lora_rank=16, recipe="mlx"),
}
MODELS = {"axolotl": "meta-llama/Llama-3.1-8B", "llamafactory": "meta-llama/Meta-Llama-3-8B",
          "torchtune": "meta-llama/Llama-3.1-8B", "trl": "Qwen/Qwen2.5-7B", "mlx": "mistralai/Mistral-7B-v0.1"}


def _write(tmp_path, tool, data=None, name="config"):
    ext, default = CONFIGS[tool]
    path = tmp_path / f"{name}.{ext}"
    content = data if data is not None else default
    path.write_text(json.dumps(content) if ext == "json" else yaml.safe_dump(content))
    return str(path)


@pytest.mark.parametrize("tool", sorted(CONFIGS))
def test_each_tool_is_read_key_by_key(tmp_path, tool):
    result = check_config(_write(tmp_path, tool))
    assert result.tool == tool and result.mapped.model == MODELS[tool]
    for field, value in EXPECTED[tool].items():
        assert getattr(result.setup, field) == value, field
    assert result.estimate.device_bytes == estimate(load_model(MODELS[tool]), result.setup).device_bytes
    assert result.mapped.ignored, "keys that do not affect memory are listed"
    assert "learning_rate" in result.mapped.ignored or "lr" in str(result.mapped.ignored) or tool == "torchtune"


@pytest.mark.parametrize("tool", sorted(CONFIGS))
def test_a_written_edit_rechecks_to_the_promised_estimate(tmp_path, tool):
    hw = load_hardware(gpu="rtx-4090")
    result = check_config(_write(tmp_path, tool), hw)
    assert result.verdict.status == "does-not-fit"
    out = tmp_path / f"fixed.{CONFIGS[tool][0]}"
    best = write_suggested(result, str(out))
    again = check_config(str(out), hw)
    assert again.estimate.device_bytes == best.device_bytes
    assert again.verdict.status == "fits"


def test_defaults_are_the_tools_own(tmp_path):
    minimal = {"base_model": "meta-llama/Llama-3.2-1B", "adapter": "lora"}
    result = check_config(_write(tmp_path, "axolotl", minimal))
    assert (result.setup.batch_size, result.setup.seq_len, result.setup.grad_accum) == (1, 512, 1)
    assert any("sequence_len not set" in d for d in result.mapped.defaults)
    lf = check_config(_write(tmp_path, "llamafactory", {"model_name_or_path": "meta-llama/Llama-3.2-1B",
                                                        "finetuning_type": "lora", "stage": "sft"}))
    assert lf.setup.grad_ckpt and lf.setup.batch_size == 8 and lf.setup.seq_len == 2048


def test_qlora_and_deepspeed_keys(tmp_path):
    data = dict(CONFIGS["trl"][1], load_in_4bit=True, deepspeed={"zero_optimization": {"stage": 2}})
    result = check_config(_write(tmp_path, "trl", data))
    assert result.setup.method == "qlora" and result.setup.shard == "zero2"
    lf = dict(CONFIGS["llamafactory"][1], quantization_bit=4)
    assert check_config(_write(tmp_path, "llamafactory", lf)).setup.method == "qlora"


def test_bad_configs_name_the_file_key_and_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("base_model: x\nadapter: [lora\nsequence_len: 5\n")
    with pytest.raises(SourceError, match=r"broken.yaml:\d+: not valid YAML"):
        check_config(str(broken))
    with pytest.raises(UnknownModelError, match="base_model"):
        check_config(_write(tmp_path, "axolotl", dict(CONFIGS["axolotl"][1], base_model="no-such-model-x")))
    with pytest.raises(InvalidSetupError, match="load_in_4bit and load_in_8bit"):
        check_config(_write(tmp_path, "axolotl", dict(CONFIGS["axolotl"][1], load_in_4bit=True, load_in_8bit=True,
                                                      adapter="qlora")))
    with pytest.raises(InvalidSetupError, match="finetuning_type: full contradicts quantization_bit"):
        check_config(_write(tmp_path, "llamafactory", dict(CONFIGS["llamafactory"][1], finetuning_type="full",
                                                           quantization_bit=4)))
    with pytest.raises(InvalidSetupError, match="cannot tell which tool"):
        check_config(_write(tmp_path, "mlx", {"foo": 1}))


def test_dataset_named_in_the_config_is_checked(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["a b c"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    data_path = tmp_path / "train.jsonl"
    data_path.write_text("\n".join(json.dumps({"text": " ".join(["a"] * n)}) for n in range(1, 101)))
    config = dict(CONFIGS["axolotl"][1], sequence_len=32, datasets=[{"path": "train.jsonl", "type": "completion"}])
    result = check_config(_write(tmp_path, "axolotl", config), tokenizer=str(tok_path))
    assert result.dataset.p50 == 50 and result.dataset.truncated_share == 0.68
    assert "length-below-typical" in [w.code for w in result.warnings]


def test_check_cli_json(capsys, tmp_path):
    path = _write(tmp_path, "axolotl")
    assert main(["check", path, "--gpu", "rtx-4090", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tool"] == "axolotl" and data["verdict"]["status"] == "does-not-fit"
    first = next(s for s in data["suggestions"] if s["fits"] and s["edits"])
    assert all("from" in e and "to" in e for e in first["edits"].values())


def test_sharding_settings_and_pure_bf16(tmp_path):
    ds = tmp_path / "zero3.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    cfg = dict(CONFIGS["llamafactory"][1], deepspeed="zero3.json", pure_bf16=True, finetuning_type="full")
    result = check_config(_write(tmp_path, "llamafactory", cfg), gpus=8)
    s = result.setup
    assert (s.shard, s.offload, s.gpus, s.precision, s.method) == ("zero3", "optimizer", 8, "bf16", "full")
    assert result.estimate.device_bytes == estimate(load_model("meta-llama/Meta-Llama-3-8B"), s).device_bytes
    trl = dict(CONFIGS["trl"][1], fsdp="full_shard auto_wrap")
    assert check_config(_write(tmp_path, "trl", trl), gpus=4).setup.shard == "fsdp"


def test_written_yaml_keeps_comments_order_and_refuses_the_input(tmp_path, capsys):
    """Issue #13 / D7: --write-suggested never silently overwrites its input, and keeps comments and key order."""
    text = ("# my run\nbase_model: meta-llama/Llama-3.1-8B  # the base\nadapter: lora\nsequence_len: 4096\n"
            "micro_batch_size: 8\ngradient_accumulation_steps: 1\ngradient_checkpointing: false\n"
            "optimizer: adamw_torch_fused\n")
    path = tmp_path / "a.yml"
    path.write_text(text)
    assert main(["check", str(path), "--gpu", "rtx-4090", "--write-suggested", str(path)]) == 1
    assert "--in-place" in capsys.readouterr().err and path.read_text() == text
    out = tmp_path / "b.yml"
    assert main(["check", str(path), "--gpu", "rtx-4090", "--write-suggested", str(out)]) == 0
    written = out.read_text()
    assert written.startswith("# my run\nbase_model: meta-llama/Llama-3.1-8B  # the base\n")
    keys = [line.split(":")[0] for line in written.splitlines() if line and not line.startswith("#")]
    assert keys[:7] == ["base_model", "adapter", "sequence_len", "micro_batch_size", "gradient_accumulation_steps",
                        "gradient_checkpointing", "optimizer"]
    data = yaml.safe_load(written)
    # The obvious fix, not a 64-token length: micro-batch 1 x 8 at the user's 4096 tokens.
    assert data["sequence_len"] == 4096 and data["micro_batch_size"] * data["gradient_accumulation_steps"] == 8
    capsys.readouterr()
    assert main(["check", str(out), "--gpu", "rtx-4090", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["status"] == "fits"
    assert main(["check", str(path), "--gpu", "rtx-4090", "--write-suggested", str(path), "--in-place"]) == 0
    assert path.read_text().startswith("# my run\n")


def test_torchtune_8bit_optimizer_edit_drops_torch_only_arguments(tmp_path):
    """D5: bitsandbytes' AdamW8bit takes no `fused`; an edit that switches to it removes the argument."""
    from memfit.preflight.edits import apply_edits, edits_for

    data = CONFIGS["torchtune"][1]
    edits, reason = edits_for("torchtune", {"optimizer": "adamw-8bit"}, data)
    assert reason is None
    assert edits == {"optimizer._component_": "bitsandbytes.optim.AdamW8bit", "optimizer.fused": None}
    assert apply_edits(data, edits)["optimizer"] == {"_component_": "bitsandbytes.optim.AdamW8bit", "lr": 3e-4}
    # An edit that changes nothing is no edit.
    assert edits_for("torchtune", {"lora_rank": 8}, data) == ({}, None)
