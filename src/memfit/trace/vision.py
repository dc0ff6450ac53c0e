"""Trace a vision-language model: the real transformers VLM class on fake tensors, pixel values included.

The VLM's forward computes a few small integer tensors from the data (Qwen2.5-VL: the image grid's window
index, cu_seqlens split sizes, 3-D rotary positions from input_ids). A FakeTensor has no data, so those would
fail; FakeTensorMode does keep real values for "constants" (tensors made from Python data inside the mode, and
ops whose inputs are all constants) up to CONSTANT_NUMEL_LIMIT elements (torch/_subclasses/fake_tensor.py).
``fake_constants`` raises that limit while a VLM is traced, the inputs' ids and grid are made as constants, and
the one helper that builds its index with factory ops (arange: never a constant) runs on the real values
(``on_constants``). Every activation, weight and gradient stays fake.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from ..setup import TrainingSetup
from ..spec import ModelSpec
from ..vision import parse_image_size, plan_images

# The largest integer tensor computed for real: input_ids of a micro-batch (b x s), the window index over
# patches. 64M elements (512 MiB of int64) is beyond any micro-batch memfit traces.
_CONSTANT_LIMIT = 1 << 26
# (module, function) pairs whose integer work uses factory ops on data (transformers 5.24
# modeling_qwen2_5_vl.py imports get_vision_window_index from vision_utils.py and calls it in
# Qwen2_5_VisionTransformerPretrainedModel.forward).
# Qwen3-VL resamples its learned position grid to each image's grid from grid_thw with linspace (vision_utils.py
# get_vision_interpolation_indices_and_weights, imported by modeling_qwen3_vl.py).
_DATA_HELPERS = {"qwen2_5_vl": [("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "get_vision_window_index")],
                 "qwen3_vl": [("transformers.models.qwen3_vl.modeling_qwen3_vl",
                               "get_vision_interpolation_indices_and_weights"),
                              ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel.get_rope_index")],
                 # The M-RoPE positions are built from input_ids and mm_token_type_ids in Python loops ending in
                 # torch.tensor(list): modeling_qwen2_vl.py Qwen2VLModel.get_rope_index.
                 "qwen2_vl": [("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel.get_rope_index")]}


def auto_class():
    import transformers

    return transformers.AutoModelForImageTextToText


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The language model's decoder layers (the vision blocks come first in module order)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text = base.model.text_model if hasattr(base.model, "text_model") else base.model.language_model   # SmolVLM
    return list(text.layers)


def freeze_tower(model: nn.Module, setup: TrainingSetup) -> None:
    """The tower and projector take no gradient: the default of LLaMA-Factory (freeze_vision_tower,
    freeze_multi_modal_projector) and ms-swift (freeze_vit, freeze_aligner), and what the estimate assumes."""
    for name, p in model.named_parameters():
        if not name.startswith(("model.language_model.", "model.text_model.", "lm_head.")):
            p.requires_grad_(False)


def lora_targets(names: list[str]) -> str:
    """PEFT target_modules as a regex over full module names: the language model's linears only (the vision
    MLP reuses gate_proj/up_proj/down_proj; the trainers' frozen tower gets no adapter)."""
    return r".*(language_model|text_model)\..*\.(" + "|".join(names) + r")"


def on_constants(fn):
    """Run `fn` on the real values of constant FakeTensors and return its tensors as constants again."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_map
    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def real(x):
            if isinstance(x, FakeTensor):
                if x.constant is None:
                    raise RuntimeError(f"{fn.__name__} needs data that a fake tensor does not have")
                return x.constant
            return x

        with _disable_current_modes():       # real values, not traced: only the constants made below count
            out = fn(*tree_map(real, args), **tree_map(real, kwargs))

        def constant(x):
            if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
                return torch.tensor(x.tolist(), dtype=x.dtype)     # lift_fresh inside the mode: a constant
            return x
        return tree_map(constant, out)
    return wrapper


@contextlib.contextmanager
def fake_constants(spec: ModelSpec):
    """While tracing a VLM: constants up to _CONSTANT_LIMIT elements, and the data helpers on real values."""
    import importlib

    import torch._subclasses.fake_tensor as fake_tensor

    if spec.vision is None:
        yield
        return
    limit = fake_tensor.CONSTANT_NUMEL_LIMIT
    patched = []
    for module_name, path in _DATA_HELPERS.get(spec.vision.family, []):
        owner = importlib.import_module(module_name)
        *classes, name = path.split(".")           # "Class.method": the method, patched on its class
        for class_name in classes:
            owner = getattr(owner, class_name)
        patched.append((owner, name, owner.__dict__[name] if classes else getattr(owner, name)))
        setattr(owner, name, on_constants(getattr(owner, name)))
    fake_tensor.CONSTANT_NUMEL_LIMIT = _CONSTANT_LIMIT
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = limit
        for module, name, original in patched:
            setattr(module, name, original)


def make_inputs(spec: ModelSpec, setup: TrainingSetup) -> dict:
    """One micro-batch as the processor makes it: per sample, each image as <start> + its image tokens + <end>,
    then text up to seq_len text tokens; fp32 pixel values in the family's layout."""
    import json

    vision = spec.vision
    plan = plan_images(vision, setup.image_size, setup.images_per_sample, setup.min_pixels, setup.max_pixels,
                       setup.image_tokens)
    config = json.loads(spec.hf_config_json)
    if vision.family == "mllama":
        return _mllama_inputs(spec, setup, plan)
    if vision.family == "smolvlm":
        # processing_smolvlm.py wraps each tile's <image> run in <fake_token_around_image> (49189) tokens.
        start = end = config.get("fake_image_token_id", 49189)
    elif vision.family == "gemma3":
        # processing_gemma3.py: "\n\n" + <start_of_image> + 256 x <image_soft_token> + <end_of_image> + "\n\n".
        start, end = config.get("boi_token_index", 255999), config.get("eoi_token_index", 256000)
    elif vision.family == "internvl":
        # processing_internvl.py: <img> (151665) + 256 x <IMG_CONTEXT> per tile + </img> (151666).
        start, end = 151665, 151666
    elif vision.family in ("llava", "llava_onevision", "llava_next"):
        start = end = None                 # processing_llava*.py: the <image> token repeated, nothing around
    else:
        start, end = config.get("vision_start_token_id", 151652), config.get("vision_end_token_id", 151653)
    row: list[int] = []
    for _ in range(plan.images):
        run = [vision.image_token_id] * plan.tokens_per_image
        row += run if start is None else [start] + run + [end]
    text = setup.seq_len + plan.tokens - len(row)
    if text < 0:
        raise ValueError(f"seq_len {setup.seq_len} leaves no room for the images' start/end tokens")
    # Ordinary text ids, below every special token of these families (SmolVLM's start at 49152, LLaVA's <image>
    # is 32000).
    row += [(7 * k) % (min(spec.vocab_size, 49152, vision.image_token_id) - 10) + 10 for k in range(text)]
    ids = torch.tensor([row] * setup.batch_size)          # a constant: the model finds its image tokens in it
    images = setup.batch_size * plan.images
    if not images:
        return {"input_ids": ids, "labels": ids}           # --images-per-sample 0: a text-only batch
    if vision.family == "smolvlm":
        return {"input_ids": ids, "labels": ids, **_constant_pixels(vision, setup.batch_size, plan)}
    if vision.family in ("llava_onevision", "llava_next"):
        # The processor's pixel_values [images, tiles, c, side, side] and image_sizes (height, width): the model
        # picks each image's tiles and unpads its features from those sizes (modeling_llava_onevision.py,
        # modeling_llava_next.py get_image_features, pack_image_features), so image_sizes is a constant.
        width, height = (parse_image_size(setup.image_size) if setup.image_size else
                         max(((w, h) for h, w in vision.grid_pinpoints), key=lambda s: s[0] * s[1]))
        tiles = plan.patches_per_image // (vision.fixed_side // vision.patch_size) ** 2
        side = vision.fixed_side
        pixels = torch.empty(images, tiles, vision.in_channels, side, side, dtype=torch.float32)
        return {"input_ids": ids, "labels": ids, "pixel_values": pixels,
                "image_sizes": torch.tensor([[height, width]] * images)}
    if vision.family in ("gemma3", "llava", "internvl"):
        crops = plan.patches_per_image // (vision.fixed_side // vision.patch_size) ** 2
        side = vision.fixed_side
        pixels = torch.empty(images * crops, vision.in_channels, side, side, dtype=torch.float32)
        if vision.family != "gemma3":
            return {"input_ids": ids, "labels": ids, "pixel_values": pixels}
        # The processor's token_type_ids (1 on image tokens): Gemma 3 attends bidirectionally within an image.
        types = torch.tensor([[int(t == vision.image_token_id) for t in row]] * setup.batch_size)
        return {"input_ids": ids, "labels": ids, "pixel_values": pixels, "token_type_ids": types}
    grid = torch.tensor([[1, *plan.grid]] * images)
    pixels = torch.empty(setup.batch_size * plan.patches, vision.patch_values, dtype=torch.float32)
    out = {"input_ids": ids, "labels": ids, "pixel_values": pixels, "image_grid_thw": grid}
    if vision.family in ("qwen2_vl", "qwen3_vl"):
        # processing_qwen2_vl.py return_mm_token_type_ids = True (Qwen3-VL's processor too): 1 on image tokens, which
        # the model's M-RoPE position computation requires (modeling_qwen2_vl.py get_rope_index).
        out["mm_token_type_ids"] = torch.tensor([[int(t == vision.image_token_id) for t in row]] * setup.batch_size)
    return out


def _constant_pixels(vision, batch: int, plan) -> dict:
    """SmolVLM drops all-zero padding tiles by looking at the pixel values (modeling_smolvlm.py
    get_image_features: real_images_inds) and sizes its position ids from pixel_attention_mask: both must hold
    data. They are made real (ones: every tile real, no padding) and lifted into the fake mode as constants; the
    model's copies of them are still counted."""
    from torch.utils._python_dispatch import _disable_current_modes

    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    frames = plan.patches_per_image // (vision.fixed_side // vision.patch_size) ** 2
    side = vision.fixed_side
    # Made outside every mode: the tracker counts the lifted inputs, not the real values behind them.
    with _disable_current_modes():
        pixels = torch.ones(batch, plan.images * frames, vision.in_channels, side, side, dtype=torch.float32)
        mask = torch.ones(batch, plan.images * frames, side, side, dtype=torch.int64)
    lift = mode.fake_tensor_converter.from_real_tensor
    return {"pixel_values": lift(mode, pixels, make_constant=True),
            "pixel_attention_mask": lift(mode, mask, make_constant=True)}


def _mllama_inputs(spec: ModelSpec, setup: TrainingSetup, plan) -> dict:
    """Mllama as MllamaProcessor makes a batch (transformers 5.25 models/mllama/processing_mllama.py): one
    <|image|> token per image at the start of the text (seq_len tokens in all), pixel_values padded to max_tiles
    tiles per image, aspect-ratio ids and mask, and the cross_attention_mask [b, s, images, tiles] that lets every
    token after an image attend to its tiles (all tiles real here: the memory does not depend on which)."""
    vision, b = spec.vision, setup.batch_size
    if plan.images > setup.seq_len:
        raise ValueError(f"seq_len {setup.seq_len} leaves no room for the images' <|image|> tokens")
    row = [vision.image_token_id] * plan.images
    row += [(7 * k) % (spec.vocab_size - 10) + 10 for k in range(setup.seq_len - len(row))]
    ids = torch.tensor([row] * b)
    if not plan.images:
        return {"input_ids": ids, "labels": ids}
    side = vision.fixed_side
    return {"input_ids": ids, "labels": ids,
            "pixel_values": torch.empty(b, plan.images, vision.max_tiles, vision.in_channels, side, side),
            "aspect_ratio_ids": torch.ones(b, plan.images, dtype=torch.int64),
            "aspect_ratio_mask": torch.ones(b, plan.images, vision.max_tiles, dtype=torch.int64),
            "cross_attention_mask": torch.ones(b, setup.seq_len, plan.images, vision.max_tiles, dtype=torch.int64)}
