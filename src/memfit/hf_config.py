"""Reading a Hugging Face config.json into ModelSpec fields: one reader per family's key names.

Sources: huggingface/transformers src/transformers/models/<type>/configuration_<type>.py (v5.24) for each key's
name and default.
"""

from __future__ import annotations

import math

from .errors import SourceError, printable, shorten


class ConfigReader:
    """Typed access to config keys with errors that name the key and the file. Ranges are checked once the
    fields are assembled (ModelSpec.validate); here only the JSON types."""

    def __init__(self, config: dict, source: str):
        self.config, self.source = config, source

    def int(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            # JSON has one number type: 4096.0 is accepted as 4096, 4096.5 and 1e400 (inf) are not.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
                raise SourceError(f"{self.source}: {key} must be an integer, got {shorten(value)}")
            return int(value)
        if default is None:
            raise SourceError(f"{self.source}: config is missing {keys[0]}")
        return default

    def float(self, key: str, default: float | None) -> float | None:
        value = self.config.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SourceError(f"{self.source}: {key} must be a finite number, got {shorten(value)}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SourceError(f"{self.source}: {key} must be true or false, got {shorten(value)}")
        return value

    def str(self, *keys: str, default: str) -> str:
        """The first of `keys` that is set (activation names); a non-string is an error, not str(value)."""
        for key in keys:
            value = self.config.get(key)
            if value is None or value == "":
                continue
            if not isinstance(value, str) or len(value) > 100:
                raise SourceError(f"{self.source}: {key} must be a short string such as 'silu', got "
                                  f"{shorten(value)}")
            return printable(value)
        return default


def _per_head(hidden: int, heads: int) -> int:
    """hidden / heads, or 0 ("not known", refused by validation) when heads is not positive: no ZeroDivision."""
    return hidden // heads if heads > 0 else 0


def read_llama_like(r: ConfigReader, traits: dict) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", default=heads)
    head_dim = r.int("head_dim", default=_per_head(hidden, heads))
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
    model_type = r.config.get("model_type")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not r.bool("use_sliding_window", False):
        out["sliding_window"] = None     # Qwen configs carry a window but do not use it by default
    if model_type == "gemma3_text":
        pattern = r.int("sliding_window_pattern", default=6)
        if pattern < 1:
            raise SourceError(f"{r.source}: sliding_window_pattern must be a positive integer, got {pattern}")
        out["sliding_fraction"] = (pattern - 1) / pattern
    elif model_type == "gemma2":
        out["sliding_fraction"] = 0.5
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


def _read_gpt2(r: ConfigReader, traits: dict) -> dict:
    hidden = r.int("n_embd", "hidden_size")
    heads = r.int("n_head", "num_attention_heads")
    return dict(
        hidden_size=hidden, intermediate_size=r.int("n_inner", default=4 * hidden),
        num_layers=r.int("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
        head_dim=_per_head(hidden, heads), vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True),
        qkv_bias=True, o_bias=True, mlp_bias=True, norm_bias=True,
        position_embeddings=r.int("n_positions", "max_position_embeddings", default=1024),
        activation=r.str("activation_function", default="gelu_new"),
        resid_dropout=r.float("resid_pdrop", 0.1) or 0.0,
        attn_dropout=r.float("attn_pdrop", 0.1) or 0.0,
        embd_dropout=r.float("embd_pdrop", 0.1) or 0.0,
    )


def _read_neox(r: ConfigReader, traits: dict) -> dict:
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    return dict(
        hidden_size=hidden, intermediate_size=r.int("intermediate_size", default=4 * hidden),
        num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=heads, head_dim=_per_head(hidden, heads),
        vocab_size=r.int("vocab_size"), tied_embeddings=r.bool("tie_word_embeddings", False),
        qkv_bias=r.bool("attention_bias", True), o_bias=r.bool("attention_bias", True), mlp_bias=True,
        norm_bias=True, partial_rotary_factor=r.float("rotary_pct", 0.25) or 0.25,
        parallel_attn_mlp=r.bool("use_parallel_residual", True),
        resid_dropout=r.float("hidden_dropout", 0.0) or 0.0, attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
        activation=r.str("hidden_act", default="gelu"),
    )


def _read_falcon(r: ConfigReader, traits: dict) -> dict:
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
        head_dim=_per_head(hidden, heads), vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True),
        qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=True,
        parallel_attn_mlp=r.bool("parallel_attn", True),
        attn_kv_broadcast=not new_arch and kv_heads != heads,
        # new_decoder_architecture (40B/180B) has two layer norms (ln_attn, ln_mlp); 7B has one.
        norms_per_layer=2 if new_arch or not r.bool("parallel_attn", True) else 1,
        resid_dropout=r.float("hidden_dropout", 0.0) or 0.0, attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
    )


def _read_bloom(r: ConfigReader, traits: dict) -> dict:
    # configuration_bloom.py: attribute_map n_layer / n_head, the old n_embed key for hidden_size (:52-77);
    # BloomMLP is 4h wide whatever the config says (modeling_bloom.py:321-323).
    hidden = r.int("hidden_size", "n_embed")
    heads = r.int("n_head", "num_attention_heads")
    return dict(
        hidden_size=hidden, intermediate_size=4 * hidden, num_layers=r.int("n_layer", "num_hidden_layers"),
        num_heads=heads, num_kv_heads=heads, head_dim=_per_head(hidden, heads), vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True), qkv_bias=True, o_bias=True, mlp_bias=True,
        norm_bias=True, embed_norm=True, activation="gelu",
        resid_dropout=r.float("hidden_dropout", 0.0) or 0.0, attn_dropout=r.float("attention_dropout", 0.0) or 0.0,
    )


def _read_phi(r: ConfigReader, traits: dict) -> dict:
    out = read_llama_like(r, traits)
    out.update(qkv_bias=True, o_bias=True, mlp_bias=True, norm_bias=True, parallel_attn_mlp=True,
               qk_norm="head" if r.bool("qk_layernorm", False) else "none",
               partial_rotary_factor=r.float("partial_rotary_factor", 0.5) or 0.5,
               resid_dropout=r.float("resid_pdrop", 0.0) or 0.0,
               embd_dropout=r.float("embd_pdrop", 0.0) or 0.0,
               activation=r.str("hidden_act", default="gelu_new"))
    return out


READERS = {"gpt2": _read_gpt2, "gpt_neox": _read_neox, "falcon": _read_falcon, "phi": _read_phi,
           "bloom": _read_bloom}


def common_traits(traits: dict, r: ConfigReader) -> dict:
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
    if "act" in traits and r.config.get("model_type") not in ("gpt2", "gpt_neox", "phi", "bloom"):
        out["activation"] = r.str("hidden_activation", "hidden_act", default=traits["act"])
    if "norms" in traits:
        out["norms_per_layer"] = traits["norms"]
    if traits.get("parallel"):
        out["parallel_attn_mlp"] = True
    if "qk_norm" in traits:
        out["qk_norm"] = traits["qk_norm"]
    if r.config.get("model_type") == "gpt_neox":
        out.pop("norms_per_layer", None)
    return out
