"""Training configs of five tools, read into a memfit setup, with each tool's own key names and defaults.

Each reader returns a Mapped: the model reference, the TrainingSetup arguments, which keys were used, which
defaults were assumed (the tool's own, cited), which keys were ignored because they do not affect memory, and
for each memfit field the key that sets it (so advice comes back as edits to that key).
Defaults: axolotl src/axolotl/utils/schemas/config.py; LLaMA-Factory src/llamafactory/hparams/*.py;
torchtune recipes/configs/*.yaml and recipes/*_single_device.py; TRL trl/trainer/sft_config.py and
transformers TrainingArguments; mlx-lm mlx_lm/lora.py CONFIG_DEFAULTS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidSetupError
from ..setup import normalize_optimizer, parse_targets

FORMATS = ("axolotl", "llamafactory", "torchtune", "trl", "mlx")


@dataclass
class Mapped:
    tool: str
    model: str
    setup: dict
    used: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    keys: dict = field(default_factory=dict)          # memfit field -> the config key that sets it
    dataset: str | None = None


def detect_format(data: dict) -> str:
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):
        return "torchtune"
    if "base_model" in data:
        return "axolotl"
    if "finetuning_type" in data or "stage" in data or "cutoff_len" in data or "template" in data:
        return "llamafactory"
    if "fine_tune_type" in data or "lora_parameters" in data or ("model" in data and "iters" in data):
        return "mlx"
    if "model_name_or_path" in data or "per_device_train_batch_size" in data:
        return "trl"
    raise InvalidSetupError("cannot tell which tool this config is for (axolotl, LLaMA-Factory, torchtune, "
                            "TRL / HF Trainer, mlx-lm): pass --format-of")


class _Reader:
    """Typed access that records which keys were read."""

    def __init__(self, data: dict, tool: str, base_dir=None):
        self.data, self.tool, self.used = data, tool, []
        self.base_dir = base_dir     # the config's folder, for relative paths (a DeepSpeed JSON)

    def get(self, key: str, default=None):
        if key in self.data and self.data[key] is not None:
            self.used.append(key)
            return self.data[key]
        return default

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def int(self, key: str, default: int | None = None) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetupError(f"{key}: expected a whole number, got {value!r}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if isinstance(value, str) and value.lower() in ("true", "false", "auto"):
            return value.lower() != "false"
        return bool(value)


def _precision(bf16, fp16, default: str = "auto") -> str:
    if fp16 and bf16:
        raise InvalidSetupError("bf16 and fp16 are both enabled: pick one")
    if fp16:
        return "auto"   # fp16 mixed over the checkpoint dtype; memfit's auto keeps the loaded dtype
    return default


def _attn(value) -> str | None:
    if value in (None, "auto"):
        return None
    text = str(value).lower()
    if text in ("fa2", "flash_attention_2", "flash", "true"):
        return "flash"
    if text in ("sdpa", "sdp_attention"):
        return "sdpa"
    if text in ("eager", "disabled"):
        return "eager"
    return None


# ---- axolotl ----------------------------------------------------------------------------------------------------
def read_axolotl(data: dict, base_dir=None) -> Mapped:
    r = _Reader(data, "axolotl", base_dir)
    model = r.get("base_model")
    adapter = r.get("adapter")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    if four and eight:
        raise InvalidSetupError("load_in_4bit and load_in_8bit are both true")
    if four and adapter not in ("qlora", "lora"):
        raise InvalidSetupError("load_in_4bit needs adapter: qlora")
    method = "qlora" if (adapter == "qlora" or four) else ("lora" if adapter == "lora" else "full")
    setup = {"method": method, "batch_size": r.int("micro_batch_size", 1), "seq_len": r.int("sequence_len", 512),
             "grad_accum": r.int("gradient_accumulation_steps", 1), "grad_ckpt": r.flag("gradient_checkpointing"),
             "recipe": "axolotl"}
    keys = {"batch_size": "micro_batch_size", "seq_len": "sequence_len", "grad_accum": "gradient_accumulation_steps",
            "grad_ckpt": "gradient_checkpointing", "optimizer": "optimizer", "lora_rank": "lora_r",
            "method": "adapter", "chunked_ce": "cut_cross_entropy"}
    defaults = [f"{k} not set: axolotl's default {v}" for k, v in (("micro_batch_size", 1), ("sequence_len", 512),
                ("gradient_accumulation_steps", 1), ("gradient_checkpointing", False)) if not r.has(k)]
    if r.has("optimizer"):
        setup["optimizer"] = normalize_optimizer(r.get("optimizer"))
    else:
        setup["optimizer"] = "adamw-fused"
        defaults.append("optimizer not set: HF Trainer's default adamw_torch_fused")
    if method != "full":
        setup["lora_rank"] = r.int("lora_r", 8)
        setup["lora_dropout"] = float(r.get("lora_dropout", 0.0))
        if r.flag("lora_target_linear"):
            setup["lora_targets"] = parse_targets("all-linear")
        elif r.has("lora_target_modules"):
            setup["lora_targets"] = parse_targets(",".join(r.get("lora_target_modules")))
    attn = "flash" if r.flag("flash_attention") else ("sdpa" if r.flag("sdp_attention") else None)
    if attn:
        setup["attn"] = attn
    if r.flag("cut_cross_entropy"):
        setup["chunked_ce"] = True
    setup["precision"] = _precision(r.flag("bf16"), r.flag("fp16"))
    ds = data.get("datasets")
    dataset = ds[0].get("path") if isinstance(ds, list) and ds and isinstance(ds[0], dict) else None
    _deepspeed(r, setup, r.get("deepspeed"))
    _fsdp(r, setup)
    return Mapped("axolotl", model, setup, r.used, defaults, _ignored(data, r.used), keys, dataset)


# ---- LLaMA-Factory ----------------------------------------------------------------------------------------------
def read_llamafactory(data: dict, base_dir=None) -> Mapped:
    r = _Reader(data, "llamafactory", base_dir)
    model = r.get("model_name_or_path")
    ftype = r.get("finetuning_type", "lora")
    qbit = r.int("quantization_bit")
    if ftype == "full" and qbit:
        raise InvalidSetupError("finetuning_type: full contradicts quantization_bit (quantized training needs lora)")
    if ftype not in ("lora", "full"):
        raise InvalidSetupError(f"finetuning_type: {ftype} is not modelled (lora and full are)")
    method = "full" if ftype == "full" else ("qlora" if qbit == 4 else "lora")
    setup = {"method": method, "batch_size": r.int("per_device_train_batch_size", 8),
             "seq_len": r.int("cutoff_len", 2048), "grad_accum": r.int("gradient_accumulation_steps", 1),
             # LLaMA-Factory checkpoints by default: disable_gradient_checkpointing defaults to false.
             "grad_ckpt": not r.flag("disable_gradient_checkpointing"), "recipe": "hf"}
    if r.flag("enable_liger_kernel"):
        setup["chunked_ce"] = True      # model_args.py:137; Liger's fused linear cross-entropy
    defaults = [f"{k} not set: LLaMA-Factory's default {v}" for k, v in (
        ("per_device_train_batch_size", 8), ("cutoff_len", 2048), ("gradient_accumulation_steps", 1))
        if not r.has(k)]
    if not r.has("disable_gradient_checkpointing"):
        defaults.append("gradient checkpointing on: LLaMA-Factory's default (disable_gradient_checkpointing: false)")
    keys = {"batch_size": "per_device_train_batch_size", "seq_len": "cutoff_len",
            "grad_accum": "gradient_accumulation_steps", "grad_ckpt": "disable_gradient_checkpointing",
            "optimizer": "optim", "lora_rank": "lora_rank", "method": "finetuning_type"}
    setup["optimizer"] = normalize_optimizer(r.get("optim", "adamw_torch"))
    if not r.has("optim"):
        defaults.append("optim not set: adamw_torch (foreach AdamW on CUDA)")
    if method != "full":
        setup["lora_rank"] = r.int("lora_rank", 8)
        setup["lora_dropout"] = float(r.get("lora_dropout", 0.0))
        target = r.get("lora_target", "all")
        setup["lora_targets"] = parse_targets("all-linear" if target == "all" else target)
    attn = _attn(r.get("flash_attn"))
    if attn:
        setup["attn"] = attn
    setup["precision"] = "bf16" if r.flag("pure_bf16") else _precision(r.flag("bf16"), r.flag("fp16"))
    _deepspeed(r, setup, r.get("deepspeed"))
    dataset = None
    if r.has("dataset_dir") and r.has("dataset"):
        dataset = f"{r.get('dataset_dir')}/{str(r.get('dataset')).split(',')[0]}"
    return Mapped("llamafactory", model, setup, r.used, defaults, _ignored(data, r.used), keys, dataset)


# ---- torchtune --------------------------------------------------------------------------------------------------
_TT_MODELS = {  # torchtune builder -> catalog model
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B", "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B", "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B", "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B",
    "mistral_7b": "mistralai/Mistral-7B-v0.1", "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
}


def read_torchtune(data: dict, base_dir=None) -> Mapped:
    r = _Reader(data, "torchtune", base_dir)
    model_cfg = r.get("model") or {}
    component = str(model_cfg.get("_component_", ""))
    builder = component.rsplit(".", 1)[-1]
    method = "qlora" if builder.startswith("qlora_") else ("lora" if builder.startswith("lora_") else "full")
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    model = _TT_MODELS.get(base)
    if model is None:
        raise InvalidSetupError(f"model._component_ {component!r}: no catalog model for torchtune builder {base!r}")
    tokenizer = r.get("tokenizer") or {}
    setup = {"method": method, "batch_size": r.int("batch_size", 2),
             "seq_len": int(tokenizer.get("max_seq_len") or 2048),
             "grad_accum": r.int("gradient_accumulation_steps", 1),
             "grad_ckpt": r.flag("enable_activation_checkpointing"), "recipe": "torchtune",
             "precision": {"bf16": "bf16", "fp32": "fp32"}.get(str(r.get("dtype", "bf16")), "bf16")}
    defaults = [] if tokenizer.get("max_seq_len") else ["tokenizer.max_seq_len not set: memfit assumes 2048"]
    opt = r.get("optimizer") or {}
    opt_name = str(opt.get("_component_", "torch.optim.AdamW"))
    if "PagedAdamW8bit" in opt_name:
        setup["optimizer"] = "paged-adamw-8bit"
    elif "AdamW8bit" in opt_name:
        setup["optimizer"] = "adamw-8bit"
    else:
        setup["optimizer"] = "adamw-fused" if opt.get("fused") else "adamw"
    setup["optimizer_in_backward"] = r.flag("optimizer_in_bwd")
    loss = str((r.get("loss") or {}).get("_component_", ""))
    setup["chunked_ce"] = "Chunked" in loss
    if method != "full":
        setup["lora_rank"] = int(model_cfg.get("lora_rank", 8))
        targets = [{"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}.get(t, t)
                   for t in model_cfg.get("lora_attn_modules", ["q_proj", "v_proj"])]
        if model_cfg.get("apply_lora_to_mlp"):
            targets += ["gate", "up", "down"]
        setup["lora_targets"] = parse_targets(",".join(targets))
        setup["lora_dropout"] = float(model_cfg.get("lora_dropout", 0.0))
    keys = {"batch_size": "batch_size", "seq_len": "tokenizer.max_seq_len",
            "grad_accum": "gradient_accumulation_steps", "grad_ckpt": "enable_activation_checkpointing",
            "optimizer": "optimizer._component_", "lora_rank": "model.lora_rank", "method": "model._component_",
            "chunked_ce": "loss._component_"}
    ds = r.get("dataset") or {}
    dataset = ds.get("data_files") if isinstance(ds, dict) else None
    return Mapped("torchtune", model, setup, r.used, defaults, _ignored(data, r.used), keys, dataset)


# ---- TRL / HF Trainer -------------------------------------------------------------------------------------------
def read_trl(data: dict, base_dir=None) -> Mapped:
    r = _Reader(data, "trl", base_dir)
    model = r.get("model_name_or_path")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    if four and eight:
        raise InvalidSetupError("load_in_4bit and load_in_8bit are both true")
    peft = r.flag("use_peft") or four
    method = "qlora" if four else ("lora" if peft else "full")
    length_key = "max_length" if r.has("max_length") else ("max_seq_length" if r.has("max_seq_length") else None)
    setup = {"method": method, "batch_size": r.int("per_device_train_batch_size", 8),
             "seq_len": r.int(length_key, 1024) if length_key else 1024,
             "grad_accum": r.int("gradient_accumulation_steps", 1),
             "grad_ckpt": r.flag("gradient_checkpointing", False), "recipe": "hf"}
    defaults = [f"{k} not set: the default {v}" for k, v in (("per_device_train_batch_size", 8),
                ("gradient_accumulation_steps", 1)) if not r.has(k)]
    if length_key is None:
        defaults.append("max_length not set: SFTConfig's default 1024")
    setup["optimizer"] = normalize_optimizer(r.get("optim", "adamw_torch_fused"))
    if not r.has("optim"):
        defaults.append("optim not set: adamw_torch_fused (transformers >= 4.55 with torch >= 2.8)")
    if method != "full":
        setup["lora_rank"] = r.int("lora_r", 16)
        setup["lora_dropout"] = float(r.get("lora_dropout", 0.05))
        targets = r.get("lora_target_modules")
        if targets:
            setup["lora_targets"] = parse_targets(targets if isinstance(targets, str) else ",".join(targets))
        if not r.has("lora_r"):
            defaults.append("lora_r not set: TRL ModelConfig's default 16")
    attn = _attn(r.get("attn_implementation"))
    if attn:
        setup["attn"] = attn
    setup["precision"] = _precision(r.flag("bf16"), r.flag("fp16"))
    if r.flag("use_liger_kernel"):
        setup["chunked_ce"] = True
    keys = {"batch_size": "per_device_train_batch_size", "seq_len": length_key or "max_length",
            "grad_accum": "gradient_accumulation_steps", "grad_ckpt": "gradient_checkpointing", "optimizer": "optim",
            "lora_rank": "lora_r", "method": "load_in_4bit", "chunked_ce": "use_liger_kernel"}
    _deepspeed(r, setup, r.get("deepspeed"))
    _fsdp(r, setup)
    return Mapped("trl", model, setup, r.used, defaults, _ignored(data, r.used), keys, r.get("dataset_name"))


# ---- mlx-lm -----------------------------------------------------------------------------------------------------
def read_mlx(data: dict, base_dir=None) -> Mapped:
    r = _Reader(data, "mlx", base_dir)
    model = r.get("model")
    ftype = r.get("fine_tune_type", "lora")
    if ftype not in ("lora", "full"):
        raise InvalidSetupError(f"fine_tune_type: {ftype} is not modelled (lora and full are)")
    params = r.get("lora_parameters") or {}
    setup = {"method": "full" if ftype == "full" else "lora", "batch_size": r.int("batch_size", 4),
             "seq_len": r.int("max_seq_length", 2048), "grad_ckpt": r.flag("grad_checkpoint"), "recipe": "mlx",
             "grad_accum": r.int("grad_accumulation_steps", 1), "optimizer": "adamw"}
    if ftype != "full":
        setup["lora_rank"] = int(params.get("rank", 8))
        setup["lora_dropout"] = float(params.get("dropout", 0.0))
    defaults = [f"{k} not set: mlx-lm's default {v}" for k, v in (("batch_size", 4), ("max_seq_length", 2048),
                ("num_layers", 16)) if not r.has(k)]
    r.get("num_layers")
    keys = {"batch_size": "batch_size", "seq_len": "max_seq_length", "grad_ckpt": "grad_checkpoint",
            "lora_rank": "lora_parameters.rank", "method": "fine_tune_type"}
    data_dir = r.get("data")
    return Mapped("mlx", model, setup, r.used, defaults, _ignored(data, r.used), keys,
                  f"{data_dir}/train.jsonl" if data_dir else None)


def _fsdp(r: _Reader, setup: dict) -> None:
    """HF Trainer / TRL `fsdp: "full_shard auto_wrap"`, axolotl `fsdp: [full_shard, auto_wrap]` or fsdp_config."""
    value = r.get("fsdp")
    words = " ".join(value) if isinstance(value, list) else str(value or "")
    if "full_shard" in words or "hybrid_shard" in words:
        setup["shard"] = "hsdp" if "hybrid" in words else "fsdp"
    elif "shard_grad_op" in words:
        setup["shard"] = "fsdp-shard-grad-op"
    if "offload" in words:
        setup["offload"] = "optimizer+params"


def _deepspeed(r: _Reader, setup: dict, ds) -> None:
    """A DeepSpeed config inline (a dict) or as a path to its JSON sets the ZeRO stage and offload."""
    if isinstance(ds, str) and r.base_dir is not None:
        import json
        from pathlib import Path

        path = Path(ds) if Path(ds).is_absolute() else r.base_dir / ds
        if path.is_file():
            try:
                ds = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                raise InvalidSetupError(f"deepspeed: {ds} is not a readable DeepSpeed JSON") from None
    if isinstance(ds, dict):
        stage = (ds.get("zero_optimization") or {}).get("stage")
        if stage in (1, 2, 3):
            setup["shard"] = f"zero{stage}"
            offload = (ds.get("zero_optimization") or {}).get("offload_optimizer")
            if isinstance(offload, dict) and offload.get("device") == "cpu":
                setup["offload"] = "optimizer"


def _ignored(data: dict, used: list[str]) -> list[str]:
    return [k for k in data if k not in used]


READERS = {"axolotl": read_axolotl, "llamafactory": read_llamafactory, "torchtune": read_torchtune,
           "trl": read_trl, "mlx": read_mlx}
