"""Advice as edits to the tool's own config keys, and writing the edited config with its comments kept.

A suggestion carries the setup options it changes (``Suggestion.changes``); each becomes an edit at the key the
options table names for that tool (options.tool_key), in the value spelling the tool accepts.
"""

from __future__ import annotations

import copy

from ..options import tool_key
from ..spec import FAMILY_TRAITS
from .formats import MODEL_KEYS, TORCHTUNE_ATTN

# memfit optimizer -> HF TrainingArguments.optim, which axolotl, LLaMA-Factory and TRL all take (transformers 5.24
# training_args.py OptimizerNames).
_HF_OPTIM = {"adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit", "adamw": "adamw_torch",
             "adamw-fused": "adamw_torch_fused"}
OPTIMIZER_NAMES = {  # memfit optimizer -> each tool's spelling
    "axolotl": _HF_OPTIM, "llamafactory": _HF_OPTIM, "trl": _HF_OPTIM,
    "torchtune": {"adamw-8bit": "bitsandbytes.optim.AdamW8bit", "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
                  "adamw": "torch.optim.AdamW", "adamw-fused": "torch.optim.AdamW"},
    "mlx": {"adamw": "adamw", "sgd": "sgd", "adafactor": "adafactor"},
}
# Constructor arguments torch's AdamW takes and bitsandbytes' optimizers do not (bitsandbytes 0.45
# optim/adamw.py AdamW8bit.__init__ has no `fused` or `foreach`): dropped when the optimizer changes.
_TORCH_ONLY_ARGS = ("fused", "foreach", "capturable", "differentiable")
# The module names configs list (Llama-style; PEFT matches them by suffix) and torchtune's attention names.
_TARGET_NAMES = FAMILY_TRAITS["llama"]["names"]
_TORCHTUNE_ATTN = {_TARGET_NAMES[target]: name for name, target in TORCHTUNE_ATTN.items()}


def edits_for(tool: str, changes: dict, data: dict) -> tuple[dict, str | None]:
    """{dotted key: new value (None removes the key)} for a suggestion's option changes, leaving out edits that
    change nothing; or (partial, reason) when the tool has no key for one of them."""
    out: dict = {}
    for name, value in changes.items():
        if name == "loss" and "chunked_ce" in changes:
            continue                     # the loss follows from the chunked switch written for chunked_ce
        edits = _one(tool, name, value, data)
        if edits is None:
            return out, f"{tool} has no setting for {name} {value} (a launcher or another tool's option)"
        out.update(edits)
    return {k: v for k, v in out.items() if get_dotted(data, k) != v or (v is None and _has(data, k))}, None


def _one(tool: str, name: str, value, data: dict) -> dict | None:  # noqa: C901 (one branch per kind of value)
    if name == "offload" and value == "none":
        return {}
    if name == "model":
        # torchtune names a model builder, not a model: memfit cannot write one for it.
        return {MODEL_KEYS[tool]: value} if tool != "torchtune" else None
    if name == "method":
        return _method(tool, value, data)
    if name == "optimizer":
        return _optimizer(tool, value, data)
    if name == "lora_targets":
        return _targets(tool, value)
    key = tool_key(name, tool)
    if key is None:
        return None
    if name == "seq_len" and tool == "trl" and "max_seq_length" in data:
        key = "max_seq_length"           # TRL < 0.20 spelling, kept when the file uses it
    if name == "grad_ckpt" and tool == "llamafactory":
        return {key: not value}          # LLaMA-Factory's switch is disable_gradient_checkpointing
    if name == "chunked_ce":
        if tool == "torchtune":
            return {key: "torchtune.modules.loss.CEWithChunkedOutputLoss"} if value else None
        return {key: bool(value)}
    if name in ("quant", "precision", "attn"):
        return None                      # not levers memfit proposes; never written
    return {key: value}


def _optimizer(tool: str, value: str, data: dict) -> dict | None:
    names = OPTIMIZER_NAMES.get(tool, {})
    if value not in names:
        return None
    key = tool_key("optimizer", tool)
    edits = {key: names[value]}
    if tool == "torchtune":
        current = data.get("optimizer") if isinstance(data.get("optimizer"), dict) else {}
        if value == "adamw-fused":
            edits["optimizer.fused"] = True
        elif value == "adamw":
            edits["optimizer.fused"] = False if "fused" in current else None
        for arg in _TORCH_ONLY_ARGS if value not in ("adamw", "adamw-fused") else ():
            if arg in current:
                edits[f"optimizer.{arg}"] = None
    return edits


def _targets(tool: str, value) -> dict | None:
    names = [_TARGET_NAMES[t] for t in value]
    if tool == "axolotl":
        return {"lora_target_modules": names, "lora_target_linear": False}
    if tool == "llamafactory":
        return {"lora_target": ",".join(names)}
    if tool == "trl":
        return {"lora_target_modules": names}
    if tool == "torchtune":
        return {"model.lora_attn_modules": [_TORCHTUNE_ATTN[n] for n in names if n in _TORCHTUNE_ATTN],
                "model.apply_lora_to_mlp": any(n in names for n in ("gate_proj", "up_proj", "down_proj"))}
    return None


def _method(tool: str, method: str, data: dict) -> dict | None:
    if tool == "axolotl":
        return {"adapter": method, "load_in_4bit": method == "qlora"} if method != "full" else None
    if tool == "llamafactory":
        return {"finetuning_type": "lora", "quantization_bit": 4 if method == "qlora" else None}
    if tool == "trl":
        # TRL's ModelConfig.use_bnb_nested_quant defaults to false; memfit's QLoRA is double-quantized (nf4-dq).
        return {"use_peft": True, "load_in_4bit": method == "qlora",
                **({"use_bnb_nested_quant": True} if method == "qlora" else {})}
    if tool == "torchtune":
        component = str((data.get("model") or {}).get("_component_", ""))
        module, _, builder = component.rpartition(".")
        base = builder.removeprefix("qlora_").removeprefix("lora_")
        return {"model._component_": f"{module}.{'qlora_' if method == 'qlora' else 'lora_'}{base}"}
    if tool == "mlx" and method == "lora":
        return {"fine_tune_type": "lora"}
    return None


def apply_edits(data, edits: dict):
    """A copy of `data` (a dict, or ruamel's CommentedMap: its comments and order are kept) with the edits."""
    out = copy.deepcopy(data)
    for dotted, value in edits.items():
        keys = dotted.split(".")
        target = out
        for key in keys[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
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


def _has(data: dict, dotted: str) -> bool:
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return isinstance(node, dict) and last in node
