"""Build the real transformers (+ PEFT) model for a ModelSpec and TrainingSetup, without weights.

Recipe (research/memory-physics.md §8.2): construct on the meta device in the training dtype, apply PEFT and
gradient checkpointing there (casting fake parameters later fails: nn.Module._apply swaps FakeTensors), then
`to_empty` under FakeTensorMode. QLoRA's 4-bit linears cannot wrap fake tensors (bitsandbytes Params4bit), so
they are replaced by an activation-equivalent function (below) and their storage is accounted in NF4 bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import SourceError
from ..options import ALL_TARGETS, PEFT_METHODS
from ..physics.stack import Stack
from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import adapters

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Built:
    model: nn.Module
    layers: list[nn.Module]
    quantized: list[nn.Linear]          # QLoRA: the linears that bitsandbytes would hold in 4 bits
    notes: list[str]


def _config(spec: ModelSpec, setup: TrainingSetup):
    import transformers

    if not spec.hf_config_json:
        raise SourceError(f"{spec.name}: no config to build the model from (a bare size cannot be traced)")
    config_dict = json.loads(spec.hf_config_json)
    try:
        config = transformers.AutoConfig.for_model(**config_dict)
    except (ValueError, KeyError) as exc:
        raise SourceError(f"transformers cannot build model_type {spec.model_type!r} ({exc}); "
                          f"use `memfit estimate` for the analytic estimate") from None
    if config_dict.get("auto_map"):
        raise SourceError(f"{spec.name} needs remote code (auto_map); memfit never runs it: use `memfit estimate`")
    config.use_cache = False
    return config


def build(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> Built:
    import transformers

    config = _config(spec, setup)
    notes: list[str] = []
    attn = "eager" if stack.attn == "eager" else "sdpa"
    if setup.attn == "flash":
        notes.append("flash-attention 2 has no CPU kernel: traced with SDPA, whose CPU flash kernel saves the "
                     "same tensors (q, k, v, out, logsumexp)")
    if setup.precision == "fp8":
        notes.append("fp8: traced as pure bf16 (torchao's Float8Linear is not applied); the analytic estimate adds "
                     "its float8 copies (physics/fp8.py)")
    weight_dtype = torch.float32 if stack.weight_bytes == 4 and not setup.quantized_base else \
        _TORCH_DTYPES["fp16" if stack.precision.startswith("fp16") else "bf16"]
    from . import vision as vlm

    auto = vlm.auto_class() if spec.vision else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config, dtype=weight_dtype, attn_implementation=attn)
    model.train()
    layers = vlm.decoder_layers(model) if spec.vision else _decoder_layers(model, spec)
    if spec.vision:
        vlm.freeze_tower(model, setup)
    quantized: list[nn.Linear] = []
    if setup.quantized_base:
        quantized = _fake_4bit_linears(layers, setup.quant)
        if setup.kbit_upcast:
            # prepare_model_for_kbit_training: every non-4-bit parameter goes to fp32 (peft utils/other.py).
            kept = {id(m.weight) for m in quantized}
            for p in model.parameters():
                if id(p) not in kept:
                    p.data = p.data.float()
    if setup.method in ("lora", "qlora"):
        for p in model.parameters():
            p.requires_grad_(False)
        model = _apply_lora(model, spec, setup, stack)
    elif setup.method == "lisa":
        adapters.freeze_inactive_layers(layers, stack.lora_layers)
    elif setup.method in PEFT_METHODS:
        for p in model.parameters():
            p.requires_grad_(False)
        model = adapters.apply(model, spec, setup, stack)
    if setup.grad_ckpt:
        target = model.get_base_model() if hasattr(model, "get_base_model") else model
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": setup.ckpt_reentrant})
        if setup.ckpt_reentrant and setup.method != "full":
            # Reentrant checkpoints need an input that requires grad: PEFT's enable_input_require_grads.
            target.enable_input_require_grads()
        notes.append("gradient checkpointing: " + ("reentrant (as requested)" if setup.ckpt_reentrant else
                                                   "non-reentrant (transformers v5 default)"))
    return Built(model=model, layers=layers, quantized=quantized, notes=notes)


def storage_on(model: nn.Module, device: str) -> None:
    """Give a meta-device model storage on `device`. to_empty materializes each module's parameter separately,
    which unties tied embeddings: tie them again as the checkpoint would be."""
    model.to_empty(device=device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "tie_word_embeddings", False):
        inp, out = base.get_input_embeddings(), base.get_output_embeddings()
        if hasattr(inp, "base_layer") or hasattr(out, "base_layer"):
            # PEFT wrapped the embedding or lm_head (LoRA on them): tie the wrapped base layers' weights.
            getattr(out, "base_layer", out).weight = getattr(inp, "base_layer", inp).weight
        else:
            base.tie_weights()


def _decoder_layers(model: nn.Module, spec: ModelSpec) -> list[nn.Module]:
    layer_class = spec.traits["layer"]
    return [m for m in model.modules() if type(m).__name__ == layer_class]


def _apply_lora(model, spec: ModelSpec, setup: TrainingSetup, stack: Stack):
    from peft import LoraConfig, get_peft_model

    # Fused MoE experts are PEFT target_parameters, not target_modules (physics/moe.py).
    names = adapters.target_names(spec, stack, parts=set(ALL_TARGETS))
    # LoRA on the embedding / lm_head (physics/lora_outer.py): their module names as this model spells them.
    outer = {m.linear.parts[0] for m in stack.outer_lora}
    for part, module in (("embed", model.get_input_embeddings()), ("head", model.get_output_embeddings())):
        if part in outer:
            names += [n for n, m in model.named_modules() if m is module]
    kwargs = {}
    experts = sorted({m.linear.name for m in stack.lora_modules if m.linear.parts == ("experts",)})
    if experts:
        # v5's fused 3-D expert parameters (physics/moe.py): PEFT >= 0.17 target_parameters.
        kwargs["target_parameters"] = experts
    if stack.lora_layers < spec.num_layers:
        kwargs["layers_to_transform"] = list(range(spec.num_layers - stack.lora_layers, spec.num_layers))
    if spec.vision:
        from .vision import lora_targets

        names = lora_targets(names)
    config = LoraConfig(r=setup.lora_rank, lora_alpha=2 * setup.lora_rank, target_modules=names,
                        lora_dropout=setup.lora_dropout, bias="none", task_type="CAUSAL_LM", **kwargs)
    return get_peft_model(model, config, autocast_adapter_dtype=stack.adapter_bytes == 4)


class _MatMul4bit(torch.autograd.Function):
    """What bitsandbytes' MatMul4Bit keeps and allocates (bitsandbytes/autograd/_functions.py, >= 0.43.2):
    the input is cast to the compute dtype, the weight is dequantized into a transient in forward and again in
    backward, no activation is saved, and the output takes the input's dtype.

    `saves_input` (int8): bitsandbytes 0.50.2 autograd/_functions.py:186-187 MatMul8bitLt.forward keeps
    ``ctx.tensors = (CAt, subA, A)`` whenever ``any(ctx.needs_input_grad[:2])`` (input A or weight B): the layer
    input itself stays alive until backward. Saved here as the same tensor, so the tracker counts it only when no
    other op keeps that storage (lora_A with dropout 0 saves it too). (subA, the outlier columns above threshold
    6.0, depends on the data; CAt is None for a frozen weight.)"""

    tracker = None   # set by the step runner so the dequantization transient is counted

    @staticmethod
    def forward(ctx, x, weight, bias, transposed, saves_input=False):
        if saves_input and any(ctx.needs_input_grad[:2]):
            ctx.save_for_backward(weight, x)
        else:
            ctx.save_for_backward(weight)     # the parameter itself: no new memory
        ctx.in_dtype, ctx.transposed = x.dtype, transposed
        w = weight.t() if transposed else weight      # GPT-2's Conv1D stores [in, out]
        _dequant(weight, +1)
        out = nn.functional.linear(x.to(weight.dtype), w, bias)
        _dequant(weight, -1)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        weight = ctx.saved_tensors[0]
        w = weight.t() if ctx.transposed else weight
        _dequant(weight, +1)
        grad_x = (grad.to(weight.dtype) @ w).to(ctx.in_dtype)
        _dequant(weight, -1)
        return grad_x, None, None, None, None


def _dequant(weight: torch.Tensor, sign: int) -> None:
    tracker = _MatMul4bit.tracker
    if tracker is not None:
        nbytes = tracker.rounded(weight.numel() * weight.element_size())
        (tracker.add_virtual if sign > 0 else tracker.remove_virtual)(nbytes, "temporaries")


class _Linear4bitForward:
    def __init__(self, linear: nn.Module, transposed: bool, saves_input: bool):
        self.linear, self.transposed, self.saves_input = linear, transposed, saves_input

    def __call__(self, x):
        return _MatMul4bit.apply(x, self.linear.weight, self.linear.bias, self.transposed, self.saves_input)


def _fake_4bit_linears(layers: list[nn.Module], quant: str) -> list[nn.Linear]:
    """transformers' bitsandbytes integration quantizes every nn.Linear and GPT-2 Conv1D in the decoder."""
    from transformers.pytorch_utils import Conv1D

    found = []
    for layer in layers:
        for module in layer.modules():
            if type(module) is nn.Linear or isinstance(module, Conv1D):
                module.forward = _Linear4bitForward(module, transposed=isinstance(module, Conv1D),
                                                    saves_input=quant == "int8")
                found.append(module)
    return found
