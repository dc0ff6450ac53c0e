"""ms-swift's training arguments (`swift sft` / `swift rlhf`), from a YAML or JSON file or a shell command line.

Keys and defaults from modelscope/ms-swift@3602360 (4.6.0.dev0):
- swift/cli/main.py:39-70 parse_yaml_args: a .json/.yaml file's keys become `--key value` arguments (lists as several
  values), so a file and a command line carry the same names.
- swift/arguments/base_args/model_args.py:68 model, :74 torch_dtype None (the checkpoint's), :79 attn_impl;
  :130-141 _init_mixed_precision: bfloat16 -> bf16, float16/float32 -> fp16 mixed precision.
- swift/arguments/base_args/base_args.py:93 tuner_type 'lora' (3.x: train_type).
- swift/arguments/tuner_args.py:126 target_modules ['all-linear'], :133 lora_rank 8, :134 lora_alpha 32,
  :135 lora_dropout 0.05.
- swift/arguments/base_args/quant_args.py:33 quant_method, :36 quant_bits, :41 bnb_4bit_quant_type nf4,
  :42 bnb_4bit_use_double_quant True; :44-56 bnb takes 4 or 8 bits.
- swift/trainers/arguments.py:129 per_device_train_batch_size 1, :131 gradient_accumulation_steps None,
  :134 gradient_checkpointing True; swift/arguments/base_args/template_args.py:130 max_length None (the model's).
- swift/arguments/rlhf_args.py:232 rlhf_type 'dpo' (dpo, orpo, simpo, kto, cpo, rm, ppo, grpo, gkd), :233
  ref_model, :239 beta None, :241 max_completion_length 512, :70 teacher_model, :163 num_generations 8;
  :291-298 the reference: none for GRPO with beta 0, a full copy for dpo/kto/ppo/grpo with full tuning, none
  passed with LoRA (the adapter switched off; a ref_model with LoRA is refused); :355-356 GRPO's beta defaults to
  0.04 (a reference, unlike TRL's 0.0).
- swift/rlhf_trainers/args_mixin.py:37 vllm_gpu_memory_utilization 0.9, :169 use_vllm False, :170 vllm_mode None
  (required with use_vllm, rlhf_args.py:446-447), :188 sleep_level 0.
"""

from __future__ import annotations

import math
import shlex

from ..errors import InvalidSetupError, SourceError
from ..options import PEFT_METHODS
from .reader import Reader, quant4, read_attention, read_deepspeed

_RLHF = ("dpo", "orpo", "simpo", "kto", "cpo", "ppo", "grpo", "gkd")
_WITH_REFERENCE = ("dpo", "kto", "ppo", "grpo")
# ms-swift names DeepSpeed presets; memfit's ZeRO stage and offload for each (swift/arguments/sft_args.py
# _init_deepspeed maps them to swift/plugin/ds_config/*.json).
_DS_PRESETS = {"zero0": {"shard": "none"}, "zero1": {"shard": "zero1"}, "zero2": {"shard": "zero2"},
               "zero3": {"shard": "zero3"}, "zero2_offload": {"shard": "zero2", "offload": "optimizer"},
               "zero3_offload": {"shard": "zero3", "offload": "optimizer+params"}}


def command_line(text: str, name: str) -> dict:
    """`swift sft|rlhf|pt --key value ...` (a shell script's first swift command) as the file's keys."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise SourceError(f"{name}: cannot split the command line ({exc})") from None
        if "swift" in words:
            words = words[words.index("swift") + 1:]
            if not words or words[0] not in ("sft", "rlhf", "pt"):
                continue
            out: dict = {}
            key = None
            for word in words[1:]:
                if word.startswith("--"):
                    key = word[2:].replace("-", "_")
                    out[key] = True          # a flag alone; a value below replaces it
                elif key is not None:
                    value = _scalar(word)
                    out[key] = value if out[key] is True else (
                        out[key] + [value] if isinstance(out[key], list) else [out[key], value])
            return out
    raise SourceError(f"{name}: no `swift sft`, `swift rlhf` or `swift pt` command in it")


def _scalar(word: str):
    """argparse's typed value as YAML would read it: numbers, true/false, otherwise the text."""
    low = word.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def read_swift(data: dict, base_dir=None, lines=None):
    from .formats import _mapped, field_keys
    from .vision import read_image_keys

    r = Reader(data, "ms-swift", base_dir, lines)
    model = r.text("model", what="a model name or path")
    defaults: list[str] = []
    tuner_key = "tuner_type" if r.has("tuner_type") else "train_type"
    tuner = (r.text(tuner_key, "lora", what="a tuner type") or "lora").lower()
    if not r.has(tuner_key):
        defaults.append("tuner_type not set: ms-swift's default lora (base_args.py:93)")
    if tuner in ("lora", "full"):
        method = tuner
    elif tuner in PEFT_METHODS:
        method = tuner
    else:
        r.problem(tuner_key, f"{tuner} is not modelled (memfit models lora, full and {', '.join(PEFT_METHODS)})")
        method = "lora"
    setup: dict = {"recipe": "ms-swift", "method": method}
    quant_method = r.text("quant_method", what="a quantization method")
    bits = r.get("quant_bits")
    if quant_method is None and bits is not None:
        # quant_args.py:45-46 get_quantization_config: no quant_method, no quantization
        r.note("key-not-honoured", "quant_bits", "ignored by ms-swift without quant_method (quant_args.py:45-46): "
                                                 "estimated unquantized; give quant_method bnb for a 4/8-bit base")
    elif quant_method:
        if quant_method != "bnb":
            r.problem("quant_method", f"{quant_method} is not modelled (memfit models bitsandbytes, quant_method bnb)")
        elif bits not in (4, 8):
            r.problem("quant_bits", f"bnb takes 4 or 8 bits (quant_args.py:49-56), got {bits}")
        elif method == "full":
            r.problem("quant_bits", "a quantized base needs an adapter (tuner_type lora): transformers refuses to "
                                    "fine-tune a purely quantized model")
        elif method != "lora":
            r.problem("quant_bits", f"memfit models a quantized base with LoRA, not {method}")
        else:
            setup["method"] = "qlora"
            if bits == 4:
                qtype = r.choice("bnb_4bit_quant_type", ("nf4", "fp4"), "nf4", "bitsandbytes 4-bit types")
                setup["quant"] = quant4(r, qtype, r.flag("bnb_4bit_use_double_quant", True),
                                        "bnb_4bit_use_double_quant")
                if not r.has("bnb_4bit_use_double_quant"):
                    defaults.append("bnb_4bit_use_double_quant not set: ms-swift's default true (quant_args.py:42)")
            else:
                setup["quant"] = "int8"
    setup["batch_size"] = r.option("per_device_train_batch_size", "batch_size", 1)
    if not r.has("per_device_train_batch_size"):
        defaults.append("per_device_train_batch_size not set: ms-swift's default 1 (trainers/arguments.py:129)")
    accum = r.option("gradient_accumulation_steps", "grad_accum", None)
    if accum is not None:
        setup["grad_accum"] = accum
    else:
        # trainers/arguments.py:131 None -> ceil(16 / batch / world size) in _init_gradient_accumulation_steps
        setup["grad_accum"] = max(1, math.ceil(16 / (setup["batch_size"] or 1)))
        defaults.append(f"gradient_accumulation_steps not set: ms-swift's ceil(16 / batch / GPUs) = "
                        f"{setup['grad_accum']} on one GPU")
    length = r.option("max_length", "seq_len", None)
    if length is not None:
        setup["seq_len"] = length     # not set: apply_model takes the model's max_model_len, as ms-swift does
    setup["grad_ckpt"] = r.flag("gradient_checkpointing", True)
    if method != "full":
        setup["lora_rank"] = r.option("lora_rank", "lora_rank", 8)
        setup["lora_dropout"] = r.option("lora_dropout", "lora_dropout", 0.05)
        r.get("lora_alpha")            # a scale: no memory
        targets = r.targets("target_modules")
        if targets:
            setup["lora_targets"] = targets
    dtype = r.choice("torch_dtype", ("bfloat16", "float16", "float32"), None, "ms-swift's torch_dtype values")
    if dtype:
        # model_args.py:130-141: the weights load in torch_dtype; float32 trains under fp16 mixed precision
        setup["precision"] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp16-mixed"}[dtype]
    attn = read_attention(r, "attn_impl") if r.has("attn_impl") else None
    if attn:
        setup["attn"] = attn
    ds = r.get("deepspeed")
    if isinstance(ds, str) and ds.lower() in _DS_PRESETS:
        setup.update(_DS_PRESETS[ds.lower()])
    else:
        read_deepspeed(r, setup)
    keys = field_keys("ms-swift", batch_size="per_device_train_batch_size", seq_len="max_length",
                      grad_accum="gradient_accumulation_steps", grad_ckpt="gradient_checkpointing",
                      lora_rank="lora_rank", lora_targets="target_modules", method=tuner_key)
    if r.has("freeze_vit") and not r.flag("freeze_vit", True):
        r.note("key-not-honoured", "freeze_vit", "false trains the vision tower: memfit models it frozen (ms-swift's "
                                                 "default freeze_vit true, tuner_args.py), so the estimate is low")
    _rlhf(r, setup, defaults, keys)
    read_image_keys(r, setup, keys)
    dataset = _first_dataset(r)
    return _mapped(r, model, setup, defaults, keys, dataset, "dataset" if dataset else None)


def _first_dataset(r: Reader) -> str | None:
    """The first dataset of `dataset` (a list or one string); ms-swift's '#N' suffix samples N rows."""
    value = r.get("dataset")
    first = value[0] if isinstance(value, list) and value else value
    return (first.split("#")[0].strip() or None) if isinstance(first, str) else None


def apply_model(mapped, spec) -> None:
    """max_length not set: ms-swift takes the model's max_model_len (template_args.py:130). And a note where ms-swift
    hooks a tower that transformers alone leaves out of the graph."""
    if mapped.tool != "ms-swift":
        return
    if "seq_len" not in mapped.setup and not spec.max_positions:
        raise InvalidSetupError("max_length: not set, and memfit does not know this model's context length, which "
                                "ms-swift would then use (template_args.py:130): give max_length")
    if "seq_len" not in mapped.setup:
        mapped.setup["seq_len"] = spec.max_positions
        mapped.defaults.append(f"max_length not set: ms-swift uses the model's max_model_len, "
                               f"{spec.max_positions:,} tokens, and pads each batch to its longest sample (set "
                               f"max_length, or give the dataset to size it by its longest row)")
    vision = spec.vision
    if vision is not None and vision.family == "qwen3_vl" and mapped.setup.get("grad_ckpt"):
        from ..vision import plan_images

        # swift/model/models/qwen.py Qwen2VLLoader.get_model (Qwen3VLLoader's too) patch_get_input_embeddings(
        # visual, 'patch_embed'): enable_input_require_grads then hooks the tower, whose checkpointed blocks keep
        # their inputs; physics/vision.py follows transformers, where Qwen3-VL's tower is not hooked.
        try:
            plan = plan_images(vision, mapped.setup.get("image_size"), mapped.setup.get("images_per_sample", 1),
                               mapped.setup.get("min_pixels"), mapped.setup.get("max_pixels"), None)
        except Exception:   # an image setting the estimate itself refuses, with its own message
            return
        missing = mapped.setup.get("batch_size", 1) * plan.patches * vision.depth * vision.hidden_size * 2
        mapped.notes.append(("key-not-honoured", f"gradient_checkpointing: ms-swift hooks Qwen3-VL's patch embedding "
                             f"(patch_get_input_embeddings), so the frozen tower keeps each block's input: about "
                             f"{missing / 2**30:.2f} GiB more than this estimate, which follows transformers"))


def _rlhf(r: Reader, setup: dict, defaults: list, keys: dict) -> None:
    if not r.has("rlhf_type"):
        return
    kind = (r.text("rlhf_type", what="an RLHF type") or "").lower()
    if kind == "rm":
        r.problem("rlhf_type", "rm (reward-model training) is not modelled (memfit models dpo, orpo, simpo, kto, "
                               "cpo, ppo, grpo and gkd)")
        return
    if kind not in _RLHF:
        r.problem("rlhf_type", f"{kind!r} is not one of ms-swift's RLHF types ({', '.join(_RLHF)}, rm)")
        return
    setup["trainer"] = kind
    keys["trainer"] = "rlhf_type"
    full = setup["method"] == "full"
    beta = r.get("beta")
    if r.has("ref_model") and not full:
        r.problem("ref_model", "ms-swift refuses a ref_model with LoRA training (rlhf_args.py:297-298): the "
                               "reference is the adapter switched off")
    if kind in _WITH_REFERENCE:
        no_kl = kind == "grpo" and isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta == 0
        setup["ref_model"] = "none" if no_kl else ("copy" if full else "adapter-off")
        if kind == "grpo" and beta is None:
            defaults.append("beta not set: ms-swift's GRPO default 0.04 (rlhf_args.py:355-356): a reference "
                            "model (TRL's default is 0.0, none)")
    keys["ref_model"] = "beta" if kind == "grpo" else "ref_model"
    if kind in ("dpo", "kto"):
        # ms-swift's DPO/KTO concatenated_forward takes the model's full logits (swift/rlhf_trainers/dpo_trainer.py:
        # 99-130 outputs.logits -> get_per_token_logps), not TRL's fused head.
        setup["loss"] = "hf"
    if kind in ("grpo", "ppo", "gkd"):
        completion = r.option("max_completion_length", "completion_len", 512)
        setup["completion_len"] = completion
        keys["completion_len"] = "max_completion_length"
        if not r.has("max_completion_length"):
            defaults.append("max_completion_length not set: ms-swift's default 512 (rlhf_args.py:241)")
        if setup.get("seq_len") and completion and completion < setup["seq_len"]:
            setup["prompt_len"] = setup["seq_len"] - completion
            setup["seq_len"] = setup["prompt_len"] + completion
        if kind == "grpo":
            setup["loss"] = "plain"
            defaults.append("ms-swift's GRPO scores the completion's logits (logits_to_keep, then TRL's "
                            "selective_log_softmax: swift/rlhf_trainers/grpo_trainer.py:47, :1432-1452); priced "
                            "as the plain loss over the rows (an upper bound)")
    if kind == "grpo":
        setup["num_generations"] = r.option("num_generations", "num_generations", 8)
        keys["num_generations"] = "num_generations"
        if not r.has("num_generations"):
            defaults.append("num_generations not set: ms-swift's default 8 (rlhf_args.py:163)")
    if kind in ("grpo", "ppo", "gkd") and r.flag("use_vllm"):
        mode = r.choice("vllm_mode", ("colocate", "server"), None, "ms-swift's vLLM modes")
        if mode is None:
            r.problem("vllm_mode", "not set: ms-swift requires vllm_mode with use_vllm (rlhf_args.py:446-447)")
        setup["generation"] = "vllm-server" if mode == "server" else "vllm-colocate"
        if mode == "colocate":
            setup["vllm_gpu_util"] = r.option("vllm_gpu_memory_utilization", "vllm_gpu_util", 0.9)
            if not r.has("vllm_gpu_memory_utilization"):
                defaults.append("vllm_gpu_memory_utilization not set: ms-swift's default 0.9 (args_mixin.py:37)")
            level = r.int("sleep_level", 0)
            if level:
                setup["vllm_sleep"] = True
        keys.update(generation="vllm_mode", vllm_gpu_util="vllm_gpu_memory_utilization", vllm_sleep="sleep_level")
    if kind == "gkd":
        teacher = r.text("teacher_model", what="a model name or path")
        if teacher:
            setup["teacher"] = teacher
        keys["teacher"] = "teacher_model"
