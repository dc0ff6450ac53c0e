"""Vision-language models: the vision tower and projector read from a config, and image tokens per family.

A VLM's config.json holds the language model (``text_config``, or flat keys for Qwen2/2.5-VL) and the vision
tower (``vision_config``). ``read_vision(config, source)`` returns the ``VisionSpec`` (tower geometry, exact
parameter counts of tower and projector) and the language model's config with its text family's model_type,
so the language model goes through the same ``ModelSpec`` path as any text model.

``image_tokens(vision, ...)`` counts the tokens one image becomes, the way each family's processor does:
- Qwen2/2.5-VL: ``smart_resize`` to multiples of patch x merge (28 px) inside [min_pixels, max_pixels]; one
  token per 28 x 28 block, the tower sees 4 patches (14 x 14) per token
  (transformers 5.24 models/qwen2_vl/image_processing_qwen2_vl.py smart_resize, lines 63-89). Qwen3-VL: the same
  processor class with patch 16, merge 2 (32 px per token; processing_qwen3_vl.py uses Qwen2VLImageProcessor).
- Gemma 3, LLaVA-1.5: every image resized (LLaVA: shortest edge then center crop, CLIPImageProcessor) to one fixed
  square: 256 (Gemma 3, pooled) or (336 / 14)^2 = 576 (LLaVA, the class token dropped) tokens.
- SmolVLM: longest edge resized, cut into 512 px tiles + a global tile, 64 tokens each.
- InternVL: 448 px tiles on the grid nearest the aspect ratio + a thumbnail, 256 tokens each (vision_tiles.py).
- LLaVA-OneVision: any-resolution 384 px tiles + the base image, the padding cut off, a newline token per row,
  pooled above 9 tiles' worth (vision_tiles.py). LLaVA-NeXT: the same with 336 px CLIP tiles, never pooled.
- Llama 3.2 Vision (mllama): no image tokens in the text beyond one <|image|> each; every image is padded to
  max_tiles tiles, and the language model's cross-attention layers attend to tiles x 1601 vision tokens.
Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InvalidSetupError, Problem, SourceError, shorten

# VLM model_type -> the text family its language model is built as (transformers 5.24 modeling files: the
# Qwen2.5-VL text decoder layer is Qwen2's, q/k/v bias and no o bias; modeling_qwen2_5_vl.py
# Qwen2_5_VLDecoderLayer / Qwen2_5_VLAttention).
TEXT_FAMILY = {"qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2", "gemma3": "gemma3_text", "smolvlm": "llama",
               "mllama": "llama"}
VISION_CHOICES = ("frozen", "lora", "full")


@dataclass(frozen=True)
class VisionSpec:
    """The vision side of a VLM. Sizes are element counts; the tower runs on `patches`, the LM on tokens."""

    family: str                   # the VLM's model_type ("qwen2_5_vl")
    depth: int                    # vision blocks
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int               # pixels per patch side
    merge_size: int               # patches per token side (2: a 2x2 merge)
    temporal_patch_size: int      # frames per patch (an image is repeated to fill them)
    in_channels: int
    out_hidden_size: int          # the projector's output: the LM's hidden size
    window_size: int              # Qwen2.5-VL window attention, in pixels (0: full attention everywhere)
    full_attention_layers: tuple[int, ...]
    image_token_id: int
    tower_params: int             # patch embedding + blocks (+ final norm)
    projector_params: int         # the merger / multimodal projector
    min_pixels: int               # the processor's defaults (preprocessor_config.json), 0 where not used
    max_pixels: int
    fixed_side: int = 0           # every image (or tile) resized to this square (Gemma 3: 896), 0: dynamic (Qwen)
    longest_edge: int = 0         # SmolVLM: images resized to this longest edge, then cut into fixed_side tiles
    max_tiles: int = 0            # InternVL: at most this many fixed_side tiles per image (+ a thumbnail); mllama:
                                  # every image padded to this many; 0: none
    min_tiles: int = 0            # LLaVA-OneVision: max_tiles is anyres_max_N, the pooling threshold
    grid_pinpoints: tuple = ()    # LLaVA-OneVision: the (height, width) grid resolutions of image_grid_pinpoints
    # Llama 3.2 Vision (mllama): every image is padded to max_tiles tiles of fixed_side; a second, gated
    # encoder of global_layers runs after the depth local ones; the language model attends to the vision states
    # (output_dim wide before the projector) in its cross_layers, not through image tokens in its sequence.
    global_layers: int = 0
    output_dim: int = 0
    cross_layers: tuple[int, ...] = ()
    lm_extra_params: int = 0      # language-model parameters a Llama layer does not have (mllama_extra_params)

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params + self.lm_extra_params

    @property
    def patches_per_tile(self) -> int:
        """Mllama: patches of one tile with its class token (560 / 14)^2 + 1 = 1601, the vision tokens per tile."""
        return (self.fixed_side // self.patch_size) ** 2 + 1

    @property
    def padded_patches_per_tile(self) -> int:
        """Mllama pads each tile's patches to a multiple of 8 before the encoders (modeling_mllama.py
        MllamaVisionModel.forward num_padding_patches): 1608."""
        return -(-self.patches_per_tile // 8) * 8

    @property
    def pixel_bounded(self) -> bool:
        """Qwen-VL: min/max pixels bound the resize (the other families resize to fixed tiles)."""
        return not (self.fixed_side or self.longest_edge or self.max_tiles or self.grid_pinpoints)

    @property
    def token_pixels(self) -> int:
        """Pixels per side of one LM token (Qwen: 14 x 2 = 28)."""
        return self.patch_size * self.merge_size

    @property
    def patch_values(self) -> int:
        """Values per patch in pixel_values (channels x frames x p x p): 1176 for Qwen2.5-VL."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


def read_vision(config: dict, source: str, processor: dict | None = None) -> tuple[VisionSpec, dict]:
    """(VisionSpec, the language model's config dict) from a VLM config.json; `processor` holds the processor
    defaults the catalog stores (min_pixels, max_pixels) from the model's preprocessor_config.json."""
    model_type = config.get("model_type")
    from .vision_readers import READERS

    readers = {**_READERS, **READERS}
    if model_type not in readers:
        raise SourceError(f"{source}: vision-language model_type {shorten(model_type)} is not supported yet "
                          f"(supported: {', '.join(sorted(readers))})")
    vision_config = config.get("vision_config")
    if not isinstance(vision_config, dict):
        raise SourceError(f"{source}: vision_config must be a JSON object, got {shorten(vision_config)}")
    return readers[model_type](config, vision_config, source, processor or {})


def _int(d: dict, key: str, source: str, default: int | None = None) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SourceError(f"{source}: vision_config {key} must be a non-negative integer, got {shorten(value)}")
    return value


def _read_qwen2_5_vl(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # Defaults: transformers 5.24 models/qwen2_5_vl/configuration_qwen2_5_vl.py Qwen2_5_VLVisionConfig.
    h = _int(vc, "hidden_size", source, 1280)
    i = _int(vc, "intermediate_size", source, 3420)
    depth = _int(vc, "depth", source, 32)
    p = _int(vc, "patch_size", source, 14)
    m = _int(vc, "spatial_merge_size", source, 2)
    t = _int(vc, "temporal_patch_size", source, 2)
    c = _int(vc, "in_channels", source, 3)
    text = dict(config["text_config"]) if isinstance(config.get("text_config"), dict) else \
        {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
    out = _int(vc, "out_hidden_size", source, text.get("hidden_size", 3584))
    full = vc.get("fullatt_block_indexes", [7, 15, 23, 31])
    if not isinstance(full, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in full):
        raise SourceError(f"{source}: vision_config fullatt_block_indexes must be a list of integers")
    # modeling_qwen2_5_vl.py: Qwen2_5_VisionPatchEmbed (Conv3d, no bias); Qwen2_5_VLVisionBlock: two RMSNorms,
    # qkv and proj with bias, gated MLP (gate/up/down) with bias; Qwen2_5_VLPatchMerger: RMSNorm(h),
    # Linear(4h, 4h), GELU, Linear(4h, out), both with bias.
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * i + i) + (i * h + h)
    tower = c * t * p * p * h + depth * block
    merged = h * m * m
    projector = h + merged * merged + merged + merged * out + out
    vision = VisionSpec(
        family="qwen2_5_vl", depth=depth, hidden_size=h, intermediate_size=i, num_heads=_int(vc, "num_heads", source, 16),
        patch_size=p, merge_size=m, temporal_patch_size=t, in_channels=c, out_hidden_size=out,
        window_size=_int(vc, "window_size", source, 112), full_attention_layers=tuple(full),
        image_token_id=_int(config, "image_token_id", source, 151655), tower_params=tower, projector_params=projector,
        # Qwen/Qwen2.5-VL-*-Instruct preprocessor_config.json: min_pixels 3136, max_pixels 12845056.
        min_pixels=int(processor.get("min_pixels", 3136)), max_pixels=int(processor.get("max_pixels", 12845056)))
    if not all(v > 0 for v in (h, i, depth, p, m, t, c, out, vision.num_heads)):
        raise SourceError(f"{source}: vision_config sizes must be positive")
    text["model_type"] = TEXT_FAMILY[config["model_type"]]
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    for key in ("torch_dtype", "dtype"):
        if key in config:
            text.setdefault(key, config[key])
    return vision, text


def _read_gemma3(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # transformers 5.24 models/siglip/modeling_siglip.py (SiglipVisionEmbeddings: Conv2d with bias and a learned
    # position per patch; SiglipEncoderLayer: two LayerNorms with bias, q/k/v/out and fc1/fc2 with bias;
    # post_layernorm; no pooling head when vision_use_head is false) and models/gemma3/modeling_gemma3.py
    # Gemma3MultiModalProjector (mm_input_projection_weight [vision h, text h], RMSNorm(vision h), avg-pooling
    # the patch grid down to mm_tokens_per_image). Defaults: SiglipVisionConfig.
    h = _int(vc, "hidden_size", source, 768)
    i = _int(vc, "intermediate_size", source, 3072)
    depth = _int(vc, "num_hidden_layers", source, 12)
    p = _int(vc, "patch_size", source, 16)
    side = _int(vc, "image_size", source, 224)
    c = _int(vc, "num_channels", source, 3)
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"{source}: text_config must be a JSON object (the language model's config)")
    text = dict(text)
    out = _int(text, "hidden_size", source, 2304)
    tokens = _int(config, "mm_tokens_per_image", source, 256)
    per_side = side // p
    token_side = math.isqrt(tokens)
    if not (h and p and token_side and per_side % token_side == 0 and token_side ** 2 == tokens):
        raise SourceError(f"{source}: mm_tokens_per_image {tokens} must be a square whose side divides the "
                          f"{per_side} patches per side")
    if vc.get("vision_use_head", True) is not False:
        raise SourceError(f"{source}: a SigLIP pooling head (vision_use_head) is not what Gemma 3 builds")
    tower = _siglip_params(h, i, depth, p, per_side, c)
    vision = VisionSpec(
        family="gemma3", depth=depth, hidden_size=h, intermediate_size=i,
        num_heads=_int(vc, "num_attention_heads", source, 12), patch_size=p, merge_size=per_side // token_side,
        temporal_patch_size=1, in_channels=c, out_hidden_size=out, window_size=0, full_attention_layers=(),
        image_token_id=_int(config, "image_token_id", source, _int(config, "image_token_index", source, 262144)),
        tower_params=tower, projector_params=h * out + h, min_pixels=0, max_pixels=0, fixed_side=side)
    text["model_type"] = TEXT_FAMILY["gemma3"]
    for key in ("torch_dtype", "dtype"):
        if key in config:
            text.setdefault(key, config[key])
    return vision, text


def _siglip_params(h: int, i: int, depth: int, p: int, per_side: int, c: int) -> int:
    """A SigLIP encoder without pooling head: Conv2d patch embedding with bias, one learned position per patch,
    layers of two LayerNorms, q/k/v/out and fc1/fc2 (all with bias), a final LayerNorm
    (transformers 5.24 models/siglip/modeling_siglip.py; SmolVLM's vision model is the same, modeling_smolvlm.py)."""
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    return (c * p * p * h + h) + per_side ** 2 * h + depth * layer + 2 * h


def _read_smolvlm(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # Defaults: transformers 5.24 models/smolvlm/configuration_smolvlm.py SmolVLMVisionConfig (hidden 1152,
    # intermediate 3072, 12 layers, 16 heads, 512 px, patch 32) and SmolVLMConfig (scale_factor 2).
    h = _int(vc, "hidden_size", source, 1152)
    i = _int(vc, "intermediate_size", source, 3072)
    depth = _int(vc, "num_hidden_layers", source, 12)
    p = _int(vc, "patch_size", source, 32)
    side = _int(vc, "image_size", source, 512)
    c = _int(vc, "num_channels", source, 3)
    scale = _int(config, "scale_factor", source, 2)
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"{source}: text_config must be a JSON object (the language model's config)")
    text = dict(text)
    out = _int(text, "hidden_size", source, 4096)
    if not (h and p and scale and side % p == 0 and (side // p) % scale == 0):
        raise SourceError(f"{source}: image_size {side} must be a multiple of patch_size {p} x scale_factor {scale}")
    vision = VisionSpec(
        family="smolvlm", depth=depth, hidden_size=h, intermediate_size=i,
        num_heads=_int(vc, "num_attention_heads", source, 16), patch_size=p, merge_size=scale, temporal_patch_size=1,
        in_channels=c, out_hidden_size=out, window_size=0, full_attention_layers=(),
        image_token_id=_int(config, "image_token_id", source, 128257),
        tower_params=_siglip_params(h, i, depth, p, side // p, c),
        # SmolVLMConnector: pixel shuffle (scale x scale patches into one), then Linear(h * scale^2, out, bias=False).
        projector_params=h * scale * scale * out, min_pixels=0, max_pixels=0, fixed_side=side,
        # preprocessor_config.json size.longest_edge (SmolVLM/SmolVLM2: 2048; 4 x 512 tiles per side at most).
        longest_edge=int(processor.get("longest_edge", 4 * side)))
    text["model_type"] = TEXT_FAMILY["smolvlm"]
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return vision, text


def _read_mllama(config: dict, vc: dict, source: str, processor: dict) -> tuple[VisionSpec, dict]:
    # Defaults: transformers 5.25 models/mllama/configuration_mllama.py MllamaVisionConfig / MllamaTextConfig.
    h = _int(vc, "hidden_size", source, 1280)
    i = _int(vc, "intermediate_size", source, 5120)
    depth = _int(vc, "num_hidden_layers", source, 32)
    glob = _int(vc, "num_global_layers", source, 8)
    p = _int(vc, "patch_size", source, 14)
    side = _int(vc, "image_size", source, 448)
    c = _int(vc, "num_channels", source, 3)
    tiles = _int(vc, "max_num_tiles", source, 4)
    out_dim = _int(vc, "vision_output_dim", source, 7680)
    ratios = vc.get("supported_aspect_ratios") or [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise SourceError(f"{source}: text_config must be a JSON object (the language model's config)")
    text = dict(text)
    cross = text.pop("cross_attention_layers", [3, 8, 13, 18, 23, 28, 33, 38])
    if not isinstance(cross, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in cross):
        raise SourceError(f"{source}: text_config cross_attention_layers must be a list of integers")
    if not (h and p and tiles and side % p == 0 and isinstance(ratios, list)):
        raise SourceError(f"{source}: vision_config image_size {side} must be a multiple of patch_size {p}")
    out = _int(text, "hidden_size", source, 4096)
    heads = _int(vc, "attention_heads", source, _int(vc, "num_attention_heads", source, 16))
    n = (side // p) ** 2 + 1
    # modeling_mllama.py (transformers 5.25): MllamaVisionModel has a Conv2d patch embedding without bias, a class
    # embedding, MllamaPrecomputedPositionEmbedding (gate, n x h positions, a tile embedding of
    # (ratios + 1) x (tiles * n * h)), two gated MllamaPrecomputedAspectRatioEmbedding ((ratios + 1) x tiles * h),
    # layernorm_pre/post with bias; MllamaVisionEncoderLayer: two LayerNorms, q/k/v/o without bias, fc1/fc2 with
    # bias, and in the global encoder two gates (gate_attn, gate_ffn).
    layer = 2 * 2 * h + 4 * h * h + (h * i + i) + (i * h + h)
    ids = len(ratios) + 1                       # aspect-ratio ids, 0 for padding
    embeddings = c * p * p * h + h + (1 + n * h + ids * tiles * n * h) + 2 * (1 + ids * tiles * h)
    tower = embeddings + 2 * 2 * h + depth * layer + glob * (layer + 2)
    vision = VisionSpec(
        family="mllama", depth=depth, hidden_size=h, intermediate_size=i, num_heads=heads, patch_size=p, merge_size=1,
        temporal_patch_size=1, in_channels=c, out_hidden_size=out, window_size=0, full_attention_layers=(),
        image_token_id=_int(config, "image_token_index", source, _int(config, "image_token_id", source, 128256)),
        tower_params=tower, projector_params=out_dim * out + out,     # multi_modal_projector: Linear with bias
        min_pixels=0, max_pixels=0, fixed_side=side, max_tiles=tiles, global_layers=glob, output_dim=out_dim,
        cross_layers=tuple(cross), lm_extra_params=mllama_extra_params(text, len(cross)))
    text["model_type"] = TEXT_FAMILY["mllama"]
    for key in ("torch_dtype", "dtype"):
        if key in config:
            text.setdefault(key, config[key])
    return vision, text


def mllama_extra_params(text: dict, cross: int) -> int:
    """What Mllama's language model has beyond a Llama of the same size and depth (modeling_mllama.py, 5.25):
    embed_tokens has vocab + 8 rows (MllamaTextModel), and each MllamaCrossAttentionDecoderLayer adds q_norm and
    k_norm over head_dim and two tanh gates (cross_attn_attn_gate, cross_attn_mlp_gate); its q/k/v/o and MLP are a
    Llama layer's."""
    h = text.get("hidden_size", 4096)
    head_dim = h // text.get("num_attention_heads", 32)
    return 8 * h + cross * (2 * head_dim + 2)


_READERS = {"qwen2_5_vl": _read_qwen2_5_vl, "gemma3": _read_gemma3, "smolvlm": _read_smolvlm, "mllama": _read_mllama}


# ---- image tokens ---------------------------------------------------------------------------------------------
def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize: both sides multiples of `factor`, area in [min_pixels, max_pixels], aspect kept.
    Mirrors transformers 5.24 models/qwen2_vl/image_processing_qwen2_vl.py smart_resize (lines 63-89);
    tests/test_vision.py checks it against that function."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.0f} is above the processor's "
                         f"limit of 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImagePlan:
    """What one sample's images become: tokens in the LM's sequence, patches in the tower."""

    images: int
    grid: tuple[int, int]          # patches per image (rows, columns) as the tower sees them
    tokens_per_image: int
    patches_per_image: int
    how: str                       # the assumption, in words
    cross_tokens_per_image: int = 0    # Mllama: vision tokens the LM's cross-attention layers attend to

    @property
    def cross_tokens(self) -> int:
        return self.images * self.cross_tokens_per_image

    @property
    def tokens(self) -> int:
        return self.images * self.tokens_per_image

    @property
    def patches(self) -> int:
        return self.images * self.patches_per_image


def parse_image_size(text: str) -> tuple[int, int]:
    """'1280x720' -> (width, height)."""
    parts = str(text).lower().replace("*", "x").split("x")
    try:
        width, height = (int(x) for x in parts)
    except ValueError:
        raise InvalidSetupError(Problem("image_size", f"{{image_size}} {text!r} is not WIDTHxHEIGHT in pixels "
                                                      f"(e.g. 1280x720)")) from None
    if not (1 <= width <= 1 << 16 and 1 <= height <= 1 << 16):
        raise InvalidSetupError(Problem("image_size", f"{{image_size}} {text!r}: each side must be 1 to 65536 "
                                                      f"pixels"))
    return width, height


def plan_images(vision: VisionSpec, image_size: str | None, images: int, min_pixels: int | None,
                max_pixels: int | None, image_tokens: int | None) -> ImagePlan:
    """The tokens and patches of `images` images per sample, as the family's processor makes them."""
    if vision.grid_pinpoints:
        from .vision_tiles import plan_onevision

        return plan_onevision(vision, image_size, images, min_pixels, max_pixels, image_tokens)
    if vision.cross_layers:
        return _plan_mllama(vision, image_size, images, min_pixels, max_pixels, image_tokens)
    if vision.max_tiles:
        from .vision_tiles import plan_internvl

        return plan_internvl(vision, image_size, images, min_pixels, max_pixels, image_tokens)
    if vision.longest_edge:
        return _plan_tiles(vision, image_size, images, min_pixels, max_pixels, image_tokens)
    if vision.fixed_side:
        return _plan_fixed(vision, image_size, images, min_pixels, max_pixels, image_tokens)
    lo = vision.min_pixels if min_pixels is None else min_pixels
    hi = vision.max_pixels if max_pixels is None else max_pixels
    f = vision.token_pixels
    if lo > hi:
        raise InvalidSetupError(Problem("min_pixels", f"{{min_pixels}} {lo} is above {{max_pixels}} {hi}"))
    if hi < f * f:
        raise InvalidSetupError(Problem("max_pixels", f"{{max_pixels}} {hi} is below one token ({f}x{f} = "
                                                      f"{f * f} pixels)"))
    if image_tokens is not None:
        # Given directly: a square grid of tokens is what the tower sees (its cost depends on the count only).
        side = math.isqrt(image_tokens)
        rows, cols = side, -(-image_tokens // side)
        if rows * cols != image_tokens:
            rows, cols = 1, image_tokens
        grid = (rows * vision.merge_size, cols * vision.merge_size)
        how = f"{image_tokens} tokens per image (given)"
    else:
        if image_size is None:
            # No size: the largest image the processor lets through, a square at max_pixels (the usual cause
            # of out-of-memory reports: research/frontier.md §1.2).
            side = max(f, math.isqrt(hi) // f * f)
            height = width = side
            how = f"no --image-size: a square image at max_pixels {hi:,} ({side}x{side} px), the largest"
        else:
            width, height = parse_image_size(image_size)
            height, width = smart_resize(height, width, f, lo, hi)
            how = f"{image_size} resized to {width}x{height} (smart_resize, {lo:,} <= pixels <= {hi:,})"
        grid = (height // vision.patch_size, width // vision.patch_size)
    patches = grid[0] * grid[1]
    tokens = patches // (vision.merge_size ** 2)
    return ImagePlan(images=images, grid=grid, tokens_per_image=tokens, patches_per_image=patches,
                     how=f"{images} image(s) per sample, {how}: {tokens:,} tokens and {patches:,} tower patches "
                         f"each")


def _no_pixel_bounds(vision: VisionSpec, min_pixels: int | None, max_pixels: int | None) -> None:
    for name, value in (("max_pixels", max_pixels), ("min_pixels", min_pixels)):
        if value is not None:
            raise InvalidSetupError(Problem(name, f"{{{name}}} bounds Qwen-VL's resize; {vision.family} resizes "
                                                  f"images its own way"))


def smolvlm_frames(width: int, height: int, longest_edge: int, tile: int) -> tuple[int, int]:
    """(rows, cols) of tiles SmolVLM's processor cuts an image into; (0, 0) when it stays one tile. Mirrors
    transformers 5.24 models/smolvlm/image_processing_pil_smolvlm.py: resize the longest edge to `longest_edge`
    (_resize_output_size_rescale_to_max_len, then below MAX_IMAGE_SIZE 4096), round both sides up to multiples of
    the tile (resize_for_vision_encoder), cut (split_images) and add one global tile."""
    aspect = width / height
    if width >= height:
        width, height = longest_edge, int(longest_edge / aspect)
        height += height % 2
    else:
        height, width = longest_edge, int(longest_edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    cap = 4096
    if width >= height and width > cap:
        width, height = cap, int(cap / (width / height))
    elif height > width and height > cap:
        height, width = cap, int(cap * (width / height))
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    if height > tile or width > tile:
        return (height - tile) // tile + 1, (width - tile) // tile + 1
    return 0, 0


def given_tiles(vision: VisionSpec, image_tokens: int, per_tile: int) -> int:
    """The tiles `--image-tokens` stands for, in a family that makes `per_tile` tokens of each tile."""
    if image_tokens % per_tile:
        raise InvalidSetupError(Problem("image_tokens", f"{{image_tokens}} {image_tokens}: {vision.family} makes "
                                                        f"{per_tile} tokens per tile (a multiple of it)"))
    return image_tokens // per_tile


def _plan_tiles(vision: VisionSpec, image_size: str | None, images: int, min_pixels: int | None,
                max_pixels: int | None, image_tokens: int | None) -> ImagePlan:
    """SmolVLM: tiles of fixed_side pixels plus a global tile, each (side / patch / scale)^2 tokens (64)."""
    _no_pixel_bounds(vision, min_pixels, max_pixels)
    side = vision.fixed_side // vision.patch_size
    per_tile = (side // vision.merge_size) ** 2
    if image_tokens is not None:
        frames = given_tiles(vision, image_tokens, per_tile)
        how = f"{frames} tiles (given)"
    else:
        width, height = parse_image_size(image_size) if image_size else (vision.longest_edge, vision.longest_edge)
        rows, cols = smolvlm_frames(width, height, vision.longest_edge, vision.fixed_side)
        frames = rows * cols + 1 if rows else 1
        what = image_size or f"no --image-size: a square image at the longest edge {vision.longest_edge}"
        how = f"{what} cut into {rows}x{cols} tiles of {vision.fixed_side} px + 1 global" if rows else \
            f"{what} as one {vision.fixed_side} px tile"
    return ImagePlan(images=images, grid=(side * frames, side), tokens_per_image=per_tile * frames,
                     patches_per_image=side * side * frames,
                     how=f"{images} image(s) per sample, {how}: {per_tile * frames:,} tokens and "
                         f"{side * side * frames:,} tower patches each")


def _plan_fixed(vision: VisionSpec, image_size: str | None, images: int, min_pixels: int | None,
                max_pixels: int | None, image_tokens: int | None) -> ImagePlan:
    """Gemma 3: every image (or pan-and-scan crop) is resized to fixed_side x fixed_side and pooled to a fixed
    number of tokens (Gemma3ImageProcessor; mm_tokens_per_image). Pixel bounds do not apply."""
    _no_pixel_bounds(vision, min_pixels, max_pixels)
    if image_size is not None:
        parse_image_size(image_size)          # checked, then resized away
    side = vision.fixed_side // vision.patch_size
    per_crop = (side // vision.merge_size) ** 2
    crops = 1
    if image_tokens is not None:
        if image_tokens % per_crop:
            raise InvalidSetupError(Problem("image_tokens", f"{{image_tokens}} {image_tokens}: {vision.family} makes "
                                                            f"{per_crop} tokens per image or crop (a multiple of it)"))
        crops = image_tokens // per_crop
    size = f"{image_size} resized" if image_size else "each image resized"
    return ImagePlan(images=images, grid=(side * crops, side), tokens_per_image=per_crop * crops,
                     patches_per_image=side * side * crops,
                     how=f"{images} image(s) per sample, {size} to {vision.fixed_side}x{vision.fixed_side}"
                         + (f" in {crops} crops" if crops > 1 else "") + f": {per_crop * crops:,} tokens and "
                         f"{side * side * crops:,} tower patches each")


def image_token_rule(vision: VisionSpec, min_pixels: int | None = None, max_pixels: int | None = None):
    """(width, height) -> the tokens one image of that size becomes, under the processor's rule and the run's
    pixel bounds (Qwen-VL only: the other families resize their own way). Raises ValueError as smart_resize does."""
    lo, hi = (min_pixels, max_pixels) if vision.pixel_bounded else (None, None)

    def tokens(width: int, height: int) -> int:
        try:
            return plan_images(vision, f"{width}x{height}", 1, lo, hi, None).tokens_per_image
        except InvalidSetupError:
            raise ValueError("each side must be 1 to 65536 pixels") from None
    return tokens


def _plan_mllama(vision: VisionSpec, image_size: str | None, images: int, min_pixels: int | None,
                 max_pixels: int | None, image_tokens: int | None) -> ImagePlan:
    """Llama 3.2 Vision: MllamaImageProcessor fits each image to a canvas of up to max_tiles tiles of fixed_side
    pixels, then pack_images pads every image to max_tiles tiles (transformers 5.25
    models/mllama/image_processing_pil_mllama.py pack_images: pixel_values [batch, images, max_image_tiles, 3,
    560, 560]). The tower runs on all of them whatever the image size; the LM's text holds one <|image|> token per
    image (part of seq_len) and cross-attends to max_tiles x patches_per_tile vision tokens per image."""
    _no_pixel_bounds(vision, min_pixels, max_pixels)
    if image_size is not None:
        parse_image_size(image_size)              # checked; the padding to max_tiles makes its size irrelevant
    per_image = vision.max_tiles * vision.patches_per_tile
    if image_tokens is not None and image_tokens != per_image:
        raise InvalidSetupError(Problem("image_tokens", f"{{image_tokens}} {image_tokens}: {vision.family} pads every "
                                                        f"image to {vision.max_tiles} tiles, {per_image:,} vision "
                                                        f"tokens per image whatever its size"))
    side = vision.fixed_side // vision.patch_size
    size = image_size or "each image"
    return ImagePlan(images=images, grid=(side * vision.max_tiles, side), tokens_per_image=0,
                     patches_per_image=side * side * vision.max_tiles, cross_tokens_per_image=per_image,
                     how=f"{images} image(s) per sample, {size} padded to {vision.max_tiles} tiles of "
                         f"{vision.fixed_side} px: {per_image:,} vision tokens each, attended to by "
                         f"{len(vision.cross_layers)} cross-attention layers (the text length is unchanged)")
