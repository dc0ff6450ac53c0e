"""ModelSpec: the architecture facts that decide training memory, and where they came from.

``ModelSpec.from_hf_config(config_dict)`` reads a Hugging Face ``config.json`` (the catalog stores the same
keys), so every model source lands on the same object. Family quirks (which key names a model type uses,
its MLP and norm kind) live in ``FAMILY_TRAITS``; each row cites the transformers modeling file it mirrors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from .errors import SourceError, printable, shorten

# The VLM model_types vision.py reads (the tower and projector); others with a text_config read as text models.
VISION_FAMILIES = ("qwen2_5_vl", "gemma3", "smolvlm", "qwen2_vl", "qwen3_vl", "llava", "internvl",
                   "llava_onevision", "llava_next", "mllama")

# What each transformers model_type builds. Sources: huggingface/transformers src/transformers/models/<type>/
# modeling_<type>.py (v5.24). mlp: "gated" = act(gate(x)) * up(x) -> down; "plain" = fc2(act(fc1(x))).
# norm_style "llama": x.float() -> normalize -> cast back -> * weight;  "gemma": (x.float() * (1 + w)).type_as(x).
# layer: the decoder layer class (FSDP's wrap unit, the trace's layer boundary).
# names: the nn.Linear module names PEFT targets (q, k, v, o, gate, up, down), fused ones share a name.
_LLAMA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_NEOX_NAMES = {"q": "query_key_value", "k": "query_key_value", "v": "query_key_value", "o": "dense",
               "up": "dense_h_to_4h", "down": "dense_4h_to_h"}
FAMILY_TRAITS: dict[str, dict] = {
    "llama": dict(layer="LlamaDecoderLayer", mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES),
    "mistral": dict(layer="MistralDecoderLayer", mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES),
    "mixtral": dict(layer="MixtralDecoderLayer", mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True),
    "qwen2": dict(layer="Qwen2DecoderLayer",
                  mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, qkv_bias_default=True),
    "qwen3": dict(layer="Qwen3DecoderLayer",
                  mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, qk_norm="head"),
    "qwen2_moe": dict(layer="Qwen2MoeDecoderLayer",
                      mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True,
                      qkv_bias_default=True),
    "qwen3_moe": dict(layer="Qwen3MoeDecoderLayer",
                      mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True, qk_norm="head"),
    "gemma": dict(layer="GemmaDecoderLayer", mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma",
                  names=_LLAMA_NAMES, embed_scale=True, tied_default=True),
    "gemma2": dict(layer="Gemma2DecoderLayer",
                   mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma", norms=4,
                   names=_LLAMA_NAMES, embed_scale=True, tied_default=True, sdpa=False,
                   eager_why="attention soft-capping"),
    "gemma3_text": dict(layer="Gemma3DecoderLayer",
                        mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma", norms=4,
                        names=_LLAMA_NAMES, embed_scale=True, tied_default=True, qk_norm="head"),
    "phi3": dict(layer="Phi3DecoderLayer", mlp="gated", act="silu", norm="rmsnorm", fused_qkv=True, fused_gate_up=True,
                 names={"q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "o": "o_proj",
                        "gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"}),
    "phi": dict(layer="PhiDecoderLayer",
                mlp="plain", act="gelu_new", norm="layernorm", norms=1, parallel=True, all_bias=True,
                lm_head_bias=True,
                names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "dense", "up": "fc1", "down": "fc2"}),
    "gpt2": dict(layer="GPT2Block", mlp="plain", act="gelu_new", norm="layernorm", all_bias=True, fused_qkv=True,
                 tied_default=True,
                 names={"q": "c_attn", "k": "c_attn", "v": "c_attn", "o": "c_proj", "up": "c_fc", "down": "c_proj"}),
    "gpt_neox": dict(layer="GPTNeoXLayer",
                     mlp="plain", act="gelu", norm="layernorm", all_bias=True, fused_qkv=True, names=_NEOX_NAMES),
    "falcon": dict(layer="FalconDecoderLayer",
                   mlp="plain", act="gelu", norm="layernorm", fused_qkv=True, tied_default=True, names=_NEOX_NAMES),
    # BLOOM (modeling_bloom.py): ALiBi instead of positions (a [b x heads, 1, s] bias built once per forward,
    # :505-515), its own eager attention only (baddbmm scores in the model dtype, fp32 softmax cast back, :271-284;
    # no SDPA/flash path), fused query_key_value with the heads interleaved, a 4h GELU MLP (:321-323, BloomGelu a
    # custom autograd Function that saves only its input, :142-152), a LayerNorm on the word embeddings
    # (word_embeddings_layernorm, :425), tied head (BloomConfig tie_word_embeddings True).
    "bloom": dict(layer="BloomBlock", mlp="plain", act="gelu", norm="layernorm", all_bias=True, fused_qkv=True,
                  tied_default=True, sdpa=False, eager_why="ALiBi: BloomAttention is its own baddbmm + softmax",
                  embed_norm=True, names=_NEOX_NAMES),
    "stablelm": dict(layer="StableLmDecoderLayer", mlp="gated", act="silu", norm="layernorm", names=_LLAMA_NAMES),
    # OLMo 2's RMSNorm multiplies the weight in fp32 before casting back: "gemma" style (modeling_olmo2.py).
    "olmo2": dict(layer="Olmo2DecoderLayer",
                  mlp="gated", act="silu", norm="rmsnorm", norm_style="gemma", names=_LLAMA_NAMES, qk_norm="full",
                  post_norm=True),
}

# Activations written in Python by transformers save more tensors than a fused kernel. NewGELUActivation
# (0.5*x*(1+tanh(c*(x+0.044715*x**3)))) saves x, tanh(.), 0.5*x and 1+tanh(.): 4 tensors of the input's size.
# Source: transformers src/transformers/activations.py.
ACT_SAVED_TENSORS = {"silu": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4, "relu": 1}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of one causal LM. Sizes are element counts; nothing here is bytes yet."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    source: str                                # where these facts came from (catalog file, path, cache, Hub)
    mlp_kind: str = "gated"                    # "gated" | "plain"
    activation: str = "silu"
    norm_kind: str = "rmsnorm"                 # "rmsnorm" | "layernorm"
    norm_style: str = "llama"                  # "llama" | "gemma" (see FAMILY_TRAITS)
    norm_bias: bool = False
    norms_per_layer: int = 2
    qk_norm: str = "none"                      # "none" | "head" (over head_dim) | "full" (over all heads)
    parallel_attn_mlp: bool = False            # attention and MLP read the same normed input (Phi-2, Falcon)
    # Falcon-7B passes 1 K/V head and 71 query heads to SDPA without enable_gqa: no fused kernel accepts that,
    # so SDPA takes the math path (s x s scores) on CUDA too (modeling_falcon.py FalconAttention.forward).
    attn_kv_broadcast: bool = False
    sdpa_supported: bool = True                # Gemma 2: transformers refuses SDPA (soft-capping), runs eager
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    module_names: tuple[tuple[str, str], ...] = tuple(_LLAMA_NAMES.items())
    position_embeddings: int = 0               # learned absolute positions (GPT-2); 0 for rotary models
    partial_rotary_factor: float = 1.0
    num_experts: int = 0                       # 0: dense
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    embed_scale: bool = False                  # Gemma multiplies the embedding by sqrt(hidden)
    embed_norm: bool = False                   # BLOOM: a LayerNorm on the word embeddings
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
    sliding_fraction: float = 1.0              # share of layers with local attention (Gemma 3: 5 of 6)
    resid_dropout: float = 0.0
    attn_dropout: float = 0.0
    embd_dropout: float = 0.0
    checkpoint_dtype: str = "bf16"             # dtype of the published weights (what dtype="auto" loads)
    exact_params: int | None = None            # from safetensors headers, when read
    prequantized: str | None = None            # e.g. "bnb-4bit", "gptq", "awq" when the checkpoint is quantized
    family: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    # A bare size ("7B") has no architecture: only the seed's rule of thumb applies, and the architecture
    # fields above are 0 ("not known"). estimate() routes such a spec to rule.py.
    rule_params: int | None = None
    # The config.json this spec was read from (sorted JSON): the trace rebuilds the real model from it.
    hf_config_json: str | None = None
    # A vision-language model: its vision tower and projector (vision.py); the fields above are its language
    # model's, and hf_config_json holds the whole VLM's config.
    vision: "VisionSpec | None" = None

    def __hash__(self) -> int:
        # Specs key the estimator's caches; hashing 40 fields on every lookup would dominate a search.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    # ---- derived sizes -------------------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def traits(self) -> dict:
        """What transformers builds for this model_type (FAMILY_TRAITS); empty for a bare size."""
        return FAMILY_TRAITS.get(self.model_type, {})

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def module_name(self, target: str) -> str | None:
        return dict(self.module_names).get(target)

    @property
    def is_rule_of_thumb(self) -> bool:
        return self.rule_params is not None

    @property
    def params(self) -> int:
        """Total parameters: read from safetensors when we had them, otherwise counted from the config."""
        from .params import count_params

        if self.rule_params is not None:
            return self.rule_params
        return self.exact_params if self.exact_params is not None else count_params(self).total

    @classmethod
    def from_size(cls, params: int, text: str) -> "ModelSpec":
        """A bare parameter count: no architecture, so only the rule of thumb can use it."""
        return cls(name=text, model_type="unknown", hidden_size=0, intermediate_size=0, num_layers=0, num_heads=0,
                   num_kv_heads=0, head_dim=0, vocab_size=0, tied_embeddings=False,
                   source="bare size: rule of thumb only", family="rule-of-thumb", rule_params=params)

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict, *, name: str, source: str, family: str = "",
                       processor: dict | None = None) -> "ModelSpec":
        """Build from a Hugging Face config.json dict. Raises SourceError naming what is missing or wrong.
        `processor`: a VLM's processor defaults (preprocessor_config.json keys such as max_pixels)."""
        if not isinstance(config, dict):
            raise SourceError(f"{source}: config is not a JSON object")
        vision, vlm_config = None, None
        if isinstance(config.get("vision_config"), dict) and config.get("model_type") in VISION_FAMILIES:
            from .vision import read_vision

            vlm_config = config
            vision, config = read_vision(config, source, processor)
        if "text_config" in config and "hidden_size" not in config:
            # Multimodal wrappers (Gemma 3, Llama 4, ...) keep the language model in text_config.
            text_config = config["text_config"]
            if not isinstance(text_config, dict):
                raise SourceError(f"{source}: text_config must be a JSON object (the language model's config), "
                                  f"got {shorten(text_config)}")
            merged = dict(text_config)
            merged.setdefault("model_type", config.get("model_type", ""))
            config = merged
        raw_type = config.get("model_type", "")
        if not isinstance(raw_type, str):
            raise SourceError(f"{source}: model_type must be a string, got {shorten(raw_type)}")
        model_type = raw_type.strip()
        if not model_type:
            raise SourceError(f"{source}: config has no model_type")
        if model_type not in FAMILY_TRAITS:
            known = ", ".join(sorted(FAMILY_TRAITS))
            raise SourceError(f"{source}: model_type {shorten(model_type)} is not supported yet (supported: {known})")
        traits = FAMILY_TRAITS[model_type]
        from .hf_config import READERS, ConfigReader, common_traits, read_llama_like

        reader = ConfigReader(config, source)
        kwargs = READERS.get(model_type, read_llama_like)(reader, traits)
        kwargs.update(common_traits(traits, reader))
        kwargs.update(_dtype_and_quant(config, source))
        try:
            config_json = json.dumps(vlm_config or config, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            # Keys of mixed types or NaN from a caller's dict: the trace cannot rebuild from it, nothing else needs it.
            config_json = None
        spec = cls(name=name, model_type=model_type, source=source, family=family or model_type,
                   hf_config_json=config_json, vision=vision, **kwargs)
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.rule_params is not None:
            return
        problems = []
        for fld, (key, low, high) in _INT_LIMITS.items():
            value = getattr(self, fld)
            if type(value) is not int or not low <= value <= high:
                allowed = f"a positive integer up to {high:,}" if low == 1 else f"an integer from {low} to {high:,}"
                problems.append(f"{key} must be {allowed}, got {shorten(value)}")
        for fld, (key, low, high, low_open, optional) in _FLOAT_LIMITS.items():
            value = getattr(self, fld)
            if value is None and optional:
                continue
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
                (low < value if low_open else low <= value) and value <= high
            if not ok:
                bracket = "(" if low_open else "["
                problems.append(f"{key} must be a number in {bracket}{low:g}, {high:g}], got {shorten(value)}")
        if self.sliding_window is not None and (type(self.sliding_window) is not int or
                                                not 1 <= self.sliding_window <= 2**31):
            problems.append(f"sliding_window must be a positive number of tokens (or null), got "
                            f"{shorten(self.sliding_window)}")
        if not problems:
            if self.num_heads % self.num_kv_heads:
                problems.append(f"num_attention_heads ({self.num_heads}) is not a multiple of "
                                f"num_key_value_heads ({self.num_kv_heads})")
            if self.is_moe and not 0 < self.experts_per_token <= self.num_experts:
                problems.append(f"experts per token ({self.experts_per_token}) must be between 1 and "
                                f"the number of experts ({self.num_experts})")
        if not problems:
            params = self.params
            if params > MAX_PARAMS:
                problems.append(f"these sizes make {params:.3g} parameters, more than any model that exists "
                                f"(limit {MAX_PARAMS:.0e}); check hidden_size, layers, vocab and experts")
        if problems:
            raise SourceError(f"{self.source}: " + "; ".join(problems))

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model was built for (config max_position_embeddings / n_positions)."""
        if not self.hf_config_json:
            return None
        config = json.loads(self.hf_config_json)
        value = config.get("max_position_embeddings") or config.get("n_positions")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
           "fp32": "fp32", "half": "fp16", "float": "fp32"}


def _dtype_and_quant(config: dict, source: str) -> dict:
    raw = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    key = raw.strip().lower().removeprefix("torch.") if isinstance(raw, str) else None
    if key == "auto":
        key = "bfloat16"     # "auto" names no dtype; bf16 is what current checkpoints ship
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise SourceError(f"{source}: quantization_config must be a JSON object, got {shorten(quant)}")
    if key not in _DTYPES:
        # An fp8 or int dtype without a quantization_config: memfit's weights model (bf16, fp16, fp32) would be
        # wrong by 2x or more, so say what the file holds instead of guessing.
        if not isinstance(quant, dict):
            raise SourceError(f"{source}: torch_dtype {shorten(raw)} is not supported (memfit models bfloat16, "
                              f"float16 and float32 checkpoints; fp8 or integer weights need their "
                              f"quantization_config)")
        key = "bfloat16"     # a quantized checkpoint's stored dtype is its quant method's; compute is bf16
    out: dict = {"checkpoint_dtype": _DTYPES[key]}
    if isinstance(quant, dict):
        method = quant.get("quant_method", "unknown")
        method = printable(method)[:40] if isinstance(method, str) else "unknown"
        if method == "bitsandbytes":
            method = "bnb-4bit" if quant.get("load_in_4bit") is True else "bnb-8bit"
        out["prequantized"] = method
    return out


MAX_PARAMS = 10**14   # 100T parameters: twenty times the largest model published; a bigger count is a typo
# Bounds on each size: far beyond the largest real model (hidden 16384 / 25600, 126 layers, vocab 262144,
# 256-384 experts), so only nonsense fails, and the message names the config key and the allowed range.
_INT_LIMITS = {   # field: (config.json key, lowest, highest)
    "hidden_size": ("hidden_size", 1, 2**18),
    "intermediate_size": ("intermediate_size", 1, 2**21),
    "num_layers": ("num_hidden_layers", 1, 10_000),
    "num_heads": ("num_attention_heads", 1, 2**16),
    "num_kv_heads": ("num_key_value_heads", 1, 2**16),
    "head_dim": ("head_dim", 1, 2**16),
    "vocab_size": ("vocab_size", 1, 10**7),
    "num_experts": ("num_experts", 0, 2**16),
    "experts_per_token": ("num_experts_per_tok", 0, 2**16),
    "moe_intermediate_size": ("moe_intermediate_size", 0, 2**21),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", 0, 2**21),
    "position_embeddings": ("max_position_embeddings", 0, 2**24),
    "norms_per_layer": ("norms per layer", 0, 16),
}
_FLOAT_LIMITS = {   # field: (config.json key, lowest, highest, lowest excluded, may be null)
    "partial_rotary_factor": ("partial_rotary_factor", 0.0, 1.0, True, False),
    "resid_dropout": ("resid_pdrop / hidden_dropout", 0.0, 0.99, False, False),
    "attn_dropout": ("attention_dropout", 0.0, 0.99, False, False),
    "embd_dropout": ("embd_pdrop", 0.0, 0.99, False, False),
    "attn_logit_softcap": ("attn_logit_softcapping", 0.0, 1e6, True, True),
    "final_logit_softcap": ("final_logit_softcapping", 0.0, 1e6, True, True),
    "sliding_fraction": ("sliding_window_pattern", 0.0, 1.0, False, False),
}
