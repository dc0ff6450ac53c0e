"""The image settings of the trainers' configs, for vision-language models (`memfit check`).

LLaMA-Factory resizes every image itself before the model's processor sees it, with its own bounds
(hiyouga/LLaMA-Factory src/llamafactory/hparams/model_args.py ProcessorArguments: image_max_pixels
default 768 * 768, image_min_pixels default 32 * 32): those, not the model's preprocessor_config.json, bound the
image tokens of a LLaMA-Factory run. The keys are read whatever the model; they apply once the model is known to
be a VLM (``apply_to``), and are set aside as not affecting memory for a text model.
"""

from __future__ import annotations

from .formats import Mapped
from .reader import Reader

# memfit option -> (the tool's key, the tool's default when the key is absent)
IMAGE_KEYS = {"llamafactory": {"max_pixels": ("image_max_pixels", 768 * 768),
                               "min_pixels": ("image_min_pixels", 32 * 32)}}


def read_image_keys(r: Reader, setup: dict, keys: dict) -> None:
    """The image keys `r`'s tool sets, into `setup` (checked as memfit options) and `keys`."""
    for name, (key, _) in IMAGE_KEYS.get(r.tool, {}).items():
        keys[name] = key
        if r.has(key):
            setup[name] = r.option(key, name)


def apply_to(mapped: Mapped, spec) -> None:
    """With the model known: a VLM takes the tool's defaults for keys not set; a text model drops them."""
    table = IMAGE_KEYS.get(mapped.tool, {})
    # Pixel bounds steer Qwen-VL's dynamic resize only (its processor has max_pixels); Gemma 3, SmolVLM and
    # Llama 3.2 Vision resize to fixed tiles whatever the tool hands them, so the keys do not affect memory.
    if spec.vision is None or not spec.vision.max_pixels:
        for name, (key, _) in table.items():
            if mapped.setup.pop(name, None) is not None:
                mapped.ignored.append(key)
                mapped.used = [k for k in mapped.used if k != key]
        return
    for name, (key, default) in table.items():
        if name not in mapped.setup:
            mapped.setup[name] = default
            mapped.defaults.append(f"{key} not set: {mapped.tool}'s default {default:,} pixels per image")
