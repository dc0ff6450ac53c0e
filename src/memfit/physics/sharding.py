"""Per-GPU model state under data parallelism: DDP, DeepSpeed ZeRO-1/2/3 and PyTorch FSDP, with offload.

Activations are never sharded (each GPU runs its own micro-batch); what changes is where weights, gradients
and optimizer state live, what a GPU gathers while it computes, and the communication buffers.

- DDP: everything replicated, plus gradient buckets as big as the gradients (gradient_as_bucket_view=False, the
  DDP and accelerate default; pytorch/pytorch#41954).
- DeepSpeed ZeRO (read from deepspeed 0.19.8, runtime/zero/stage_1_and_2.py and stage3.py): the engine holds the
  model in 16 bits (physics/stack.py) and keeps the *client* optimizer (HF Trainer's, when the DeepSpeed config
  has no "optimizer" section; transformers integrations/deepspeed.py sets zero_allow_untested_optimizer) working
  on one flat fp32 master partition per parameter group. So per trainable parameter: 16-bit param and gradient,
  4 B fp32 master / N, the optimizer's own state per fp32 element / N, and a 4 B fp32 gradient / N that exists
  only inside the step. Stage 1 shards the fp32 part, stage 2 also the 16-bit gradients, stage 3 also the
  16-bit params (frozen ones too) and gathers modules as it computes. See `_zero`.
- FSDP2 FULL_SHARD: parameters, gradients and optimizer state sharded in the dtype the model holds; the root
  module (embeddings, final norm, lm_head) stays gathered for the step, plus two decoder layers in flight
  (current and prefetched) and one layer's unsharded gradient for the reduce-scatter. Parameters are gathered in
  the dtype they are stored in: torchao's NF4Tensor all-gathers its packed NF4 data and scalers
  (torchao@36027d82d torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py:976 fsdp_pre_all_gather), and
  bitsandbytes' 4-bit weights with quant_storage=bf16 are flat bf16 storage of the packed bytes.
  SHARD_GRAD_OP keeps all parameters gathered between forward and backward. HSDP shards within a node only.
- FSDP1 as LitGPT drives it (lightning.fabric FSDPStrategy: use_orig_params=True, fabric.no_backward_sync while
  accumulating): see `_fsdp1_no_sync_grad_bytes`.
- FSDP1 (fsdp_qlora, LitGPT, the HF Trainer's HSDP) all-gathers on its own stream and frees under
  record_stream: reserved keeps one more layer than is live (`fsdp1_idle_unshard_bytes`).
"""

from __future__ import annotations

from ..params import count_params, layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec
from . import states
from .stack import Stack

# DeepSpeed's estimators: additional_buffer_factor=1.5 on host memory; 4 B x largest layer gathered (ZeRO-3).
DS_HOST_BUFFER_FACTOR = 1.5
DS_GATHER_BYTES_PER_PARAM = 4
# deepspeed 0.19.8 runtime/zero/config.py:182: sub_group_size defaults to 1e9 elements; ZeRO-3 steps the
# optimizer one sub-group at a time, so its fp32 gradient and step temporaries are bounded by it.
DS_SUB_GROUP_SIZE = 1_000_000_000
# The fp32 master partition ZeRO creates (stage_1_and_2.py:577 single_partition_of_fp32_groups,
# stage3.py:1081 _create_fp32_partitions) and the fp32 gradient the step builds on it (stage_1_and_2.py:3118,
# stage3.py:2686 `.to(fp32 dtype)`), per trainable parameter.
FP32 = 4


def largest_layer_params(spec: ModelSpec) -> int:
    """Params of the largest single module (recurse=False), as DeepSpeed's estimator counts them: usually the
    embedding or lm_head matrix."""
    linears = layer_linears(spec)
    candidates = [lin.params for lin in linears if lin.parts != ("experts",)]
    # transformers v5 MoE: one `experts` module owns the stacked gate_up and down parameters.
    candidates.append(sum(lin.params for lin in linears if lin.parts == ("experts",)))
    head = spec.vocab_size * spec.hidden_size + (spec.vocab_size if spec.lm_head_bias else 0)
    return max(candidates + [head])


def largest_module_stored_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Bytes of the largest single module as it is stored (and so all-gathered): a 4-bit linear is its packed
    data, the embedding / lm_head and 16-bit linears are 2 B (or the weight dtype) per element."""
    h = stack.weight_bytes
    head = (spec.vocab_size * spec.hidden_size + (spec.vocab_size if spec.lm_head_bias else 0)) * h
    linears = layer_linears(spec)
    sizes = []
    experts = 0
    for lin in linears:
        if setup.quantized_base and lin.parts != ("router",):
            data, _ = states.quant_storage_bytes(lin.d_in * lin.d_out, setup.quant, lin.d_out)
            size = data * lin.copies + (lin.d_out * lin.copies * h if lin.bias else 0)
        else:
            size = lin.params * h
        if lin.parts == ("experts",):
            experts += size
        else:
            sizes.append(size)
    return max(sizes + [experts, head])


def apply(parts: dict, spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> dict:
    """Per-GPU parts for the layout in `setup` (unchanged for one GPU without sharding)."""
    shard = setup.shard
    if shard == "none":
        return dict(parts, master=0, gathered=0, comm=0, host=0)
    if shard == "ddp":
        return dict(parts, master=0, gathered=0, comm=parts["grads"], host=0)
    if shard.startswith("zero"):
        return _zero(parts, spec, setup, stack)
    return _fsdp(parts, spec, setup, stack)


def fp32_partition_state(setup: TrainingSetup, elements: int) -> tuple[int, int, int, str]:
    """(device state bytes, paged state bytes, step temporaries) of the user's optimizer stepping ZeRO's flat fp32
    partition of `elements` elements, and a note. The partition is one 1-D fp32 tensor per parameter group
    (stage_1_and_2.py:577, stage3.py:1081), which decides every optimizer's footprint:
    - torch AdamW (foreach, fused, for-loop): exp_avg + exp_avg_sq in fp32, 8 B (torch/optim/adamw.py); foreach
      takes _foreach_sqrt(exp_avg_sq) of the whole tensor (4 B), the for-loop builds a denom (4 B) and a step
      copy (4 B), the fused kernel none.
    - torch SGD with momentum: momentum_buffer, 4 B (torch/optim/sgd.py; in-place foreach ops).
    - bitsandbytes 32-bit AdamW: 8 B; 8-bit AdamW: two uint8 states + an fp32 absmax per 256-element block
      (bitsandbytes optim/optimizer.py Optimizer2State, blocksize 256); paged variants put them in CUDA managed
      memory (functional.get_paged), outside torch's counters.
    - transformers Adafactor: a 1-D tensor is not factored (`factored = len(shape) >= 2`,
      transformers/optimization.py Adafactor._get_options), so exp_avg_sq is a full fp32 copy, 4 B, and the step
      builds `update = grad**2 + eps` (4 B); no first moment with the default beta1=None.
    """
    opt = setup.optimizer
    if opt in ("adamw", "adamw-fused", "adamw-loop", "adamw-bnb", "paged-adamw"):
        state = 8 * elements
        temp = {"adamw": 4, "adamw-loop": 8}.get(opt, 0) * elements
        note = "AdamW moments in fp32 on the master partition"
    elif opt == "sgd":
        state, temp, note = 4 * elements, 0, "SGD momentum in fp32 on the master partition"
    elif opt in ("adamw-8bit", "paged-adamw-8bit"):
        state = 2 * elements + 2 * 4 * -(-elements // states.BNB_BLOCK)
        temp, note = 0, "8-bit AdamW states (uint8 + fp32 absmax per 256) on the master partition"
    elif opt == "adafactor":
        state, temp = 4 * elements, 4 * elements
        note = "Adafactor on a flat 1-D partition is unfactored: a full fp32 second moment"
    else:
        raise AssertionError(f"unhandled optimizer {opt}")  # setup validation makes this unreachable
    paged = state if opt.startswith("paged") else 0
    return state - paged, paged, temp, note


def _zero(parts: dict, spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> dict:
    """DeepSpeed ZeRO per GPU, read from deepspeed 0.19.8 (runtime/zero/stage_1_and_2.py, stage3.py), with the
    16-bit dtype h the engine casts the model to (2 B; 4 B when neither bf16 nor fp16 is enabled), t trainable
    parameters and N the data-parallel degree:

    - 16-bit parameters: all of them on every GPU at stages 1-2; at stage 3 partitioned, frozen ones included
      (h x params / N). Quantization constants (bitsandbytes quant_state) are attributes, not parameters, so
      ZeRO-3 does not partition them: every GPU keeps all of them.
    - 16-bit gradients: stage 1 the full .grad tensors (h x t), stage 2 the partition buffer grads_in_partition
      (stage_1_and_2.py:2192, h x t / N, from backward to the step), stage 3 grad_partitions_flat_buffer in the
      gradient-accumulation dtype, the model dtype unless data_types.grad_accum_dtype is set (stage3.py:789,
      engine.py:1806; h x t / N), allocated when the optimizer is built and alive in every phase.
    - fp32 master partition: 4 x t / N; the user's optimizer state on it (fp32_partition_state).
    - Inside the step only: the fp32 gradient of the partition, 4 x t / N (stage_1_and_2.py:3118-3142, freed after
      the group's step; stage3.py:2686 per sub-group of at most sub_group_size elements), plus the optimizer's
      own temporaries.
    - Stage 3 gathers modules as it computes: the largest module's 16-bit params in forward, and in backward
      also its unsharded 16-bit gradient before the reduce-scatter (DeepSpeed's estimator: 4 B x largest layer).
      After backward every partitioned parameter is released, so nothing is gathered in the step.
    - Reduce buckets: reduce_bucket_size elements of the 16-bit dtype (hidden^2 in the config memfit writes and
      in HF's "auto"), two of them under overlap_comm at stage 2 (stage_1_and_2.py:3266-3275), one per dtype at
      stage 3 (stage3.py:782).

    DeepSpeed's own estimate_zero{2,3}_model_states_mem_needs count 18 B / N per parameter for Adam, which is the
    step-time total at stage 2 (16-bit grad 2 + fp32 grad 4 + master 4 + moments 8); at stage 3 the code above
    holds 2 B / N more in the step (the 16-bit param partition alongside those 18). tests/test_sharding.py holds
    memfit within 10% of both DeepSpeed estimators.

    Offload (`offload_optimizer` / `offload_param`) needs DeepSpeed's CPU Adam: with a client torch optimizer the
    engine raises unless zero_force_ds_cpu_optimizer is false (engine.py _configure_optimizer), so memfit's config
    names AdamW and the host figures are DeepSpeed's estimator's.
    """
    n, stage = setup.shard_degree, int(setup.shard[-1])
    h = stack.weight_bytes
    t = parts["trainable_params"]
    part = -(-t // n)                        # elements of this GPU's fp32 partition
    weights, adapter, quant = parts["weights"], parts["adapter"], parts["quant"]
    if stage == 3:
        weights, adapter = -(-weights // n), -(-adapter // n)
    grads16 = h * t if stage == 1 else h * part
    master = FP32 * part
    opt, paged, opt_temp, _ = fp32_partition_state(setup, part)
    step_elements = min(part, DS_SUB_GROUP_SIZE) if stage == 3 else part
    step_share = step_elements / max(part, 1)
    step_temp = FP32 * step_elements + int(opt_temp * step_share)
    bucket = spec.hidden_size * spec.hidden_size * h
    comm = 2 * bucket if stage == 2 else (bucket if stage == 3 else 0)
    gathered = gathered_busy = 0
    if stage == 3:
        largest = largest_module_stored_bytes(spec, setup, stack)
        gathered = largest
        # The largest module's own gradient exists unsharded only when it trains (full fine-tuning).
        gathered_busy = 2 * largest if stack.base_trainable else largest
    host = 0
    if setup.offload == "optimizer":
        master = opt = paged = step_temp = 0
        if stage >= 2:
            grads16 = 0
        host = int(t * max(4 * setup.world_size, 16) * DS_HOST_BUFFER_FACTOR) if stage < 3 else \
            int(t * 16 / setup.nodes * DS_HOST_BUFFER_FACTOR)
    elif setup.offload == "optimizer+params":
        grads16 = master = opt = paged = step_temp = weights = adapter = 0
        host = int(t * 18 / setup.nodes * DS_HOST_BUFFER_FACTOR)
    scale = grads16 / max(parts["grads"], 1)
    return dict(parts, weights=weights, quant=quant, adapter=adapter, grads=grads16, opt=opt, paged=paged,
                master=master, step_temp=step_temp, head_grad=int(parts["head_grad"] * scale),
                embed_grad=int(parts["embed_grad"] * scale), tied_grad_extra=int(parts["tied_grad_extra"] * scale),
                gathered=gathered, gathered_busy=gathered_busy, gathered_step=0, comm=comm, host=host,
                # stage3.py:789 allocates grad_partitions_flat_buffer in __init__; stage 2's grads_in_partition
                # is allocated in backward and released with the reduce buckets (stage_1_and_2.py:930, 2192).
                grads_persistent=stage == 3 and setup.offload == "none")


# Recipes whose multi-GPU path is FSDP1 driven by lightning.fabric: FSDPStrategy(auto_wrap_policy={Block},
# activation_checkpointing_policy={Block}) with fabric's default use_orig_params=True (lightning 2.1.0
# fabric/strategies/fsdp.py:171), and `with fabric.no_backward_sync(model, enabled=is_accumulating)` around every
# micro-batch but the last of an accumulation window (lit-gpt@0cc02afa finetune/lora.py:214-215;
# litgpt@26857050 litgpt/finetune/lora.py:353-354, full.py:280-281), which is FSDP1's module.no_sync()
# (lightning 2.1.0 fabric/strategies/fsdp.py:760).
FSDP1_NO_SYNC_RECIPES = ("litgpt", "litgpt-0.4", "lit-gpt")   # litgpt@e5493986 finetune/lora.py:303, lit-gpt@8641822 :215


# Where the FSDP is FSDP1 with limit_all_gathers=True (torch's default, torch 2.13 FullyShardedDataParallel
# __init__): Answer.AI's train.py (AnswerDotAI/fsdp_qlora@1a9fddfb train.py:734), lightning.fabric's FSDPStrategy
# (LitGPT), and the HF Trainer under the accelerate config memfit writes for --shard hsdp (engine_config.py:
# fsdp_version 1, HYBRID_SHARD; accelerate 1.16 utils/dataclasses.py:1629 limit_all_gathers=True). For --shard
# fsdp memfit writes fsdp_version 2, and torchtune shards with fully_shard: FSDP2 frees without record_stream.
FSDP1_RECIPES = ("fsdp-qlora",) + FSDP1_NO_SYNC_RECIPES
FSDP1_HSDP_RECIPES = ("hf", "trl", "trl-1.14", "trl-0.21")


def fsdp1_rate_limited(setup: TrainingSetup) -> bool:
    if setup.offload != "none":
        return False
    return (setup.recipe in FSDP1_RECIPES and setup.shard in ("fsdp", "hsdp")) or (
        setup.recipe in FSDP1_HSDP_RECIPES and setup.shard == "hsdp")


def fsdp1_idle_unshard_bytes(parts: dict, gathered_at_peak: int) -> int:
    """Reserved bytes of FSDP1's unshard stream that hold no tensor at the allocated peak.

    FSDP1 all-gathers each unit into a padded unsharded flat parameter allocated on its unshard stream
    (torch 2.13 distributed/fsdp/_runtime_utils.py:297-305, `with stream(unshard_stream): handle.unshard()`), so
    the caching allocator files those blocks in that stream's pool, which the compute stream's tensors never
    reuse. When a unit reshards, the block is freed under record_stream on the compute stream
    (_flat_param.py:1805-1821): it returns to the pool only once the GPU has run past the free. The rate limiter
    lets the CPU run two such frees ahead before it waits on the older (_limiter_utils.py:15-24, _FreeEventQueue
    _max_num_inflight_all_gathers = 2; _runtime_utils.py:297-302, 320-326), so the next all-gather cannot take
    the block freed just before it: in backward the pool grows to the root, the current and the prefetched
    layer, plus the one pending free. Those segments stay reserved (nothing calls empty_cache), so at the
    allocated peak the pool's idle part is its size minus the unsharded parameters live then."""
    return max(parts.get("unshard_pool", 0) - gathered_at_peak, 0)


def root_view_grad_bytes(spec: ModelSpec, grad_bytes_per_param: int) -> tuple[int, int]:
    """FSDP1's root unit under full fine-tuning: (all its view gradients, the lm_head's alone), unsharded.

    FSDP1 hands modules views of the unsharded flat parameter: torch.split(flat, numels) then .view(shape)
    (torch 2.13 distributed/fsdp/_flat_param.py:1876-1901). Autograd's split backward runs once every view's
    gradient has arrived and concatenates them into one gradient of the whole flat parameter; until then the
    engine holds each view's gradient. The root unit holds the lm_head (its gradient comes first in backward) and
    the embedding (last), so the lm_head's gradient is held, unsharded, through every layer's backward, and at the
    embedding's backward the view gradients and their concatenation are alive together (tests/test_sharding.py
    runs this on CPU tensors). The decoder units' views are used within one layer and cost a layer at most."""
    counts = count_params(spec)
    head = (counts.lm_head or spec.vocab_size * spec.hidden_size) + counts.final_norm
    root = counts.embedding + counts.final_norm + counts.lm_head
    return root * grad_bytes_per_param, head * grad_bytes_per_param


def _fsdp1_no_sync_grad_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Gradient bytes per GPU while LitGPT accumulates under FSDP1's no_sync().

    Two FSDP1 behaviours (torch 2.13 torch/distributed/fsdp) combine:
    - no_sync() keeps "the full model gradients (instead of gradient shards) until the eventual sync"
      (fully_sharded_data_parallel.py:1043-1045): every unit's unsharded flat-parameter gradient lives across
      the micro-batches of a window, and through the last one's forward.
    - With use_orig_params=True a unit mixing frozen and trainable parameters gets one FlatParameter that
      requires grad if any of them does (_flat_param.py:832), and its original parameters are re-registered as
      views with that requires_grad (_flat_param.py:1982/1992): "higher than expected gradient memory usage"
      (fully_sharded_data_parallel.py:210-213). So under LoRA every decoder block (it holds adapters) gets a
      gradient for all its weights; the root unit (embeddings, final norm, lm_head) has none unless it trains.
    """
    counts = count_params(spec)
    per = stack.weight_bytes
    if stack.base_trainable:
        return counts.total * per
    return spec.num_layers * counts.per_layer * per + states.lora_params(stack) * stack.adapter_bytes


def _fsdp(parts: dict, spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> dict:
    n = setup.shard_degree
    counts = count_params(spec)
    compute = stack.compute_bytes
    root = counts.embedding + counts.final_norm + counts.lm_head
    layer = counts.per_layer
    root_bytes = root * compute
    if setup.quantized_base:
        # Gathered as stored: the layer's packed 4-bit data, its constants, its 16-bit norms and adapters.
        layer_bytes = (parts["weights"] + parts["quant"] + parts["adapter"] - root * stack.weight_bytes) \
            // spec.num_layers
    else:
        layer_bytes = layer * compute
    sharded_weights = (parts["weights"] + parts["quant"] + parts["adapter"]) // n
    if setup.shard == "fsdp-shard-grad-op":
        gathered = gathered_busy = root_bytes + spec.num_layers * layer_bytes
    else:
        # Between layers (end of forward, loss, optimizer step) the root plus the one layer being prefetched
        # are unsharded; inside a layer's backward, the current and the prefetched layer (FSDPMemTracker on a
        # fake process group shows exactly this, tests/test_sharding.py).
        gathered, gathered_busy = root_bytes + layer_bytes, root_bytes + 2 * layer_bytes
    grad_bytes = parts["grads"] // max(parts["trainable_params"], 1) if parts["trainable_params"] else 0
    comm = layer * grad_bytes if stack.base_trainable else 0
    weights, grads, opt = sharded_weights, parts["grads"] // n, parts["opt"] // n
    if setup.recipe in FSDP1_NO_SYNC_RECIPES and setup.grad_accum > 1 and setup.offload == "none":
        # Unsharded gradients of every unit that trains, held across the accumulation window.
        grads = _fsdp1_no_sync_grad_bytes(spec, setup, stack)
        comm = 0      # no reduce-scatter buffer beyond them: the unsharded gradients are the buffer
    # FSDP1's unshard-stream pool holds one more freed layer than is live (see fsdp1_idle_unshard_bytes).
    unshard_pool = gathered_busy + layer_bytes if fsdp1_rate_limited(setup) else 0
    # FSDP1's root unit reaches autograd through split views of its flat parameter (see root_view_grad_bytes).
    root_view, head_view = (0, 0) if not fsdp1_rate_limited(setup) or not stack.base_trainable \
        or setup.optimizer_in_backward else root_view_grad_bytes(spec, grad_bytes)
    host = 0
    if setup.offload != "none":
        host = weights + grads + opt
        weights, grads, opt = 0, 0, 0
    scale = grads / max(parts["grads"], 1)
    paged = parts["paged"] // n if setup.offload == "none" else 0
    return dict(parts, weights=weights, quant=0, adapter=0, grads=grads, opt=opt, paged=paged, master=0,
                gathered_busy=gathered_busy, step_temp=parts["step_temp"] // n if setup.offload == "none" else 0,
                head_grad=min(int(parts["head_grad"] * scale), grads),
                embed_grad=min(int(parts["embed_grad"] * scale), grads),
                tied_grad_extra=int(parts["tied_grad_extra"] * scale), gathered=gathered, comm=comm, host=host,
                unshard_pool=unshard_pool, root_view_grad=root_view, root_head_view_grad=head_view)


def notes(setup: TrainingSetup, stack: Stack) -> dict[str, str]:
    """Component notes that differ under a sharded layout."""
    if not setup.shard.startswith("zero"):
        return {}
    h = stack.weight_bytes
    if setup.offload != "none":
        return {"gradients": f"16-bit gradients ({h} B), ZeRO stage {setup.shard[-1]}"}
    _, _, _, note = fp32_partition_state(setup, 1)
    return {"gradients": f"16-bit gradients ({h} B per trainable param), ZeRO stage {setup.shard[-1]} layout",
            "optimizer state": f"{setup.optimizer}: {note} (DeepSpeed ZeRO keeps the client optimizer)",
            "master weights": "fp32 master partition of the trainable weights (DeepSpeed ZeRO)",
            "optimizer step temporaries": "the fp32 gradient of the partition, built for the step, and the "
                                          "optimizer's own temporaries",
            "communication buffers": "ZeRO reduce buckets (reduce_bucket_size = hidden^2)"}


def assumption(setup: TrainingSetup, stack: Stack) -> str:
    """The sentence the estimate's assumptions carry for a sharded layout."""
    where = f"{setup.world_size} GPUs" + (f" on {setup.nodes} nodes" if setup.nodes > 1 else "")
    out = f"per-GPU figures: {setup.shard} over {where}, state sharded {setup.shard_degree} ways"
    if setup.offload != "none":
        out += f", {setup.offload} offloaded to CPU"
    if setup.shard.startswith("zero"):
        if setup.offload != "none":
            out += ("; ZeRO-Offload needs DeepSpeed's CPU Adam (the engine rejects a client optimizer unless "
                    f"zero_force_ds_cpu_optimizer is false), so the optimizer is AdamW on the CPU, not "
                    f"{setup.optimizer}")
        else:
            _, _, _, note = fp32_partition_state(setup, 1)
            out += (f"; DeepSpeed keeps the {setup.optimizer} optimizer on a flat fp32 master partition ({note}), "
                    f"{stack.weight_bytes * 8}-bit params and gradients, no autocast")
    elif setup.recipe in FSDP1_NO_SYNC_RECIPES and setup.shard in ("fsdp", "hsdp"):
        out += ("; FSDP1 through lightning.fabric (use_orig_params=True)"
                + (f": gradient accumulation {setup.grad_accum} runs under no_sync(), which keeps every "
                   "training unit's unsharded gradient (frozen weights in those units included)"
                   if setup.grad_accum > 1 else ""))
    if fsdp1_rate_limited(setup):
        out += ("; FSDP1 with limit_all_gathers: its unshard stream's pool keeps the root, two layers and one "
                "free pending under record_stream reserved all step")
    return out


MODEL_STATE_KEYS = ("weights", "quant", "adapter", "master", "opt", "grads")


def model_state_bytes(parts: dict) -> int:
    """Weights, gradients, optimizer state, master copy and gathered parameters per GPU at the largest of the
    step's moments (forward, backward, optimizer step): the quantity DeepSpeed's estimators cover (they leave
    out activations and buffers). `parts` is the estimator's sharded static parts."""
    persistent = sum(parts[k] for k in MODEL_STATE_KEYS)
    forward = persistent - (0 if parts.get("grads_persistent") else parts["grads"]) + parts["gathered"]
    backward = persistent + parts.get("gathered_busy", parts["gathered"])
    step = persistent + parts["step_temp"] + parts.get("gathered_step", parts["gathered"])
    return max(forward, backward, step)
