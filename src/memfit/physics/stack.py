"""The numeric plan of a run: which dtypes, which tensors train, which kernels. Resolved once per estimate.

Everything in physics/ reads a Stack instead of re-deriving dtype rules; the rules (and their sources) are here.
Byte widths are counted per element; NF4 is handled in states.py in bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..params import Linear, layer_linears
from ..options import LINEAR_ADAPTER_METHODS
from ..recipes import get_recipe
from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import adapters, litgpt_adapter, moe
from .lora_outer import outer_linears

@dataclass(frozen=True)
class LoraModule:
    linear: Linear
    rank: int                   # LoRA's rank; OFT/BOFT: the block size; FourierFT: n_frequency
    kind: str = "lora"          # the PEFT method (physics/adapters.py)

    @property
    def tensors(self) -> tuple[int, ...]:
        """Element counts of its trainable tensors. A 3-D expert parameter gets one set per expert (PEFT
        ParamWrapper: lora_A [r*E, in], lora_B [out, r*E])."""
        return tuple(n * self.linear.copies for n in adapters.module_tensors(
            self.kind, self.linear.d_in, self.linear.d_out, self.rank, self.feedforward))

    @property
    def params(self) -> int:
        return sum(self.tensors) + adapters.module_frozen_params(self.kind, self.linear.d_in, self.linear.d_out,
                                                                 self.rank) * self.linear.copies

    @property
    def feedforward(self) -> bool:
        return bool(set(self.linear.parts) & adapters.FEEDFORWARD_PARTS)


@dataclass(frozen=True)
class Stack:
    method: str
    weight_bytes: int          # bytes per element of the (non-quantized) model weights as loaded
    residual_bytes: int        # dtype of the hidden states between layers
    compute_bytes: int         # dtype of matmul outputs (2 under autocast or 16-bit weights)
    autocast: bool
    autocast_dtype: str        # "bf16" | "fp16" | "" (no autocast)
    weight_dtype: str          # dtype of the non-quantized weights: "bf16" | "fp16" | "fp32"
    residual_cast: bool        # autocast casts 16-bit hidden states too (fp16 weights under bf16 autocast)
    adapter_bytes: int         # LoRA A/B weights and grads
    base_trainable: bool       # full fine-tuning
    lora_modules: tuple[LoraModule, ...]   # per adapted layer
    outer_lora: tuple[LoraModule, ...]     # LoRA on the embedding / lm_head (once each; physics/lora_outer.py)
    lora_layers: int           # how many (last) layers carry adapters (setup.train_layers)
    loss_kind: str             # "hf" | "plain" | "chunked-fp32" | "chunked-kept" | "liger" | "unsloth" |
                               # "trl-chunked-nll" | "trl-fused-head" (physics/loss.py)
    fp32_logits_copy: bool
    keeps_logits: bool         # the loop holds the logits through backward (LitGPT, nanoGPT)
    logits_bytes: int          # dtype of the lm_head output
    fused_norm: bool
    ckpt_offload: bool
    compiled: bool             # torch.compile: the partitioner's saved set (physics/compile.py)
    kbit_upcast: bool
    precision: str             # resolved (never "auto")
    attn: str                  # the attention path transformers really takes
    notes: tuple[str, ...]
    # Adapter tensors outside the adapted Linears (physics/adapters.py extra_params): trainable (elements, count)
    # and frozen elements.
    extra_trainable: tuple[tuple[int, int], ...] = ()
    extra_frozen_params: int = 0
    quantized: bool = False    # the base linears are bitsandbytes-quantized (QLoRA, QDoRA, ...)
    lora_dropout: float = 0.0  # the adapters' input dropout (physics/adapters.py)
    # LitGPT's facts (recipes.Recipe, physics/litgpt.py).
    fabric_fp32_output: bool = False
    keeps_previous_logits: bool = False
    quantized_head: bool = False   # lm_head is a 4-bit linear too
    repeats_kv: str = ""
    lora_qkv_zero_pad: bool = False


def resolve_precision(spec: ModelSpec, setup: TrainingSetup) -> tuple[str, str | None]:
    """'auto' -> the checkpoint's dtype, as transformers v5 loads it (dtype='auto'). Returns (precision, note)."""
    if setup.precision != "auto":
        return setup.precision, None
    if setup.quantized_base:
        # QLoRA setups load the non-quantized weights in the 4-bit compute dtype (bnb_4bit_compute_dtype=bf16).
        return "bf16", "precision auto: QLoRA keeps the non-quantized weights in its compute dtype (bf16)"
    ckpt = spec.checkpoint_dtype
    if ckpt == "fp32":
        # An fp32 checkpoint loads in fp32; with Trainer bf16=True that is fp32 weights + bf16 autocast.
        return "bf16-mixed", ("precision auto: the checkpoint is fp32 (config dtype), so weights load in fp32 and "
                              "train under bf16 autocast (bf16-mixed)")
    return ckpt, f"precision auto: weights load in the checkpoint dtype ({ckpt})"


def deepspeed_param_dtype(setup: TrainingSetup) -> str:
    """The dtype DeepSpeed's engine holds parameters in under ZeRO ("" when not ZeRO or when fp32).

    The config memfit writes (engine_config.deepspeed_config) and HF Trainer's "auto" both enable bf16 unless the
    precision is fp16/fp16-mixed (then fp16) or fp32 (neither). With either enabled the engine casts the module's
    parameters, frozen ones included, to that dtype (deepspeed 0.19.8 runtime/engine.py:2080-2088), or zero.Init
    creates them in it (HF from_pretrained under ZeRO-3)."""
    if not setup.shard.startswith("zero") or setup.precision == "fp32":
        return ""
    return "fp16" if setup.precision.startswith("fp16") else "bf16"


def resolve_stack(spec: ModelSpec, setup: TrainingSetup) -> Stack:
    recipe = get_recipe(setup.recipe)
    precision, note = resolve_precision(spec, setup)
    notes = [note] if note else []
    mixed = precision.endswith("-mixed")
    weight_bytes = 4 if (mixed or precision == "fp32") else 2
    if setup.quantized_base:
        # QLoRA's non-quantized params stay in the 16-bit load dtype unless prepare_model_for_kbit_training
        # upcasts them to fp32 (peft src/peft/utils/other.py; TRL < 0.22 called it).
        weight_bytes = 4 if setup.kbit_upcast else 2
        mixed = False
    # An explicit bf16/fp16 means pure 16-bit training. "auto" means what the recipe does with the checkpoint:
    # HF Trainer's bf16=True wraps the forward in autocast even when the weights are already bf16.
    autocast = mixed or (setup.precision == "auto" and setup.autocast and precision in ("bf16", "fp16"))
    if setup.quantized_base:
        autocast = setup.autocast
    zero_dtype = deepspeed_param_dtype(setup)
    if zero_dtype:
        # DeepSpeed's bf16/fp16 engine casts every floating-point parameter (frozen ones and LoRA adapters too)
        # to the 16-bit dtype and runs the forward without torch autocast; the fp32 master copy lives in the ZeRO
        # optimizer (physics/sharding.py).
        weight_bytes, mixed, autocast = 2, False, False
        notes.append(f"DeepSpeed ZeRO with {zero_dtype} enabled: the engine casts all parameters to {zero_dtype} "
                     "and runs without torch autocast (deepspeed 0.19.8 runtime/engine.py:2080-2088 "
                     "_cast_module_mixed_precision; accelerate 1.16 accelerator.py:557 leaves native_amp off under "
                     "DeepSpeed); fp32 master weights and optimizer state sit in ZeRO's fp32 partition")
    residual_bytes = weight_bytes
    compute_bytes = 2 if (autocast or weight_bytes == 2) else 4
    autocast_dtype = ("fp16" if precision == "fp16-mixed" else "bf16") if autocast else ""
    if weight_bytes == 4:
        weight_dtype = "fp32"
    elif zero_dtype:
        weight_dtype = zero_dtype
    else:
        weight_dtype = "fp16" if precision.startswith("fp16") else "bf16"
    # HF Trainer bf16=True on an fp16 checkpoint (Llama 2, Phi-2, Pythia load in fp16 with dtype="auto"): autocast
    # casts every fp16 weight and hidden state to bf16, and the weight casts are saved for backward.
    residual_cast = autocast and weight_dtype == "fp16" and autocast_dtype == "bf16"
    if setup.quantized_base and autocast and spec.norm_kind == "layernorm" and not recipe.fused_norm:
        # A LayerNorm under autocast returns fp32, Linear4bit keeps its input's dtype, so the MLP output and the
        # residual stream after the first layer are fp32.
        residual_bytes = 4
    if spec.embed_norm and autocast and not recipe.fused_norm:
        # BLOOM's word_embeddings_layernorm runs in fp32 under CUDA autocast (layer_norm is on autocast's fp32
        # list) and returns fp32; the blocks add their outputs to that residual (modeling_bloom.py dropout_add),
        # so the hidden states between layers, and their checkpoints, are fp32 from the first layer on.
        residual_bytes = 4
    if residual_cast:
        # bf16 layer outputs added to an fp16 residual promote to fp32: from the first residual add on, the
        # hidden states (and the checkpoints of them) are fp32.
        residual_bytes = 4
        notes.append("fp16 weights under bf16 autocast (Trainer bf16=True): every matmul casts its weight and "
                     "input to bf16, the weight copies stay alive until backward, and the residual stream "
                     "becomes fp32 (bf16 + fp16 promotes)")
    adapter_bytes = 4 if setup.adapter_fp32 else (2 if setup.quantized_base else weight_bytes)
    if adapters.own_dtype(setup.method):
        adapter_bytes = weight_bytes
    if zero_dtype:
        adapter_bytes = 2       # PEFT's fp32 adapters are cast with the rest of the module
    # `--loss chunked` is the stack's own chunked loss: LitGPT keeps its logit chunks, torchtune upcasts each.
    loss_kind = recipe.chunked_kind if setup.loss == "chunked" else setup.loss
    logits_bytes = compute_bytes if not (setup.quantized_base and setup.kbit_upcast and not autocast
                                                 and not zero_dtype) else 4
    lora_modules: tuple[LoraModule, ...] = ()
    if setup.method in LINEAR_ADAPTER_METHODS:
        targets = set(setup.lora_targets)
        size = adapters.module_size(setup)
        lora_modules = tuple(LoraModule(lin, size, setup.method) for lin in layer_linears(spec)
                             if set(lin.parts) & targets and lin.parts not in (("experts",), ("router",)))
        lora_modules += tuple(LoraModule(lin, setup.lora_rank) for lin in moe.adapted_experts(spec, setup))
        if spec.is_moe and targets & {"gate", "up", "down"} and "experts" not in targets:
            notes.append("MoE experts are stacked 3-D parameters in transformers v5, not nn.Linear: LoRA "
                         "targets only attention (and shared-expert) linears; add the target `experts` to adapt "
                         "them (PEFT target_parameters)")
    attn = setup.attn
    if attn == "sdpa" and not spec.sdpa_supported:
        attn = "eager"
        why = spec.traits.get("eager_why", "")
        notes.append(f"{spec.model_type} has no SDPA path in transformers" + (f" ({why})" if why else "")
                     + ": it runs eager attention, which keeps the s x s scores")
    lora_layers = spec.num_layers
    if setup.method == "lisa":
        lora_layers = min(setup.lisa_layers, spec.num_layers)       # the layers active in one interval
    elif setup.method == "llama-adapter":
        lora_layers = litgpt_adapter.adapted_layers(spec)            # layers 0-1 save nothing (no gradient)
    elif setup.train_layers and setup.method != "full":
        # PEFT layers_to_transform / mlx-lm --num-layers: adapters on the last N layers only.
        lora_layers = min(setup.train_layers, spec.num_layers)
    return Stack(method=setup.method, weight_bytes=weight_bytes, residual_bytes=residual_bytes,
                 compute_bytes=compute_bytes, autocast=autocast, autocast_dtype=autocast_dtype,
                 weight_dtype=weight_dtype, residual_cast=residual_cast, adapter_bytes=adapter_bytes,
                 base_trainable=setup.method in ("full", "lisa"), lora_modules=lora_modules, lora_layers=lora_layers,
                 outer_lora=tuple(LoraModule(lin, setup.lora_rank) for lin in outer_linears(spec, setup))
                 if setup.method in ("lora", "qlora") else (),
                 loss_kind=loss_kind, fp32_logits_copy=recipe.fp32_logits_copy and autocast,
                 keeps_logits=recipe.keeps_logits,
                 logits_bytes=logits_bytes, fused_norm=recipe.fused_norm,
                 ckpt_offload=setup.ckpt_offload, compiled=setup.compile, kbit_upcast=setup.kbit_upcast,
                 precision=precision, attn=attn, notes=tuple(notes),
                 fabric_fp32_output=recipe.fabric_fp32_output, keeps_previous_logits=recipe.keeps_previous_logits,
                 quantized_head=recipe.quantizes_head and setup.quantized_base and setup.quant in BNB4_QUANTS,
                 repeats_kv=recipe.repeats_kv, lora_qkv_zero_pad=recipe.lora_qkv_zero_pad,
                 **_extras(spec, setup, lora_modules))


# The bitsandbytes 4-bit formats Lightning's BitsandbytesPrecision swaps every nn.Linear for.
BNB4_QUANTS = ("nf4", "nf4-dq", "fp4")


def _extras(spec: ModelSpec, setup: TrainingSetup, lora_modules: tuple[LoraModule, ...]) -> dict:
    adapters.check_modules(spec, setup, [m.linear for m in lora_modules])
    trainable, frozen = adapters.extra_params(spec, setup.method, setup.lora_rank, setup.num_virtual_tokens,
                                              [m.linear for m in lora_modules], litgpt_adapter.is_peft(setup))
    return dict(extra_trainable=trainable, extra_frozen_params=frozen, quantized=setup.quantized_base,
                lora_dropout=setup.lora_dropout)
