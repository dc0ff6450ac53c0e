"""ModelSpec: the architecture facts that decide training memory, and where they came from.

``ModelSpec.from_hf_config(config_dict)`` reads a Hugging Face ``config.json`` (the catalog stores the same
keys), so every model source lands on the same object. Family quirks (which key names a model type uses,
its MLP and norm kind) live in ``FAMILY_TRAITS``; each row cites the transformers modeling file it mirrors.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .errors import SourceError

# What each transformers model_type builds. Sources: huggingface/transformers src/transformers/models/<type>/
# modeling_<type>.py (v5.24). mlp: "gated" = act(gate(x)) * up(x) -> down; "plain" = fc2(act(fc1(x))).
# norm_style "llama": x.float() -> normalize -> cast back -> * weight;  "gemma": (x.float() * (1 + w)).type_as(x).
# names: the nn.Linear module names PEFT targets (q, k, v, o, gate, up, down), fused ones share a name.
_LLAMA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_NEOX_NAMES = {"q": "query_key_value", "k": "query_key_value", "v": "query_key_value", "o": "dense",
               "up": "dense_h_to_4h", "down": "dense_4h_to_h"}
FAMILY_TRAITS: dict[str, dict] = {
    "llama": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES),
    "mistral": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES),
    "mixtral": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True),
    "qwen2": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, qkv_bias_default=True),
    "qwen3": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, qk_norm="head"),
    "qwen2_moe": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True,
                      qkv_bias_default=True),
    "qwen3_moe": dict(mlp="gated", act="silu", norm="rmsnorm", names=_LLAMA_NAMES, moe=True, qk_norm="head"),
    "gemma": dict(mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma",
                  names=_LLAMA_NAMES, embed_scale=True, tied_default=True),
    "gemma2": dict(mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma", norms=4,
                   names=_LLAMA_NAMES, embed_scale=True, tied_default=True, sdpa=False),
    "gemma3_text": dict(mlp="gated", act="gelu_pytorch_tanh", norm="rmsnorm", norm_style="gemma", norms=4,
                        names=_LLAMA_NAMES, embed_scale=True, tied_default=True, qk_norm="head"),
    "phi3": dict(mlp="gated", act="silu", norm="rmsnorm", fused_qkv=True, fused_gate_up=True,
                 names={"q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "o": "o_proj",
                        "gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"}),
    "phi": dict(mlp="plain", act="gelu_new", norm="layernorm", norms=1, parallel=True, all_bias=True,
                lm_head_bias=True,
                names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "dense", "up": "fc1", "down": "fc2"}),
    "gpt2": dict(mlp="plain", act="gelu_new", norm="layernorm", all_bias=True, fused_qkv=True,
                 tied_default=True,
                 names={"q": "c_attn", "k": "c_attn", "v": "c_attn", "o": "c_proj", "up": "c_fc", "down": "c_proj"}),
    "gpt_neox": dict(mlp="plain", act="gelu", norm="layernorm", all_bias=True, fused_qkv=True, names=_NEOX_NAMES),
    "falcon": dict(mlp="plain", act="gelu", norm="layernorm", fused_qkv=True, tied_default=True, names=_NEOX_NAMES),
    "stablelm": dict(mlp="gated", act="silu", norm="layernorm", names=_LLAMA_NAMES),
    # OLMo 2's RMSNorm multiplies the weight in fp32 before casting back: "gemma" style (modeling_olmo2.py).
    "olmo2": dict(mlp="gated", act="silu", norm="rmsnorm", norm_style="gemma", names=_LLAMA_NAMES, qk_norm="full",
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
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
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
    def from_hf_config(cls, config: dict, *, name: str, source: str, family: str = "") -> "ModelSpec":
        """Build from a Hugging Face config.json dict. Raises SourceError naming what is missing or wrong."""
        if not isinstance(config, dict):
            raise SourceError(f"{source}: config is not a JSON object")
        if "text_config" in config and "hidden_size" not in config:
            # Multimodal wrappers (Gemma 3, Llama 4, ...) keep the language model in text_config.
            merged = dict(config["text_config"])
            merged.setdefault("model_type", config.get("model_type", ""))
            config = merged
        model_type = str(config.get("model_type", "")).strip()
        if not model_type:
            raise SourceError(f"{source}: config has no model_type")
        if model_type not in FAMILY_TRAITS:
            known = ", ".join(sorted(FAMILY_TRAITS))
            raise SourceError(f"{source}: model_type {model_type!r} is not supported yet (supported: {known})")
        traits = FAMILY_TRAITS[model_type]
        reader = _ConfigReader(config, source)
        kwargs = _READERS.get(model_type, _read_llama_like)(reader, traits)
        kwargs.update(_common_traits(traits, reader))
        kwargs.update(_dtype_and_quant(config))
        spec = cls(name=name, model_type=model_type, source=source, family=family or model_type,
                   hf_config_json=json.dumps(config, sort_keys=True), **kwargs)
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.rule_params is not None:
            return
        problems = []
        for fld in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "vocab_size"):
            value = getattr(self, fld)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{fld} must be a positive integer, got {value!r}")
        if not problems:
            if self.num_heads % self.num_kv_heads:
                problems.append(f"num_attention_heads ({self.num_heads}) is not a multiple of "
                                f"num_key_value_heads ({self.num_kv_heads})")
            if self.hidden_size > 1_000_000 or self.num_layers > 10_000 or self.vocab_size > 10_000_000:
                problems.append("sizes are implausibly large (hidden > 1e6, layers > 1e4 or vocab > 1e7)")
            if self.is_moe and not 0 < self.experts_per_token <= self.num_experts:
                problems.append(f"experts per token ({self.experts_per_token}) must be between 1 and "
                                f"the number of experts ({self.num_experts})")
        if problems:
            raise SourceError(f"{self.source}: " + "; ".join(problems))

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)


class _ConfigReader:
    """Typed access to config keys with errors that name the key and the file."""

    def __init__(self, config: dict, source: str):
        self.config, self.source = config, source

    def int(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
                raise SourceError(f"{self.source}: {key} must be an integer, got {value!r}")
            return int(value)
        if default is None:
            raise SourceError(f"{self.source}: config is missing {keys[0]}")
        return default

    def float(self, key: str, default: float | None) -> float | None:
        value = self.config.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SourceError(f"{self.source}: {key} must be a number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SourceError(f"{self.source}: {key} must be true or false, got {value!r}")
        return value


def _read_llama_like(r: _ConfigReader, traits: dict) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", default=heads)
    head_dim = r.int("head_dim", default=hidden // heads if heads else 0)
    out = dict(
        hidden_size=hidden,
        intermediate_size=r.int("intermediate_size"),
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", traits.get("tied_default", False)),
        qkv_bias=r.bool("attention_bias", traits.get("qkv_bias_default", False)),
        mlp_bias=r.bool("mlp_bias", False),
        partial_rotary_factor=r.float("partial_rotary_factor", 1.0) or 1.0,
        attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
        sliding_window=r.int("sliding_window", default=0) or None,
        attn_logit_softcap=r.float("attn_logit_softcapping", None),
        final_logit_softcap=r.float("final_logit_softcapping", None),
    )
    out["o_bias"] = out["qkv_bias"] and r.config.get("model_type") in ("llama", "mistral", "olmo2")
    if r.config.get("model_type") in ("qwen2", "qwen2_moe"):
        out["qkv_bias"], out["o_bias"] = True, False   # Qwen2: bias on q/k/v only (modeling_qwen2.py)
    if r.config.get("model_type") == "stablelm":
        out["qkv_bias"] = r.bool("use_qkv_bias", False)
        out["o_bias"] = False
        out["norm_bias"] = True
        out["qk_norm"] = "head" if r.bool("qk_layernorm", False) else "none"
        out["parallel_attn_mlp"] = r.bool("use_parallel_residual", False)
        out["resid_dropout"] = r.float("hidden_dropout", 0.0) or 0.0
    if r.config.get("model_type") == "phi3":
        out["resid_dropout"] = r.float("resid_pdrop", 0.0) or 0.0
        out["embd_dropout"] = r.float("embd_pdrop", 0.0) or 0.0
    if traits.get("moe"):
        out["num_experts"] = r.int("num_local_experts", "num_experts")
        out["experts_per_token"] = r.int("num_experts_per_tok")
        out["moe_intermediate_size"] = r.int("moe_intermediate_size", default=out["intermediate_size"])
        out["shared_expert_intermediate_size"] = r.int("shared_expert_intermediate_size", default=0)
    return out


def _read_gpt2(r: _ConfigReader, traits: dict) -> dict:
    hidden = r.int("n_embd", "hidden_size")
    heads = r.int("n_head", "num_attention_heads")
    return dict(
        hidden_size=hidden, intermediate_size=r.int("n_inner", default=4 * hidden),
        num_layers=r.int("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
        head_dim=hidden // heads, vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True),
        qkv_bias=True, o_bias=True, mlp_bias=True, norm_bias=True,
        position_embeddings=r.int("n_positions", "max_position_embeddings", default=1024),
        activation=str(r.config.get("activation_function", "gelu_new")),
        resid_dropout=r.float("resid_pdrop", 0.1) or 0.0,
        attn_dropout=r.float("attn_pdrop", 0.1) or 0.0,
        embd_dropout=r.float("embd_pdrop", 0.1) or 0.0,
    )


def _read_neox(r: _ConfigReader, traits: dict) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    return dict(
        hidden_size=hidden, intermediate_size=r.int("intermediate_size", default=4 * hidden),
        num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        vocab_size=r.int("vocab_size"), tied_embeddings=r.bool("tie_word_embeddings", False),
        qkv_bias=r.bool("attention_bias", True), o_bias=r.bool("attention_bias", True), mlp_bias=True,
        norm_bias=True, partial_rotary_factor=r.float("rotary_pct", 0.25) or 0.25,
        parallel_attn_mlp=r.bool("use_parallel_residual", True),
        resid_dropout=r.float("hidden_dropout", 0.0) or 0.0, attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
        activation=str(r.config.get("hidden_act", "gelu")),
    )


def _read_falcon(r: _ConfigReader, traits: dict) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads", "n_head")
    new_arch = r.bool("new_decoder_architecture", False)
    if new_arch:
        kv_heads = r.int("num_kv_heads", "n_head_kv", default=heads)
    else:
        kv_heads = 1 if r.bool("multi_query", True) else heads
    bias = r.bool("bias", False)
    return dict(
        hidden_size=hidden, intermediate_size=r.int("ffn_hidden_size", default=4 * hidden),
        num_layers=r.int("num_hidden_layers", "n_layer"), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=hidden // heads, vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True),
        qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=True,
        parallel_attn_mlp=r.bool("parallel_attn", True),
        attn_kv_broadcast=not new_arch and kv_heads != heads,
        # new_decoder_architecture (40B/180B) has two layer norms (ln_attn, ln_mlp); 7B has one.
        norms_per_layer=2 if new_arch or not r.bool("parallel_attn", True) else 1,
        resid_dropout=r.float("hidden_dropout", 0.0) or 0.0, attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
    )


def _read_phi(r: _ConfigReader, traits: dict) -> dict:
    out = _read_llama_like(r, traits)
    out.update(qkv_bias=True, o_bias=True, mlp_bias=True, norm_bias=True, parallel_attn_mlp=True,
               qk_norm="head" if r.bool("qk_layernorm", False) else "none",
               partial_rotary_factor=r.float("partial_rotary_factor", 0.5) or 0.5,
               resid_dropout=r.float("resid_pdrop", 0.0) or 0.0,
               embd_dropout=r.float("embd_pdrop", 0.0) or 0.0,
               activation=str(r.config.get("hidden_act", "gelu_new")))
    return out


_READERS = {"gpt2": _read_gpt2, "gpt_neox": _read_neox, "falcon": _read_falcon, "phi": _read_phi}


def _common_traits(traits: dict, r: _ConfigReader) -> dict:
    out = dict(
        mlp_kind=traits["mlp"],
        norm_kind=traits["norm"],
        norm_style=traits.get("norm_style", "llama"),
        module_names=tuple(traits["names"].items()),
        fused_qkv=traits.get("fused_qkv", False),
        fused_gate_up=traits.get("fused_gate_up", False),
        embed_scale=traits.get("embed_scale", False),
        lm_head_bias=traits.get("lm_head_bias", False),
        sdpa_supported=traits.get("sdpa", True),
    )
    if "act" in traits and r.config.get("model_type") not in ("gpt2", "gpt_neox", "phi"):
        act = r.config.get("hidden_activation") or r.config.get("hidden_act") or traits["act"]
        out["activation"] = str(act)
    if "norms" in traits:
        out["norms_per_layer"] = traits["norms"]
    if traits.get("parallel"):
        out["parallel_attn_mlp"] = True
    if "qk_norm" in traits:
        out["qk_norm"] = traits["qk_norm"]
    if r.config.get("model_type") == "gpt_neox":
        out.pop("norms_per_layer", None)
    return out


_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16",
           "fp32": "fp32", "half": "fp16", "float": "fp32"}


def _dtype_and_quant(config: dict) -> dict:
    raw = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    out: dict = {"checkpoint_dtype": _DTYPES.get(raw, "bf16")}
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "unknown"))
        if method == "bitsandbytes":
            method = "bnb-4bit" if quant.get("load_in_4bit") else "bnb-8bit"
        out["prequantized"] = method
    return out
