"""estimate(model, setup) -> Estimate: the step's peak as named components, for three counters. Pure; no I/O.

One training step has a few candidate peaks (research/memory-physics.md §4.2); each is a sum of named parts and
the largest wins:
  forward end       weights + optimizer state + saved activations + loss tensors + logits transients
  CE backward       the same with the cross-entropy backward's 12·bs·V instead of the forward transients
  layer backward    gradients so far + remaining activations (or checkpoints + one recomputed layer) + temps
  optimizer step    weights + gradients + optimizer state + step temporaries (foreach AdamW: one param copy)
Iteration >= 2 is the steady state: Adam's state exists (its lazy creation in step 1 peaks the same).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .params import count_params, layer_linears
from .physics import activations as act
from .physics import context_parallel as cp
from .physics import fp8, litgpt, load, lora_outer, moe, optimizers, quantized_base, sharding, states, trainers
from .physics import vision as vision_physics
from .physics.adapters import assumption as adapter_assumption
from .physics.adapters import virtual_tokens
from .physics.compile import ASSUMPTION as COMPILE_ASSUMPTION
from .physics.loss import loss_memory
from .physics.overhead import CUBLAS_WORKSPACE_BYTES, error_band, overheads
from .physics.stack import Stack, resolve_stack
from .recipes import get_recipe
from .options import PEFT_METHODS
from .physics import litgpt_adapter
from .setup import OPTIMIZERS, TrainingSetup
from .spec import ModelSpec

LOAD_PHASE = "model load"
SCHEMA_VERSION = 2   # 2: suggestions carry option `changes` and a `status`; setup lists `explicit`


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    counter: str      # "allocated" | "reserved" | "device": the first counter that includes it
    note: str


@dataclass(frozen=True)
class Estimate:
    model_name: str
    params: int
    trainable_params: int
    model_source: str
    setup: TrainingSetup
    precision: str                     # the resolved precision (never "auto")
    components: tuple[Component, ...]  # the breakdown at the peak; sums to device_bytes
    peak_phase: str
    phases: tuple[tuple[str, int], ...]  # every candidate peak, allocated bytes
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_bytes: int
    range_low_bytes: int
    range_high_bytes: int
    paged_bytes: int                   # optimizer state in CUDA managed memory: outside all three counters
    download_bytes: int                # the 16-bit weights a user downloads
    assumptions: tuple[str, ...]
    kind: str = "analytic"             # "analytic" | "rule-of-thumb" | "mlx" | "mps" | "trace" | "cuda"
    extra: dict = field(default_factory=dict)
    host_bytes: int = 0                # CPU RAM that offload moves off the GPU (per node)

    def component(self, name: str) -> int:
        return sum(c.bytes for c in self.components if c.name == name)


def estimate(spec: ModelSpec, setup: TrainingSetup) -> Estimate:
    """The peak memory of one steady-state training step on one GPU."""
    vision_physics.check_text_model(spec, setup)
    if spec.is_rule_of_thumb:
        from .rule import estimate_rule

        if setup.trainer != "sft":
            from .errors import InvalidSetupError

            raise InvalidSetupError(f"trainer {setup.trainer} needs the model's architecture (a bare size has "
                                    "none): name a catalog model, a Hugging Face id or a config.json")

        return estimate_rule(spec, setup)
    if setup.recipe == "mlx":
        from .estimate_mlx import estimate_mlx

        return estimate_mlx(spec, setup)
    if setup.recipe == "mps":
        from .estimate_mps import estimate_mps

        return estimate_mps(spec, setup)
    if setup.recipe == "megatron":
        from .estimate_megatron import estimate_megatron

        return estimate_megatron(spec, setup)
    cp.check_model(spec, setup)
    spec = _as_built_by(spec, setup)
    tower, user_setup = None, setup
    if spec.vision is not None:
        # A VLM: the language model runs text + image tokens; the tower's parts join every phase.
        stack = resolve_stack(spec, setup)
        tower = vision_physics.vision_parts(spec, setup, stack.weight_bytes, stack.residual_bytes, stack)
        setup = tower.lm_setup
    # The policy's training micro-step (setup itself for SFT), over the sequence the model really processes.
    micro = _as_run(trainers.micro_setup(setup))
    static = _static_parts(spec, micro)
    parts = _token_parts(spec, micro, static)
    extra_notes, extra_assumptions = {}, ()
    if setup.trainer != "sft":
        parts["loss"] = trainers.concatenated_logits_loss(spec, setup, static["stack"]) or \
            loss_memory(spec, micro, static["stack"], tokens=trainers.shape(setup).scored_tokens)
    phases = _phases(spec, micro, static["stack"], parts)
    if tower is not None:
        phases = tower.add_to(phases)
    if setup.trainer != "sft":
        phases, extra_notes, extra_assumptions = trainers.trainer_phases(
            spec, setup, micro, static, parts, phases, setup.card_bytes, _teacher(setup))
    totals = {name: sum(parts_.values()) for name, parts_ in phases.items()}
    peak_phase = max(totals, key=totals.__getitem__)
    peak_parts, allocated = phases[peak_phase], totals[peak_phase]
    over = overheads(allocated)
    notes = {**static["notes"], **extra_notes, **(tower.notes if tower else {})}
    components = [Component(name, nbytes, "allocated", notes.get(name, ""))
                  for name, nbytes in peak_parts.items() if nbytes > 0]
    components += cuda_overhead_components(over)
    idle_unshard = sharding.fsdp1_idle_unshard_bytes(static["sharded"], peak_parts.get("gathered parameters", 0))
    if idle_unshard:
        components.insert(-1, Component("FSDP1 unshard pool", idle_unshard, "reserved",
                                    "FSDP1's all-gather blocks on its own stream, idle at the peak (one pending "
                                    "free under record_stream, layers freed since the backward)"))
    reserved = allocated + over.reserved_slack + idle_unshard
    device = reserved + over.cuda_context
    low, high = min(over.range_low, device), max(over.range_high + idle_unshard, device)
    band = static["error_band"]
    if band:
        # measured = predicted / (1 + error): the measured runs' error band widens the range.
        low = min(low, int(device / (1 + band["high"])))
        high = max(high, int(device / (1 + band["low"])))
    return Estimate(
        model_name=spec.name, params=static["params"] + (spec.vision.params if tower else 0),
        trainable_params=static["trainable_params"],
        model_source=spec.source, setup=user_setup, precision=static["stack"].precision, components=tuple(components),
        peak_phase=peak_phase, phases=tuple(totals.items()),
        peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, device_bytes=device,
        range_low_bytes=low, range_high_bytes=high,
        paged_bytes=static["sharded"]["paged"],
        download_bytes=static["download"] + (2 * spec.vision.params if tower else 0),
        assumptions=(tower.assumptions if tower else ()) + tuple(extra_assumptions) + static["assumptions"]
        + (load.assumption(spec, setup, totals[LOAD_PHASE], max(v for k, v in totals.items() if k != LOAD_PHASE)),),
        extra={**({"expected_error": band} if band else {}), "load": phases[LOAD_PHASE]},
        host_bytes=static["sharded"]["host"] + parts["offload_host"] * setup.gpus,   # offloaded activations: per GPU
    )


def cuda_overhead_components(over) -> list[Component]:
    """What a CUDA run holds beyond its tensors: allocator slack (reserved) and the CUDA context (device)."""
    return [Component("allocator slack", over.reserved_slack, "reserved",
                      "caching-allocator rounding and fragmentation (reserved - allocated)"),
            Component("CUDA context", over.cuda_context, "device",
                      "driver context and kernels: seen by nvidia-smi, not by torch")]


def _teacher(setup: TrainingSetup) -> ModelSpec | None:
    """GKD's teacher, resolved as any model reference is (catalog, config.json, HF cache)."""
    if not setup.teacher:
        return None
    from .sources import load_model

    return load_model(setup.teacher)


def _as_built_by(spec: ModelSpec, setup: TrainingSetup) -> ModelSpec:
    """The model as the recipe's stack builds it (LitGPT: untied head, fused qkv, fp32-weight norms)."""
    recipe = get_recipe(setup.recipe)
    overrides = dict(recipe.arch_overrides)
    if recipe.fused_gelu:
        overrides["activation"] = litgpt.built_activation(spec.activation)
    if not overrides:
        return spec
    return _ARCH_CACHE.get((spec, setup.recipe)) or _ARCH_CACHE.setdefault((spec, setup.recipe), spec.replace(
        **overrides, exact_params=None, notes=spec.notes + (f"as built by {setup.recipe}",)))


def _as_run(setup: TrainingSetup) -> TrainingSetup:
    """The sequence the model really processes: prompt and p-tuning prepend their virtual tokens."""
    extra = virtual_tokens(setup.method, setup.num_virtual_tokens)
    return setup.replace(seq_len=setup.seq_len + extra) if extra else setup


_ARCH_CACHE: dict[tuple, ModelSpec] = {}
_STATIC_CACHE: dict[tuple, dict] = {}
_STATIC_CACHE_MAX = 4096


def _static_parts(spec: ModelSpec, setup: TrainingSetup) -> dict:
    """Everything that does not depend on batch size or length, cached: searches over length or batch
    (memfit max) re-estimate thousands of times with only those changed."""
    # Whether a sliding window is shorter than the sequence changes the layer walk (its layers take a mask).
    windowed = bool(spec.sliding_window and setup.seq_len > spec.sliding_window)
    key = (spec, setup.shape_free_key(), windowed, setup.seq_len if setup.method == "prefix" else 0)
    cached = _STATIC_CACHE.get(key)
    if cached is None:
        if len(_STATIC_CACHE) >= _STATIC_CACHE_MAX:
            _STATIC_CACHE.clear()
        cached = _STATIC_CACHE[key] = _compute_static_parts(spec, setup)
    return cached


def _compute_static_parts(spec: ModelSpec, setup: TrainingSetup) -> dict:
    stack = resolve_stack(spec, setup)
    weights, quant_consts = states.base_weight_bytes(spec, setup, stack)
    opt_state, paged, opt_note = states.optimizer_state_bytes(spec, setup, stack)
    step_temp, step_note = states.optimizer_step_transient(spec, setup, stack)
    counts = count_params(spec)
    # The lm_head matmul casts its weight under autocast whether or not it is tied to the embedding.
    # TRL's fused LM head casts lm_head one vocabulary chunk at a time and saves the weight itself, not a cast
    # (trl 1.16.0 kernels/chunked_logprob.py:354, :395): no head cast is kept for backward.
    fused_head = stack.loss_kind == "trl-fused-head"
    matmul = spec.num_layers * counts.layer_linear_weights + (0 if fused_head else spec.vocab_size * spec.hidden_size)
    weights_cast = stack.autocast and stack.weight_dtype != stack.autocast_dtype
    mixed_casts = 2 * matmul if (weights_cast and not setup.quantized_base) else 0
    if mixed_casts and not stack.base_trainable:
        # With a frozen base, the first adapted layer's input needs no grad, so the linears reading it (q, k, v) keep
        # no weight cast for backward: F.linear saves W only to compute the input's gradient. The frozen layers
        # below the adapted ones (PEFT layers_to_transform, LLaMA-Adapter's first layers) keep none at all.
        first = [lin for lin in layer_linears(spec) if set(lin.parts) & {"q", "k", "v"}]
        mixed_casts -= 2 * sum(lin.weight_params for lin in first)
        mixed_casts -= 2 * (spec.num_layers - act.adapted_layers(spec, stack)) * counts.layer_linear_weights
        if litgpt_adapter.is_peft(setup):
            mixed_casts += litgpt_adapter.peft_weight_cast_bytes(spec, stack.lora_layers)
    if setup.quantized_base and stack.autocast and stack.kbit_upcast:
        mixed_casts = 2 * spec.vocab_size * spec.hidden_size    # bf16 cast of the fp32 lm_head
    fp32_adapters_cast = stack.autocast and stack.adapter_bytes == 4
    # LoRA on lm_head / the embedding sits outside the checkpointed layers: its casts are saved either way.
    outer_casts = 2 * lora_outer.cast_params(stack.outer_lora) if fp32_adapters_cast else 0
    adapter_casts = states.adapter_cast_bytes(spec, stack) + outer_casts
    adapter_saved = states.adapter_saved_weight_bytes(spec, stack)     # per layer, like activations
    # LoRA on fused experts folds W + s*B@A into a new expert stack per layer, saved like a weight cast.
    expert_delta = moe.expert_delta_weight_bytes(spec, stack)
    expert_casts = moe.expert_saved_delta_bytes(spec, stack)
    per = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    grads = states.gradient_bytes(spec, setup, stack)
    head_grad = ((counts.lm_head or spec.vocab_size * spec.hidden_size) + counts.final_norm) * per \
        if stack.base_trainable else 0
    embed_grad = counts.embedding * per if stack.base_trainable and not setup.optimizer_in_backward else 0
    layer_casts = 2 * counts.layer_linear_weights if mixed_casts else 0
    static = dict(
        stack=stack, weights=weights, quant=quant_consts, adapter=states.adapter_weight_bytes(stack),
        grads=grads, opt=opt_state, paged=paged, step_temp=step_temp,
        layer_step_temp=optimizers.layer_step_temp_bytes(spec, setup, stack),
        layer_coeffs=act.layer_coefficients(spec, setup, stack), adapted_layers=act.adapted_layers(spec, stack),
        head_coeff=act.head_coefficient(spec, setup, stack),
        quant_saved_per_token=quantized_base.saved_per_token_bytes(spec, setup, stack),
        quant_saved_per_layer=quantized_base.saved_per_layer_bytes(spec, setup),
        int8_first_layer=act.int8_first_layer_per_token(spec, setup, stack),
        casts=mixed_casts + adapter_casts + adapter_saved + expert_casts, weight_casts=mixed_casts,
        adapter_casts=adapter_casts, outer_casts=outer_casts,
        head_cast=2 * spec.vocab_size * spec.hidden_size if mixed_casts and not fused_head else 0,
        layer_casts=layer_casts + (adapter_casts + adapter_saved) // max(spec.num_layers, 1) + expert_delta,
        head_grad=min(head_grad, grads), embed_grad=min(embed_grad, grads),
        trainable_params=states.trainable_params(spec, stack), download=counts.total * 2, params=spec.params,
        tied_grad_extra=2 * spec.vocab_size * spec.hidden_size * per,
    )
    static["notes"] = {
        "weights": _weights_note(spec, setup, stack),
        "quantization constants": (f"{setup.quant} scales, zeros and group index (physics/quantized_base.py)"
                                   if setup.quant in quantized_base.PREQUANTIZED else
                                   f"{setup.quant} absmax / double-quant constants (bitsandbytes quantize_4bit)"),
        "adapter weights": (f"LoRA A/B, rank {setup.lora_rank}" if setup.method in ("lora", "qlora") else
                            f"{setup.method} adapter") + f", {stack.adapter_bytes} B per param",
        "gradients": f"trainable params x {per} B (.grad in the param dtype)",
        "optimizer state": f"{OPTIMIZERS[setup.optimizer]}: {opt_note}",
        "optimizer step temporaries": step_note,
        "autocast weight copies": "bf16 casts of weights saved for backward under autocast",
        "activations": "tensors autograd saves, all layers (op-level walk, memory-physics §3)",
        "checkpoints": "gradient checkpointing keeps each layer's input hidden states",
        "recomputed layer": "one layer's activations rebuilt during backward",
        "logits and loss": loss_memory(spec, setup, stack).note,
        "previous step's outputs": "the loop's `logits` from the previous step, alive until this forward returns "
                                   "(physics/litgpt.py)",
        "backward temporaries": "one layer's backward: grads of its output and MLP intermediates",
        "cuBLAS workspace": "cuBLAS/cuBLASLt workspaces, allocated through the caching allocator",
        "embedding and head activations": "embedding indices, final norm, lm_head input, labels",
        "master weights": "fp32 master copy of the trainable weights, sharded (DeepSpeed ZeRO)",
        "gathered parameters": "unsharded parameters in flight while a GPU computes (ZeRO-3 / FSDP all-gather)",
        "communication buffers": "DDP gradient buckets, or one layer's unsharded gradient for reduce-scatter",
        "context-parallel buffers": "attention's K/V (or all-to-all) buffers across the GPUs of one sequence",
        "load temporaries": load.note(setup),
    }
    static["sharded"] = fp8.apply(sharding.apply(static, spec, setup, stack), spec, setup)
    static["notes"].update(sharding.notes(setup, stack))
    # The PEFT methods besides LoRA share one band: the published method comparison has one row or two of each.
    band = error_band("peft" if setup.method in PEFT_METHODS else setup.method)
    static["error_band"] = band
    static["assumptions"] = tuple(_assumptions(spec, setup, stack, static)) + ((
        f"expected error for {setup.method}: {band['low']:+.0%} to {band['high']:+.0%} against {band['n']} "
        f"published measured runs (median {band['median']:+.0%}; docs/accuracy.md); the range includes it",)
        if band else ())
    return static


def _token_parts(spec: ModelSpec, setup: TrainingSetup, static: dict) -> dict:
    """The parts that grow with batch size and length, from the cached per-token coefficients."""
    stack = static["stack"]
    static = static["sharded"]
    full, setup = setup, cp.local_setup(setup)       # with --cp, one GPU holds seq_len / cp tokens of a sequence
    T, s = setup.batch_size * setup.seq_len, setup.seq_len
    per_token, per_position = static["layer_coeffs"]
    # LoRA on an int8 / GPTQ / AWQ base: what those kernels save beyond the walk (physics/quantized_base.py).
    layer_act = (T * (per_token + per_position * s + static["quant_saved_per_token"]) + static["quant_saved_per_layer"]
                 + cp.ulysses_kv_extra_bytes(spec, full, stack.compute_bytes))
    all_layers_act = static["adapted_layers"] * layer_act - T * static["int8_first_layer"]
    offload_host = 0
    if full.activation_offload and not full.grad_ckpt:
        resident = min(cp.OFFLOAD_RESIDENT_LAYERS, static["adapted_layers"])
        offload_host, all_layers_act = all_layers_act - resident * layer_act, resident * layer_act
    elif stack.ckpt_offload:
        offload_host = cp.offloaded_checkpoint_bytes(spec, setup, stack.residual_bytes)
    cp_fwd, cp_bwd = cp.buffer_bytes(spec, full, stack.compute_bytes)
    bnb_saved = T * (static["adapted_layers"] * static["quant_saved_per_token"]
                     + quantized_base.head_saved_per_token_bytes(spec, full, stack))
    return dict(static, layer_act=layer_act,
                previous_step=litgpt.previous_step_bytes(spec, setup, stack, bnb_saved),
                all_layers_act=all_layers_act, offload_host=offload_host,
                cp_fwd=cp_fwd, cp_bwd=cp_bwd,
                ckpt=0 if stack.ckpt_offload else act.checkpoint_bytes(spec, setup, stack),
                loss=loss_memory(spec, setup, stack), head_act=T * static["head_coeff"],
                temps=act.layer_backward_temp_bytes(spec, setup, stack)
                + quantized_base.backward_transient_bytes(spec, setup) + fp8.matmul_temp_bytes(spec, setup),
                grad_hidden=T * spec.hidden_size * stack.residual_bytes)


def _phases(spec: ModelSpec, setup: TrainingSetup, stack: Stack, p: dict) -> dict[str, dict[str, int]]:
    # DDP's gradient buckets live as long as the model; FSDP's reduce-scatter buffer only inside backward.
    persistent_comm = p["comm"] if setup.shard == "ddp" else 0
    state = {"weights": p["weights"], "quantization constants": p["quant"], "adapter weights": p["adapter"],
             "master weights": p["master"], "optimizer state": p["opt"],
             "gathered parameters": p["gathered"], "communication buffers": persistent_comm,
             "cuBLAS workspace": CUBLAS_WORKSPACE_BYTES}
    # Grads persist across micro-batches; ZeRO-3's gradient partition buffer lives from the engine's start.
    accum_grads = p["grads"] if setup.grad_accum > 1 or p.get("grads_persistent") else 0
    loss = p["loss"]
    if setup.grad_ckpt:
        saved_layers = {"checkpoints": spec.num_layers * p["ckpt"]}
    else:
        saved_layers = {"activations": p["all_layers_act"]}
    head = {"embedding and head activations": p["head_act"]}
    phases: dict[str, dict[str, int]] = {}
    # The autocast cache keeps casts of fp32 leaf tensors that need grad (fp32 weights, fp32 adapters) until the
    # forward ends (aten autocast_mode.cpp cached_cast); other casts live only as long as something saves them,
    # which under checkpointing nothing does.
    # The lm_head sits outside the checkpointed layers: its cast is saved for backward either way.
    fwd_casts = p["casts"] if not setup.grad_ckpt else p["adapter_casts"] + (
        p["weight_casts"] if stack.weight_dtype == "fp32" and stack.base_trainable else p["head_cast"])
    # LitGPT's loop still holds the previous step's logits (and what their graph keeps) during this forward.
    phases["forward (end)"] = {**state, "gradients": accum_grads, "autocast weight copies": fwd_casts,
                               **saved_layers, **head, "logits and loss": loss.saved + loss.forward_extra,
                               "previous step's outputs": p["previous_step"]}
    bwd_casts = p["head_cast"] + p["outer_casts"] if setup.grad_ckpt else p["casts"]
    phases["cross-entropy backward"] = {**state, "gradients": accum_grads, "autocast weight copies": bwd_casts,
                                        **saved_layers, **head, "logits and loss": loss.saved + loss.backward_extra}
    # Backward through the top layer: the loss buffers are gone, the hidden-state grad and head grads exist.
    top_grads = max(accum_grads, p["head_grad"])
    if setup.grad_ckpt:
        top_saved = {"checkpoints": spec.num_layers * p["ckpt"], "recomputed layer": p["layer_act"]}
        bottom_saved = {"checkpoints": p["ckpt"], "recomputed layer": p["layer_act"]}
    else:
        top_saved = {"activations": p["all_layers_act"]}
        bottom_saved = {"activations": p["layer_act"]}
    temps = p["temps"] + p["grad_hidden"]
    # Past the lm_head's backward: without checkpointing the layers' casts are still saved; with it, only the
    # recomputed layer's exist.
    top_casts = p["casts"] - p["head_cast"] if not setup.grad_ckpt else p["layer_casts"]
    busy = dict(state, **{"gathered parameters": p.get("gathered_busy", p["gathered"]),
                          "communication buffers": p["comm"]})
    # A loop that holds its logits (LitGPT, fsdp_qlora) keeps them until the whole backward is over.
    phases["layer backward (top)"] = {**busy, "gradients": top_grads, "autocast weight copies": top_casts,
                                      **top_saved, **head, "backward temporaries": temps,
                                      "logits and loss": loss.kept}
    held = p.get("root_head_view_grad", 0)
    if held:
        phases["layer backward (top)"]["FSDP1 root view gradients"] = held
    if p["layer_step_temp"]:
        # LOMO's update runs in each gradient's hook, while the layers below still hold their saved activations.
        phases["layer backward (top)"]["optimizer step temporaries"] = p["layer_step_temp"]
    if stack.base_trainable and not setup.optimizer_in_backward:
        # Near the bottom, almost every gradient exists (the embedding's comes last).
        phases["layer backward (bottom)"] = {**busy, "gradients": p["grads"] - p["embed_grad"],
                                             "autocast weight copies": p["layer_casts"], **bottom_saved,
                                             "embedding and head activations": p["head_act"],
                                             "backward temporaries": temps, "logits and loss": loss.kept,
                                             "FSDP1 root view gradients": held}
    if stack.base_trainable and not setup.optimizer_in_backward:
        # Last in backward: the embedding's dense gradient, when every other gradient exists. A tied matrix also
        # has the lm_head's gradient from early in backward; accumulating the two keeps both and their sum
        # alive at once: two V x h tensors beyond .grad.
        extra = p["tied_grad_extra"] if spec.tied_embeddings else 0
        phases["embedding backward"] = {**state, "gradients": p["grads"],
                                        "backward temporaries": extra + p["grad_hidden"],
                                        # the root's view gradients and their concatenation
                                        "FSDP1 root view gradients": 2 * p.get("root_view_grad", 0)}
    # ZeRO-3 releases every gathered parameter after backward: nothing is gathered in the step.
    phases["optimizer step"] = {**state, "gathered parameters": p.get("gathered_step", p["gathered"]),
                                "gradients": p["grads"],
                                "optimizer step temporaries": p["step_temp"]}
    if p["cp_fwd"]:
        # Attention's cross-GPU buffers exist while a layer runs; backward's (with the K/V gradients) are larger.
        for name, phase in phases.items():
            if name.startswith("layer backward"):
                phase["context-parallel buffers"] = p["cp_bwd"]
    # Before the first step: the checkpoint being read (and quantized, or sharded) into the weights.
    phases[LOAD_PHASE] = load.load_parts(spec, setup, stack, p)
    return phases


def _weights_note(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> str:
    if setup.quantized_base:
        return (f"{setup.quant} base linears ({'4' if setup.quant != 'int8' else '8'}-bit) + embeddings, norms "
                f"and lm_head in {stack.weight_bytes * 8}-bit")
    what = "trained" if stack.base_trainable else "frozen"
    return f"{what} weights, {stack.weight_bytes} B per param ({stack.precision})"


def _assumptions(spec: ModelSpec, setup: TrainingSetup, stack: Stack, p: dict) -> list[str]:
    out = list(stack.notes)
    out.append(f"recipe {setup.recipe}: {'bf16' if stack.precision == 'fp8' else stack.precision} weights, "
               f"{'autocast bf16' if stack.autocast else 'no autocast'}, optimizer {setup.optimizer}, "
               f"{_ckpt_words(setup)}, "
               f"attention {stack.attn}")
    if setup.method in ("lora", "qlora"):
        names = ",".join(sorted({m.linear.name for m in stack.lora_modules + stack.outer_lora}))
        out.append(f"LoRA rank {setup.lora_rank} on {names} in {stack.lora_layers} of {spec.num_layers} layers, "
                   f"adapters in {'fp32' if stack.adapter_bytes == 4 else '16-bit'}, dropout {setup.lora_dropout}")
    out += moe.assumptions(spec, setup) + [a for a in (fp8.assumption(setup),) if a]
    if setup.method in PEFT_METHODS or setup.method == "lisa":
        out.append(adapter_assumption(setup, stack))
    if setup.quantized_base:
        out.append((quantized_base.assumption(setup) or "bitsandbytes >= 0.43.2: 4-bit linears save no input "
                                                         "activation")
                   + ("; prepare_model_for_kbit_training upcasts norms, embeddings and lm_head to fp32"
                      if setup.kbit_upcast else "; no fp32 upcast of norms/embeddings (TRL >= 0.22)"))
    if setup.compile:
        out.append(COMPILE_ASSUMPTION)
    if p["sharded"]["paged"]:
        out.append(f"{p['sharded']['paged'] / 2**30:.2f} GiB of paged optimizer state lives in CUDA managed memory: not in "
                   "torch's counters, evicted to host RAM under pressure")
    out.append("no padding in batches (packed or equal-length); steady-state step (iteration >= 2)"
               if not setup.padding else "batches padded: a [b,1,s,s] mask and repeated K/V in SDPA")
    if spec.exact_params is not None:
        out.append("parameter count read from the safetensors headers")
    if setup.grad_accum > 1:
        out.append(f"gradient accumulation {setup.grad_accum}: gradients stay allocated between micro-batches")
    if setup.shard != "none":
        out.append(sharding.assumption(setup, stack))
    if setup.cp > 1 or setup.activation_offload:
        out.append(cp.assumption(setup))
    return out


def _ckpt_words(setup: TrainingSetup) -> str:
    if not setup.grad_ckpt:
        return "no gradient checkpointing"
    return ("reentrant " if setup.ckpt_reentrant else "") + "gradient checkpointing"
