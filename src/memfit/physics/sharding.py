"""Per-GPU model state under data parallelism: DDP, DeepSpeed ZeRO-1/2/3 and PyTorch FSDP (FSDP2), with offload.

Activations are never sharded (each GPU runs its own micro-batch); what changes is where weights, gradients
and optimizer state live, what a GPU gathers while it computes, and the communication buffers.

- DDP: everything replicated, plus gradient buckets as big as the gradients (gradient_as_bucket_view=False, the
  DDP and accelerate default; pytorch/pytorch#41954).
- DeepSpeed ZeRO with its mixed-precision Adam: 16-bit params (2 B) and grads (2 B), fp32 master params,
  grads and Adam moments (4 + 4 + 8 B) per trainable parameter; stage 1 shards the fp32 part, stage 2 also the
  16-bit grads, stage 3 also the 16-bit params and keeps 4 B x the largest layer gathered
  (deepspeedai/DeepSpeed runtime/zero/stage_1_and_2.py and stage3.py, estimate_zero{2,3}_model_states_mem_needs).
- FSDP2 FULL_SHARD: parameters, gradients and optimizer state sharded in the dtype the model holds; the root
  module (embeddings, final norm, lm_head) stays gathered for the step, plus two decoder layers in flight
  (current and prefetched) and one layer's unsharded gradient for the reduce-scatter. SHARD_GRAD_OP keeps all
  parameters gathered between forward and backward. HSDP shards within a node only.
"""

from __future__ import annotations

from ..params import count_params
from ..setup import TrainingSetup
from ..spec import ModelSpec
from .stack import Stack

# DeepSpeed's estimators: additional_buffer_factor=1.5 on host memory; 4 B x largest layer gathered (ZeRO-3).
DS_HOST_BUFFER_FACTOR = 1.5
DS_GATHER_BYTES_PER_PARAM = 4


def largest_layer_params(spec: ModelSpec) -> int:
    """Params of the largest single module (recurse=False), as DeepSpeed's estimator counts them: usually the
    embedding or lm_head matrix."""
    from ..params import layer_linears

    linears = layer_linears(spec)
    candidates = [lin.params for lin in linears if lin.parts != ("experts",)]
    # transformers v5 MoE: one `experts` module owns the stacked gate_up and down parameters.
    candidates.append(sum(lin.params for lin in linears if lin.parts == ("experts",)))
    head = spec.vocab_size * spec.hidden_size + (spec.vocab_size if spec.lm_head_bias else 0)
    return max(candidates + [head])


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


def _zero(parts: dict, spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> dict:
    """Per trainable parameter, as DeepSpeed's estimators count it: stage 1 = 2 + 2 + 16/N (16-bit params and
    grads; fp32 grads, master and Adam moments sharded), stage 2 = 2 + 18/N, stage 3 = 18/N + 4 x largest layer
    (no separate 16-bit grads: they are reduced into the fp32 partition)."""
    n, stage = setup.shard_degree, int(setup.shard[-1])
    t = parts["trainable_params"]
    # The engine casts the model to 16 bits; trainable weights then cost 2 B, frozen ones what they are stored in.
    frozen = parts["weights"] + parts["quant"] - (t * stack.weight_bytes if stack.base_trainable else 0)
    weights = frozen + 2 * t if stage < 3 else (frozen + 2 * t) // n
    grads16 = 2 * t if stage == 1 else (2 * t // n if stage == 2 else 0)
    grads32, master, adam = 4 * t // n, 4 * t // n, 8 * t // n
    gathered = DS_GATHER_BYTES_PER_PARAM * largest_layer_params(spec) if stage == 3 else 0
    host = 0
    if setup.offload == "optimizer":
        grads32 = master = adam = 0
        if stage >= 2:
            grads16 = 0
        host = int(t * max(4 * setup.world_size, 16) * DS_HOST_BUFFER_FACTOR) if stage < 3 else \
            int(t * 16 / setup.nodes * DS_HOST_BUFFER_FACTOR)
    elif setup.offload == "optimizer+params":
        grads16 = grads32 = master = adam = weights = 0
        host = int(t * 18 / setup.nodes * DS_HOST_BUFFER_FACTOR)
    grads = grads16 + grads32
    scale = grads / max(parts["grads"], 1)
    return dict(parts, weights=weights, quant=0, adapter=0, grads=grads, opt=adam, master=master,
                step_temp=0, head_grad=int(parts["head_grad"] * scale), embed_grad=int(parts["embed_grad"] * scale),
                tied_grad_extra=int(parts["tied_grad_extra"] * scale), gathered=gathered, comm=0, host=host)


def _fsdp(parts: dict, spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> dict:
    n = setup.shard_degree
    counts = count_params(spec)
    compute = 2 if (stack.autocast or stack.weight_bytes == 2) else 4
    root = counts.embedding + counts.final_norm + counts.lm_head
    layer = counts.per_layer
    sharded_weights = (parts["weights"] + parts["quant"] + parts["adapter"]) // n
    if setup.shard == "fsdp-shard-grad-op":
        gathered = gathered_busy = counts.total * compute
    else:
        # Between layers (end of forward, loss, optimizer step) the root plus the one layer being prefetched
        # are unsharded; inside a layer's backward, the current and the prefetched layer (FSDPMemTracker on a
        # fake process group shows exactly this, tests/test_sharding.py).
        gathered, gathered_busy = (root + layer) * compute, (root + 2 * layer) * compute
    grad_bytes = parts["grads"] // max(parts["trainable_params"], 1) if parts["trainable_params"] else 0
    comm = layer * grad_bytes if stack.base_trainable else 0
    weights, grads, opt = sharded_weights, parts["grads"] // n, parts["opt"] // n
    host = 0
    if setup.offload != "none":
        host = weights + grads + opt
        weights, grads, opt = 0, 0, 0
    scale = grads / max(parts["grads"], 1)
    return dict(parts, weights=weights, quant=0, adapter=0, grads=grads, opt=opt, master=0,
                gathered_busy=gathered_busy, step_temp=parts["step_temp"] // n if setup.offload == "none" else 0,
                head_grad=int(parts["head_grad"] * scale), embed_grad=int(parts["embed_grad"] * scale),
                tied_grad_extra=int(parts["tied_grad_extra"] * scale), gathered=gathered, comm=comm, host=host)


MODEL_STATE_KEYS = ("weights", "quant", "adapter", "master", "opt", "grads", "gathered")


def model_state_bytes(parts: dict) -> int:
    """Weights, gradients, optimizer state, master copy and gathered parameters per GPU: the part DeepSpeed's
    estimators cover (they leave out activations and buffers)."""
    return sum(parts[k] for k in MODEL_STATE_KEYS)
