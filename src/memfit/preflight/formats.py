"""Training configs of six tools (ms-swift's in swift.py) and PEFT's adapter_config.json (preflight/peft_methods.py),
read into a memfit setup, with each tool's own key names and defaults.

Each reader returns a Mapped: the model reference, the TrainingSetup arguments, which keys were used, which
defaults were assumed (the tool's own, cited), which keys were ignored because they do not affect memory, notes
on keys memfit read but cannot honour, and for each memfit field the key that sets it (so advice comes back as
edits to that key). Values are read through reader.py's typed access; every problem of a file is collected and
raised together as one InvalidSetupError.

Versions read for the defaults and refusals cited below: axolotl 0.18.0 (src/axolotl/utils/schemas/*.py,
src/axolotl/loaders/model.py); LLaMA-Factory 0.9.6.dev0 (src/llamafactory/hparams/*.py,
src/llamafactory/model/model_utils/quantization.py); torchtune recipes/configs/*.yaml and
recipes/*_single_device.py; TRL 0.22.0 (trl/trainer/sft_config.py, model_config.py, utils.py) and transformers
5.24 TrainingArguments; mlx-lm 0.32.2 mlx_lm/lora.py CONFIG_DEFAULTS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidSetupError
from ..options import ALL_TARGETS, BY_NAME, SETUP_OPTIONS, normalize, parse_targets
from .long_context import read_long_context
from .peft_methods import axolotl_method, llamafactory_method, read_peft
from .trainers import read_trainer_keys
from .reader import (ATTENTION_NAMES, Reader, is_file, one_line, quant4, read_attention, read_deepspeed, read_fsdp,
                     read_precision, show)

FORMATS = ("axolotl", "llamafactory", "torchtune", "trl", "mlx", "ms-swift", "peft")
# The key that names the model (torchtune names a builder, mapped to a catalog model below).
MODEL_KEYS = {"axolotl": "base_model", "llamafactory": "model_name_or_path", "torchtune": "model._component_",
              "trl": "model_name_or_path", "mlx": "model", "ms-swift": "model", "peft": "base_model_name_or_path"}


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
    notes: list[tuple[str, str]] = field(default_factory=list)   # (code, message): keys read but not honoured
    dataset_key: str | None = None                    # the key that names the dataset


def field_keys(tool: str, **keys_in_file: str | None) -> dict[str, str]:
    """memfit field -> the key that sets it in `tool`'s config: the options table's, or the one this file uses."""
    keys = {o.name: o.tool_keys[tool] for o in SETUP_OPTIONS if tool in o.tool_keys}
    return keys | {name: key for name, key in keys_in_file.items() if key}


# ms-swift's arguments (swift/arguments/*.py) that, with `model` naming the model, tell its config apart.
_SWIFT_KEYS = ("tuner_type", "train_type", "ENV", "quant_bits", "quant_method", "freeze_vit", "attn_impl",
               "max_pixels", "per_device_train_batch_size", "max_length", "dataset")


def detect_format(data: dict) -> str:
    if "peft_type" in data:
        return "peft"                  # a PEFT adapter_config.json (preflight/peft_methods.py)
    if any(isinstance(v, dict) and "_component_" in v for v in data.values()):
        return "torchtune"
    if "base_model" in data:
        return "axolotl"
    if any(k in data for k in ("rlhf_type", "tuner_type", "train_type", "quant_bits")) or \
            ("model" in data and ("torch_dtype" in data or "target_modules" in data)):
        return "ms-swift"       # swift/arguments/*.py names (preflight/swift.py)
    if "finetuning_type" in data or "stage" in data or "cutoff_len" in data or "template" in data:
        return "llamafactory"
    if "fine_tune_type" in data or "lora_parameters" in data or ("model" in data and "iters" in data):
        return "mlx"
    if "model" in data and "model_name_or_path" not in data and any(k in data for k in _SWIFT_KEYS):
        return "ms-swift"       # ms-swift: the command's arguments, `model` names the model (preflight/swift.py)
    if "model_name_or_path" in data or "per_device_train_batch_size" in data:
        return "trl"
    raise InvalidSetupError("cannot tell which tool this config is for (axolotl, LLaMA-Factory, torchtune, "
                            "TRL / HF Trainer, mlx-lm, ms-swift, a PEFT adapter_config.json): pass --format-of")

# ---- axolotl (0.18.0) ---------------------------------------------------------------------------------------------
def read_axolotl(data: dict, base_dir=None, lines=None) -> Mapped:
    r = Reader(data, "axolotl", base_dir, lines)
    model = r.text(MODEL_KEYS["axolotl"], what="a model name or path")
    adapter = r.get("adapter")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    method, quant = "full", None
    if adapter is not None and not isinstance(adapter, str):
        # Not a guess at full fine-tuning: axolotl itself refuses an adapter it has no builder or plugin for
        # (utils/schemas/peft.py LoraConfig.validate_adapter), and a number names none.
        r.problem("adapter", f"must be lora or qlora (or left out to train every weight), got {show(adapter)}")
    elif adapter and adapter.strip().lower() == "llama-adapter":
        # axolotl builds it as PEFT's AdaptionPromptConfig with peft_adapter.len / .layers (loaders/adapter.py:
        # 434-470); memfit's llama-adapter fixes LitGPT's 10 prompt positions on all but the first two layers.
        r.problem("adapter", "llama-adapter (PEFT's adaption_prompt) is not read from axolotl's peft_adapter "
                             "settings: memfit estimate --method llama-adapter prices 10 prompt positions on all but "
                             "the first two layers")
    elif adapter and adapter.strip().lower() not in ("lora", "qlora"):
        r.problem("adapter", f"{adapter!r} is not modelled (memfit models lora and qlora, or no adapter to train "
                             f"every weight)")
    elif adapter and adapter.strip().lower() == "qlora":
        method = "qlora"
        if eight and four:
            r.problem("load_in_8bit", "load_in_4bit and load_in_8bit are both true: with adapter: qlora axolotl "
                                      "refuses 8-bit (\"Can't load qlora in 8bit\"); drop load_in_8bit")
        elif eight:
            # axolotl 0.18.0 utils/schemas/peft.py validate_qlora: "Can't load qlora in 8bit".
            r.problem("adapter", "qlora with load_in_8bit: true is refused by axolotl (\"Can't load qlora in "
                                 "8bit\"): for LoRA on an 8-bit base write adapter: lora with load_in_8bit: true; "
                                 "for QLoRA, load_in_4bit: true")
        elif not four:
            r.problem("adapter", "qlora needs load_in_4bit: true (axolotl refuses it otherwise: \"Require "
                                 "cfg.load_in_4bit to be True for qlora\")")
        kwargs = r.mapping("bnb_config_kwargs")
        # loaders/model.py _set_quantization_config: nf4 with double quant unless bnb_config_kwargs override.
        qtype = kwargs.get("bnb_4bit_quant_type", "nf4")
        double = kwargs.get("bnb_4bit_use_double_quant", True)
        if qtype not in ("nf4", "fp4") or not isinstance(double, bool):
            r.problem("bnb_config_kwargs", "bnb_4bit_quant_type must be nf4 or fp4 and bnb_4bit_use_double_quant "
                                           f"true or false, got {show(qtype)} and {show(double)}")
        else:
            quant = quant4(r, qtype, double, "bnb_config_kwargs")
    elif adapter:
        if four and eight:
            r.problem("load_in_4bit", "load_in_4bit and load_in_8bit are both true")
        elif eight:
            # loaders/model.py: adapter lora + load_in_8bit loads BitsAndBytesConfig(load_in_8bit=True).
            method, quant = "qlora", "int8"
            r.defaults.append("adapter: lora with load_in_8bit: true is LoRA on a bitsandbytes 8-bit base: "
                              "estimated as --method qlora --quant int8")
        elif four:
            method, quant = "qlora", "nf4-dq"
            r.note("key-not-honoured", "load_in_4bit",
                   "true with adapter: lora: axolotl 0.18.0 builds its 4-bit config only for adapter: qlora "
                   "(loaders/model.py _set_quantization_config); estimated as QLoRA, write adapter: qlora to be "
                   "sure that is what runs")
        else:
            method = "lora"
    elif four or eight:
        # utils/schemas/peft.py validate_adapter: quantized loading needs an adapter.
        key = "load_in_4bit" if four else "load_in_8bit"
        r.problem(key, "true needs adapter: lora or qlora (axolotl refuses quantized full fine-tuning: \"load_in_8bit "
                       "and load_in_4bit are not supported without setting an adapter\")")
    ckpt = r.flag("gradient_checkpointing", words=("offload", "offload_disk"))
    setup = {"method": method, "batch_size": r.setting("batch_size", 1),
             "seq_len": r.setting("seq_len", 512),
             "grad_accum": r.setting("grad_accum", 1), "grad_ckpt": ckpt,
             "recipe": "axolotl"}
    setup["method"] = method = axolotl_method(r, method, setup)        # peft_use_dora (preflight/peft_methods.py)
    if ckpt and str(r.get("gradient_checkpointing")).lower().startswith("offload"):
        setup["ckpt_offload"] = True
    if quant:
        setup["quant"] = quant
    keys = field_keys("axolotl")
    defaults = [f"{k} not set: axolotl's default {v}" for k, v in (("micro_batch_size", 1), ("sequence_len", 512),
                ("gradient_accumulation_steps", 1), ("gradient_checkpointing", "false")) if not r.has(k)]
    setup["optimizer"] = r.setting("optimizer", "adamw-fused")
    if not r.has("optimizer"):
        defaults.append("optimizer not set: HF Trainer's default adamw_torch_fused")
    if method != "full":
        setup["lora_rank"] = r.setting("lora_rank", 8)
        setup["lora_dropout"] = r.setting("lora_dropout", 0.0)
        if r.flag("lora_target_linear"):
            setup["lora_targets"] = normalize(BY_NAME["lora_targets"], "all-linear")
        elif r.has("lora_target_modules"):
            targets = r.targets("lora_target_modules")
            if targets:
                setup["lora_targets"] = targets
    attn = "flash" if r.flag("flash_attention") else ("sdpa" if r.flag("sdp_attention") else None)
    attn = attn or (read_attention(r, "attn_implementation") if r.has("attn_implementation") else None)
    if attn:
        setup["attn"] = attn
    if r.flag("cut_cross_entropy"):
        setup["chunked_ce"] = True
    setup["precision"] = read_precision(r, r.flag("bf16", words=("auto", "full")), r.flag("fp16"))
    dataset, dataset_key = None, None
    ds = r.get("datasets")
    if isinstance(ds, list) and ds and isinstance(ds[0], dict) and isinstance(ds[0].get("path"), str):
        dataset, dataset_key = ds[0]["path"], "datasets[0].path"
    elif ds is not None and not isinstance(ds, list):
        r.problem("datasets", f"must be a list of datasets, got {show(ds)}")
    read_deepspeed(r, setup)
    read_fsdp(r, setup)
    read_long_context(r, setup, keys)
    from .vision import read_image_keys

    read_image_keys(r, setup, keys)          # processor_kwargs.max_pixels / min_pixels, image_size
    read_trainer_keys("axolotl", r, setup, defaults, keys)   # dpo/kto/grpo/... (preflight/trainers.py)
    return _mapped(r, model, setup, defaults, keys, dataset, dataset_key)


# ---- LLaMA-Factory (0.9.6.dev0) -----------------------------------------------------------------------------------
def read_llamafactory(data: dict, base_dir=None, lines=None) -> Mapped:
    r = Reader(data, "llamafactory", base_dir, lines)
    model = r.text(MODEL_KEYS["llamafactory"], what="a model name or path")
    # hparams/finetuning_args.py: finetuning_type: Literal["lora", "oft", "freeze", "full"] = "lora".
    ftype = r.choice("finetuning_type", ("lora", "oft", "freeze", "full"), "lora", "LLaMA-Factory's methods")
    qbit = r.int("quantization_bit")
    method, quant = ("full" if ftype == "full" else "lora"), None
    if qbit is not None:
        # hparams/model_args.py quantization_method (bnb | hqq | eetq, default bnb), quantization_type (nf4 | fp4,
        # default nf4), double_quantization (default true); model_utils/quantization.py builds the
        # BitsAndBytesConfig: 8 -> load_in_8bit, 4 -> 4-bit of that type, else "Bitsandbytes only accepts 4-bit or
        # 8-bit quantization."
        qmethod = r.choice("quantization_method", ("bnb", "hqq", "eetq"), "bnb", "LLaMA-Factory's on-the-fly "
                                                                               "quantization")
        if ftype == "full":
            r.problem("finetuning_type", "full contradicts quantization_bit (quantized training needs lora)")
        elif qmethod != "bnb":
            r.problem("quantization_method", f"{qmethod} is not modelled (memfit models bitsandbytes, bnb)")
        elif qbit == 8:
            method, quant = "qlora", "int8"
            r.defaults.append("quantization_bit: 8 is LoRA on a bitsandbytes 8-bit base: estimated as --method "
                              "qlora --quant int8")
        elif qbit == 4:
            method = "qlora"
            qtype = r.choice("quantization_type", ("nf4", "fp4"), "nf4", "bitsandbytes 4-bit types")
            quant = quant4(r, qtype, r.flag("double_quantization", True), "quantization_type")
        else:
            r.problem("quantization_bit", f"bitsandbytes quantizes to 4 or 8 bits, got {qbit}")
    setup = {"method": method, "batch_size": r.setting("batch_size", 8),
             "seq_len": r.setting("seq_len", 2048),
             "grad_accum": r.setting("grad_accum", 1),
             # LLaMA-Factory checkpoints by default: disable_gradient_checkpointing defaults to false.
             "grad_ckpt": not r.flag("disable_gradient_checkpointing"), "recipe": "hf"}
    # oft, freeze, use_dora, use_rslora, pissa_init (preflight/peft_methods.py)
    setup["method"] = method = llamafactory_method(r, ftype, method, setup)
    if quant:
        setup["quant"] = quant
    defaults = [f"{k} not set: LLaMA-Factory's default {v}" for k, v in (
        ("per_device_train_batch_size", 8), ("cutoff_len", 2048), ("gradient_accumulation_steps", 1))
        if not r.has(k)]
    if not r.has("disable_gradient_checkpointing"):
        defaults.append("gradient checkpointing on: LLaMA-Factory's default (disable_gradient_checkpointing: false)")
    keys = field_keys("llamafactory")
    setup["optimizer"] = r.setting("optimizer", "adamw")
    if not r.has("optim"):
        defaults.append("optim not set: adamw_torch (foreach AdamW on CUDA)")
    if method in BY_NAME["lora_rank"].methods:
        setup["lora_rank"] = r.setting("lora_rank", 8)
    if method in BY_NAME["lora_dropout"].methods:
        setup["lora_dropout"] = r.setting("lora_dropout", 0.0)
    if method != "full":
        target = r.get("lora_target", "all")
        targets = r.option_value("lora_target", "lora_targets", "all-linear" if target == "all" else target)
        if targets:
            setup["lora_targets"] = targets
    flash = r.choice("flash_attn", ("auto", "disabled", "sdpa", "fa2", "fa3"), "auto",
                     "LLaMA-Factory's AttentionFunction")
    if flash != "auto":
        setup["attn"] = ATTENTION_NAMES[flash]
    if r.flag("enable_liger_kernel"):
        setup["chunked_ce"] = True
    pure = r.flag("pure_bf16")
    setup["precision"] = "bf16" if pure else read_precision(r, r.flag("bf16"), r.flag("fp16"))
    read_deepspeed(r, setup)
    from .vision import read_image_keys

    read_image_keys(r, setup, keys)
    dataset, dataset_key = _llamafactory_dataset(r)
    read_trainer_keys("llamafactory", r, setup, defaults, keys)   # dpo/kto/grpo/... (preflight/trainers.py)
    return _mapped(r, model, setup, defaults, keys, dataset, dataset_key)


def _llamafactory_dataset(r: Reader) -> tuple[str | None, str | None]:
    """The first dataset's file: LLaMA-Factory names datasets by their entry in {dataset_dir}/dataset_info.json
    (data/parser.py; dataset_dir defaults to "data", hparams/data_args.py), whose file_name is the file."""
    name = r.get("dataset")
    if name is None:
        return None, None
    names = name if isinstance(name, list) else str(name).split(",")
    first = str(names[0]).strip() if names else ""
    if not first:
        return None, None
    folder = r.text("dataset_dir", "data", what="a folder")
    base = Path(folder) if Path(folder).is_absolute() or r.base_dir is None else Path(r.base_dir) / folder
    info_path = base / "dataset_info.json"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8")) if is_file(info_path) else None
    except (OSError, ValueError, RecursionError):
        info = None
    entry = info.get(first) if isinstance(info, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("file_name"), str):
        return str(base / entry["file_name"]), "dataset"
    where = (f"{info_path} has no entry {first!r} with a file_name" if isinstance(info, dict)
             else f"no readable {info_path}")
    r.note("dataset-not-checked", "dataset", f"{first}: {where} (a Hub dataset, or a missing path): its lengths "
                                             f"were not checked")
    return None, None


# ---- torchtune ----------------------------------------------------------------------------------------------------
_TT_MODELS = {  # torchtune builder -> catalog model
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B", "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B", "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B", "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B",
    "mistral_7b": "mistralai/Mistral-7B-v0.1", "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
}
TORCHTUNE_ATTN = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}   # lora_attn_modules


def read_torchtune(data: dict, base_dir=None, lines=None) -> Mapped:
    r = Reader(data, "torchtune", base_dir, lines)
    r.mapping("model")
    component = r.text("model._component_", "", what="a torchtune model builder")
    builder = component.rsplit(".", 1)[-1]
    method = "qlora" if builder.startswith("qlora_") else ("lora" if builder.startswith("lora_") else "full")
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    model = _TT_MODELS.get(base)
    if model is None and component and not r.problems:
        r.problem("model._component_", f"{component!r}: no catalog model for torchtune builder {base!r} (known: "
                                       f"{', '.join(sorted(_TT_MODELS))})")
    r.mapping("tokenizer")
    seq_len = r.setting("seq_len", None)
    # torchtune's full_finetune / lora_finetune recipes refuse fp16 ("full fp16 training is not supported with
    # this recipe. Please use bf16 or fp32 instead.").
    dtype = r.choice("dtype", ("bf16", "fp32"), "bf16", "torchtune's recipes train in bf16 or fp32")
    setup = {"method": method, "batch_size": r.setting("batch_size", 2),
             "seq_len": seq_len or 2048, "grad_accum": r.setting("grad_accum", 1),
             "grad_ckpt": r.flag("enable_activation_checkpointing"), "recipe": "torchtune", "precision": dtype}
    defaults = [] if seq_len else ["tokenizer.max_seq_len not set: memfit assumes 2048"]
    opt = r.mapping("optimizer")
    opt_name = r.text("optimizer._component_", "torch.optim.AdamW", what="an optimizer class path")
    if "PagedAdamW8bit" in opt_name:
        setup["optimizer"] = "paged-adamw-8bit"
    elif "AdamW8bit" in opt_name:
        setup["optimizer"] = "adamw-8bit"
    elif opt_name.rsplit(".", 1)[-1] in ("AdamW", "Adam"):
        setup["optimizer"] = "adamw-fused" if opt and r.flag("optimizer.fused") else "adamw"
    elif opt_name.rsplit(".", 1)[-1] == "SGD":
        setup["optimizer"] = "sgd"
    else:
        r.problem("optimizer._component_", f"{opt_name!r} is not modelled (torch.optim.AdamW, torch.optim.SGD, "
                                           f"bitsandbytes.optim.AdamW8bit or PagedAdamW8bit)")
    setup["optimizer_in_backward"] = r.flag("optimizer_in_bwd")
    r.mapping("loss")
    loss = r.text("loss._component_", "", what="a loss class path")
    setup["chunked_ce"] = "Chunked" in loss
    if method != "full":
        setup["lora_rank"] = r.setting("lora_rank", 8)
        modules = r.get("model.lora_attn_modules", ["q_proj", "v_proj"])
        if not isinstance(modules, list) or not all(isinstance(t, str) for t in modules):
            r.problem("model.lora_attn_modules", f"must be a list of q_proj, k_proj, v_proj, output_proj, got "
                                                 f"{show(modules)}")
            modules = []
        targets = [TORCHTUNE_ATTN.get(t, t) for t in modules]
        if r.flag("model.apply_lora_to_mlp"):
            targets += ["gate", "up", "down"]
        if targets:
            checked = r.option_value("model.lora_attn_modules", "lora_targets", targets)
            if checked:
                setup["lora_targets"] = checked
        setup["lora_dropout"] = r.setting("lora_dropout", 0.0)
    keys = field_keys("torchtune")
    read_long_context(r, setup, keys)
    ds = r.get("dataset")
    dataset = ds.get("data_files") if isinstance(ds, dict) and isinstance(ds.get("data_files"), str) else None
    return _mapped(r, model, setup, defaults, keys, dataset, "dataset.data_files" if dataset else None)


# ---- TRL / HF Trainer (TRL 0.22.0) --------------------------------------------------------------------------------
def read_trl(data: dict, base_dir=None, lines=None) -> Mapped:
    r = Reader(data, "trl", base_dir, lines)
    model = r.text(MODEL_KEYS["trl"], what="a model name or path")
    four, eight = r.flag("load_in_4bit"), r.flag("load_in_8bit")
    peft = r.flag("use_peft")
    method, quant = ("lora" if peft else "full"), None
    if (four or eight) and not peft:
        # TRL's sft.py passes get_peft_config(model_args), None without use_peft; transformers 5.24
        # trainer_utils.py then refuses: "You cannot perform fine-tuning on purely quantized models."
        key = "load_in_4bit" if four else "load_in_8bit"
        r.problem(key, "true needs use_peft: true (transformers refuses to fine-tune a purely quantized model: "
                       "\"You cannot perform fine-tuning on purely quantized models\")")
    elif four:
        # trl/trainer/utils.py get_quantization_config: bnb_4bit_quant_type (default nf4) and
        # use_bnb_nested_quant (default false) -> BitsAndBytesConfig; 4-bit is checked before 8-bit.
        method = "qlora"
        qtype = r.choice("bnb_4bit_quant_type", ("nf4", "fp4"), "nf4", "bitsandbytes 4-bit types")
        quant = quant4(r, qtype, r.flag("use_bnb_nested_quant"), "use_bnb_nested_quant")
        if not r.has("use_bnb_nested_quant"):
            r.defaults.append("use_bnb_nested_quant not set: TRL ModelConfig's default false (no double "
                              "quantization)")
        if eight:
            r.note("key-not-honoured", "load_in_8bit", "true is ignored by TRL when load_in_4bit is true "
                                                       "(get_quantization_config checks 4-bit first): estimated "
                                                       "with the 4-bit base")
    elif eight:
        method, quant = "qlora", "int8"
        r.defaults.append("load_in_8bit: true with use_peft is LoRA on a bitsandbytes 8-bit base: estimated as "
                          "--method qlora --quant int8")
    defaults = [f"{k} not set: the default {v}" for k, v in (("per_device_train_batch_size", 8),
                ("gradient_accumulation_steps", 1)) if not r.has(k)]
    # max_length is TRL >= 0.20's name; max_seq_length was deprecated in 0.19 and removed in 0.20.
    length_key = "max_length" if r.has("max_length") else ("max_seq_length" if r.has("max_seq_length") else None)
    if length_key == "max_length" and r.has("max_seq_length"):
        r.note("key-not-honoured", "max_seq_length", "ignored: max_length is set, and TRL >= 0.20 reads only "
                                                     "max_length")
    elif length_key == "max_seq_length":
        defaults.append("max_seq_length is TRL < 0.20's name for max_length (removed in TRL 0.20): read as the "
                        "length")
    elif "max_length" in data:
        r.note("key-not-honoured", "max_length", "null turns truncation off in TRL (the longest sample sets the "
                                                 "memory): estimated at SFTConfig's default 1024; set max_length")
    else:
        defaults.append("max_length not set: SFTConfig's default 1024")
    setup = {"method": method, "batch_size": r.setting("batch_size", 8),
             "seq_len": r.option(length_key, "seq_len", 1024) if length_key else 1024,
             "grad_accum": r.setting("grad_accum", 1),
             # TRL 0.22.0 trl/trainer/sft_config.py: gradient_checkpointing: bool = True (transformers'
             # TrainingArguments defaults it off; TRL turned it on in 0.22).
             "grad_ckpt": r.flag("gradient_checkpointing", True), "recipe": "hf"}
    if not r.has("gradient_checkpointing"):
        defaults.append("gradient_checkpointing not set: on, SFTConfig's default since TRL 0.22 (plain HF "
                        "TrainingArguments default it off: set gradient_checkpointing: false if that is what runs)")
    if quant:
        setup["quant"] = quant
    setup["optimizer"] = r.setting("optimizer", "adamw-fused")
    if not r.has("optim"):
        defaults.append("optim not set: adamw_torch_fused (transformers >= 4.55 with torch >= 2.8)")
    if method != "full":
        setup["lora_rank"] = r.setting("lora_rank", 16)
        setup["lora_dropout"] = r.setting("lora_dropout", 0.05)
        targets = r.targets("lora_target_modules")
        if targets:
            setup["lora_targets"] = targets
        if not r.has("lora_r"):
            defaults.append("lora_r not set: TRL ModelConfig's default 16")
    attn = read_attention(r, "attn_implementation") if r.has("attn_implementation") else None
    if attn:
        setup["attn"] = attn
    setup["precision"] = read_precision(r, r.flag("bf16"), r.flag("fp16"))
    if r.flag("use_liger_kernel"):
        setup["chunked_ce"] = True
    keys = field_keys("trl", seq_len=length_key)
    read_deepspeed(r, setup)
    read_fsdp(r, setup)
    read_long_context(r, setup, keys)
    dataset = r.text("dataset_name", what="a dataset name or path")
    read_trainer_keys("trl", r, setup, defaults, keys)   # dpo/kto/grpo/... (preflight/trainers.py)
    return _mapped(r, model, setup, defaults, keys, dataset, "dataset_name" if dataset else None)


# ---- mlx-lm (0.32.2) ----------------------------------------------------------------------------------------------
# mlx_lm/lora.py CONFIG_DEFAULTS: optimizer "adam" (adam | adamw | muon | sgd | adafactor).
_MLX_OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "adafactor": "adafactor"}


def read_mlx(data: dict, base_dir=None, lines=None) -> Mapped:
    r = Reader(data, "mlx", base_dir, lines)
    model = r.text(MODEL_KEYS["mlx"], what="a model name or path")
    ftype = r.choice("fine_tune_type", ("lora", "dora", "full"), "lora", "mlx-lm's fine-tune types")
    if ftype == "dora":
        r.problem("fine_tune_type", "dora is not modelled yet (memfit models lora and full)")
    r.mapping("lora_parameters")
    setup = {"method": "full" if ftype == "full" else "lora", "batch_size": r.setting("batch_size", 4),
             "seq_len": r.setting("seq_len", 2048), "grad_ckpt": r.flag("grad_checkpoint"),
             "recipe": "mlx", "grad_accum": r.setting("grad_accum", 1)}
    opt = r.choice("optimizer", ("adam", "adamw", "muon", "sgd", "adafactor"), "adam", "mlx-lm's optimizers")
    if opt == "muon":
        r.problem("optimizer", "muon is not modelled (adam, adamw, sgd and adafactor are)")
    setup["optimizer"] = _MLX_OPTIMIZERS.get(opt, "adamw")
    if ftype != "full":
        setup["lora_rank"] = r.setting("lora_rank", 8)
        setup["lora_dropout"] = r.setting("lora_dropout", 0.0)
    defaults = [f"{k} not set: mlx-lm's default {v}" for k, v in (("batch_size", 4), ("max_seq_length", 2048),
                ("num_layers", 16), ("optimizer", "adam")) if not r.has(k)]
    layers = r.int("num_layers", 16, minimum=-1)
    if layers is not None and layers != 16:
        # mlx-lm --num-layers (-1: all of them) is memfit's train_layers (lora.py:240-252).
        setup["train_layers"] = 10_000 if layers == -1 else max(layers, 1)
    keys_given = (data.get("lora_parameters") or {}).get("keys") if isinstance(data.get("lora_parameters"), dict) \
        else None
    if ftype != "full" and isinstance(keys_given, list) and keys_given:
        # mlx-lm lora_parameters.keys: module paths such as self_attn.q_proj (tuner/utils.py linear_to_lora_layers)
        names = [str(k).rsplit(".", 1)[-1] for k in keys_given]
        setup["lora_targets"] = parse_targets(",".join(names)) if all(
            n.removesuffix("_proj") in ALL_TARGETS for n in names) else None
        r.used.append("lora_parameters.keys")
    keys = field_keys("mlx")
    data_dir = r.text("data", what="a data folder or dataset name")
    return _mapped(r, model, setup, defaults, keys, f"{data_dir}/train.jsonl" if data_dir else None,
                   "data" if data_dir else None)


# ---- shared pieces ------------------------------------------------------------------------------------------------
def _mapped(r: Reader, model, setup: dict, defaults: list, keys: dict, dataset, dataset_key) -> Mapped:
    """The reader's result, or every problem it found as one InvalidSetupError."""
    r.finish()
    setup = {k: v for k, v in setup.items() if v is not None}
    used = list(dict.fromkeys(r.used))
    return Mapped(r.tool, model, setup, used, defaults + r.defaults, _ignored(r.data, used), keys, dataset,
                  r.notes, dataset_key)


def _ignored(data: dict, used: list[str]) -> list[str]:
    return [one_line(str(k)) for k in data if k not in used]


def _read_swift(data: dict, base_dir=None, lines=None) -> Mapped:
    from .swift import read_swift

    return read_swift(data, base_dir, lines)


READERS = {"axolotl": read_axolotl, "llamafactory": read_llamafactory, "torchtune": read_torchtune,
           "trl": read_trl, "mlx": read_mlx, "ms-swift": _read_swift, "peft": read_peft}
