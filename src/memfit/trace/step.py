"""Run real training steps of the real model on fake CPU tensors and measure every live byte.

Where CPU kernels differ from CUDA ones we mimic CUDA (each is listed in the measurement's deviations):
- the optimizer implementation is passed explicitly (CPU defaults to the for-loop AdamW, CUDA to foreach);
- dropout saves a bool mask as CUDA's native_dropout does, not the CPU path's fp32 noise;
- bitsandbytes' 8-bit / paged states and its 4-bit storage are added from their real layout (no CPU kernels).
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch
from torch import nn

from ..physics import states
from ..physics.stack import Stack
from ..setup import TrainingSetup
from ..spec import ModelSpec
from .build import Built, _MatMul4bit, storage_on
from .tracker import PeakTracker
from .vision import fake_constants

from ..options import BNB_OPTIMIZERS  # noqa: E402  (bitsandbytes states are accounted, not traced)
from ..physics.optimizers import OPTIMIZER_FACTS  # noqa: E402
from . import optimizers as trace_optimizers  # noqa: E402


def _cuda_like_dropout(x, p=0.5, training=True, inplace=False):
    """native_dropout on CUDA: keeps a bool mask (1 B/element) and the scaled output."""
    if not training or p == 0.0:
        return x
    mask = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)
    return x * mask * (1.0 / (1.0 - p))


def make_optimizer(params: list, setup: TrainingSetup, model: nn.Module | None = None):
    opt = setup.optimizer
    facts = OPTIMIZER_FACTS.get(opt)
    if facts and not facts.bnb:                 # GaLore, APOLLO, Muon, Adam-mini, Lion, CAME, LOMO (trace/optimizers)
        return trace_optimizers.make(opt, model, setup)
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, foreach=True)
    if opt == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    if opt == "adamw-loop":
        return torch.optim.AdamW(params, lr=1e-5, foreach=False)
    if opt == "sgd":
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9, foreach=True)
    if opt == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=None, relative_step=True, scale_parameter=True, warmup_init=False)
    # bitsandbytes: a step that allocates nothing; its state is added from its real layout.
    return torch.optim.SGD(params, lr=1e-5, foreach=False)


class _Progress:
    """A progress line on stderr for traces that take more than a few seconds."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def tick(self, label: str) -> None:
        self.done += 1
        if self.enabled and time.perf_counter() - self.start > 2.0:
            width = 24
            filled = int(width * self.done / self.total)
            print(f"\rtrace [{'#' * filled}{'.' * (width - filled)}] {label:<28}", end="", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self.enabled and time.perf_counter() - self.start > 2.0:
            print(file=sys.stderr)


def materialize(built: Built, fake: bool = True):
    """Give the meta-device model storage: fake CPU tensors (the trace) or real ones (the tests' oracle).
    Returns the FakeTensorMode (or a null context) the steps must run under."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    model = built.model
    with mode:
        storage_on(model, "cpu")
    return mode


def track_weights(model: nn.Module, built: Built, setup: TrainingSetup, tracker: PeakTracker) -> list[str]:
    """Weights and buffers; 4-bit linears at their NF4 size plus their constants."""
    quantized = {id(m.weight) for m in built.quantized}
    for p in model.parameters():
        if id(p) in quantized:
            data, consts = states.quant_storage_bytes(p.numel(), setup.quant, p.shape[0])
            tracker.add(p, "weights", nbytes=data)
            tracker.add_virtual(tracker.rounded(consts), "weights")
        else:
            tracker.add(p, "weights")
    for b in model.buffers():
        tracker.add(b, "weights")
    if not built.quantized:
        return []
    return [f"4-bit storage of {len(built.quantized)} linears ({setup.quant}: packed data + constants) and "
            f"their dequantization transients"]


@contextlib.contextmanager
def cuda_like_kernels(setup: TrainingSetup, tracker: PeakTracker | None):
    """Dropout with a bool mask, the real run's causal-mask decision, bitsandbytes' dequantization transient."""
    _MatMul4bit.tracker = tracker
    original_dropout = nn.functional.dropout
    nn.functional.dropout = _cuda_like_dropout
    restore_masking = _real_run_masking(setup)
    original_sdpa = nn.functional.scaled_dot_product_attention

    def sdpa_without_dropout(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False):
        # CUDA's flash / mem-efficient kernels apply attention dropout inside the kernel (philox state, no mask);
        # the CPU kernel falls back to the math path, which materializes the s x s scores. Trace the CUDA way.
        if query.shape[-3] != key.shape[-3] and not enable_gqa:
            return _cuda_math_sdpa(query, key, value, attn_mask, is_causal, scale)
        return original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)

    nn.functional.scaled_dot_product_attention = sdpa_without_dropout
    original_layer_norm = nn.functional.layer_norm

    def layer_norm_as_cuda_autocast(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        # CUDA autocast runs layer_norm in fp32 (its fp32 op list: every floating argument cast, fp32 out);
        # CPU autocast leaves it in 16 bits.
        if torch.is_autocast_enabled("cpu") and x.dtype != torch.float32:
            x = x.float()
            weight = weight.float() if weight is not None else None
            bias = bias.float() if bias is not None else None
        return original_layer_norm(x, normalized_shape, weight, bias, eps)

    nn.functional.layer_norm = layer_norm_as_cuda_autocast
    try:
        yield
    finally:
        nn.functional.layer_norm = original_layer_norm
        nn.functional.scaled_dot_product_attention = original_sdpa
        restore_masking()
        nn.functional.dropout = original_dropout
        _MatMul4bit.tracker = None


def _cuda_math_sdpa(query, key, value, attn_mask, is_causal, scale):
    """SDPA's math path as CUDA runs it, in the input dtype (the CPU one upcasts 16-bit inputs to fp32):
    aten/src/ATen/native/transformers/attention.cpp _scaled_dot_product_attention_math."""
    import math

    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    scores = (query * factor) @ (key * factor).transpose(-2, -1)
    s_q, s_k = query.shape[-2], key.shape[-2]
    if is_causal:
        causal = torch.ones(s_q, s_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return torch.softmax(scores, dim=-1) @ value


def make_inputs(spec: ModelSpec, setup: TrainingSetup) -> dict:
    if spec.vision is not None:
        from .vision import make_inputs as vlm_inputs

        return vlm_inputs(spec, setup)
    ids = torch.randint(0, spec.vocab_size, (setup.batch_size, setup.seq_len))
    inputs = {"input_ids": ids, "labels": ids}
    if setup.padding:
        mask = torch.ones_like(ids)
        mask[:, 0] = 0                           # one padded position per row: HF must build the mask
        inputs["attention_mask"] = mask
    return inputs


def train_step(model: nn.Module, optimizer, inputs: dict, stack: Stack, micro: int, tracker: PeakTracker,
               on_first_step=None, bar: "_Progress | None" = None) -> None:
    """One optimizer step as HF Trainer runs it: `micro` forward/backward passes, step, zero_grad(None)."""
    autocast = (torch.autocast("cpu", dtype=torch.float16 if stack.autocast_dtype == "fp16" else torch.bfloat16)
                if stack.autocast else contextlib.nullcontext())
    for _ in range(micro):
        tracker.phase, tracker.default_category, tracker.where = "forward", "activations", ""
        with autocast:
            out = model(**inputs)
        loss = out.loss
        if stack.fp32_logits_copy:
            logits32 = out.logits.float()       # accelerate convert_outputs_to_fp32
            del logits32
        del out                                 # Trainer keeps only the loss
        if bar:
            bar.tick("forward")
        # Until the lm_head's backward, what backward allocates is the cross-entropy's.
        tracker.phase, tracker.default_category, tracker.where = "backward", "logits and loss", "cross-entropy"
        (loss / micro).backward()
        del loss
        if bar:
            bar.tick("backward")
    tracker.phase, tracker.where = "optimizer step", ""
    if on_first_step:
        on_first_step()
    optimizer_step(optimizer, tracker)
    if bar:
        bar.tick("optimizer step")


def optimizer_step(optimizer, tracker: PeakTracker) -> None:
    """Step, tag the state the optimizer created as its state, and free the gradients (set_to_none)."""
    tracker.phase, tracker.where = "optimizer step", ""
    optimizer.step()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                tracker.retag(value, "optimizer state")
    optimizer.zero_grad(set_to_none=True)


def run_steps(spec: ModelSpec, setup: TrainingSetup, stack: Stack, built: Built, tracker: PeakTracker,
              steps: int = 2, progress: bool = False) -> dict:
    """Two optimizer steps on fake tensors (the first allocates the optimizer state lazily); two micro-batches
    per step with gradient accumulation (the pattern repeats after the second)."""
    model = built.model
    micro = min(setup.grad_accum, 2)
    bar = _Progress(steps * (micro * 2 + 1), progress)
    fake = materialize(built, fake=True)
    accounted = track_weights(model, built, setup, tracker)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: tracker.retag(p.grad, "gradients"))
    install_hooks(model, built, tracker)
    bnb_state = 0
    if setup.optimizer in BNB_OPTIMIZERS or getattr(OPTIMIZER_FACTS.get(setup.optimizer), "bnb", False):
        bnb_state, paged, _ = states.optimizer_state_bytes(spec, setup, stack)
        accounted.append(f"bitsandbytes {setup.optimizer} state from its layout ({bnb_state:,} B on the device"
                         + (f", {paged:,} B paged" if paged else "") + ")")
    try:
        with cuda_like_kernels(setup, tracker), fake_constants(spec), fake, tracker:
            optimizer = make_optimizer(trainable, setup, model)
            inputs = make_inputs(spec, setup)
            for t in inputs.values():
                tracker.add(t, "inputs")
            for step in range(steps):
                first = (lambda: tracker.add_virtual(tracker.rounded(bnb_state), "optimizer state")) \
                    if step == 0 and bnb_state else None
                train_step(model, optimizer, inputs, stack, micro, tracker, on_first_step=first, bar=bar)
    finally:
        bar.close()
    return {"accounted": accounted}


def _real_run_masking(setup: TrainingSetup):
    """transformers never skips the causal mask while a position tensor is a FakeTensor ("tracing"), and cannot
    read a fake padding mask; a real CUDA run decides from the data (masking_utils._ignore_causal_mask_sdpa).
    Give the real run's answer: our batches have padding exactly when setup.padding, so the mask is skipped
    (SDPA is_causal=True, no mask tensor) unless there is padding or a sliding window shorter than the input."""
    from transformers import masking_utils

    original = masking_utils._ignore_causal_mask_sdpa

    def real_run_answer(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        if padding_mask is not None and setup.padding:
            return False
        if local_attention_size is not None and kv_length >= local_attention_size:
            return False
        return q_length == 1 or kv_length == q_length

    original_packed = masking_utils.find_packed_sequence_indices
    masking_utils._ignore_causal_mask_sdpa = real_run_answer
    # Our position ids are a plain arange (no packed sequences): the real run finds none.
    masking_utils.find_packed_sequence_indices = lambda position_ids: None

    def restore():
        masking_utils._ignore_causal_mask_sdpa = original
        masking_utils.find_packed_sequence_indices = original_packed
    return restore


def install_hooks(model: nn.Module, built: Built, tracker: PeakTracker) -> None:
    """Name the module the peak happens in; route the lm_head output and the loss to 'logits and loss'."""
    for index, layer in enumerate(built.layers):
        def pre(module, args, index=index):
            tracker.where = f"layer {index}"
        layer.register_forward_pre_hook(pre)

        def back_pre(module, grad_output, index=index):
            tracker.where = f"layer {index}"
        layer.register_full_backward_pre_hook(back_pre)

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        def head_pre(module, args):
            tracker.where = "lm_head"

        def head_post(module, args, output):
            tracker.retag(output, "logits and loss")
            tracker.phase, tracker.default_category, tracker.where = "loss", "logits and loss", "cross-entropy"
        head.register_forward_pre_hook(head_pre)
        head.register_forward_hook(head_post)

        def head_back(module, grad_output):
            tracker.where, tracker.default_category = "lm_head", "temporaries"
        head.register_full_backward_pre_hook(head_back)
