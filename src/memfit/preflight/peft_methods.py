"""The PEFT methods besides plain LoRA as configs name them, mapped to memfit's method and knobs (memfit check).

- LLaMA-Factory 0.9.6.dev0 (hiyouga/LLaMA-Factory@ff6d4d12): src/llamafactory/hparams/finetuning_args.py
  finetuning_type lora | oft | freeze | full (:464), freeze_trainable_layers 2 (:23), use_rslora (:99), use_dora
  (:103), pissa_init (:107), OFTArguments module_dropout (:139), oft_rank 0 (:143), oft_block_size 32 (:147);
  :624-632 refuses use_rslora / use_dora outside lora. model/adapter.py:229-232 takes the targets of both LoRA and
  OFT from lora_target, :258-275 builds LoraConfig(use_rslora, use_dora) or OFTConfig(r=oft_rank,
  oft_block_size, module_dropout), :288-294 pissa_init sets init_lora_weights="pissa".
- axolotl 0.18.0 (axolotl-ai-cloud/axolotl@067b021c): src/axolotl/utils/schemas/peft.py adapter (:41; lora, qlora,
  llama-adapter or a plugin's, validate_adapter:179-197), peft_use_dora (:89), peft_use_rslora (:92),
  peft_init_lora_weights (:99), peft_autocast_adapter_dtype (:124); loaders/adapter.py:148-149 passes use_dora,
  :368-369 autocast_adapter_dtype, :434-470 builds llama-adapter as PEFT's AdaptionPromptConfig.
- PEFT's adapter_config.json (peft 0.21.2 config.py PeftConfigMixin.to_dict): peft_type, base_model_name_or_path
  and the method's own fields (LoraConfig r, lora_dropout, target_modules, use_dora; OFTConfig oft_block_size;
  ...).
"""

from __future__ import annotations

from ..options import ALL_TARGETS
from .reader import Reader, show

LORA_EQUAL = "costs what LoRA costs (the same tensors; options.py LORA_EQUIVALENTS)"


def llamafactory_method(r: Reader, ftype: str, method: str, setup: dict) -> str:
    """memfit's method for LLaMA-Factory's finetuning_type (after quantization chose lora or qlora), with the
    method's knobs put in `setup`."""
    if ftype == "freeze":
        layers = r.int("freeze_trainable_layers", 2)
        r.problem("finetuning_type", f"freeze (the last {layers} layers unfrozen, freeze_trainable_layers) is not "
                                     "modelled for the HF Trainer stack (memfit models it for the mlx recipe only)")
        return method
    if ftype == "oft":
        if method == "qlora":
            r.problem("finetuning_type", "oft with quantization_bit: PEFT's OFT on a bitsandbytes base is not "
                                         "modelled (--quant takes dora, lora-fa, adalora, ia3)")
        rank = r.int("oft_rank", 0)
        block = r.int("oft_block_size", 32)
        if rank:
            # PEFT OFTConfig takes r or oft_block_size, not both (r x block = the layer's input width).
            r.problem("oft_rank", f"{rank}: memfit takes OFT's block size (oft_block_size, the width / oft_rank) "
                                  "instead of the number of blocks")
        elif block:
            setup["oft_block_size"] = block
        dropout = r.get("module_dropout")
        if isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and dropout > 0:
            r.note("key-not-honoured", "module_dropout", "OFT's multiplicative dropout is not modelled "
                                                         "(estimated without it)")
        return "oft"
    if ftype != "lora":
        return method
    if r.flag("use_dora"):
        # QDoRA: use_dora with quantization_bit keeps the bitsandbytes base (memfit: dora with --quant).
        return "dora"
    for key in ("use_rslora", "pissa_init"):
        if r.flag(key):
            r.defaults.append(f"{key}: true {LORA_EQUAL}")
    return method


def axolotl_method(r: Reader, method: str, setup: dict) -> str:
    """peft_use_dora on top of adapter lora / qlora (whose base quantization the caller has read), and
    peft_autocast_adapter_dtype."""
    if r.has("peft_autocast_adapter_dtype"):
        setup["adapter_fp32"] = r.flag("peft_autocast_adapter_dtype", True)
    if method == "full":
        return method
    if r.flag("peft_use_dora"):
        return "dora"
    if r.flag("peft_use_rslora"):
        r.defaults.append(f"peft_use_rslora: true {LORA_EQUAL}")
    init = r.get("peft_init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(("pissa", "olora", "eva", "loftq", "corda")):
        r.defaults.append(f"peft_init_lora_weights: {init} {LORA_EQUAL}")
    return method


# peft 0.21.2 utils/peft_types.py PeftType -> memfit's method (options.PEFT_METHODS).
PEFT_TYPES = {"LORA": "lora", "ADALORA": "adalora", "IA3": "ia3", "LOHA": "loha", "LOKR": "lokr", "VERA": "vera",
              "OFT": "oft", "BOFT": "boft", "FOURIERFT": "fourierft", "PREFIX_TUNING": "prefix",
              "PROMPT_TUNING": "prompt", "P_TUNING": "ptuning", "LN_TUNING": "ln-tuning", "OSF": "osf",
              "TINYLORA": "tinylora"}
# The config field that holds each method's size knob (peft 0.21.2 tuners/<method>/config.py).
_RANK_KEY = {"lora": "r", "dora": "r", "adalora": "init_r", "loha": "r", "lokr": "r", "vera": "r", "tinylora": "r"}
_VIRTUAL = ("prefix", "prompt", "ptuning")


def read_peft(data: dict, base_dir=None, lines=None):
    """A PEFT adapter_config.json: the method and its knobs; the run's other settings are not in it (memfit's hf
    recipe defaults, said as such)."""
    from .formats import _mapped

    r = Reader(data, "peft", base_dir, lines)
    model = r.text("base_model_name_or_path", what="a model name or path")
    kind = r.get("peft_type")
    method = PEFT_TYPES.get(kind.upper()) if isinstance(kind, str) else None
    setup: dict = {"recipe": "hf"}
    keys = {"method": "peft_type", "model": "base_model_name_or_path"}
    if method is None and kind == "ADAPTION_PROMPT":
        r.problem("peft_type", "ADAPTION_PROMPT (LLaMA-Adapter) is not read from adapter_len / adapter_layers: memfit "
                               "estimate --method llama-adapter prices 10 prompt positions on all but the first two "
                               "layers")
    elif method is None:
        r.problem("peft_type", f"{show(kind)} is not a PEFT method memfit models ({', '.join(PEFT_TYPES)})")
    else:
        if method == "lora" and r.flag("use_dora"):
            method = "dora"
        setup["method"] = method
        if method in _RANK_KEY and r.has(_RANK_KEY[method]):
            setup["lora_rank"] = r.option(_RANK_KEY[method], "lora_rank")
            keys["lora_rank"] = _RANK_KEY[method]
        if method in ("lora", "dora", "adalora") and r.has("lora_dropout"):
            setup["lora_dropout"] = r.option("lora_dropout", "lora_dropout")
        elif method == "vera" and r.has("vera_dropout"):
            setup["lora_dropout"] = r.option("vera_dropout", "lora_dropout")
        if method not in _VIRTUAL + ("ln-tuning",):
            value = r.get("target_modules")
            if isinstance(value, (list, str)) and value:
                targets = r.targets("target_modules")
                if targets:
                    # PEFT keeps target_modules as a set (its file lists them in any order): memfit's order.
                    order = {t: i for i, t in enumerate(ALL_TARGETS)}
                    setup["lora_targets"] = tuple(sorted(targets, key=lambda t: order.get(t, len(order))))
                    keys["lora_targets"] = "target_modules"
        if method in ("oft", "boft"):
            key = "oft_block_size" if method == "oft" else "boft_block_size"
            block = r.int(key, 0)
            if block:
                setup["oft_block_size"] = block
                keys["oft_block_size"] = key
            elif r.int("r" if method == "oft" else "boft_block_num", 0):
                r.problem(key, "0 with a block count: memfit takes the block size (the width / the count)")
        if method == "fourierft" and r.has("n_frequency"):
            setup["n_frequency"] = r.option("n_frequency", "n_frequency")
        if method in _VIRTUAL and r.has("num_virtual_tokens"):
            setup["num_virtual_tokens"] = r.option("num_virtual_tokens", "num_virtual_tokens")
        if method == "osf" and (r.has("effective_rank") or r.has("rank_pattern")):
            # OSF's trainable rank is min(out, in) - effective_rank per module (tuners/osf/config.py).
            r.note("key-not-honoured", "effective_rank", "OSF's trainable rank is min(out, in) - effective_rank, "
                                                         "per module: give it as --lora-rank")
        if r.get("layers_to_transform") is not None:
            r.note("key-not-honoured", "layers_to_transform", "estimated with adapters in every layer")
    defaults = ["an adapter config holds the method only: batch size, sequence length, precision and optimizer are "
                "the hf recipe's defaults (set them with memfit estimate's flags)"]
    return _mapped(r, model, setup, defaults, keys, None, None)
