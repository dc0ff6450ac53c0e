"""The image settings of the trainers' configs, for vision-language models (`memfit check`).

- LLaMA-Factory resizes every image itself before the model's processor sees it, with its own bounds
  (hiyouga/LLaMA-Factory src/llamafactory/hparams/model_args.py ProcessorArguments: image_max_pixels default
  768 * 768, image_min_pixels default 32 * 32): those, not the model's preprocessor_config.json, bound the image
  tokens of a LLaMA-Factory run.
- axolotl (axolotl-ai-cloud/axolotl 067b021, src/axolotl/utils/schemas/model.py processor_kwargs: "kwargs
  forwarded to the processor's from_pretrained(), overriding processor config (e.g. image_seq_length,
  min_pixels, etc.)", loaders/processor.py load_processor) passes processor_kwargs.min_pixels / max_pixels to the
  processor; its image_size (core/training_args_base.py; processing_strategies.py: an int pads each image to that
  square keeping its aspect, a [width, height] pair resizes to it) resizes every image before the processor.
- ms-swift (modelscope/ms-swift 3602360): the max_pixels argument (swift/arguments/base_args/template_args.py:
  images above it are scaled down, every multimodal model) and the MAX_PIXELS / MIN_PIXELS environment variables
  of the Qwen-VL processors (swift/model/models/qwen.py patch_qwen_vl_utils reads them with
  swift/utils/utils.py get_env_args); a config file's ENV section sets them (swift/cli/main.py parse_yaml_args),
  else the environment memfit runs in.
- TRL (huggingface/trl f2cd577) reads no image setting: its processor is the model's
  (AutoProcessor.from_pretrained), so preprocessor_config.json's bounds apply.
The keys are read whatever the model; they apply once the model is known to be a VLM (``apply_to``), and are set
aside as not affecting memory for a text model.
"""

from __future__ import annotations

import os

from ..options import tool_key
from .formats import Mapped
from .reader import Reader, one_line

# The keys are the options table's (options.py tool_keys of max_pixels, min_pixels, image_size); the tools'
# defaults when a key is absent (absent here: the processor's own, preprocessor_config.json).
PIXEL_OPTIONS = ("max_pixels", "min_pixels")
DEFAULTS = {"llamafactory": {"max_pixels": 768 * 768, "min_pixels": 32 * 32}}
# ms-swift's environment variables for the Qwen-VL processors (memfit option -> variable).
SWIFT_ENV = {"max_pixels": "MAX_PIXELS", "min_pixels": "MIN_PIXELS"}


def read_image_keys(r: Reader, setup: dict, keys: dict) -> None:
    """The image keys `r`'s tool sets, into `setup` (checked as memfit options) and `keys`."""
    for name in PIXEL_OPTIONS:
        key = tool_key(name, r.tool)
        if key is None:
            continue
        keys[name] = key
        if r.has(key):
            setup[name] = r.option(key, name)
    if r.tool == "axolotl" and r.has("image_size"):
        _axolotl_image_size(r, setup, keys)
    if r.tool == "ms-swift":
        _swift_env(r, setup)


def _axolotl_image_size(r: Reader, setup: dict, keys: dict) -> None:
    value = r.get("image_size")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        setup["image_size"] = f"{value}x{value}"          # padded to a square of that side
    elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            and v > 0 for v in value):
        setup["image_size"] = f"{value[0]}x{value[1]}"    # resized to (width, height)
    else:
        r.problem("image_size", f"must be a side in pixels or [width, height], got {value!r}")


def _swift_env(r: Reader, setup: dict) -> None:
    """MAX_PIXELS / MIN_PIXELS from the config's ENV section, else this process's environment. With the
    max_pixels argument too, the smaller bound wins (the argument rescales first, the processor bounds again)."""
    env = r.get("ENV") if isinstance(r.get("ENV"), dict) else {}
    for name, variable in SWIFT_ENV.items():
        raw, where = (env[variable], f"ENV.{variable}") if variable in env else \
            (os.environ.get(variable), f"environment variable {variable}")
        if raw is None:
            continue
        try:
            value = int(str(raw).strip())
            if value <= 0:
                raise ValueError
        except ValueError:
            r.problem("ENV" if variable in env else variable,
                      f"{where} must be a positive whole number of pixels, got {one_line(str(raw))!r}")
            continue
        setup[name] = value if setup.get(name) is None else (min if name == "max_pixels" else max)(setup[name], value)
        r.defaults.append(f"{name} {setup[name]:,} from {where}")


def apply_to(mapped: Mapped, spec) -> None:
    """With the model known: a VLM takes the tool's defaults for keys not set; a text model drops them. Pixel
    bounds apply to the Qwen-VL processors only: a family that resizes to fixed tiles (Gemma 3, SmolVLM, LLaVA,
    InternVL) makes the same tokens of a smaller image, so the bounds are set aside there with a note."""
    if spec.vision is None:
        for name in PIXEL_OPTIONS + ("image_size",):
            if mapped.setup.pop(name, None) is not None:
                key = mapped.keys.get(name, name)
                mapped.ignored.append(key)
                mapped.used = [k for k in mapped.used if k != key.split(".")[0]]
        return
    if not spec.vision.pixel_bounded:
        for name in ("max_pixels", "min_pixels"):
            if mapped.setup.pop(name, None) is not None:
                mapped.notes.append(("pixel-bounds-not-tokens", one_line(
                    f"{mapped.keys.get(name, name)}: {spec.vision.family} resizes every image to fixed "
                    f"{spec.vision.fixed_side} px tiles, so a pixel bound does not change its image tokens")))
        return
    for name, default in DEFAULTS.get(mapped.tool, {}).items():
        if name not in mapped.setup:
            mapped.setup[name] = default
            mapped.defaults.append(f"{tool_key(name, mapped.tool)} not set: {mapped.tool}'s default {default:,} "
                                   f"pixels per image")
