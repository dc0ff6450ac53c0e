"""memfit check reads the PEFT methods besides LoRA (preflight/peft_methods.py): LLaMA-Factory's finetuning_type and
use_dora / use_rslora / pissa_init, axolotl's peft_use_dora and peft_autocast_adapter_dtype, and PEFT's own
adapter_config.json, written here by PEFT itself (save_pretrained) so the file is the real format.
"""

import json

import pytest

from memfit import estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.preflight import check_config

MODEL = "meta-llama/Llama-3.2-1B"
ALL = ("q", "k", "v", "o", "gate", "up", "down")


def _file(tmp_path, text, name="c.yml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _error(path) -> str:
    with pytest.raises(InvalidSetupError) as info:
        check_config(path)
    return str(info.value)


LF = f"model_name_or_path: {MODEL}\nstage: sft\nfinetuning_type: lora\n"


@pytest.mark.parametrize("extra, method, quant", [
    ("use_dora: true\n", "dora", "none"),
    ("use_dora: true\nquantization_bit: 4\n", "dora", "nf4-dq"),          # QDoRA: the bitsandbytes base stays
    ("use_rslora: true\n", "lora", None),
    ("pissa_init: true\n", "lora", None),
])
def test_llamafactory_lora_variants(tmp_path, extra, method, quant):
    result = check_config(_file(tmp_path, LF + "lora_rank: 16\n" + extra))
    assert result.setup.method == method and result.setup.lora_rank == 16
    assert result.setup.lora_targets == ALL                       # lora_target default "all"
    if quant:
        assert result.setup.quant == quant
    if method == "lora":
        assert any("costs what LoRA costs" in d for d in result.mapped.defaults)
    assert result.estimate.device_bytes == estimate(load_model(MODEL), result.setup).device_bytes


def test_llamafactory_oft(tmp_path):
    # OFTConfig(r=oft_rank 0, oft_block_size 32) over lora_target (model/adapter.py:229-275).
    result = check_config(_file(tmp_path, LF.replace("lora\n", "oft\n")))
    assert (result.setup.method, result.setup.oft_block_size, result.setup.lora_targets) == ("oft", 32, ALL)
    wide = check_config(_file(tmp_path, LF.replace("lora\n", "oft\n") + "oft_block_size: 64\nlora_target: q_proj,v_proj\n"))
    assert (wide.setup.oft_block_size, wide.setup.lora_targets) == (64, ("q", "v"))
    assert "line 4: oft_rank: 8: memfit takes OFT's block size" in _error(
        _file(tmp_path, LF.replace("lora\n", "oft\n") + "oft_rank: 8\n"))
    assert "line 3: finetuning_type: oft with quantization_bit" in _error(
        _file(tmp_path, LF.replace("lora\n", "oft\n") + "quantization_bit: 4\n"))


def test_llamafactory_freeze_says_what_it_is(tmp_path):
    message = _error(_file(tmp_path, LF.replace("lora\n", "freeze\n") + "freeze_trainable_layers: 4\n"))
    assert "line 3: finetuning_type: freeze (the last 4 layers unfrozen" in message


AX = f"base_model: {MODEL}\n"


def test_axolotl_dora_and_adapter_dtype(tmp_path):
    dora = check_config(_file(tmp_path, AX + "adapter: lora\npeft_use_dora: true\nlora_r: 16\n"))
    assert (dora.setup.method, dora.setup.lora_rank, dora.setup.quant) == ("dora", 16, "none")
    qdora = check_config(_file(tmp_path, AX + "adapter: qlora\nload_in_4bit: true\npeft_use_dora: true\n"))
    assert qdora.setup.method == "dora" and qdora.setup.quant.startswith("nf4")
    rslora = check_config(_file(tmp_path, AX + "adapter: lora\npeft_use_rslora: true\n"))
    assert rslora.setup.method == "lora"
    # peft_autocast_adapter_dtype: false keeps the adapters (and their gradients and Adam state) in bf16.
    fp32 = check_config(_file(tmp_path, AX + "adapter: lora\nlora_r: 64\nlora_target_linear: true\n"))
    bf16 = check_config(_file(tmp_path, AX + "adapter: lora\nlora_r: 64\nlora_target_linear: true\n"
                                             "peft_autocast_adapter_dtype: false\n"))
    assert fp32.setup.adapter_fp32 and not bf16.setup.adapter_fp32
    adapters = fp32.estimate.trainable_params
    assert fp32.estimate.component("weights") + fp32.estimate.component("adapter weights") - \
        bf16.estimate.component("weights") - bf16.estimate.component("adapter weights") == 2 * adapters


peft = pytest.importorskip("peft")


def _adapter_config(tmp_path, config) -> str:
    """The adapter_config.json PEFT itself writes for `config`."""
    config.base_model_name_or_path = MODEL
    folder = tmp_path / type(config).__name__
    config.save_pretrained(str(folder))
    return str(folder / "adapter_config.json")


@pytest.mark.parametrize("make, method, knobs", [
    (lambda: peft.LoraConfig(r=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.05), "lora",
     dict(lora_rank=32, lora_targets=("q", "v"), lora_dropout=0.05)),
    (lambda: peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj"], use_dora=True), "dora",
     dict(lora_rank=16, lora_targets=("q", "k"))),
    (lambda: peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
     "ia3", dict(lora_targets=("k", "v", "down"))),
    (lambda: peft.LoHaConfig(r=8, target_modules=["q_proj", "v_proj"]), "loha", dict(lora_rank=8)),
    (lambda: peft.LoKrConfig(r=8, target_modules=["q_proj", "v_proj"]), "lokr", dict(lora_rank=8)),
    (lambda: peft.VeraConfig(r=128, target_modules=["q_proj", "v_proj"]), "vera", dict(lora_rank=128)),
    (lambda: peft.OFTConfig(r=0, oft_block_size=64, target_modules=["q_proj", "v_proj"]), "oft",
     dict(oft_block_size=64)),
    (lambda: peft.BOFTConfig(boft_block_size=8, target_modules=["q_proj", "v_proj"]), "boft", dict(oft_block_size=8)),
    (lambda: peft.FourierFTConfig(n_frequency=2000, target_modules=["q_proj", "v_proj"]), "fourierft",
     dict(n_frequency=2000)),
    (lambda: peft.AdaLoraConfig(init_r=12, target_r=8, total_step=100, target_modules=["q_proj", "v_proj"]),
     "adalora", dict(lora_rank=12)),
    (lambda: peft.PrefixTuningConfig(num_virtual_tokens=30, task_type="CAUSAL_LM"), "prefix",
     dict(num_virtual_tokens=30)),
    (lambda: peft.PromptTuningConfig(num_virtual_tokens=40, task_type="CAUSAL_LM"), "prompt",
     dict(num_virtual_tokens=40)),
    (lambda: peft.PromptEncoderConfig(num_virtual_tokens=10, task_type="CAUSAL_LM"), "ptuning",
     dict(num_virtual_tokens=10)),
    (lambda: peft.LNTuningConfig(task_type="CAUSAL_LM"), "ln-tuning", {}),
    (lambda: peft.TinyLoraConfig(r=2, target_modules=["q_proj", "v_proj"]), "tinylora", dict(lora_rank=2)),
])
def test_peft_adapter_config(tmp_path, make, method, knobs):
    path = _adapter_config(tmp_path, make())
    assert json.loads(open(path).read())["peft_type"]            # PEFT's own file, read back as memfit's method
    result = check_config(path)
    assert result.tool == "peft" and result.mapped.model == MODEL
    assert result.setup.method == method
    for name, value in knobs.items():
        assert getattr(result.setup, name) == value, name
    assert any("adapter config holds the method only" in d for d in result.mapped.defaults)
    assert result.estimate.device_bytes == estimate(load_model(MODEL), result.setup).device_bytes


def test_peft_adapter_config_it_cannot_model(tmp_path):
    path = _adapter_config(tmp_path, peft.AdaptionPromptConfig(adapter_len=10, adapter_layers=2,
                                                               task_type="CAUSAL_LM"))
    assert "peft_type: ADAPTION_PROMPT (LLaMA-Adapter) is not read from adapter_len / adapter_layers" in _error(path)
    osf = _adapter_config(tmp_path, peft.OSFConfig(target_modules=["q_proj"], effective_rank=8))
    result = check_config(osf)
    assert result.setup.method == "osf"
    assert any("effective_rank" in message for _, message in result.mapped.notes)
