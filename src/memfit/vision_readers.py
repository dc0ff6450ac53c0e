"""The towers and projectors of Qwen2-VL, Qwen3-VL, LLaVA(-1.5, -NeXT, -OneVision) and InternVL, read from their
config.json.

Each reader returns (VisionSpec, the language model's config) like vision.py's; the exact parameter counts are
checked against the transformers classes on the meta device (tests/test_vision_more.py). Module layouts cite
transformers 5.25 (the installed version) models/<type>/modeling_<type>.py. Pure: no torch.
"""

from __future__ import annotations

from .errors import SourceError
from .vision import VisionSpec, _int, _siglip_params


def _text_of(config: dict, source: str) -> dict:
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"{source}: text_config must be a JSON object (the language model's config)")
    return dict(text)


def _carry_dtype(config: dict, text: dict) -> None:
    for key in ("torch_dtype", "dtype"):
        if key in config:
            text.setdefault(key, config[key])
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))


def _positive(source: str, *values: int) -> None:
    if not all(v > 0 for v in values):
        raise SourceError(f"{source}: vision_config sizes must be positive")


def _read_qwen2_vl(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # Defaults: configuration_qwen2_vl.py Qwen2VLVisionConfig (depth 32, embed_dim 1280, mlp_ratio 4, 16 heads).
    # modeling_qwen2_vl.py: PatchEmbed (Conv3d, no bias); Qwen2VLVisionBlock: two LayerNorms (weight and bias),
    # qkv and proj with bias, VisionMlp fc1/fc2 (embed x mlp_ratio) with bias; PatchMerger: LayerNorm(embed),
    # Linear(4 embed, 4 embed), GELU, Linear(4 embed, LM hidden), both with bias. No window attention.
    e = _int(vc, "embed_dim", source, 1280)
    ratio = vc.get("mlp_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
        raise SourceError(f"{source}: vision_config mlp_ratio must be a positive number")
    i = int(e * ratio)
    depth = _int(vc, "depth", source, 32)
    p, m = _int(vc, "patch_size", source, 14), _int(vc, "spatial_merge_size", source, 2)
    t, c = _int(vc, "temporal_patch_size", source, 2), _int(vc, "in_channels", source, 3)
    text = dict(config["text_config"]) if isinstance(config.get("text_config"), dict) else \
        {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
    out = _int(vc, "hidden_size", source, text.get("hidden_size", 3584))
    heads = _int(vc, "num_heads", source, 16)
    _positive(source, e, i, depth, p, m, t, c, out, heads)
    block = 2 * 2 * e + (e * 3 * e + 3 * e) + (e * e + e) + (e * i + i) + (i * e + e)
    merged = e * m * m
    vision = VisionSpec(
        family="qwen2_vl", depth=depth, hidden_size=e, intermediate_size=i, num_heads=heads, patch_size=p,
        merge_size=m, temporal_patch_size=t, in_channels=c, out_hidden_size=out, window_size=0,
        full_attention_layers=tuple(range(depth)), image_token_id=_int(config, "image_token_id", source, 151655),
        tower_params=c * t * p * p * e + depth * block,
        projector_params=2 * e + merged * merged + merged + merged * out + out,
        # Qwen/Qwen2-VL-*-Instruct preprocessor_config.json: min_pixels 3136, max_pixels 12845056.
        min_pixels=int(processor.get("min_pixels", 3136)), max_pixels=int(processor.get("max_pixels", 12845056)))
    text["model_type"] = "qwen2"
    _carry_dtype(config, text)
    return vision, text


def _read_qwen3_vl(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # Defaults: configuration_qwen3_vl.py Qwen3VLVisionConfig. modeling_qwen3_vl.py: Qwen3VLVisionPatchEmbed
    # (Conv3d with bias), pos_embed Embedding(num_position_embeddings, h), Qwen3VLVisionBlock (two LayerNorms,
    # qkv/proj with bias, linear_fc1/fc2 with bias), the merger (LayerNorm(h), Linear(4h, 4h), GELU,
    # Linear(4h, out)) and one more merger per deepstack index whose LayerNorm is over 4h (use_postshuffle_norm).
    # The deepstack mergers live in model.visual: counted with the tower; the projector is the final merger.
    h = _int(vc, "hidden_size", source, 1152)
    i = _int(vc, "intermediate_size", source, 4304)
    depth = _int(vc, "depth", source, 27)
    p, m = _int(vc, "patch_size", source, 16), _int(vc, "spatial_merge_size", source, 2)
    t, c = _int(vc, "temporal_patch_size", source, 2), _int(vc, "in_channels", source, 3)
    positions = _int(vc, "num_position_embeddings", source, 2304)
    heads = _int(vc, "num_heads", source, 16)
    deepstack = vc.get("deepstack_visual_indexes", [8, 16, 24])
    if not isinstance(deepstack, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in deepstack):
        raise SourceError(f"{source}: vision_config deepstack_visual_indexes must be a list of integers")
    text = _text_of(config, source)
    out = _int(vc, "out_hidden_size", source, text.get("hidden_size", 3584))
    _positive(source, h, i, depth, p, m, t, c, out, heads, positions)
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    merged = h * m * m
    mlp = merged * merged + merged + merged * out + out
    vision = VisionSpec(
        family="qwen3_vl", depth=depth, hidden_size=h, intermediate_size=i, num_heads=heads, patch_size=p,
        merge_size=m, temporal_patch_size=t, in_channels=c, out_hidden_size=out, window_size=0,
        full_attention_layers=tuple(range(depth)), image_token_id=_int(config, "image_token_id", source, 151655),
        tower_params=(c * t * p * p * h + h) + positions * h + depth * block + len(deepstack) * (2 * merged + mlp),
        projector_params=2 * h + mlp,
        # Qwen/Qwen3-VL-*-Instruct preprocessor_config.json: size shortest_edge 65536 and longest_edge 16777216
        # pixels (the processor's min_pixels / max_pixels), patch_size 16, merge_size 2.
        min_pixels=int(processor.get("min_pixels", 65536)), max_pixels=int(processor.get("max_pixels", 16777216)))
    text["model_type"] = "qwen3"
    _carry_dtype(config, text)
    return vision, text


def _clip_tower(config: dict, vc: dict, source: str, family: str) -> tuple[dict, dict]:
    """The CLIP tower's sizes and its exact parameter count (LLaVA-1.5, LLaVA-NeXT), with the text config."""
    # modeling_llava.py / modeling_llava_next.py: vision_tower = AutoModel.from_config(vision_config) (a
    # CLIPVisionModel: modeling_clip.py CLIPVisionEmbeddings has a class embedding, a Conv2d without bias and one
    # position per patch plus the class token; pre_layrnorm, layers like SigLIP's, post_layernorm);
    # the multimodal projector: Linear(vision h, text h), GELU, Linear(text h, text h), both with bias.
    if vc.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise SourceError(f"{source}: {family} with a {vc.get('model_type')!r} vision tower is not modelled "
                          f"(CLIP only)")
    h = _int(vc, "hidden_size", source, 768)
    i = _int(vc, "intermediate_size", source, 3072)
    depth = _int(vc, "num_hidden_layers", source, 12)
    p, side = _int(vc, "patch_size", source, 32), _int(vc, "image_size", source, 224)
    c = _int(vc, "num_channels", source, 3)
    heads = _int(vc, "num_attention_heads", source, 12)
    text = _text_of(config, source)
    out = _int(text, "hidden_size", source, 4096)
    _positive(source, h, i, depth, p, side, c, out, heads)
    if config.get("vision_feature_select_strategy", "default") != "default" or side % p:
        raise SourceError(f"{source}: only vision_feature_select_strategy 'default' (the class token dropped) on an "
                          f"image_size that is a multiple of patch_size is modelled")
    per_side = side // p
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    sizes = dict(depth=depth, hidden_size=h, intermediate_size=i, num_heads=heads, patch_size=p,
                 merge_size=1, temporal_patch_size=1, in_channels=c, out_hidden_size=out, window_size=0,
                 full_attention_layers=(), image_token_id=_int(config, "image_token_index", source, 32000),
                 tower_params=h + c * p * p * h + (per_side ** 2 + 1) * h + 2 * h + depth * layer + 2 * h,
                 projector_params=h * out + out + out * out + out, min_pixels=0, max_pixels=0, fixed_side=side)
    return sizes, text


def _read_llava(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    sizes, text = _clip_tower(config, vc, source, "LLaVA")
    vision = VisionSpec(family="llava", **sizes)
    _carry_dtype(config, text)
    return vision, text


def _read_llava_next(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # modeling_llava_next.py (transformers 5.25): LLaVA-1.5's CLIP tower and projector, plus image_newline (a
    # text-hidden vector, line 236; counted with the tower like OneVision's), run on every any-res tile and the
    # base image; configuration_llava_next.py: image_grid_pinpoints default [[336, 672], [672, 336], [672, 672],
    # [1008, 336], [336, 1008]]. No pooling of large grids (OneVision's anyres_max_N): max_tiles stays 0.
    sizes, text = _clip_tower(config, vc, source, "LLaVA-NeXT")
    pinpoints = config.get("image_grid_pinpoints", [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]])
    sizes["tower_params"] += sizes["out_hidden_size"]
    vision = VisionSpec(family="llava_next", grid_pinpoints=_pinpoints(pinpoints, source), **sizes)
    _carry_dtype(config, text)
    return vision, text


def _pinpoints(pinpoints, source: str) -> tuple:
    if not (isinstance(pinpoints, list) and pinpoints and all(
            isinstance(q, list) and len(q) == 2 and all(isinstance(v, int) and v > 0 for v in q) for q in pinpoints)):
        raise SourceError(f"{source}: image_grid_pinpoints must be a list of [height, width] pairs")
    return tuple(tuple(q) for q in pinpoints)


def _read_internvl(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # modeling_internvl.py: InternVLVisionEmbeddings (cls_token, Conv2d with bias, a position per patch + 1 when
    # use_absolute_position_embeddings), InternVLVisionLayer (two norms, q/k/v with attention_bias, projection
    # with bias, optional q/k RMSNorm over h, lambda_1/lambda_2 layer scales, fc1/fc2 with bias), a final
    # LayerNorm unless use_mean_pooling; InternVLMultiModalProjector: LayerNorm(4h), Linear(4h, text h), GELU,
    # Linear(text h, text h). Defaults: configuration_internvl.py InternVLVisionConfig / InternVLConfig.
    h = _int(vc, "hidden_size", source, 1024)
    i = _int(vc, "intermediate_size", source, 4096)
    depth = _int(vc, "num_hidden_layers", source, 24)
    heads = _int(vc, "num_attention_heads", source, 16)
    size, patch = vc.get("image_size", [448, 448]), vc.get("patch_size", [14, 14])
    side = size[0] if isinstance(size, list) and size else size
    p = patch[0] if isinstance(patch, list) and patch else patch
    if not (isinstance(side, int) and isinstance(p, int) and p > 0 and side % p == 0):
        raise SourceError(f"{source}: vision_config image_size {size!r} must be a multiple of patch_size {patch!r}")
    c = _int(vc, "num_channels", source, 3)
    ratio = config.get("downsample_ratio", 0.5)
    if ratio != 0.5:
        raise SourceError(f"{source}: downsample_ratio {ratio!r}: only InternVL's 0.5 (a 2x2 pixel shuffle) is modelled")
    if vc.get("norm_type", "layer_norm") != "layer_norm":
        raise SourceError(f"{source}: vision_config norm_type {vc.get('norm_type')!r} is not modelled (layer_norm)")
    text = _text_of(config, source)
    out = _int(text, "hidden_size", source, 896)
    _positive(source, h, i, depth, heads, c, out)
    per_side = side // p
    bias = 1 if vc.get("attention_bias", True) else 0
    qk_norm = 2 * h if vc.get("use_qk_norm", False) else 0
    layer = 2 * 2 * h + 3 * (h * h + bias * h) + (h * h + h) + qk_norm + 2 * h + (h * i + i) + (i * h + h)
    embeddings = h + (c * p * p * h + h) + (h if vc.get("use_mask_token", False) else 0) + \
        ((per_side ** 2 + 1) * h if vc.get("use_absolute_position_embeddings", True) else 0)
    merged = 4 * h
    vision = VisionSpec(
        family="internvl", depth=depth, hidden_size=h, intermediate_size=i, num_heads=heads, patch_size=p,
        merge_size=2, temporal_patch_size=1, in_channels=c, out_hidden_size=out, window_size=0,
        full_attention_layers=(), image_token_id=_int(config, "image_token_id", source, 151667),
        tower_params=embeddings + depth * layer + (0 if vc.get("use_mean_pooling", True) else 2 * h),
        projector_params=2 * merged + merged * out + out + out * out + out, min_pixels=0, max_pixels=0,
        fixed_side=side,
        # OpenGVLab/InternVL3-*-hf preprocessor_config.json: crop_to_patches true, min_patches 1, max_patches 12.
        max_tiles=int(processor.get("max_patches", 12)), min_tiles=int(processor.get("min_patches", 1)))
    _carry_dtype(config, text)
    return vision, text


def _read_llava_onevision(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # modeling_llava_onevision.py: vision_tower = AutoModel.from_config(vision_config) (SigLIP without pooling
    # head: vision.py _siglip_params), LlavaOnevisionMultiModalProjector (Linear(vision h, text h), GELU,
    # Linear(text h, text h), both with bias) and image_newline, a text-hidden vector in the model (counted with
    # the tower: it is not the projector module).
    if vc.get("model_type", "siglip_vision_model") != "siglip_vision_model" or vc.get("vision_use_head") is not False:
        raise SourceError(f"{source}: LLaVA-OneVision is modelled with a SigLIP tower without pooling head")
    h = _int(vc, "hidden_size", source, 1152)
    i = _int(vc, "intermediate_size", source, 4304)
    depth = _int(vc, "num_hidden_layers", source, 26)
    p, side = _int(vc, "patch_size", source, 14), _int(vc, "image_size", source, 384)
    c, heads = _int(vc, "num_channels", source, 3), _int(vc, "num_attention_heads", source, 16)
    text = _text_of(config, source)
    out = _int(text, "hidden_size", source, 896)
    _positive(source, h, i, depth, p, side, c, out, heads)
    pinpoints = config.get("image_grid_pinpoints")
    aspect = str(config.get("vision_aspect_ratio", "anyres_max_9"))
    grid = _pinpoints(pinpoints, source)
    if not aspect.startswith("anyres_max_") or not aspect[len("anyres_max_"):].isdigit():
        raise SourceError(f"{source}: vision_aspect_ratio {aspect!r}: only anyres_max_N is modelled")
    if config.get("vision_feature_select_strategy", "full") != "full":
        raise SourceError(f"{source}: only vision_feature_select_strategy 'full' is modelled")
    vision = VisionSpec(
        family="llava_onevision", depth=depth, hidden_size=h, intermediate_size=i, num_heads=heads, patch_size=p,
        merge_size=1, temporal_patch_size=1, in_channels=c, out_hidden_size=out, window_size=0,
        full_attention_layers=(), image_token_id=_int(config, "image_token_index", source, 151646),
        tower_params=_siglip_params(h, i, depth, p, side // p, c) + out,
        projector_params=h * out + out + out * out + out, min_pixels=0, max_pixels=0, fixed_side=side,
        max_tiles=int(aspect[len("anyres_max_"):]), grid_pinpoints=grid)
    _carry_dtype(config, text)
    return vision, text


READERS = {"qwen2_vl": _read_qwen2_vl, "qwen3_vl": _read_qwen3_vl, "llava": _read_llava, "internvl": _read_internvl,
           "llava_onevision": _read_llava_onevision, "llava_next": _read_llava_next}
TEXT_OF = {"qwen2_vl": "qwen2", "qwen3_vl": "qwen3"}
