"""Trace a preference trainer's real step: TRL 1.16's own loss computation on the real model, on fake tensors.

`trace_trainer` builds the policy as the SFT trace does (transformers + PEFT, checkpointing), patches it with TRL's
fused LM head (``add_fused_lm_head``, as DPOTrainer/KTOTrainer do in ``__init__``), builds the reference model
when it is a separate copy, and runs ``DPOTrainer._compute_loss`` / ``KTOTrainer._compute_loss`` themselves (on
a trainer object whose attributes are the TRL config's defaults; nothing of the trainer's loss is rewritten), then
backward and the optimizer step, under the same live-storage tracker.

What a CPU with fake tensors cannot do as CUDA does, and how the trace does it instead (listed as deviations):
- TRL projects only the labelled positions on Triton devices (trainer/utils.py:1642 ``compact``); the trace takes
  that path. Boolean-mask indexing has a data-dependent size on fake tensors, so the batch's masks (prompt and
  completion layout, preference labels) are real tensors and ``x[mask]`` is indexed with their real positions.
- ``.item()`` on a fake tensor (metrics only: entropy, rewards, accuracies) returns 0; it sizes nothing; a boolean
  mask computed from fake values (GRPO's nanmin/nanmax metrics) selects every element.
- ``selective_log_softmax`` (ORPO, CPO) takes its CUDA branch, TRL's Triton kernel, whose allocations are made
  without running it (Triton has no CPU backend; rl_trainers._CudaLogProbEntropy).
ORPO, CPO/SimPO, GRPO and GKD run their own TRL loss the same way (trace/rl_trainers.py). Generation cannot run on
fake tensors (its length is data-dependent): GRPO's and GKD's generation phase is accounted from the estimate's
formula (KV cache and prefill, physics/trainers.py) on top of the traced state, and said so.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only

from ..errors import InvalidSetupError, SourceError
from ..physics.overhead import CUBLAS_WORKSPACE_BYTES
from ..estimator import Component, Estimate
from ..params import count_params
from ..physics import states
from ..physics import trainers as physics
from ..physics.stack import resolve_stack
from ..setup import TrainingSetup
from ..spec import ModelSpec

from . import rl_trainers

TRACED = ("dpo", "ipo", "kto") + rl_trainers.TRACED
DEVIATIONS = (
    "TRL's Triton folds (in place on CUDA) and fp32-out GEMMs replaced by in-place no-ops: the CPU fallbacks' fp32 "
    "tile copies do not exist on CUDA",
    "TRL's fused LM head scores only the labelled positions as on CUDA (trl/trainer/utils.py:1642 compact path); "
    "the batch's masks are real tensors so x[mask] has its real size on fake tensors",
    ".item() of a fake tensor (TRL's metrics) reads 0; it sizes nothing",
    "selective_log_softmax's Triton kernel (ORPO, CPO log-probs) allocates as on CUDA; it is not run "
    "(trl/kernels/logprob_entropy.py)",
    "autograd sums two gradients of one tensor out of place on fake tensors (torch autograd input_buffer.cpp "
    "can_accumulate_inplace refuses tensor subclasses); real tensors reuse a solely-owned operand (checked on CPU "
    "tensors), so a GPU run holds one such buffer less where two large gradients meet: ORPO/CPO's fp32 logits, "
    "a tied embedding under gradient accumulation: the count here is the upper one",
)


class _RealMasks(TorchDispatchMode):
    """Keeps ops on real tensors only (the batch's ids and masks) real, so their values are known; indexes fake
    tensors with a real boolean mask through the mask's real positions; answers .item() of a fake with 0."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from torch._subclasses.fake_tensor import FakeTensor

        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        fake = any(isinstance(a, FakeTensor) for a in tensors)
        if tensors and not fake:
            with _disable_current_modes():
                out = func(*args, **kwargs)
            tree_map_only(torch.Tensor, lambda t: self.tracker.add(t, "inputs"), out)
            return out
        if func is torch.ops.aten._local_scalar_dense.default:
            return False if args[0].dtype == torch.bool else (0.0 if args[0].is_floating_point() else 0)
        if func is torch.ops.aten.index.Tensor:
            indices = list(args[1])
            if any(isinstance(i, torch.Tensor) and not isinstance(i, FakeTensor) and i.dtype == torch.bool
                   for i in indices):
                expanded = []
                for i in indices:
                    if isinstance(i, torch.Tensor) and i.dtype == torch.bool and not isinstance(i, FakeTensor):
                        with _disable_current_modes():
                            expanded += list(i.nonzero(as_tuple=True))
                    else:
                        expanded.append(i)
                return func(args[0], expanded)
            if len(indices) == 1 and isinstance(indices[0], FakeTensor) and indices[0].dtype == torch.bool \
                    and indices[0].shape == args[0].shape:
                # a mask computed from fake values (TRL's metrics: nanmin/nanmax of per-sequence clip ratios):
                # every element selected, the most it can be
                return args[0].reshape(-1).clone()
        return func(*args, **kwargs)


def _cuda_like_fused_head(kernels) -> None:
    """TRL's fused head as it runs on CUDA: its Triton kernels fold each [tokens, vocab] tile into the running
    statistics (forward) or into the logits gradient (backward) in place, and the fp32 gradient GEMMs accumulate with
    addmm(out_dtype=float32, out=acc) (trl/kernels/chunked_logprob.py:52-63, 79-200). The CPU fallbacks
    (_forward_tile, _backward_tile, acc.addmm_(a.float(), b.float())) make fp32 copies of every tile and weight chunk
    that a CUDA run never allocates. On fake tensors only allocations matter, so the folds write in place: nothing."""
    def fold_in_place(*args, **kwargs):
        return None

    def addmm_out_fp32(acc, a, b):
        return None      # cuBLAS writes the product into `acc`: no allocation

    kernels._forward_tile = fold_in_place
    kernels._backward_tile = fold_in_place
    kernels._addmm_fp32 = addmm_out_fp32


def _stub_trainer(trainer: str, model, ref_model, precomputed: bool):
    """A TRL trainer object with the attributes `_compute_loss` reads, set to the TRL config's defaults."""
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    cls, config = (KTOTrainer, KTOConfig) if trainer == "kto" else (DPOTrainer, DPOConfig)
    defaults = rl_trainers._defaults(config)
    obj = cls.__new__(cls)

    class _Args:
        gradient_checkpointing_kwargs = None

    attrs = dict(model=model, ref_model=ref_model, accelerator=rl_trainers._Accelerator(), args=_Args(), aux_loss_enabled=False,
                 precompute_ref_logps=precomputed, beta=defaults["beta"], _metrics=defaultdict(lambda: defaultdict(list)),
                 _total_train_tokens=0, _tp_size=1, router_aux_loss_coef=0.0)
    if trainer == "kto":
        # kto_trainer.py:815 calculate_kl unless loss_type apo_zero_unpaired
        attrs.update(loss_type=defaults["loss_type"], calculate_KL=defaults["loss_type"] != "apo_zero_unpaired",
                     desirable_weight=defaults["desirable_weight"], undesirable_weight=defaults["undesirable_weight"])
    else:
        # dpo_config.py loss_type default ["sigmoid"]; IPO is loss_type ["ipo"]
        attrs.update(loss_types=["ipo" if trainer == "ipo" else "sigmoid"], loss_weights=[1.0],
                     f_divergence_type=defaults["f_divergence_type"],
                     f_alpha_divergence_coef=defaults["f_alpha_divergence_coef"],
                     label_smoothing=defaults["label_smoothing"], ld_alpha=defaults["ld_alpha"],
                     use_weighting=defaults["use_weighting"])
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj


def _autocast_per_forward(module, dtype) -> None:
    """Each forward call its own autocast region, as accelerate 1.16 wraps a prepared model under bf16/fp16
    (accelerator.py:1791-1801 prepare_model: forward = convert_outputs_to_fp32(autocast(forward))); HF Trainer adds
    no outer region (transformers 5.24 trainer.py:2231-2236 autocast_smart_context_manager returns nullcontext).
    It matters for KTO: its no-grad KL pass runs the policy before the policy's forward. In one shared region the
    autocast cache would keep the KL pass's weight casts (cached with a graph node even under no_grad) and the
    policy forward would reuse them; the autograd engine runs nodes by descending sequence number, so every
    weight's cast backward (and its .grad) would come after the embedding's backward, with the layers' 16-bit
    gradients held meanwhile: a step a real run does not take. Leaving each region clears the cache."""
    from accelerate.utils import convert_outputs_to_fp32

    forward = module.forward

    def autocast_forward(*args, **kwargs):
        with torch.autocast("cpu", dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = convert_outputs_to_fp32(autocast_forward)


def _batch(spec: ModelSpec, setup: TrainingSetup) -> dict:
    """The collated batch, real tensors (built outside the fake mode): prompt then completion in each row."""
    sh = physics.shape(setup)
    rows, s = sh.rows, sh.row_tokens
    prompt = s - min(setup.completion_len or s - 1, s - 1)
    ids = torch.randint(0, spec.vocab_size, (rows, s))
    completion = torch.zeros(rows, s, dtype=torch.long)
    completion[:, prompt:] = 1
    batch = {"input_ids": ids, "attention_mask": torch.ones(rows, s, dtype=torch.long), "completion_mask": completion}
    if setup.trainer == "kto":
        batch["label"] = torch.arange(rows) % 2 == 0           # chosen and rejected rows alternate
        batch["KL_input_ids"] = ids.roll(1, 0)
        batch["KL_attention_mask"] = batch["attention_mask"]
        batch["KL_completion_mask"] = completion
        if setup.ref_model == "precomputed":
            batch["ref_logps"] = torch.zeros(rows)
            batch["ref_KL_logps"] = torch.zeros(rows)
    elif setup.ref_model == "precomputed":
        batch["ref_chosen_logps"] = torch.zeros(rows // 2)
        batch["ref_rejected_logps"] = torch.zeros(rows // 2)
    return batch


def trace_trainer(spec: ModelSpec, setup: TrainingSetup, steps: int = 2, progress: bool = False) -> Estimate:
    from trl.trainer import utils as trl_utils

    from .build import build
    from .measure import _quiet
    from .step import cuda_like_kernels, install_hooks, make_optimizer, materialize, track_weights
    from .tracker import PeakTracker

    if setup.trainer not in TRACED:
        raise InvalidSetupError(f"memfit trace runs {', '.join(TRACED)} and SFT steps; {setup.trainer} is not traced: "
                                "use `memfit estimate`")
    if setup.generation not in (None, "hf") and setup.trainer in physics.ONLINE:
        raise InvalidSetupError("memfit trace runs the training step with HF generate's memory accounted; vLLM's "
                                "reservation is not traced: use `memfit estimate`, or --generation hf")
    if setup.shard != "none":
        raise InvalidSetupError("memfit trace runs one GPU's step without sharding")
    if setup.ref_model == "copy" and setup.method == "qlora":
        raise InvalidSetupError("TRL loads the reference copy of a QLoRA run quantized; memfit trace builds 16-bit "
                                "copies only: use `memfit estimate`, or ref_model adapter-off")
    if setup.trainer in ("orpo", "simpo", "cpo") and setup.method == "qlora":
        raise InvalidSetupError(f"TRL's {setup.trainer} trainer casts a 4-bit PEFT model's modules itself under bf16 "
                                "(peft_module_casting_to_bf16, orpo_trainer.py:262-265), which the trace does not "
                                "replay: use `memfit estimate`, or --method lora")
    micro = physics.micro_setup(setup)
    stack = resolve_stack(spec, micro)
    start = time.perf_counter()
    tracker = PeakTracker()
    from trl.kernels import chunked_logprob as kernels

    original_compact = trl_utils._use_triton
    originals = {name: getattr(kernels, name) for name in ("_forward_tile", "_backward_tile", "_addmm_fp32")}
    teacher_spec = None
    try:
        with _quiet():
            built = build(spec, micro, stack)
            model = built.model
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            fused = setup.trainer in physics.FUSED_HEAD
            if fused:
                # the fields each trainer asks of the fused head: dpo_trainer.py:957-960, kto_trainer.py:967-970,
                # grpo_trainer.py:1068-1072 (log_probs, entropy; temperature 1.0 by default)
                outputs = {"kto": ("log_probs", "entropy", "mean_logits"), "grpo": ("log_probs", "entropy")}.get(
                    setup.trainer, ("log_probs", "entropy", "mean_logits", "is_top1"))
                trl_utils.add_fused_lm_head(base, outputs=outputs)
            ref = None
            if setup.ref_model == "copy":
                frozen = micro.with_method("full").replace(grad_ckpt=False)
                ref = _frozen(spec, frozen, build)
                if fused:
                    trl_utils.add_fused_lm_head(ref)
            teacher = None
            if setup.trainer == "gkd":
                from ..sources import load_model

                teacher_spec = load_model(setup.teacher)
                frozen = micro.with_method("full").replace(grad_ckpt=False)
                teacher = _frozen(teacher_spec, frozen, build)
            trl_utils._use_triton = lambda device: True      # the CUDA run's compaction decision
            _cuda_like_fused_head(kernels)
            state = _run(spec, setup, micro, stack, built, ref, teacher, tracker, steps, materialize, track_weights,
                 install_hooks, make_optimizer, cuda_like_kernels)
    except (SourceError, InvalidSetupError):
        raise
    except Exception as exc:
        raise SourceError(f"cannot trace {setup.trainer} on {spec.name}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}; `memfit estimate` gives the analytic estimate") from None
    finally:
        trl_utils._use_triton = original_compact
        for name, fn in originals.items():
            setattr(kernels, name, fn)
    wall = time.perf_counter() - start
    from .measure import traced_components

    phases, assumptions = [], []
    if physics.shape(setup).generated_rows:
        # Generation cannot run on fake tensors (its length is data-dependent): HF generate's KV cache and prefill
        # come from the estimate's formula, on top of the traced state the round starts from.
        accounted = physics.hf_generation_parts(spec, setup, stack.compute_bytes)
        gen_totals = {k: v for k, v in state.items() if k not in ("activations", "temporaries", "logits and loss")}
        step_peak = sum(tracker.peak_totals.values()) + CUBLAS_WORKSPACE_BYTES     # as traced_components counts
        phases.append(("training step (traced)", step_peak))
        phases.append(("generation (accounted)", sum(gen_totals.values()) + CUBLAS_WORKSPACE_BYTES
                       + sum(accounted.values())))
        assumptions.append("generation not traced (data-dependent length on fake tensors): HF generate's KV cache "
                           f"and prefill ({sum(accounted.values()) / 2**20:.1f} MiB) accounted from the formula on "
                           "the traced state")
        if phases[-1][1] > step_peak:
            tracker.peak_totals, tracker.peak_where = gen_totals, "generation (accounted)"
    components, allocated, over = traced_components(tracker)
    if tracker.peak_where == "generation (accounted)":
        from ..estimator import cuda_overhead_components
        from ..physics.overhead import overheads

        extra = [Component(k, v, "allocated", "accounted") for k, v in accounted.items()]
        allocated += sum(accounted.values())
        over = overheads(allocated)
        components = [c for c in components if c.counter == "allocated"] + extra + cuda_overhead_components(over)
    reserved = allocated + over.reserved_slack
    _, paged, _ = states.optimizer_state_bytes(spec, micro, stack)
    from .measure import DEVIATIONS as STEP_DEVIATIONS

    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=states.trainable_params(spec, stack),
        model_source=spec.source, setup=setup, precision=stack.precision, components=tuple(components),
        peak_phase=tracker.peak_where, phases=tuple(phases) or ((tracker.peak_where, allocated),),
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved, device_bytes=reserved + over.cuda_context, range_low_bytes=allocated,
        range_high_bytes=over.range_high, paged_bytes=paged, download_bytes=count_params(spec).total * 2,
        assumptions=tuple(built.notes) + DEVIATIONS + STEP_DEVIATIONS + tuple(assumptions), kind="trace",
        extra={"traced": f"TRL 1.16 {setup.trainer} loss, backward and optimizer steps, {steps} steps",
               "wall_s": round(wall, 2),
               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024},
    )


def _frozen(spec, frozen, build):
    """A frozen 16-bit copy (TRL's reference copy, GKD's teacher), built on the meta device as the policy is."""
    model = build(spec, frozen, resolve_stack(spec, frozen)).model
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _run(spec, setup, micro, stack, built, ref, teacher, tracker, steps, materialize, track_weights, install_hooks,
         make_optimizer, cuda_like_kernels) -> dict:
    """The traced steps; returns the live totals after the last optimizer step (the state a generation round
    starts from)."""
    from .step import optimizer_step

    model = built.model
    fake = materialize(built, fake=True)
    track_weights(model, built, micro, tracker)
    for frozen, category in ((ref, "reference model"), (teacher, "teacher model")):
        if frozen is None:
            continue
        with fake:        # the same fake mode: tensors of two modes cannot meet
            frozen.to_empty(device="cpu")
            if getattr(frozen.config, "tie_word_embeddings", False):
                frozen.tie_weights()
        for p in frozen.parameters():
            tracker.add(p, category)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: tracker.retag(p.grad, "gradients"))
    install_hooks(model, built, tracker)
    micro_steps = min(setup.grad_accum, 2)
    dtype = None
    if stack.autocast:
        dtype = torch.float16 if stack.autocast_dtype == "fp16" else torch.bfloat16
        for m in (model, ref, teacher):
            if m is not None:
                _autocast_per_forward(m, dtype)
    t = setup.trainer
    if t in rl_trainers.TRACED:
        sh = physics.shape(setup)
        rows = sh.rows * (micro_steps if t == "grpo" else 1)      # GRPO: one generation round's rows
        batch = rl_trainers.batch(spec, setup, rows, sh.row_tokens)
        trainer = rl_trainers.stub(t, model, ref, teacher, dtype, setup)
    else:
        batch = _batch(spec, setup)
        trainer = _stub_trainer(t, model, ref, setup.ref_model == "precomputed")
    for v in batch.values():
        tracker.add(v, "inputs")
    with cuda_like_kernels(micro, tracker), rl_trainers.cuda_log_softmax(), fake, tracker, _RealMasks(tracker):
        optimizer = make_optimizer(trainable, micro)
        for _ in range(steps):
            micro_batches = [batch] * micro_steps
            if t == "grpo":
                # A generation round per optimizer step (steps_per_generation = gradient_accumulation_steps):
                # the reference log-probs first, under no_grad, then the round's rows split into micro-batches.
                round_batch = dict(batch)
                if trainer.beta != 0.0:
                    tracker.phase, tracker.default_category, tracker.where = "reference forward", "activations", ""
                    round_batch["ref_per_token_logps"] = rl_trainers.reference_logps(trainer, model, ref, batch)
                rows = setup.batch_size
                micro_batches = [{k: (v[i * rows:(i + 1) * rows] if v.dim() else v) for k, v in round_batch.items()}
                                 for i in range(micro_steps)]
            for inputs in micro_batches:
                tracker.phase, tracker.default_category, tracker.where = "forward", "activations", ""
                if t in rl_trainers.TRACED:
                    loss = rl_trainers.loss(trainer, model, inputs)
                else:
                    loss = type(trainer)._compute_loss(trainer, model, inputs, False)
                tracker.phase, tracker.default_category, tracker.where = "backward", "logits and loss", "loss"
                (loss / micro_steps).backward()
                del loss
            optimizer_step(optimizer, tracker)
            if t == "grpo":
                del round_batch, micro_batches
        return dict(tracker.totals)
