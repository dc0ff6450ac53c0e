"""InternVL's image tiles: the grid of 448 px tiles nearest the image's aspect ratio, plus a thumbnail.

Mirrors transformers 5.25 models/got_ocr2/image_processing_pil_got_ocr2.py (the image processor InternVL-hf
uses): get_all_supported_aspect_ratios (lines 60-91), get_optimal_tiled_canvas (lines 94-132) and
get_number_of_image_patches (lines 274-300: one tile when the grid is 1x1, else the grid's tiles + a thumbnail).
Each tile becomes (448 / 14)^2 / 4 = 256 tokens after the 2x2 pixel shuffle (processing_internvl.py
image_seq_length; modeling_internvl.py pixel_shuffle with downsample_ratio 0.5). Pure: no torch.
"""

from __future__ import annotations

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
    from .vision import ImagePlan, _no_pixel_bounds, parse_image_size

    _no_pixel_bounds(vision, min_pixels, max_pixels)
    side = vision.fixed_side // vision.patch_size
    per_tile = (side // vision.merge_size) ** 2
    if image_tokens is not None:
        if image_tokens % per_tile:
            raise InvalidSetupError(Problem("image_tokens", f"{{image_tokens}} {image_tokens}: {vision.family} makes "
                                                            f"{per_tile} tokens per tile (a multiple of it)"))
        tiles, how = image_tokens // per_tile, f"{image_tokens // per_tile} tiles (given)"
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
