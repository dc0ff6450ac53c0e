"""Advice as edits to the tool's own config keys, and writing the edited config."""

from __future__ import annotations

import copy

OPTIMIZER_NAMES = {  # memfit optimizer -> each tool's spelling
    "axolotl": {"adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit", "adamw": "adamw_torch",
                "adamw-fused": "adamw_torch_fused"},
    "llamafactory": {"adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit", "adamw": "adamw_torch",
                     "adamw-fused": "adamw_torch_fused"},
    "trl": {"adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit", "adamw": "adamw_torch",
            "adamw-fused": "adamw_torch_fused"},
    "torchtune": {"adamw-8bit": "bitsandbytes.optim.AdamW8bit", "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
                  "adamw": "torch.optim.AdamW", "adamw-fused": "torch.optim.AdamW"},
}
_TARGET_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                 "down": "down_proj"}


def edits_for(tool: str, args: dict, data: dict) -> tuple[dict, str | None]:
    """{dotted key: new value} for a suggestion's flags, or (partial, reason) when the tool has no such key."""
    out: dict = {}
    for flag, value in args.items():
        key_edits = _one(tool, flag, value, data)
        if key_edits is None:
            return out, f"{tool} has no setting for {flag} {value}"
        out.update(key_edits)
    return out, None


def _one(tool: str, flag: str, value, data: dict) -> dict | None:  # noqa: C901 (a table, one branch per tool)
    if flag == "combined":
        return {}
    if flag == "--offload" and value == "none":
        return {}
    if flag == "--grad-ckpt":
        return {"axolotl": {"gradient_checkpointing": True}, "llamafactory": {"disable_gradient_checkpointing": False},
                "torchtune": {"enable_activation_checkpointing": True}, "trl": {"gradient_checkpointing": True},
                "mlx": {"grad_checkpoint": True}}.get(tool)
    if flag == "--batch-size":
        key = {"axolotl": "micro_batch_size", "llamafactory": "per_device_train_batch_size", "torchtune": "batch_size",
               "trl": "per_device_train_batch_size", "mlx": "batch_size"}[tool]
        return {key: value}
    if flag == "--grad-accum":
        key = {"axolotl": "gradient_accumulation_steps", "llamafactory": "gradient_accumulation_steps",
               "torchtune": "gradient_accumulation_steps", "trl": "gradient_accumulation_steps"}.get(tool)
        return {key: value} if key else None
    if flag == "--seq-len":
        key = {"axolotl": "sequence_len", "llamafactory": "cutoff_len", "torchtune": "tokenizer.max_seq_len",
               "trl": "max_length" if "max_seq_length" not in data else "max_seq_length", "mlx": "max_seq_length"}[tool]
        return {key: value}
    if flag == "--optimizer":
        names = OPTIMIZER_NAMES.get(tool, {})
        if value not in names:
            return None
        key = {"axolotl": "optimizer", "llamafactory": "optim", "trl": "optim", "torchtune": "optimizer._component_"}
        return {key[tool]: names[value]}
    if flag == "--method":
        return _method(tool, value, data)
    if flag == "--lora-rank":
        key = {"axolotl": "lora_r", "llamafactory": "lora_rank", "torchtune": "model.lora_rank", "trl": "lora_r",
               "mlx": "lora_parameters.rank"}[tool]
        return {key: value}
    if flag == "--lora-targets":
        names = [_TARGET_NAMES[t] for t in str(value).split(",")]
        if tool == "axolotl":
            return {"lora_target_modules": names, "lora_target_linear": False}
        if tool == "llamafactory":
            return {"lora_target": ",".join(names)}
        if tool == "trl":
            return {"lora_target_modules": names}
        if tool == "torchtune":
            return {"model.lora_attn_modules": [{"o_proj": "output_proj"}.get(n, n) for n in names
                                                if n in ("q_proj", "k_proj", "v_proj", "o_proj")],
                    "model.apply_lora_to_mlp": any(n in names for n in ("gate_proj", "up_proj", "down_proj"))}
        return None
    if flag == "--chunked-ce":
        return {"axolotl": {"cut_cross_entropy": True}, "llamafactory": {"enable_liger_kernel": True},
                "torchtune": {"loss._component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
                "trl": {"use_liger_kernel": True}}.get(tool)
    if flag == "model":
        key = {"axolotl": "base_model", "llamafactory": "model_name_or_path", "trl": "model_name_or_path",
               "mlx": "model"}.get(tool)
        return {key: value} if key else None
    return None      # --gpus / --shard: a launcher setting, not a key of these configs


def _method(tool: str, method: str, data: dict) -> dict | None:
    if tool == "axolotl":
        return {"adapter": method, "load_in_4bit": method == "qlora"} if method != "full" else None
    if tool == "llamafactory":
        return {"finetuning_type": "lora", "quantization_bit": 4 if method == "qlora" else None}
    if tool == "trl":
        return {"use_peft": True, "load_in_4bit": method == "qlora"}
    if tool == "torchtune":
        component = str((data.get("model") or {}).get("_component_", ""))
        module, _, builder = component.rpartition(".")
        base = builder.removeprefix("qlora_").removeprefix("lora_")
        return {"model._component_": f"{module}.{'qlora_' if method == 'qlora' else 'lora_'}{base}"}
    if tool == "mlx" and method == "lora":
        return {"fine_tune_type": "lora"}
    return None


def apply_edits(data: dict, edits: dict) -> dict:
    out = copy.deepcopy(data)
    for dotted, value in edits.items():
        node, *path = dotted.split(".")
        target = out
        keys = [node, *path]
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return out


def get_dotted(data: dict, dotted: str):
    node = data
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node
