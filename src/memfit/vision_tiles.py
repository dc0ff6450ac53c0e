"""Tiled processors: InternVL's 448 px tiles on the grid nearest the image's aspect ratio, plus a thumbnail; and
the any-resolution grid plus the base image of LLaVA-OneVision and LLaVA-NeXT (below).

Mirrors transformers 5.25 models/got_ocr2/image_processing_pil_got_ocr2.py (the image processor InternVL-hf
uses): get_all_supported_aspect_ratios (lines 60-91), get_optimal_tiled_canvas (lines 94-132) and
get_number_of_image_patches (lines 274-300: one tile when the grid is 1x1, else the grid's tiles + a thumbnail).
Each tile becomes (448 / 14)^2 / 4 = 256 tokens after the 2x2 pixel shuffle (processing_internvl.py
image_seq_length; modeling_internvl.py pixel_shuffle with downsample_ratio 0.5). Pure: no torch.
"""

from __future__ import annotations

import math

from .errors import InvalidSetupError, Problem


def tile_grid(width: int, height: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows) of tiles the processor cuts a width x height image into."""
    ratios = sorted(((w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1)
                     if min_tiles <= w * h <= max_tiles), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for grid in ratios:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best_diff, best = diff, grid
        elif diff == best_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid        # a tie: more tiles, until they cover over twice the image's area
    return best


def tiles_per_image(width: int, height: int, tile: int, min_tiles: int, max_tiles: int) -> int:
    """Tiles the tower sees for one image: the grid's tiles + the thumbnail, or 1 for a 1x1 grid."""
    if max_tiles <= 1:
        return 1
    cols, rows = tile_grid(width, height, tile, min_tiles, max_tiles)
    return 1 + cols * rows if cols * rows > 1 else 1


def plan_internvl(vision, image_size: str | None, images: int, min_pixels: int | None, max_pixels: int | None,
                  image_tokens: int | None):
    from .vision import ImagePlan, _no_pixel_bounds, given_tiles, parse_image_size

    _no_pixel_bounds(vision, min_pixels, max_pixels)
    side = vision.fixed_side // vision.patch_size
    per_tile = (side // vision.merge_size) ** 2
    if image_tokens is not None:
        tiles = given_tiles(vision, image_tokens, per_tile)
        how = f"{tiles} tiles (given)"
    elif image_size is None:
        # No size: the most tiles the processor makes (max_tiles + the thumbnail).
        tiles = vision.max_tiles + 1 if vision.max_tiles > 1 else 1
        how = f"no --image-size: the most tiles, {vision.max_tiles} + a thumbnail"
    else:
        width, height = parse_image_size(image_size)
        tiles = tiles_per_image(width, height, vision.fixed_side, vision.min_tiles, vision.max_tiles)
        how = f"{image_size} as {tiles} tile(s) of {vision.fixed_side} px" + (" (with the thumbnail)" if tiles > 1 else "")
    return ImagePlan(images=images, grid=(side * tiles, side), tokens_per_image=per_tile * tiles,
                     patches_per_image=side * side * tiles,
                     how=f"{images} image(s) per sample, {how}: {per_tile * tiles:,} tokens and "
                         f"{side * side * tiles:,} tower patches each")


# ---- LLaVA-OneVision, LLaVA-NeXT: any-resolution tiles + the base image -------------------------------------------
def best_resolution(width: int, height: int, pinpoints) -> tuple[int, int]:
    """(height, width) of the grid resolution the processor picks: the most of the image kept, then the least
    padding (transformers 5.25 image_processing_utils.py select_best_resolution, lines 648-690)."""
    best, best_effective, best_wasted = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > best_effective or (effective == best_effective and wasted < best_wasted):
            best, best_effective, best_wasted = (h, w), effective, wasted
    return best


def onevision_tokens(width: int, height: int, tile: int, per_side: int, pinpoints, max_tiles: int) -> tuple[int, int]:
    """(tokens, tiles the tower sees) for one image: processing_llava_onevision.py _get_number_of_features and
    _get_unpadded_features (lines 106-154): the grid's features with the padding cut off, one newline token per
    row, pooled down when above max_tiles (anyres_max_9) tiles' worth; plus the base image's per_side^2.
    LLaVA-NeXT (max_tiles 0) is the same without the pooling: processing_llava_next.py _get_number_of_features
    and _get_unpadded_features (lines 82-122; the class token it adds to the base features, +1, is taken off
    again for vision_feature_select_strategy "default" in replace_image_token, lines 71-80)."""
    best_h, best_w = best_resolution(width, height, pinpoints)
    rows, cols = per_side * (best_h // tile), per_side * (best_w // tile)
    if width / height > cols / rows:
        new_height = int(round(height * (cols / width), 7))
        rows -= (rows - new_height) // 2 * 2
    else:
        new_width = int(round(width * (rows / height), 7))
        cols -= (cols - new_width) // 2 * 2
    features, newlines = rows * cols, rows
    ratio = math.sqrt(rows * cols / (max_tiles * per_side ** 2)) if max_tiles else 0
    if ratio > 1.1:
        features, newlines = int(rows // ratio) * int(cols // ratio), int(rows // ratio)
    return features + newlines + per_side ** 2, (best_h // tile) * (best_w // tile) + 1


def plan_onevision(vision, image_size: str | None, images: int, min_pixels: int | None, max_pixels: int | None,
                   image_tokens: int | None):
    from .vision import ImagePlan, _no_pixel_bounds, parse_image_size

    _no_pixel_bounds(vision, min_pixels, max_pixels)
    per_side = vision.fixed_side // vision.patch_size
    if image_tokens is not None:
        raise InvalidSetupError(Problem("image_tokens", f"{{image_tokens}}: {vision.family}'s tokens follow from the "
                                                        f"image size (--image-size)"))
    largest = max(vision.grid_pinpoints, key=lambda p: p[0] * p[1])
    width, height = parse_image_size(image_size) if image_size else (largest[1], largest[0])
    tokens, tiles = onevision_tokens(width, height, vision.fixed_side, per_side, vision.grid_pinpoints,
                                     vision.max_tiles)
    what = image_size or f"no --image-size: the largest grid, {largest[1]}x{largest[0]}"
    return ImagePlan(images=images, grid=(per_side * tiles, per_side), tokens_per_image=tokens,
                     patches_per_image=per_side * per_side * tiles,
                     how=f"{images} image(s) per sample, {what} as {tiles - 1} tiles of {vision.fixed_side} px + the "
                         f"base image: {tokens:,} tokens and {per_side * per_side * tiles:,} tower patches each")
