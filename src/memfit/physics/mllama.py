"""Llama 3.2 Vision (mllama) in bytes: what its cross-attention layers and its two-stage tower add to the Llama
walk of physics/activations.py (research/frontier.md §2.10).

The language model is estimated as a Llama of all its layers (vision.py reads it so: a cross-attention layer has a
Llama layer's q/k/v/o and MLP), over the text alone: the image reaches it through cross-attention, not as tokens.
A cross-attention layer differs from a self-attention one in what autograd keeps (transformers 5.25
models/mllama/modeling_mllama.py MllamaCrossAttentionDecoderLayer and MllamaTextCrossAttention, lines 396-480
and 672-720), per sample, over V = images x tiles x 1601 vision tokens:
- k_proj / v_proj read the projected vision states [V, h]: their LoRA branches save their input per module (the
  walk's rule, on V tokens instead of s), and k_norm saves its fp32 input and rsqrt when k trains;
- q_norm over head_dim saves its fp32 input and rsqrt (and its output when the weights train);
- SDPA runs with the cross-attention mask, so transformers repeats k and v to every query head
  (integrations/sdpa_attention.py use_gqa_in_sdpa, lines 42-51: GQA only without a mask) and SDPA saves those
  [V, q_dim] copies, plus the mask [s, V] (one tensor shared by every cross layer);
- use_cache defaults to True (MllamaTextConfig), so the DynamicCache made in forward keeps each layer's unrepeated
  k and v [V, kv_dim] until the forward's outputs are dropped (the trace counts them to the loss);
- the two tanh gates multiply trainable scalars: with the weights training they save the attention and MLP
  outputs [s, h].
The tower (frozen) saves nothing, but MllamaVisionModel.forward keeps every encoder layer's output
(MllamaVisionEncoder returns them all; five feed the output) and the model's output keeps the vision output
[images x tiles x 1601, vision_output_dim] alive until the loss is computed (MllamaModel returns image_outputs).
Pure; no torch.
"""

from __future__ import annotations

from ..setup import TrainingSetup
from ..spec import ModelSpec
from ..vision import ImagePlan
from .activations import _Walk
from .stack import Stack


def _dtype_bytes(stack: Stack) -> tuple[int, int, int]:
    """(compute, hidden, model) bytes: what matmuls return (bf16 under autocast); the towers' residual stream
    (fp32 under autocast: its LayerNorms return fp32); the model's own dtype (masks are built in self.dtype)."""
    compute = 2 if stack.autocast else stack.compute_bytes
    hidden = 4 if stack.autocast or stack.weight_dtype == "fp32" else 2
    return compute, hidden, 4 if stack.weight_dtype == "fp32" else 2


def _kv_lora_per_token(spec: ModelSpec, setup: TrainingSetup, stack: Stack, in_bytes: int) -> int:
    """Bytes the LoRA branches of k_proj and v_proj save per token of their input (the walk's rule)."""
    walk = _Walk(spec, setup, stack)
    walk.lora({"k", "v"}, spec.hidden_size, in_bytes)
    return walk.per_token


def cross_attention_saved(spec: ModelSpec, setup: TrainingSetup, stack: Stack, plan: ImagePlan) -> dict[str, int]:
    """{"per layer": what one cross-attention layer keeps beyond the Llama layer the walk counted for it (for the
    whole micro-batch), "shared": what all cross layers share (mask, vision states), "cache": the k/v cache}."""
    vision = spec.vision
    b, s, v = setup.batch_size, setup.seq_len, plan.cross_tokens
    h, qd, kvd, a, kvh = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.num_heads, spec.num_kv_heads
    if not v:
        return {"per layer": 0, "shared": 0, "cache": 0, "layers": 0, "in flight": 0}
    cmp, _, model_bytes = _dtype_bytes(stack)
    train = stack.base_trainable
    per_layer = 0
    # The LoRA branches on k/v read V vision tokens; the walk counted them on s text tokens.
    per_layer += (v - s) * _kv_lora_per_token(spec, setup, stack, cmp)
    # q_norm (over head_dim, per query head), on the text tokens.
    per_layer += s * (4 * qd + 4 * a + (cmp * qd if train else 0))
    # k_norm on the vision tokens, when k takes a gradient.
    k_trains = train or any("k" in m.linear.parts for m in stack.lora_modules)
    if k_trains:
        per_layer += v * (4 * kvd + 4 * kvh + (cmp * kvd if train else 0))
    if stack.attn == "eager":
        # repeat_kv'd k and v (the matmuls' inputs) and the fp32 softmax plus its cast, over s x V scores.
        per_layer += v * cmp * 2 * qd + s * v * a * (4 + (2 if cmp == 2 else 0))
        per_layer -= s * cmp * 2 * qd + s * s * a * (4 + (2 if cmp == 2 else 0))
        mask = 0
    else:
        k_self = qd if setup.padding else kvd
        per_layer += v * cmp * 2 * qd - s * cmp * 2 * k_self
        mask = s * v * model_bytes
    if train:
        per_layer += 2 * s * h * cmp                              # the gates' saved attention and MLP outputs
    # Shared: the mask (SDPA saves it; checkpointed layers keep it as an input, as they keep the vision states),
    # and the vision states when k_proj / v_proj train.
    if setup.grad_ckpt:
        mask = s * v * model_bytes
    shared = mask + (v * h * cmp if train or setup.grad_ckpt else 0)
    cache = 0 if setup.grad_ckpt else len(vision.cross_layers) * v * 2 * kvd * cmp
    # The last cross-attention layer in forward, at its v_proj LoRA branch: its k and v_proj's base output exist,
    # PEFT has cast the vision states to the adapter dtype (peft tuners/lora/layer.py _cast_input_dtype; an fp32
    # copy while the branch runs) and autocast's copy for lora_A is saved; the vision states themselves are alive
    # while MllamaModel.forward runs (its local cross_attention_states).
    lora_kv = any({"k", "v"} & set(m.linear.parts) for m in stack.lora_modules)
    cast = v * h * stack.adapter_bytes if lora_kv and stack.adapter_bytes != cmp else 0
    in_flight = 2 * v * kvd * cmp + cast + v * _kv_lora_per_token(spec, setup, stack, cmp) + v * h * cmp
    return {"per layer": b * per_layer, "shared": b * shared, "cache": b * cache, "layers": len(vision.cross_layers),
            "in flight": b * in_flight}


def vision_output_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack, plan: ImagePlan) -> int:
    """The tower's output [images, tiles, 1601, vision_output_dim], kept by the model's output until the loss: fp32
    under autocast (the tower's LayerNorms return fp32 and the residual stream stays fp32), else the weights'."""
    hidden_bytes = _dtype_bytes(stack)[1]
    return setup.batch_size * plan.cross_tokens * spec.vision.output_dim * hidden_bytes


def tower_forward_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack, plan: ImagePlan) -> int:
    """The frozen tower's peak in forward, at the end of its global encoder: every layer's output (both encoders
    keep theirs in a tuple), the 4-D aspect-ratio attention mask, and the last layer's MLP intermediate."""
    vision = spec.vision
    cmp, hidden_bytes, model_bytes = _dtype_bytes(stack)
    images = setup.batch_size * plan.images
    tokens = vision.max_tiles * vision.padded_patches_per_tile        # per image, padded
    states = (vision.depth + vision.global_layers) * images * tokens * vision.hidden_size * hidden_bytes
    mask = images * tokens * tokens * model_bytes
    layer = images * tokens * vision.intermediate_size * 2 * cmp      # fc1 output and GELU output
    if stack.attn == "eager":
        # eager_attention_forward: the masked scores (compute dtype), then softmax(dtype=float32), which ATen runs
        # on an fp32 copy of a bf16 input (aten/src/ATen/native/SoftMax.cpp softmax: only CUDA fp16 -> fp32 is
        # fused): scores, their fp32 copy and the fp32 softmax at once.
        fp16 = "fp16" in (stack.autocast_dtype, stack.weight_dtype)
        per_score = cmp + 4 + (4 if cmp == 2 and not fp16 else 0)
        layer = max(layer, images * vision.num_heads * tokens * tokens * per_score)
    return states + mask + layer


def tower_saved_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack, plan: ImagePlan) -> int:
    """Under gradient checkpointing, enable_input_require_grads hooks the tower's patch embedding too
    (MllamaVisionModel.get_input_embeddings), so the frozen tower's output requires grad; its encoder layers are
    plain nn.Modules (MllamaVisionEncoderLayer, not GradientCheckpointingLayer: nothing is checkpointed), so every
    layer keeps what autograd saves for a frozen layer whose input needs a gradient, per padded token:
    the two LayerNorms' inputs (the residual stream: fp32 under autocast) with mean and rstd, SDPA's q, k, v, out
    and fp32 logsumexp per head, and GELU's input (fc1's output); the frozen Linears save nothing. Once: the
    aspect-ratio attention mask SDPA keeps, the patch embedding's output and the inputs of the outer LayerNorms."""
    vision = spec.vision
    h, i, a = vision.hidden_size, vision.intermediate_size, vision.num_heads
    cmp, hidden_bytes, model_bytes = _dtype_bytes(stack)
    images = setup.batch_size * plan.images
    tokens = vision.max_tiles * vision.padded_patches_per_tile
    per_token = 2 * (h * hidden_bytes + 8) + 4 * h * cmp + 4 * a + i * cmp
    layers = (vision.depth + vision.global_layers) * images * tokens * per_token
    mask = images * tokens * tokens * model_bytes
    patch_embeds = images * vision.max_tiles * (vision.fixed_side // vision.patch_size) ** 2 * h * model_bytes
    # layernorm_pre saves its input (fp32 under autocast) before the padding to a multiple of 8; layernorm_post
    # saves the last local layer's output, which no later layer saves.
    outer_norms = images * vision.max_tiles * (vision.patches_per_tile + vision.padded_patches_per_tile) * h * \
        hidden_bytes
    return layers + mask + patch_embeds + outer_norms


def tower_backward_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack, plan: ImagePlan) -> int:
    """When the tower is in the graph (checkpointing), its backward starts from the gradient of its output
    [tiles x 1601, vision_output_dim] and splits it (MllamaVisionModel.forward's torch.cat, after slicing the padding
    off) into the gradients of the padded final and intermediate states [tiles x 1608, vision_output_dim]: both in
    the residual stream's dtype, alive together while every language-model gradient exists."""
    vision = spec.vision
    images = setup.batch_size * plan.images
    per_image = vision.max_tiles * (vision.patches_per_tile + vision.padded_patches_per_tile) * vision.output_dim
    return images * per_image * _dtype_bytes(stack)[1]
