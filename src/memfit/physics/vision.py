"""A VLM's vision side in bytes: the tower's and projector's weights, the pixel values, and the image tokens the
language model reads on top of the text (research/frontier.md §2.10).

The language model is estimated as any text model over ``seq_len + image tokens`` (estimator.py runs it with
``lm_setup``); this module adds what the tower brings:
- weights: tower + projector parameters in the weights' dtype (transformers builds the whole VLM in one dtype);
- pixel values: the processor's fp32 ``[patches, channels x frames x p x p]`` batch, live for the whole step
  (the Trainer holds the inputs), plus the 16-bit copy the tower makes (modeling_qwen2_5_vl.py
  ``hidden_states.to(dtype=self.patch_embed.proj.weight.dtype)`` in Qwen2_5_VisionPatchEmbed.forward), which
  dies after the patch embedding;
- frozen (the default of LLaMA-Factory ``freeze_vision_tower`` and ms-swift ``freeze_vit``): no gradient reaches
  the tower, so autograd saves none of its activations and it keeps no gradients or optimizer state.
Pure; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSetupError, Problem
from ..setup import TrainingSetup
from ..spec import ModelSpec
from ..vision import ImagePlan, plan_images

LOAD_PHASE = "model load"

IMAGE_OPTIONS = ("image_size", "images_per_sample", "max_pixels", "min_pixels", "image_tokens")
UNHOOKED_TOWERS = ("qwen3_vl",)
CLS_TOWERS = ("llava", "internvl", "llava_next")     # a class token; the projector outside the checkpoints
PIXEL_BYTES = 4          # the image processors return float32 pixel_values (rescale + normalize in fp32)


@dataclass(frozen=True)
class VisionParts:
    plan: ImagePlan
    lm_setup: TrainingSetup           # the setup the language model runs: text + image tokens per sample
    weight_bytes: int                 # tower + projector weights
    pixel_bytes: int                  # the fp32 pixel values of one micro-batch
    assumptions: tuple[str, ...]
    checkpoint_bytes: int = 0         # a frozen tower's block inputs kept under gradient checkpointing
    cross: dict | None = None         # Llama 3.2 Vision: physics/mllama.py's cross-attention terms
    text_layers: int = 0              # Llama 3.2 Vision: the language model's layers, cross-attention ones included
    cross_layers: tuple[int, ...] = ()
    notes = {"vision tower weights": "the vision tower and projector, frozen (no gradients, no saved activations)",
             "pixel values": "the processor's fp32 pixel values of the micro-batch's images",
             "vision tower checkpoints": "each vision block's input, kept under gradient checkpointing",
             "cross-attention activations": "what the cross-attention layers keep beyond a Llama layer: vision-"
                                            "length k/v (repeated per head), their LoRA inputs, the mask",
             "vision outputs": "the tower's output, held by the model's outputs until the loss",
             "vision tower forward": "the frozen tower's layer outputs and attention mask while it runs"}

    def add_to(self, phases: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """Every phase holds the tower's weights and the micro-batch's pixel values."""
        # The tower's checkpoints live until backward reaches the tower, after every LM layer: gone by the step.
        if self.cross is not None:
            return self._add_cross(phases)
        return {name: {**parts, "vision tower weights": self.weight_bytes, "pixel values": self.pixel_bytes,
                       **({"vision tower checkpoints": self.checkpoint_bytes} if name != "optimizer step" else {})}
                for name, parts in phases.items()}

    def _add_cross(self, phases: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """Mllama: the cross-attention layers' extra saves in forward and backward through the top layers; the
        cache and the vision output only until the forward's outputs are dropped; the tower's own peak as a phase
        of its own (nothing of the language model exists yet)."""
        c = self.cross
        out = {}
        # Under checkpointing each cross layer keeps only its inputs (the shared mask and vision states); one is
        # rebuilt at a time in backward.
        saved = c["per layer"] * (0 if c["ckpt"] else c["layers"]) + c["shared"]
        for name, parts in phases.items():
            parts = {**parts, "vision tower weights": self.weight_bytes, "pixel values": self.pixel_bytes}
            if name == "forward (end)":
                parts["cross-attention activations"] = saved + c["cache"]
                parts["vision outputs"] = c["vision output"]
            elif name == "cross-entropy backward":
                parts["cross-attention activations"] = saved
            elif name == "layer backward (top)":
                parts["cross-attention activations"] = saved + (c["per layer"] if c["ckpt"] else 0)
            if name not in ("optimizer step", LOAD_PHASE):
                parts["vision tower checkpoints"] = self.checkpoint_bytes
            out[name] = parts
        if not c["layers"]:
            # A text-only batch: MllamaTextModel skips the cross-attention layers (no vision states, no cache), so
            # only the self-attention layers save activations or keep checkpoints.
            total = self.text_layers
            for name, parts in out.items():
                for key in ("activations", "checkpoints"):
                    if key in parts and name != "layer backward (bottom)":
                        parts[key] = parts[key] * (total - len(self.cross_layers)) // total
            return out
        # The last cross-attention layer in forward (before the logits): the layers below it have saved theirs,
        # the tower's output is still held, and the layer's own vision-length tensors are in flight.
        below = 0 if c["ckpt"] else (c["layers"] - 1) * (c["per layer"] + c["cache"] // c["layers"])
        out["cross-attention forward"] = {**out["forward (end)"], "logits and loss": 0,
                                          "embedding and head activations": 0,
                                          "cross-attention activations": below + c["shared"] + c["in flight"]}
        if c["tower backward"]:
            # The tower's backward (it joined the graph): after the language model's, every gradient exists.
            last = phases.get("embedding backward") or phases["layer backward (top)"]
            keep = ("activations", "checkpoints", "recomputed layer", "embedding and head activations",
                    "autocast weight copies", "backward temporaries")
            out["vision tower backward"] = {**{k: v for k, v in last.items() if k not in keep},
                                            "vision tower weights": self.weight_bytes,
                                            "pixel values": self.pixel_bytes,
                                            "vision tower checkpoints": self.checkpoint_bytes,
                                            "backward temporaries": c["tower backward"]}
        out["vision tower forward"] = {**{k: v for k, v in phases["optimizer step"].items()
                                          if k not in ("optimizer step temporaries", "gradients")},
                                       "vision tower weights": self.weight_bytes, "pixel values": self.pixel_bytes,
                                       "vision tower forward": c["tower forward"]}
        return out


def check_text_model(spec: ModelSpec, setup: TrainingSetup) -> None:
    """Image options on a text model are a mistake, not something to ignore."""
    given = [name for name in IMAGE_OPTIONS if name in setup.explicit]
    if spec.vision is not None and setup.recipe == "mlx":
        raise InvalidSetupError(Problem("recipe", f"{{recipe}} mlx: mlx-lm trains text models; {spec.name} is a "
                                                  f"vision-language model (mlx-vlm is not modelled)"))
    if spec.vision is None and given:
        raise InvalidSetupError([Problem(name, f"{{{name}}} applies to vision-language models; {spec.name} is a "
                                               f"text model") for name in given])


def vision_parts(spec: ModelSpec, setup: TrainingSetup, weight_bytes_per_param: int,
                 hidden_bytes: int, stack=None) -> VisionParts:
    vision = spec.vision
    autocast = bool(stack is not None and stack.autocast)
    try:
        plan = plan_images(vision, setup.image_size, setup.images_per_sample, setup.min_pixels, setup.max_pixels,
                           setup.image_tokens)
    except ValueError as exc:
        raise InvalidSetupError(Problem("image_size", f"{{image_size}} {exc}")) from None
    lm_len = setup.seq_len + plan.tokens
    try:
        lm_setup = setup.replace(seq_len=lm_len)
    except InvalidSetupError:
        raise InvalidSetupError(Problem("images_per_sample", f"text {setup.seq_len:,} + image tokens "
                                                             f"{plan.tokens:,} is more than memfit models")) from None
    pixel_bytes = setup.batch_size * plan.patches * vision.patch_values * PIXEL_BYTES
    if vision.family == "smolvlm":
        # The processor's pixel_attention_mask: int64, one per pixel of each tile (image_processing_smolvlm.py).
        pixel_bytes += setup.batch_size * plan.patches * vision.patch_size ** 2 * 8
    checkpoints = 0
    # transformers 5.25 modeling_qwen3_vl.py: Qwen3VLVisionModel sets no _input_embed_layer, so its
    # get_input_embeddings raises NotImplementedError and enable_input_require_grads hooks nothing in the tower:
    # the frozen tower stays out of the graph even under checkpointing (checked: tests/test_vision_more.py).
    if setup.grad_ckpt and vision.family not in UNHOOKED_TOWERS:
        # transformers 5.24 modeling_utils.py gradient_checkpointing_enable calls enable_input_require_grads, which
        # hooks the input embeddings of every PreTrainedModel inside, the vision tower's patch embedding too: its
        # output requires grad, so even a frozen tower joins the graph, and each checkpointed vision block
        # (GradientCheckpointingLayer) keeps its input hidden states until backward.
        checkpoints = setup.batch_size * plan.patches * vision.depth * vision.hidden_size * hidden_bytes
        if vision.family in CLS_TOWERS:
            checkpoints += _cls_tower_extras(vision, setup.batch_size, plan, hidden_bytes, autocast)
        elif vision.family in ("gemma3", "smolvlm", "llava_onevision"):
            checkpoints += _siglip_extras(vision, setup.batch_size, plan, hidden_bytes, autocast)
        if vision.family in CLS_TOWERS + ("gemma3", "smolvlm", "llava_onevision"):
            # The language model's hooked embedding output is a leaf of its own here (the image features are
            # scattered into a new tensor, the first layer's input): one more hidden state per LM token.
            checkpoints += setup.batch_size * lm_len * vision.out_hidden_size * hidden_bytes
        if vision.family in ("qwen2_5_vl", "qwen2_vl"):
            # The blocks' rotary cos and sin (fp32, head_dim per patch), passed to every checkpointed block.
            checkpoints += setup.batch_size * plan.patches * 2 * (vision.hidden_size // vision.num_heads) * 4
            # The merger is not checkpointed: Linear, GELU and Linear each save their input (4h per token = h per
            # patch). Qwen2.5-VL's RMSNorm (modeling_qwen2_5_vl.py Qwen2_5_VLPatchMerger) saves the fp32 input and
            # rsqrt; Qwen2-VL's LayerNorm (modeling_qwen2_vl.py PatchMerger ln_q) its input, mean and rstd (fp32).
            norm = vision.hidden_size * 4 + 4 if vision.family == "qwen2_5_vl" else \
                vision.hidden_size * hidden_bytes + 8
            checkpoints += setup.batch_size * plan.patches * (3 * vision.hidden_size * hidden_bytes + norm)
    notes = (f"vision-language model: {plan.how}; the language model runs {setup.seq_len:,} text + "
             f"{plan.tokens:,} image tokens = {lm_len:,} per sample",
             f"vision tower ({vision.tower_params:,} params) and projector ({vision.projector_params:,}) frozen: "
             f"weights only, no activations saved, no gradients")
    if checkpoints:
        notes += ("gradient checkpointing makes the frozen tower's output require grad (enable_input_require_grads "
                  "hooks its patch embedding): each vision block keeps its input until backward",)
    cross = None
    if vision.family == "mllama":
        from . import mllama

        checkpoints = mllama.tower_saved_bytes(spec, lm_setup, stack, plan) if setup.grad_ckpt else 0
        cross = mllama.cross_attention_saved(spec, lm_setup, stack, plan)
        cross["ckpt"] = setup.grad_ckpt
        cross["tower backward"] = mllama.tower_backward_bytes(spec, lm_setup, stack, plan) if checkpoints else 0
        cross["vision output"] = mllama.vision_output_bytes(spec, lm_setup, stack, plan)
        cross["tower forward"] = mllama.tower_forward_bytes(spec, lm_setup, stack, plan)
        pixel_bytes += setup.batch_size * plan.images * (2 + vision.max_tiles) * 8     # aspect-ratio ids and mask
        pixel_bytes += setup.batch_size * setup.seq_len * plan.images * vision.max_tiles * 8   # cross_attention_mask
        notes = (f"vision-language model: {plan.how}",
                 f"vision tower ({vision.tower_params:,} params) and projector ({vision.projector_params:,}) frozen: "
                 f"no gradients" + (": under gradient checkpointing enable_input_require_grads hooks its patch "
                                    "embedding, and its layers (not checkpointed in transformers) keep all they "
                                    "save for backward" if checkpoints else ", no activations saved"))
    return VisionParts(plan=plan, lm_setup=lm_setup, weight_bytes=vision.params * weight_bytes_per_param,
                       pixel_bytes=pixel_bytes, assumptions=notes, checkpoint_bytes=checkpoints, cross=cross,
                       text_layers=spec.num_layers, cross_layers=vision.cross_layers)


def _cls_tower_extras(vision, batch: int, plan: ImagePlan, hidden_bytes: int, autocast: bool) -> int:
    """What a checkpointed CLIP (LLaVA) or InternViT (InternVL) tower keeps beyond one block input per patch
    (measured on the trace's live tensors at the peak; transformers 5.25 modeling_clip.py, modeling_internvl.py):
    - the class token: one more position per image or tile in every block's input;
    - CLIP under autocast: pre_layrnorm returns fp32 (autocast runs layer_norm in fp32), and the residual stream
      stays fp32 (fp32 + bf16 -> fp32), so its block inputs are fp32;
    - the hooked patch embedding's output: enable_input_require_grads makes it a leaf that requires grad, held by
      its AccumulateGrad node until backward;
    - the projector, outside the checkpoints: frozen linears save no input, GELU saves its input (text hidden per
      image token); InternVL's LayerNorm over 4h saves its input (fp32 under autocast) and mean and rstd."""
    side = vision.fixed_side // vision.patch_size
    per_image = plan.patches_per_image // (side * side)            # images or tiles
    positions = batch * plan.images * (plan.patches_per_image + per_image)
    block_bytes = 4 if (vision.family in ("llava", "llava_next") and autocast) else hidden_bytes
    extra = positions * vision.depth * vision.hidden_size * block_bytes - \
        batch * plan.patches * vision.depth * vision.hidden_size * hidden_bytes
    extra += batch * plan.patches * vision.hidden_size * hidden_bytes
    tokens = batch * plan.tokens
    # LLaVA-NeXT projects every tile's patches; the padding is cut after the projector (pack_image_features).
    gelu_in = batch * plan.patches if vision.family == "llava_next" else tokens
    extra += gelu_in * vision.out_hidden_size * hidden_bytes
    if vision.family == "internvl":
        merged = vision.hidden_size * vision.merge_size ** 2
        extra += tokens * (merged * (4 if autocast else hidden_bytes) + 8)
    return extra


def _siglip_extras(vision, batch: int, plan: ImagePlan, hidden_bytes: int, autocast: bool) -> int:
    """What a checkpointed SigLIP tower (Gemma 3, SmolVLM) keeps beyond one block input per patch (measured on
    the trace's live tensors at the peak; transformers 5.25 modeling_siglip.py, modeling_gemma3.py,
    modeling_smolvlm.py): post_layernorm, outside the checkpoints, saves its input (autocast casts it to fp32)
    and fp32 mean and rstd. Gemma 3: the hooked patch embedding's Conv2d output, a leaf held by its AccumulateGrad
    node; the projector's avg-pool input (the norm's output, fp32 under autocast) and the pooled tokens its RMSNorm
    upcasts. SmolVLM: the tile's boolean patch-to-patch attention mask (patch_attention_mask expanded).
    LLaVA-OneVision: see below."""
    patches, h = batch * plan.patches, vision.hidden_size
    if vision.family == "llava_onevision":
        # The last block's output is the feature (no post_layernorm): the hooked patch embedding's output and the
        # projector's GELU input, over every tile's patches (the padding is cut after the projector).
        return patches * (h + vision.out_hidden_size) * hidden_bytes
    norm_bytes = 4 if autocast else hidden_bytes
    extra = patches * (h * norm_bytes + 8)
    if vision.family == "gemma3":
        extra += patches * h * (hidden_bytes + norm_bytes) + batch * plan.tokens * h * 4
    else:
        side = vision.fixed_side // vision.patch_size
        extra += patches * side * side           # one byte per (patch, patch) pair of its tile
    return extra


def vision_levers(spec: ModelSpec, setup: TrainingSetup) -> list[tuple]:
    """(key, words, apply) for a VLM's levers: a quarter of max_pixels (half each side: a quarter of the image
    tokens and tower patches), half the images per sample. The advisor re-estimates each."""
    vision, out = spec.vision, []
    current = setup.max_pixels or vision.max_pixels
    floor = max(setup.min_pixels or vision.min_pixels, vision.token_pixels ** 2)
    if setup.image_tokens is None and current // 4 >= floor:
        out.append(("max-pixels", "a lower max_pixels", lambda s: s.replace(max_pixels=current // 4)))
    if setup.images_per_sample > 1:
        out.append(("fewer-images", "fewer images per sample",
                    lambda s: s.replace(images_per_sample=s.images_per_sample // 2)))
    return out
