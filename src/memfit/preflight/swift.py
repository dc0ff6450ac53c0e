"""ms-swift's config file (`swift sft config.yaml`: its keys are the command's arguments, swift/cli/main.py
parse_yaml_args, plus an ENV section of environment variables), read into a memfit setup.

Defaults cited from modelscope/ms-swift 3602360: swift/arguments/base_args/base_args.py (tuner_type 'lora',
ms-swift 3's train_type; max_length None -> the model's max_model_len), base_args/quant_args.py (quant_method,
quant_bits, bnb_4bit_quant_type 'nf4', bnb_4bit_use_double_quant true), tuner_args.py (lora_rank 8, lora_dropout
0.05, target_modules ['all-linear'], freeze_vit true), swift/trainers/arguments.py (per_device_train_batch_size 1,
gradient_checkpointing true, gradient_accumulation_steps None -> ceil(16 / batch / world size)). The image keys
(max_pixels, ENV MAX_PIXELS / MIN_PIXELS) are preflight/vision.py's.
"""

from __future__ import annotations

import math

from ..options import BY_NAME
from .reader import ATTENTION_NAMES, Reader, quant4

MODEL_KEY = "model"
# ms-swift attn_impl spellings (base_args/model_args.py) beyond the common ones.
_ATTN = {**ATTENTION_NAMES, "flash_attn": "flash", "flash_attention_2": "flash"}


def read_swift(data: dict, base_dir=None, lines=None):
    from .formats import _mapped, field_keys
    from .vision import read_image_keys

    r = Reader(data, "swift", base_dir, lines)
    model = r.text(MODEL_KEY, what="a model id or path")
    type_key = "tuner_type" if r.has("tuner_type") or not r.has("train_type") else "train_type"
    tuner = (r.text(type_key, "lora", what="a tuner type") or "lora").strip().lower()
    defaults: list[str] = []
    if not r.has(type_key):
        defaults.append("tuner_type not set: ms-swift's default lora")
    methods = BY_NAME["method"].choices
    if tuner not in methods or tuner == "qlora":
        r.problem(type_key, f"{tuner!r} is not a method memfit models ({', '.join(m for m in methods if m != 'qlora')})")
        tuner = "lora"
    method, quant = tuner, None
    bits, quant_method = r.get("quant_bits"), r.text("quant_method", what="a quantization method")
    if quant_method is not None or bits is not None:
        if quant_method not in (None, "bnb"):
            r.problem("quant_method", f"{quant_method!r}: memfit models bitsandbytes (bnb) quantization only")
        elif bits not in (4, 8):
            r.problem("quant_bits", f"bnb takes 4 or 8 bits, got {bits!r}")
        elif method != "lora":
            r.problem("quant_bits", "a quantized base needs tuner_type lora (memfit models QLoRA)")
        else:
            method = "qlora"
            quant = "int8" if bits == 8 else quant4(
                r, r.choice("bnb_4bit_quant_type", ("nf4", "fp4"), "nf4", "bitsandbytes 4-bit types"),
                r.flag("bnb_4bit_use_double_quant", True), "bnb_4bit_use_double_quant")
    batch = r.int("per_device_train_batch_size", 1, minimum=1) or 1
    setup = {"method": method, "quant": quant, "batch_size": batch,
             "grad_ckpt": r.flag("gradient_checkpointing", True), "recipe": "hf"}
    if r.has("max_length"):
        setup["seq_len"] = r.option("max_length", "seq_len")
    if r.has("gradient_accumulation_steps"):
        setup["grad_accum"] = r.option("gradient_accumulation_steps", "grad_accum")
    else:
        setup["grad_accum"] = max(1, math.ceil(16 / batch))
        defaults.append(f"gradient_accumulation_steps not set: ms-swift's ceil(16 / batch / GPUs) = "
                        f"{setup['grad_accum']} on one GPU")
    defaults += [f"{k} not set: ms-swift's default {v}" for k, v in (
        ("per_device_train_batch_size", 1), ("gradient_checkpointing", "true")) if not r.has(k)]
    if method != "full":
        setup["lora_rank"] = r.option("lora_rank", "lora_rank", 8)
        setup["lora_dropout"] = r.option("lora_dropout", "lora_dropout", 0.05)
        targets = r.targets("target_modules")
        setup["lora_targets"] = targets or "all-linear"
    attn = r.text("attn_impl", what="an attention implementation name")
    if attn is not None and attn.lower() != "auto":
        if attn.strip().lower() in _ATTN:
            setup["attn"] = _ATTN[attn.strip().lower()]
        else:
            r.note("key-not-honoured", "attn_impl", f"{attn!r} is not an attention kernel memfit models")
    if r.has("freeze_vit") and not r.flag("freeze_vit", True):
        r.note("key-not-honoured", "freeze_vit", "false trains the vision tower: memfit models it frozen (ms-swift's "
                                                 "default freeze_vit true), so the estimate is low")
    for key in ("deepspeed", "rlhf_type", "fsdp"):
        if r.has(key):
            r.note("key-not-honoured", key, "not read from an ms-swift config yet: estimated on one GPU with SFT")
            r.get(key)
    keys = field_keys("swift", seq_len="max_length", batch_size="per_device_train_batch_size",
                      grad_accum="gradient_accumulation_steps", grad_ckpt="gradient_checkpointing",
                      lora_rank="lora_rank", lora_dropout="lora_dropout")
    read_image_keys(r, setup, keys)
    dataset = _first_dataset(r)
    return _mapped(r, model, setup, defaults, keys, dataset, "dataset" if dataset else None)


def _first_dataset(r: Reader) -> str | None:
    """The first dataset of `dataset` (a list or one string); ms-swift's '#N' suffix samples N rows."""
    value = r.get("dataset")
    first = value[0] if isinstance(value, list) and value else value
    return first.split("#")[0].strip() or None if isinstance(first, str) else None


def apply_model(mapped, spec) -> None:
    """max_length not set: ms-swift takes the model's max_model_len (base_args.py). And a note where ms-swift
    hooks a tower that transformers alone leaves out of the graph."""
    if mapped.tool != "swift":
        return
    if "seq_len" not in mapped.setup and spec.max_positions:
        mapped.setup["seq_len"] = spec.max_positions
        mapped.defaults.append(f"max_length not set: ms-swift uses the model's max_model_len, "
                               f"{spec.max_positions:,} tokens (set max_length)")
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
