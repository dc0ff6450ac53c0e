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


# ---- issues #14 / #15 (D12, D19): every bad config is one error naming file, key and line; unhonoured keys noted ---
def _yaml_file(tmp_path, text, name="c.yml"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return str(path)


AXOLOTL_HEAD = "base_model: meta-llama/Llama-3.2-1B\nadapter: lora\n"


def _error(path, exc=InvalidSetupError, **kwargs) -> str:
    with pytest.raises(exc) as info:
        check_config(path, **kwargs)
    message = str(info.value)
    assert message.startswith(path), message       # every message names the file first
    return message


@pytest.mark.parametrize("line, fragment", [
    ("micro_batch_size: four", "line 3: micro_batch_size: must be a whole number, got 'four' "
                               "(a whole number from 1 to 65536)"),
    ("lora_dropout: high", "line 3: lora_dropout: 'high' is not a number (a number from 0 to below 1)"),
    ("lora_target_modules: 5", "line 3: lora_target_modules: must be all-linear or a list of q,k,v,o,gate,up,down, "
                               "got 5"),
    ("lora_target_modules: [q_proj, 5]", "line 3: lora_target_modules: must be a list of module names, got a list "
                                         "with a non-text item"),
    ("sequence_len: [1024]", "line 3: sequence_len: must be a whole number, got a list"),
    ("gradient_accumulation_steps: {steps: 4}", "line 3: gradient_accumulation_steps: must be a whole number, got a "
                                                "mapping"),
    ("lora_r: true", "line 3: lora_r: must be a whole number, got true (a whole number from 1 to 16384)"),
    ("lora_dropout: .nan", "line 3: lora_dropout: must be a number, got nan"),
    ("lora_dropout: .inf", "line 3: lora_dropout: must be a finite number, got inf"),
    ("lora_dropout: 1.5", "line 3: lora_dropout: must be below 1, got 1.5"),
    ("sequence_len: -5", "line 3: sequence_len: must be at least 1, got -5"),
    ("micro_batch_size: 100000000000000000000000", "line 3: micro_batch_size: 100000000000000000000000 is absurdly "
                                                   "large (limit 65536)"),
    ("gradient_checkpointing: sometimes", "line 3: gradient_checkpointing: must be true or false, offload, "
                                          "offload_disk, got 'sometimes'"),
    ("optimizer: lion_9bit", "line 3: optimizer: 'lion_9bit' is not one of adamw, adamw-fused"),
    ("optimizer: [adamw_torch]", "line 3: optimizer: must be one of adamw, adamw-fused"),
    ("bf16: [true]", "line 3: bf16: must be true or false, auto, full, got a list"),
    ("datasets: train.jsonl", "line 3: datasets: must be a list of datasets, got 'train.jsonl'"),
    ("fsdp: 5", "line 3: fsdp: must be FSDP options as text or a list"),
])
def test_a_bad_value_names_file_key_line_and_what_is_allowed(tmp_path, line, fragment):
    message = _error(_yaml_file(tmp_path, AXOLOTL_HEAD + line + "\n"))
    assert fragment in message


def test_a_model_name_that_is_not_text(tmp_path):
    message = _error(_yaml_file(tmp_path, "base_model: [a, b]\nadapter: lora\n"))
    assert "line 1: base_model: must be a model name or path, got a list" in message
    message = _error(_yaml_file(tmp_path, "base_model: \"x\\x01\"\nadapter: lora\n"))
    assert "base_model: is not plausible as a model name or path (over 4096 characters, or control characters)" \
        in message


def test_null_means_the_tools_default(tmp_path):
    result = check_config(_yaml_file(tmp_path, AXOLOTL_HEAD + "micro_batch_size: null\nsequence_len: ~\n"))
    assert (result.setup.batch_size, result.setup.seq_len) == (1, 512)
    assert "micro_batch_size not set: axolotl's default 1" in result.mapped.defaults
    assert "no model (base_model is missing)" in _error(_yaml_file(tmp_path, "base_model: null\nadapter: lora\n"))


def test_every_problem_of_a_file_in_one_error_in_line_order(tmp_path, capsys):
    path = _yaml_file(tmp_path, AXOLOTL_HEAD + "lora_target_modules: 5\nmicro_batch_size: four\nlora_dropout: high\n")
    message = _error(path)
    assert message == (f"{path}: line 3: lora_target_modules: must be all-linear or a list of q,k,v,o,gate,up,down, "
                       f"got 5; line 4: micro_batch_size: must be a whole number, got 'four' (a whole number from 1 "
                       f"to 65536); line 5: lora_dropout: 'high' is not a number (a number from 0 to below 1)")
    assert main(["check", path]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {message}\n"


def test_yaml_exponents_pyyaml_leaves_as_text_are_numbers(tmp_path):
    # PyYAML (YAML 1.1) reads 5e-2 as a string; axolotl's pydantic and the CLI take it as 0.05.
    result = check_config(_yaml_file(tmp_path, AXOLOTL_HEAD + "lora_dropout: 5e-2\n"))
    assert result.setup.lora_dropout == 0.05


def test_json_values_name_the_key(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"model_name_or_path": "meta-llama/Llama-3.2-1B", "use_peft": true, "lora_dropout": NaN, '
                    '"lora_r": Infinity, "per_device_train_batch_size": "8"}')
    message = _error(str(path))
    assert "per_device_train_batch_size: must be a whole number, got '8'" in message
    assert "lora_r: must be a whole number, got inf" in message
    assert "lora_dropout: must be a number, got nan" in message


@pytest.mark.parametrize("content, fragment", [
    (b"", "the file is empty"),
    (b"  \n\n", "the file is empty"),
    (b"# only a comment\n", "the file has no keys (empty, or only comments)"),
    (b"- a\n- b\n", "expected a mapping of keys at the top level, got a list"),
    (b"just text\n", "expected a mapping of keys at the top level, got a single str value"),
    (bytes(range(256)), "a binary file, not a YAML or JSON config"),
    ("base_model: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 15)"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply (more than 64 levels)"),
    (b"a:\n" + b"".join(b"  " * i + b"  k:\n" for i in range(80)) + b"  " * 81 + b"v: 1\n",
     "nested too deeply (more than 64 levels)"),
    (b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n".encode() for p, n in zip("abcdefgh", "bcdefghi")),
     "YAML aliases expand to more than 200,000 values (an alias bomb?)"),
    (b"a: &a [*a]\n", ":1: a YAML alias refers to the value that contains it"),
    (b"base_model: x\nadapter: lora\nadapter: qlora\n", "c.yml:3: key 'adapter' appears twice in one mapping (first "
                                                         "on line 2; the second would win)"),
    (b"base_model: x\nwhen: 2024-13-45\n", "a value cannot be read as YAML (month must be in 1..12)"),
    (b"base_model: x\nn: " + b"9" * 5000 + b"\n", "a value cannot be read as YAML (Exceeds the limit (4300 digits)"),
    (b"base_model: !!python/object:os.system x\n", "c.yml:1: not valid YAML (could not determine a constructor"),
    (b"? [a, b]\n: 1\n", "c.yml:1: not valid YAML (found unhashable key)"),
    (b"base_model: x\nadapter: a\x07b\n", "c.yml:2: not valid YAML (the control character '\\x07' is not allowed)"),
])
def test_unreadable_files_are_one_source_error(tmp_path, content, fragment):
    assert fragment in _error(_yaml_file(tmp_path, content), SourceError)


@pytest.mark.parametrize("content, fragment", [
    ('{"model_name_or_path": "x", "a": 1, "a": 2}', "key 'a' appears twice in one object (the second would win)"),
    ("[" * 100000, "nested too deeply (more than 64 levels)"),
    ('{"a": ' * 70 + "1" + "}" * 70, "nested too deeply (more than 64 levels)"),
    ('{"model_name_or_path": "x",}', "c.json:1: not valid JSON (Expecting property name"),
    ('["model_name_or_path"]', "expected a mapping of keys at the top level, got a list"),
])
def test_unreadable_json_is_one_source_error(tmp_path, content, fragment):
    assert fragment in _error(_yaml_file(tmp_path, content, "c.json"), SourceError)


def test_a_folder_or_missing_file(tmp_path):
    assert "is a folder, not a config file" in _error(str(tmp_path), SourceError)
    assert "no such config file" in _error(str(tmp_path / "nope.yml"), SourceError)


def test_unusable_model_names_are_errors(tmp_path):
    assert "base_model: ~nosuchuser-memfit/x: no such user's home folder" in _error(
        _yaml_file(tmp_path, "base_model: ~nosuchuser-memfit/x\nadapter: lora\n"), SourceError)
    assert "cannot be read as a path (File name too long)" in _error(
        _yaml_file(tmp_path, f"base_model: {'x' * 300}\nadapter: lora\n"), SourceError)


# ---- D19: quantized bases, adapters, DeepSpeed and datasets ---------------------------------------------------------
LF_HEAD = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\n"


@pytest.mark.parametrize("extra, quant", [
    ("quantization_bit: 8\n", "int8"),
    ("quantization_bit: 4\n", "nf4-dq"),                                   # nf4, double_quantization true
    ("quantization_bit: 4\ndouble_quantization: false\n", "nf4"),
    ("quantization_bit: 4\nquantization_type: fp4\ndouble_quantization: false\n", "fp4"),
    ("quantization_bit: 4\nquantization_type: fp4\n", "nf4-dq"),           # same bytes as nf4-dq
])
def test_llamafactory_quantization_bit_is_a_quantized_base(tmp_path, extra, quant):
    result = check_config(_yaml_file(tmp_path, LF_HEAD + extra))
    assert (result.setup.method, result.setup.quant) == ("qlora", quant)
    expected = estimate(load_model("meta-llama/Llama-3.2-1B"), result.setup).device_bytes
    assert result.estimate.device_bytes == expected
    if quant == "int8":
        assert "quantization_bit: 8 is LoRA on a bitsandbytes 8-bit base: estimated as --method qlora --quant int8" \
            in result.mapped.defaults


def test_llamafactory_int8_base_costs_more_than_nf4(tmp_path):
    eight = check_config(_yaml_file(tmp_path, LF_HEAD + "quantization_bit: 8\n", "a.yml"))
    four = check_config(_yaml_file(tmp_path, LF_HEAD + "quantization_bit: 4\n", "b.yml"))
    plain = check_config(_yaml_file(tmp_path, LF_HEAD, "c.yml"))
    assert four.estimate.device_bytes < eight.estimate.device_bytes < plain.estimate.device_bytes


@pytest.mark.parametrize("extra, fragment", [
    ("quantization_bit: 3\n", "line 4: quantization_bit: bitsandbytes quantizes to 4 or 8 bits, got 3"),
    ("quantization_bit: 4\nquantization_method: hqq\n", "line 5: quantization_method: hqq is not modelled (memfit "
                                                         "models bitsandbytes, bnb)"),
    ("quantization_bit: 4\nquantization_type: int4\n", "line 5: quantization_type: 'int4' is not one of nf4, fp4"),
    ("quantization_bit: eight\n", "line 4: quantization_bit: must be a whole number, got 'eight'"),
])
def test_llamafactory_quantization_it_cannot_model(tmp_path, extra, fragment):
    assert fragment in _error(_yaml_file(tmp_path, LF_HEAD + extra))


@pytest.mark.parametrize("ftype, fragment", [
    ("freeze", "line 3: finetuning_type: freeze (the last 2 layers unfrozen, freeze_trainable_layers) is not "
               "modelled for the HF Trainer stack"),
    ("dora", "line 3: finetuning_type: 'dora' is not one of lora, oft, freeze, full (LLaMA-Factory's methods)"),
    ("5", "line 3: finetuning_type: 5 is not one of lora, oft, freeze, full"),
])
def test_llamafactory_finetuning_types_not_modelled(tmp_path, ftype, fragment):
    text = LF_HEAD.replace("finetuning_type: lora", f"finetuning_type: {ftype}")
    assert fragment in _error(_yaml_file(tmp_path, text))


def test_axolotl_adapter_and_8bit(tmp_path):
    # adapter: lora + load_in_8bit is LoRA on an 8-bit bitsandbytes base (axolotl loaders/model.py).
    result = check_config(_yaml_file(tmp_path, AXOLOTL_HEAD + "load_in_8bit: true\n"))
    assert (result.setup.method, result.setup.quant) == ("qlora", "int8")
    assert any("lora with load_in_8bit: true is LoRA on a bitsandbytes 8-bit base" in d for d in result.mapped.defaults)
    # adapter: qlora + load_in_8bit: axolotl refuses it; so does memfit, saying what to write instead.
    message = _error(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nload_in_8bit: true\n"))
    assert "line 2: adapter: qlora with load_in_8bit: true is refused by axolotl (\"Can't load qlora in 8bit\"): " \
           "for LoRA on an 8-bit base write adapter: lora with load_in_8bit: true" in message
    message = _error(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\n"))
    assert "line 2: adapter: qlora needs load_in_4bit: true" in message
    message = _error(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nload_in_8bit: true\n"))
    assert "line 2: load_in_8bit: true needs adapter: lora or qlora" in message


def test_axolotl_adapter_that_is_not_one(tmp_path):
    # An error, not a reading as full fine-tuning: axolotl refuses adapters it has no builder or plugin for.
    message = _error(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nadapter: 5\n"))
    assert "line 2: adapter: must be lora or qlora (or left out to train every weight), got 5" in message
    message = _error(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nadapter: llama-adapter\n"))
    assert "line 2: adapter: llama-adapter (PEFT's adaption_prompt) is not read from axolotl's peft_adapter" in message
    full = check_config(_yaml_file(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nadapter:\n"))
    assert full.setup.method == "full"


def test_axolotl_qlora_quant_follows_bnb_config_kwargs(tmp_path):
    head = "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nload_in_4bit: true\n"
    assert check_config(_yaml_file(tmp_path, head)).setup.quant == "nf4-dq"
    no_dq = check_config(_yaml_file(tmp_path, head + "bnb_config_kwargs: {bnb_4bit_use_double_quant: false}\n"))
    assert no_dq.setup.quant == "nf4"
    lora4 = check_config(_yaml_file(tmp_path, AXOLOTL_HEAD + "load_in_4bit: true\n"))
    assert lora4.setup.method == "qlora"
    assert ("key-not-honoured", ) == tuple({w.code for w in lora4.warnings if "load_in_4bit" in w.message})


def test_deepspeed_file_that_is_missing_or_not_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _yaml_file(tmp_path, AXOLOTL_HEAD + "deepspeed: configs/missing.json\n")
    message = _error(path)
    assert f"line 3: deepspeed: configs/missing.json does not exist (looked at {tmp_path}/configs/missing.json" \
        in message
    (tmp_path / "bad.json").write_text("{zero: 3")
    message = _error(_yaml_file(tmp_path, AXOLOTL_HEAD + "deepspeed: bad.json\n"))
    assert "line 3: deepspeed: bad.json is not a DeepSpeed JSON (line 1: Expecting property name" in message
    (tmp_path / "stage.json").write_text('{"zero_optimization": {"stage": "three"}}')
    message = _error(_yaml_file(tmp_path, AXOLOTL_HEAD + "deepspeed: stage.json\n"))
    assert f"line 3: deepspeed: {tmp_path}/stage.json: zero_optimization.stage: must be 0, 1, 2 or 3, got 'three'" \
        in message
    message = _error(_yaml_file(tmp_path, AXOLOTL_HEAD + "deepspeed:\n  zero_optimization:\n    stage: 7\n"))
    assert "line 5: deepspeed.zero_optimization.stage: must be 0, 1, 2 or 3, got 7" in message


def test_deepspeed_path_relative_to_the_working_folder(tmp_path, monkeypatch):
    # axolotl and the HF launchers open the path from where they run, not from the config's folder.
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z3.json").write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}}))
    (tmp_path / "configs").mkdir()
    monkeypatch.chdir(tmp_path)
    path = _yaml_file(tmp_path / "configs", AXOLOTL_HEAD + "deepspeed: ds/z3.json\n")
    result = check_config(path, gpus=4)
    assert (result.setup.shard, result.setup.offload, result.setup.gpus) == ("zero3", "optimizer+params", 4)
    assert "deepspeed" in result.mapped.used


def test_a_dataset_that_does_not_exist_is_noted(tmp_path):
    path = _yaml_file(tmp_path, AXOLOTL_HEAD + "datasets:\n  - path: data/missing.jsonl\n    type: completion\n")
    result = check_config(path, tokenizer=str(tmp_path / "tokenizer.json"))
    notes = [w.message for w in result.warnings if w.code == "dataset-not-checked"]
    assert notes == [f"datasets[0].path: data/missing.jsonl is not a file (looked at {tmp_path}/data/missing.jsonl; "
                     f"a Hub dataset, or a missing path): its lengths were not checked"]
    assert result.dataset is None
    lf = check_config(_yaml_file(tmp_path, LF_HEAD + "dataset: my_data\n", "lf.yml"))
    assert [w.message for w in lf.warnings if w.code == "dataset-not-checked"] == [
        f"line 4: dataset: my_data: no readable {tmp_path}/data/dataset_info.json (a Hub dataset, or a missing path): "
        f"its lengths were not checked"]


def test_llamafactory_dataset_is_found_through_dataset_info(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["a b c"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "mine.jsonl"}}))
    (tmp_path / "data" / "mine.jsonl").write_text("\n".join(json.dumps({"text": " ".join(["a"] * n)})
                                                            for n in range(1, 101)))
    result = check_config(_yaml_file(tmp_path, LF_HEAD + "dataset: mine\ncutoff_len: 32\n"),
                          tokenizer=str(tmp_path / "tokenizer.json"))
    assert result.dataset.p50 == 50 and result.dataset.truncated_share == 0.68


TRL_BASE = {"model_name_or_path": "meta-llama/Llama-3.2-1B", "use_peft": True}


def _trl(tmp_path, name="t", **keys):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(dict(TRL_BASE, **keys)))
    return str(path)


def test_trl_checkpoints_by_default_since_0_22(tmp_path):
    # TRL 0.22.0 trl/trainer/sft_config.py: gradient_checkpointing: bool = True.
    result = check_config(_trl(tmp_path))
    assert result.setup.grad_ckpt is True
    assert any(d.startswith("gradient_checkpointing not set: on, SFTConfig's default since TRL 0.22")
               for d in result.mapped.defaults)
    off = check_config(_trl(tmp_path, "off", gradient_checkpointing=False))
    assert off.setup.grad_ckpt is False
    assert off.estimate.device_bytes > result.estimate.device_bytes


def test_trl_length_keys(tmp_path):
    old = check_config(_trl(tmp_path, "old", max_seq_length=512))
    assert old.setup.seq_len == 512 and old.mapped.keys["seq_len"] == "max_seq_length"
    assert any("max_seq_length is TRL < 0.20's name" in d for d in old.mapped.defaults)
    both = check_config(_trl(tmp_path, "both", max_length=256, max_seq_length=512))
    assert both.setup.seq_len == 256
    assert "max_seq_length: ignored: max_length is set" in [w.message for w in both.warnings][0]
    off = check_config(_trl(tmp_path, "none", max_length=None))
    assert off.setup.seq_len == 1024
    assert any(w.message.startswith("max_length: null turns truncation off in TRL") for w in off.warnings)


def test_trl_quantized_bases(tmp_path):
    four = check_config(_trl(tmp_path, "four", load_in_4bit=True))
    assert (four.setup.method, four.setup.quant) == ("qlora", "nf4")       # ModelConfig: no nested quant
    nested = check_config(_trl(tmp_path, "nested", load_in_4bit=True, use_bnb_nested_quant=True))
    assert nested.setup.quant == "nf4-dq"
    eight = check_config(_trl(tmp_path, "eight", load_in_8bit=True))
    assert (eight.setup.method, eight.setup.quant) == ("qlora", "int8")
    both = check_config(_trl(tmp_path, "both", load_in_4bit=True, load_in_8bit=True))
    assert both.setup.quant == "nf4" and any(w.code == "key-not-honoured" and "load_in_8bit" in w.message
                                             for w in both.warnings)
    path = tmp_path / "nopeft.json"
    path.write_text(json.dumps({"model_name_or_path": "meta-llama/Llama-3.2-1B", "load_in_4bit": True}))
    assert "load_in_4bit: true needs use_peft: true" in _error(str(path))


def test_other_tools_keys_not_modelled(tmp_path):
    mlx = "model: meta-llama/Llama-3.2-1B\niters: 10\n"
    assert "line 3: fine_tune_type: dora is not modelled yet" in _error(
        _yaml_file(tmp_path, mlx + "fine_tune_type: dora\n"))
    layers = check_config(_yaml_file(tmp_path, mlx + "num_layers: 8\noptimizer: sgd\n"))
    assert layers.setup.optimizer == "sgd"
    # num_layers is honoured now: it is --train-layers.
    assert layers.setup.train_layers == 8 and not [w for w in layers.warnings if w.code == "key-not-honoured"]
    tt = ("model: {_component_: torchtune.models.llama3_2.lora_llama3_2_1b}\ndtype: fp16\n")
    assert "line 2: dtype: 'fp16' is not one of bf16, fp32" in _error(_yaml_file(tmp_path, tt))


def test_setup_rules_are_worded_in_the_tools_keys(tmp_path):
    tt = ("model: {_component_: torchtune.models.llama3_2.lora_llama3_2_1b}\noptimizer_in_bwd: true\n"
          "gradient_accumulation_steps: 4\n")
    message = _error(_yaml_file(tmp_path, tt))
    assert message.endswith("optimizer_in_bwd cannot accumulate gradients: set gradient_accumulation_steps 1")


def test_a_value_with_a_line_break_stays_one_error_line(tmp_path, capsys):
    """Found by the fuzz suite: parse_targets quotes the raw target, so a newline in it split the error line."""
    path = _yaml_file(tmp_path, AXOLOTL_HEAD + 'lora_target_modules: ["q_proj\\nx"]\n')
    assert main(["check", path]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "line 3: lora_target_modules: unknown LoRA target q_proj\\nx" in err


def test_the_optimizer_names_check_writes_read_back_as_the_same_optimizer():
    # Advice written into an HF-based config must mean, when read again, the optimizer memfit priced.
    from memfit.options import OPTIMIZER_ALIASES
    from memfit.preflight.edits import OPTIMIZER_NAMES

    for tool in ("axolotl", "llamafactory", "trl"):
        for memfit_name, spelling in OPTIMIZER_NAMES[tool].items():
            assert OPTIMIZER_ALIASES.get(spelling, spelling) == memfit_name, (tool, spelling)
