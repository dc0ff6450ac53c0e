"""memfit check on ms-swift's arguments (preflight/swift.py): YAML, JSON and `swift rlhf` command lines."""

import json

import pytest

from memfit import load_hardware
from memfit.errors import InvalidSetupError, SourceError
from memfit.preflight.check import check_config
from memfit.preflight.formats import detect_format


def _check(path, gpu="h100"):
    return check_config(str(path), hardware=load_hardware(gpu=gpu))


def test_grpo_yaml_reads_generation_vllm_and_swifts_beta_default(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("rlhf_type: grpo\nmodel: qwen2.5-0.5b\ntuner_type: lora\nlora_rank: 16\nlora_alpha: 32\n"
                    "target_modules: all-linear\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
                    "max_length: 1024\nmax_completion_length: 256\nnum_generations: 4\nuse_vllm: true\n"
                    "vllm_mode: colocate\nvllm_gpu_memory_utilization: 0.4\nsleep_level: 1\ntorch_dtype: bfloat16\n")
    r = _check(path)
    s = r.setup
    assert (s.recipe, s.trainer, s.method, s.lora_rank, s.batch_size, s.grad_accum) == \
        ("ms-swift", "grpo", "lora", 16, 4, 2)
    assert (s.prompt_len, s.completion_len, s.seq_len, s.num_generations) == (768, 256, 1024, 4)
    assert (s.generation, s.vllm_gpu_util, s.vllm_sleep) == ("vllm-colocate", 0.4, True)
    # beta unset: ms-swift's GRPO default 0.04 keeps a reference (the adapter switched off with LoRA)
    assert s.ref_model == "adapter-off"
    assert any("0.04" in d for d in r.mapped.defaults)
    assert r.estimate.component("vLLM reservation") == int(0.4 * load_hardware(gpu="h100").capacity_bytes)


def test_beta_zero_drops_the_reference_and_full_tuning_copies_it(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"rlhf_type": "grpo", "model": "qwen2.5-0.5b", "tuner_type": "full", "beta": 0.0,
                                "max_length": 512, "max_completion_length": 128, "num_generations": 8,
                                "per_device_train_batch_size": 8}))
    assert _check(path).setup.ref_model == "none"
    path.write_text(json.dumps({"rlhf_type": "kto", "model": "qwen2.5-0.5b", "tuner_type": "full",
                                "max_length": 512, "per_device_train_batch_size": 2}))
    r = _check(path)
    assert (r.setup.trainer, r.setup.ref_model, r.setup.loss) == ("kto", "copy", "hf")
    assert r.estimate.component("reference model") > 0


def test_swift_rlhf_command_line_with_quantized_lora_and_deepspeed_preset(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\nNPROC_PER_NODE=2 \\\nswift rlhf \\\n    --rlhf_type dpo \\\n"
                    "    --model qwen2.5-0.5b \\\n    --train_type lora \\\n    --quant_method bnb --quant_bits 4 \\\n"
                    "    --target_modules q_proj v_proj \\\n    --per_device_train_batch_size 2 \\\n"
                    "    --max_length 2048 --gradient_checkpointing false \\\n    --deepspeed zero2  # comment\n")
    r = _check(path)
    s = r.setup
    assert (s.trainer, s.method, s.quant, s.lora_targets, s.batch_size, s.seq_len, s.grad_ckpt, s.shard) == \
        ("dpo", "qlora", "nf4-dq", ("q", "v"), 2, 2048, False, "zero2")
    assert s.ref_model == "adapter-off" and s.loss == "hf"


def test_orpo_simpo_cpo_gkd(tmp_path):
    path = tmp_path / "c.yaml"
    for kind in ("orpo", "simpo", "cpo"):
        path.write_text(f"rlhf_type: {kind}\nmodel: qwen2.5-0.5b\nmax_length: 1024\n")
        r = _check(path)
        assert (r.setup.trainer, r.setup.ref_model, r.setup.batch_size) == (kind, "none", 1)
    path.write_text("rlhf_type: gkd\nmodel: qwen2.5-0.5b\nteacher_model: qwen2.5-1.5b\nmax_length: 1024\n"
                    "max_completion_length: 256\n")
    r = _check(path)
    assert (r.setup.trainer, r.setup.teacher, r.setup.completion_len) == ("gkd", "qwen2.5-1.5b", 256)
    assert r.estimate.component("teacher model") > 0


def test_max_length_not_set_is_the_models_context_said_so(tmp_path):
    # template_args.py:130: max_length None -> the model's max_model_len; the check says it took that bound, and
    # refuses when the model's context length is not known (no silent recipe default).
    from memfit.sources.resolve import load_model

    path = tmp_path / "c.yaml"
    path.write_text("rlhf_type: dpo\nmodel: Qwen/Qwen2-VL-2B-Instruct\n")
    r = _check(path)
    assert r.setup.seq_len == load_model("Qwen/Qwen2-VL-2B-Instruct", allow_network=False).max_positions > 0
    assert any("max_length not set" in d for d in r.mapped.defaults)
    path.write_text("rlhf_type: dpo\nmodel: qwen2.5-0.5b\n")
    with pytest.raises(InvalidSetupError, match="max_length: not set"):
        _check(path)


@pytest.mark.parametrize("text, words", [
    ("rlhf_type: rm\nmodel: qwen2.5-0.5b\nmax_length: 512\n", "reward-model training. is not modelled"),
    ("rlhf_type: dpo\nmodel: qwen2.5-0.5b\nref_model: qwen2.5-0.5b\nmax_length: 512\n", "refuses a ref_model"),
    ("model: qwen2.5-0.5b\ntuner_type: full\nquant_method: bnb\nquant_bits: 4\nmax_length: 512\n",
     "purely quantized"),
    ("model: qwen2.5-0.5b\ntuner_type: lora\nquant_method: hqq\nquant_bits: 4\nmax_length: 512\n", "hqq"),
    ("rlhf_type: grpo\nmodel: qwen2.5-0.5b\nmax_length: 1024\nuse_vllm: true\n", "vllm_mode: not set"),
])
def test_what_ms_swift_refuses_is_one_line_naming_the_key(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidSetupError, match=words):
        _check(path)


def test_quant_bits_without_quant_method_is_not_quantized_as_in_ms_swift(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("model: qwen2.5-0.5b\ntuner_type: lora\nquant_bits: 4\nmax_length: 512\n")
    r = _check(path)
    assert r.setup.method == "lora" and not r.setup.quantized_base
    assert any("quant_bits" in text for _, text in r.mapped.notes)


def test_detection_and_a_script_without_a_swift_command(tmp_path):
    assert detect_format({"model": "x", "rlhf_type": "dpo"}) == "ms-swift"
    assert detect_format({"model": "x", "tuner_type": "lora"}) == "ms-swift"
    assert detect_format({"model": "x", "iters": 10}) == "mlx"
    path = tmp_path / "run.sh"
    path.write_text("python train.py --lr 1e-4\n")
    with pytest.raises(SourceError, match="no `swift sft`"):
        _check(path)
