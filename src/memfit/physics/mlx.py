"""The mlx-lm training step on Apple silicon: what `mx.get_peak_memory()` reads, component by component.

Pure: no I/O, never imports mlx. Sources (versions this was read against; file:line):

* mlx-lm 0.32.2 (site-packages ``mlx_lm``; upstream ml-explore/mlx-lm):
  - ``lora.py:45-82`` CONFIG_DEFAULTS: fine_tune_type lora, optimizer adam, num_layers 16, batch_size 4,
    max_seq_length 2048, grad_checkpoint False, lora_parameters rank 8 / dropout 0 / scale 20.
  - ``lora.py:240-252`` (train_model): ``full`` unfreezes only ``model.layers[-num_layers:]``; lora/dora calls
    ``linear_to_lora_layers``.
  - ``tuner/utils.py:95-115`` with no ``keys``, every Linear/QuantizedLinear/SwitchLinear/Embedding inside a
    layer becomes LoRA, in the last ``num_layers`` layers.
  - ``tuner/lora.py:88-98``: ``lora_a`` = ``mx.random.uniform`` and ``lora_b`` = ``mx.zeros``, both float32;
    ``z = (x @ lora_a) @ lora_b``: a bf16/fp16 ``x`` is promoted to float32 by the matmul, and that float32 copy
    is what the ``lora_a`` gradient needs, so autodiff keeps it.
  - ``tuner/dora.py:90``: DoRA adds a float32 magnitude ``m`` of d_out per linear.
  - ``tuner/trainer.py:27-40`` grad_checkpoint wraps the layer class in ``mx.checkpoint``; ``:245-261`` the
    step is ``mx.compile``d, value_and_grad + ``optimizer.update`` in one graph; ``:88-101`` default_loss
    (``nn.losses.cross_entropy`` on the model-dtype logits, then ``.astype(float32)`` on the per-token loss).
* mlx 0.32.4 (site-packages ``mlx``; upstream ml-explore/mlx@846d176 for C++):
  - ``optimizers/optimizers.py:521-524`` Adam state ``m``, ``v`` = ``zeros_like(parameter)``: the parameter's
    dtype (float32 for LoRA adapters, the model dtype for full fine-tuning).
  - ``nn/losses.py:98-126``: cross_entropy uses the fused ``mx.fast.cross_entropy`` only on the GPU; on the
    CPU it is composite (``logits - max``, ``take_along_axis``, ``logsumexp``).
  - ``mlx/backend/metal/scaled_dot_product_attention.cpp:735-739``: "It's faster for training on Metal to use
    the unfused SDPA for both forward and backward": under autodiff Metal runs the same composite attention
    (``mlx/fast.cpp:718-790``: B*heads*S*S scores, softmax) that the CPU always runs
    (``mlx/backend/no_gpu/primitives.cpp:26-48``); ``:918`` the fused SDPA VJP is never used.
  - ``mlx/backend/metal/normalization.cpp:13`` and ``rope.cpp:10``: RMSNorm and RoPE are fused kernels on Metal
    and the composite fallback on the CPU (``mlx/fast.cpp:90-107``: ``astype(x, float32)`` then normalize; the
    fallback's autodiff keeps that float32 copy, the fused RMSNormVJP keeps ``x`` in its own dtype).
  - ``python/mlx/nn/layers/quantized.py`` / ``mx.quantize``: affine mode packs ``bits`` per weight into uint32
    and stores one scale and one bias per ``group_size`` weights in the weight's dtype.

``backend="metal"`` is what a Mac user runs; ``backend="cpu"`` is what ``benchmarks/mlx_measure.py`` can
measure on Linux. The two differ only in the RMSNorm input copy, the RMSNorm backward temporaries and the
cross-entropy buffers (the components say which).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..params import count_params, layer_linears
from ..spec import ModelSpec

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
METHODS = ("lora", "dora", "full", "qlora")
BACKENDS = ("metal", "cpu")
# The loss's (tokens, vocab) buffers alive at the loss backward, as (copies, bytes per element or None for the
# model dtype). Measured on MLX's CPU backend (benchmarks/mlx_measure.py, the "era" setups): the composite
# cross-entropy of mlx <= 0.32.0 (python/mlx/nn/losses.py: take_along_axis + logsumexp) keeps 3; mlx 0.32.1 shifts
# the logits by their max first (ml-explore/mlx#4188), 4; mlx-lm before ml-explore/mlx-lm#63 (2025-04-03) cast the
# logits to float32 before the loss (tuner/trainer.py default_loss), 4 float32 copies; the fused
# mx.fast.cross_entropy (GPU only, the mlx 0.32.4 installed here; not in mlx@846d176) reads the logits and writes
# one gradient, 2.
LOSS_KERNELS = {"fused": (2, None), "composite": (3, None), "composite-shifted": (4, None),
                "fp32-composite": (4, 4)}
# How autodiff runs attention: "composite" keeps the (B, heads, S, S) softmax of every trained layer
# (mlx/fast.cpp fallback); "recompute": the fused SDPA primitive of mlx 0.24 (taken under grad for masked
# full-length attention, ml-explore/mlx#1924, until #2054 in 0.25.0) whose Custom::vjp re-runs the fallback in the
# backward (mlx/fast.cpp Custom::vjp), so each layer keeps only q, k, v and the S x S buffers live one layer at a
# time.
ATTENTION_GRADS = ("composite", "recompute")
# S x S buffers alive while one layer's attention backward runs (measured, CPU backend): the cotangent of the
# softmax output and of the scores; the recompute path also rebuilds the softmax itself.
ATTENTION_BACKWARD_COPIES = {"composite": 2, "recompute": 3}
ADAPTER_BYTES = 4      # lora_a / lora_b / DoRA m are float32 (tuner/lora.py:88-93, tuner/dora.py:90)
GROUP_SIZE = 64        # mlx-lm affine default (utils.py quantize_model; nn.quantize default)

# mlx-lm defaults (lora.py:45-82).
DEFAULT_BATCH = 4
DEFAULT_TRAIN_LAYERS = 16
DEFAULT_RANK = 8
DEFAULT_SCALE = 20.0
DEFAULT_MAX_SEQ_LEN = 2048


@dataclass(frozen=True)
class MlxEstimate:
    """Bytes of each component at the step's peak, and what ``mx.get_peak_memory()`` would report."""

    weights: int                  # frozen + trainable base weights (packed uint32 when quantized)
    quant_constants: int          # affine scales + biases (0 unless qlora)
    adapters: int                 # LoRA A/B (+ DoRA magnitudes), float32
    gradients: int                # gradients alive at the peak
    optimizer_state: int          # Adam m and v
    saved_activations: int        # what autodiff keeps for the backward, all trained layers
    logits_and_loss: int          # the (B, S, vocab) buffers of the loss and its gradient at that moment
    backward_workspace: int       # one layer's cotangents while its backward runs
    peak_phase: str               # the larger of the two transient terms: "loss backward" | "layer backward"
    activation_bytes_per_token_layer: int   # saved bytes per token per trained layer (no checkpointing)
    backend: str
    notes: tuple[str, ...] = ()
    compiled: bool = True         # the step is one mx.compile graph (mlx-lm since ml-explore/mlx-lm#53)

    @property
    def persistent(self) -> int:
        return self.weights + self.quant_constants + self.adapters + self.optimizer_state

    @property
    def mlx_peak_bytes(self) -> int:
        """What ``mx.get_peak_memory()`` reads after a training step (bytes; mlx-lm prints it / 1e9)."""
        # Measured on the CPU backend (benchmarks/mlx_measure.py, V / intermediate / layer differencing): the
        # loss-backward buffers and the first layer's backward cotangents are alive together at the peak of the
        # compiled step, so they add. Which eval-order detail keeps the logit buffers alive is not pinned down.
        # Without compile (mlx-lm before ml-explore/mlx-lm#53, 2025-03-25) the loss buffers are freed before the
        # first layer's backward starts: the larger of the two is the peak (measured, the "era" setups).
        transient = (self.logits_and_loss + self.backward_workspace if self.compiled
                     else max(self.logits_and_loss, self.backward_workspace))
        return self.persistent + self.gradients + self.saved_activations + transient

    def components(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if type(getattr(self, f.name)) is int and f.name != "activation_bytes_per_token_layer"}


def affine_quantized_bytes(rows: int, cols: int, bits: int, scale_bytes: int = 2,
                           group_size: int = GROUP_SIZE) -> tuple[int, int]:
    """(packed weight bytes, scales + biases bytes) of one ``rows x cols`` matrix under mx.quantize affine mode.

    The weight is packed along the last axis into uint32 words (``cols * bits / 32`` words per row); each row
    has ``cols / group_size`` groups with one scale and one bias each, in the weight's dtype.
    """
    if cols % group_size:
        raise ValueError(f"last dimension {cols} is not a multiple of the group size {group_size}")
    packed = rows * (cols * bits // 32) * 4
    constants = 2 * rows * (cols // group_size) * scale_bytes
    return packed, constants


def _weights(spec: ModelSpec, method: str, quant_bits: int, b: int) -> tuple[int, int]:
    counts = count_params(spec)
    if method != "qlora":
        return counts.total * b, 0
    packed = constants = 0
    # Every Linear in every layer and the embedding (and an untied lm_head) is quantized (utils.py
    # quantize_model: any module with to_quantized whose last dim divides by the group size); norms and biases
    # stay in the model dtype.
    for lin in layer_linears(spec):
        if lin.parts == ("router",):
            continue                    # routers are counted with the unquantized rest below
        if lin.d_in % GROUP_SIZE:
            packed += lin.weight_params * b
            continue
        p, c = affine_quantized_bytes(lin.d_out * lin.copies, lin.d_in, quant_bits, b)
        packed += p
        constants += c
    packed *= spec.num_layers
    constants *= spec.num_layers
    others = spec.num_layers * (counts.per_layer - counts.layer_linear_weights) + counts.final_norm
    for matrices in (1, 0 if spec.tied_embeddings else 1):
        if matrices:
            p, c = affine_quantized_bytes(spec.vocab_size, spec.hidden_size, quant_bits, b)
            packed += p
            constants += c
    return packed + others * b, constants


ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _adapted(spec: ModelSpec, targets) -> list:
    return [lin for lin in layer_linears(spec) if lin.parts != ("router",) and set(lin.parts) & set(targets)]


def _adapter_params(spec: ModelSpec, rank: int, dora: bool, targets=ALL_TARGETS) -> int:
    per_layer = sum((lin.d_in + lin.d_out) * rank * lin.copies + (lin.d_out if dora else 0)
                    for lin in _adapted(spec, targets))
    return per_layer


def _layer_saved_bytes(spec: ModelSpec, *, seq_len: int, b: int, adapters: bool, rank: int,
                       backend: str, targets=ALL_TARGETS, attention_grad: str = "composite") -> int:
    """Bytes per token that autodiff keeps for one trained layer (llama-style block, mlx_lm/models/llama.py).

    * two RMSNorm inputs: the CPU fallback keeps its float32 upcast (4 B), Metal's RMSNormVJP the input (b);
    * the input of every trained linear: with float32 adapters and a 16-bit model, the float32 copy the
      matmul promotion makes (compile's CSE shares one per distinct input: q/k/v read one, gate/up one);
      for full fine-tuning the input itself, for the weight gradient. With LoRA on some targets only (mlx-lm
      ``keys``, e.g. q,v before ml-explore/mlx-lm#515) a frozen linear's input still stays alive, in the model
      dtype: its input gradient needs only W, but the VJP graph holds the primitive's inputs. Measured
      (benchmarks/mlx_measure.py, three q,v setups): -11% to +3% with that term, -5% to -16% without;
    * attention (composite, mlx/fast.cpp:718-790): scaled q, rotated k, v, the softmax output
      (heads * seq_len per token);
    * gated MLP: gate, up, sigmoid(gate) and silu(gate) (the compiled swiglu's product rule), in b;
    * QK-norm (Qwen3): the normalized q and k inputs, like the layer norms;
    * Gemma (mlx-lm 0.32.2 models/gemma2.py, gemma3_text.py): four norms a layer (input, post-attention,
      pre- and post-feedforward: ``norms_per_layer``); the gated MLP's ``nn.gelu_approx`` (a compiled
      tanh polynomial, mlx/nn/layers/activations.py) keeps two more (tokens, intermediate) buffers than the
      swiglu; Gemma 2's attention soft-capping (gemma2.py:93-94, ``tanh(scores / cap) * cap`` before the
      softmax) keeps the tanh output, one more (heads, S) row per token. Measured on the CPU backend
      (benchmarks/mlx_measure.py, the gemma-2-9b setups).
    """
    h, qd, kvd, i = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    norm_b = 4 if backend == "cpu" else b
    total = spec.norms_per_layer * h * norm_b
    # xn (q,k,v), attention output (o), xn2 (gate, up), swiglu out (down)
    inputs = ((h, {"q", "k", "v"}), (qd, {"o"}), (h, {"gate", "up"}), (i, {"down"}))
    in_b = (ADAPTER_BYTES if b < ADAPTER_BYTES else b) if adapters else b
    wanted = set(targets) if adapters else set(ALL_TARGETS)
    total += sum(width for width, reads in inputs if reads & wanted) * in_b
    total += sum(width for width, reads in inputs if not reads & wanted) * b
    if adapters:
        n_lin = len(_adapted(spec, targets))
        total += n_lin * rank * ADAPTER_BYTES          # x @ lora_a, kept for the lora_b gradient
    total += (qd + 2 * kvd) * b
    if attention_grad == "composite":
        total += spec.num_heads * seq_len * b          # the softmax output, per layer
    if spec.attn_logit_softcap:
        total += spec.num_heads * seq_len * b          # the soft-capping tanh output (a manual attention)
    if spec.qk_norm != "none":
        total += (qd + kvd) * norm_b
    if spec.mlp_kind == "gated":
        total += (6 if spec.activation.startswith("gelu") else 4) * i * b
    else:
        total += 2 * i * b
    return total


def _backward_workspace(spec: ModelSpec, *, b: int, adapters: bool, backend: str) -> int:
    """Bytes per token alive while one layer's MLP backward runs (the widest block).

    Cotangents of width intermediate: from the frozen down projection (b), its float32 LoRA path (4) and its
    cast (b), their sum d_a (b), then d silu, d up and d gate (b each), and, with adapters, the float32
    cotangents of the gate and up LoRA branches (``astype`` and ``* scale`` vjps, fused by compile: 4 each).
    Of width hidden: two LoRA float32 paths into the MLP input plus casts, the two frozen paths, their sum and
    the residual stream cotangent. The CPU's composite RMSNorm backward adds three float32 (tokens, hidden)
    temporaries (mlx/fast.cpp:133-160); Metal's RMSNormVJP is one kernel.
    """
    h, i = spec.hidden_size, spec.intermediate_size
    lora_i = 3 * ADAPTER_BYTES + b if adapters else 0
    work = i * (lora_i + 4 * b)
    work += h * ((2 * ADAPTER_BYTES + 2 * b if adapters else 0) + 3 * b)
    if backend == "cpu":
        work += 3 * h * 4
    return work


def mlx_estimate(spec: ModelSpec, *, method: str = "lora", batch_size: int = DEFAULT_BATCH,
                 seq_len: int = DEFAULT_MAX_SEQ_LEN, train_layers: int = DEFAULT_TRAIN_LAYERS,
                 lora_rank: int = DEFAULT_RANK, lora_scale: float = DEFAULT_SCALE, quant_bits: int = 4,
                 grad_ckpt: bool = False, dtype: str = "bf16", backend: str = "metal",
                 targets: tuple[str, ...] = ALL_TARGETS, loss_kernel: str | None = None,
                 attention_grad: str = "composite", compiled: bool = True) -> MlxEstimate:
    """Peak of one mlx-lm training step. ``seq_len`` is the model's input length (batch length - 1).

    ``lora_scale`` multiplies the adapter output only; it changes no buffer size (kept for a complete setup).
    ``targets``: the adapted projections (mlx-lm ``keys``); every Linear by default, as mlx-lm 0.32 does.
    ``loss_kernel`` (LOSS_KERNELS; default: the fused kernel on Metal, the shifted composite on the CPU, as mlx
    0.32.4 runs), ``attention_grad`` (ATTENTION_GRADS) and ``compiled`` describe older mlx/mlx-lm releases
    (physics/mlx_eras.py names them).
    """
    problems = []
    if method not in METHODS:
        problems.append(f"method must be one of {METHODS}")
    if dtype not in DTYPE_BYTES:
        problems.append(f"dtype must be one of {tuple(DTYPE_BYTES)}")
    if backend not in BACKENDS:
        problems.append(f"backend must be one of {BACKENDS}")
    if method == "qlora" and quant_bits not in (4, 8):
        problems.append("quant_bits must be 4 or 8 (MLX affine)")
    if loss_kernel is not None and loss_kernel not in LOSS_KERNELS:
        problems.append(f"loss_kernel must be one of {tuple(LOSS_KERNELS)}")
    if attention_grad not in ATTENTION_GRADS:
        problems.append(f"attention_grad must be one of {ATTENTION_GRADS}")
    if min(batch_size, seq_len, lora_rank) < 1:
        problems.append("batch_size, seq_len and lora_rank must be positive")
    if problems:
        from ..errors import InvalidSetupError
        raise InvalidSetupError("; ".join(problems))
    del lora_scale
    b = DTYPE_BYTES[dtype]
    n = spec.num_layers if train_layers < 0 else min(train_layers, spec.num_layers)
    tokens = batch_size * seq_len
    weights, constants = _weights(spec, method, quant_bits, b)
    adapters = method != "full"
    if adapters:
        adapter_bytes = n * _adapter_params(spec, lora_rank, method == "dora", targets) * ADAPTER_BYTES
        trainable = adapter_bytes
        layer_grads = adapter_bytes // max(n, 1)
    else:
        adapter_bytes = 0
        trainable = n * count_params(spec).per_layer * b
        layer_grads = count_params(spec).per_layer * b
    per_token_layer = _layer_saved_bytes(spec, seq_len=seq_len, b=b, adapters=adapters, rank=lora_rank,
                                         backend=backend, targets=targets, attention_grad=attention_grad)
    if grad_ckpt:
        # mx.checkpoint keeps each layer's input; the layer being differentiated is recomputed in full.
        saved = tokens * (n * spec.hidden_size * b + per_token_layer) if n else 0
    else:
        saved = tokens * n * per_token_layer
    # Loss backward: CPU composite cross-entropy keeps the shifted logits and builds softmax, the cotangent
    # product and the take_along_axis scatter (4 copies); Metal's fused kernel reads the logits and writes one
    # gradient (2 copies). Logits are in the model dtype (default_loss computes CE before .astype(float32)).
    copies, elem = LOSS_KERNELS[loss_kernel or ("composite-shifted" if backend == "cpu" else "fused")]
    logits = copies * tokens * spec.vocab_size * (elem or b)
    if spec.final_logit_softcap:
        # Gemma 2 caps the logits in the model (gemma2.py:199-200, tanh(out / cap) * cap, model dtype, before any
        # float32 cast of the loss); the tanh output stays for its vjp: one more (tokens, vocab) buffer (measured).
        logits += tokens * spec.vocab_size * b
    mlp_adapters = adapters and bool(set(targets) & {"gate", "up", "down"})
    workspace = tokens * _backward_workspace(spec, b=b, adapters=mlp_adapters, backend=backend)
    if n:
        # One layer's attention backward: its S x S cotangents (and, recomputing, its softmax) on top.
        workspace += ATTENTION_BACKWARD_COPIES[attention_grad] * batch_size * spec.num_heads * seq_len ** 2 * b
    # Gradients: LoRA's are tiny, all counted; full fine-tuning has one layer's at the activation peak.
    grads = trainable if adapters else layer_grads
    phase = "loss backward" if logits >= workspace else "layer backward"
    notes = []
    if method == "full" and n < spec.num_layers:
        notes.append(f"mlx-lm's full fine-tuning trains only the last {n} of {spec.num_layers} layers "
                     "(lora.py:240-242); set the number of trained layers to all of them for a full fine-tune")
    return MlxEstimate(weights=weights, quant_constants=constants, adapters=adapter_bytes, gradients=grads,
                       optimizer_state=2 * trainable, saved_activations=saved, logits_and_loss=logits,
                       backward_workspace=workspace, peak_phase=phase,
                       activation_bytes_per_token_layer=per_token_layer, backend=backend, notes=tuple(notes),
                       compiled=compiled)
