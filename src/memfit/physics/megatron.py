"""Megatron-Core layouts: tensor, pipeline, context and expert parallelism with the distributed optimizer.

Per GPU, on each pipeline stage that can be the most loaded: the first, which holds the embedding and, under the
1F1B schedule, the most micro-batches in flight (min(micro-batches, pp): it starts pp of them before its first
backward), and the last, which holds the output layer and the logits of one micro-batch (stages between hold
fewer micro-batches than the first and neither end). In flight on pipeline rank r: min(warm-up + 1, micro-batches
x chunks) model chunks, warm-up = pp - r - 1 (plain 1F1B) or 2 (pp - r - 1) + (vpp - 1) pp (interleaved,
megatron/core/pipeline_parallel/schedules.py:955-977); a chunk is L / (pp x vpp) layers. The last stage always
holds the output layer's weight, tied or not: with shared embeddings it allocates its own copy and all-reduces
the gradient with the first (megatron/core/models/gpt/gpt_model.py:277-290 skips the allocation only on the
first stage; common/language_module/language_module.py:253-257).

Model state follows Megatron-LM's own theoretical memory report (NVIDIA/Megatron-LM@d98e8a64,
megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory): bf16 parameters (2 B), fp32
main gradients (4 B; bf16 training accumulates and all-reduces gradients in fp32, megatron/training/arguments.py
:1205-1216) and fp32 main parameters plus Adam's two moments (12 B), the last 12 B divided by the data-parallel
degree under the distributed optimizer. The distributed optimizer shards over the data- *and* context-parallel
ranks (megatron/core/optimizer/__init__.py:934 intra_dp_cp_group); routed experts over the expert-data-parallel
ranks, world / (expert-tensor x expert x pipeline parallel). Attention and MLP weights and the embedding are
split over the tensor-parallel GPUs (the vocabulary padded to a multiple of 128 x tp,
megatron/core/tokenizers/utils/build_tokenizer.py:133-138); norms and routers are replicated.

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) as the same file computes them
(compute_activation_memory, compute_activation_memory_without_sp), per layer and micro-batch with s the tokens on
this GPU (S / cp: context parallelism splits the sequence, which that file does not model), b the micro-batch,
h the hidden size, f the MLP width, t the tensor-parallel degree:
  with sequence parallelism   s b h (18 + 4 f/h) / t
  without it                  s b h (10 + (8 + 4 f/h) / t)    (the 10 s b h of norms, dropout masks and block
                              inputs is not split; Megatron's file writes 10 + 24/t, its f = 4h case)
Both assume no s x s attention scores are saved: Transformer Engine's fused attention saves none, so recompute
"none" and "selective" (which recomputes only core attention) hold the same here. Full recompute keeps each
layer's input, 2 s b h (/ t with sequence parallelism), and rebuilds one layer at a time in backward.
Outside the layers: the embedding's int64 input and dropout mask per micro-batch in flight on the first stage,
and on the last stage the output layer's input and logits of one micro-batch. Megatron's without-sequence-parallel
report adds 5% for "optimizer and miscellaneous temporaries"; memfit keeps that as its own component.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSetupError, Problem
from ..options import BY_NAME
from ..params import layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec

MEGATRON_OPTIONS = ("tp", "pp", "ep", "vpp", "sequence_parallel", "recompute", "distributed_optimizer", "pp_stage",
                    "moe_capacity_factor", "moe_pad_expert_input_to_capacity")
STAGES = ("first", "last")
# megatron/training/models/gpt.py:163 make_vocab_size_divisible_by = 128 (times tp: build_tokenizer.py:138).
VOCAB_DIVISIBLE_BY = 128
PARAM_BYTES = 2                 # bf16 model parameters
MAIN_GRAD_BYTES = 4             # fp32 main-gradient buffer
MASTER_BYTES = 4                # fp32 main parameters
ADAM_BYTES = 8                  # fp32 exp_avg + exp_avg_sq
TEMPORARIES_SHARE = 0.05        # theoretical_memory_usage.py compute_activation_memory_without_sp overhead_factor
INDEX_BYTES = 8                 # int64 token ids at the embedding


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int                    # virtual pipeline stages per GPU (1: the plain 1F1B schedule)
    dp: int                     # data-parallel replicas: world / (tp x pp x cp)
    expert_dp: int              # world / (tp x ep x pp): expert-tensor parallel = tp (Megatron's default)
    sequence_parallel: bool     # effective: only with tp > 1
    recompute: str
    distributed_optimizer: bool
    microbatches: int           # per optimizer step on one pipeline (grad_accum)
    capacity_factor: float | None = None    # MoE expert capacity factor (None: dropless)
    pad_to_capacity: bool = False

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations the first stage holds at once under 1F1B."""
        return 1 if self.pp == 1 else min(self.microbatches, self.pp)

    def rank(self, stage: str) -> int:
        return 0 if stage == "first" else self.pp - 1

    def held_stages(self, stage: str = "first") -> float:
        """How many stages' worth of activations (L/pp layers for one micro-batch each) a stage's GPU holds:
        its model chunks in flight (schedules.py:955-977) over vpp. On the first GPU of the interleaved schedule
        that is pp x (1 + (pp - 1) / (pp x vpp)), the penalty Narayanan et al. 2021 give and
        theoretical_memory_usage.py applies; the last GPU holds (vpp - 1) pp + 1 chunks."""
        if self.pp == 1:
            return 1
        warmup = self.pp - self.rank(stage) - 1
        if self.vpp > 1:
            warmup = 2 * warmup + (self.vpp - 1) * self.pp
        return min(warmup + 1, self.microbatches * self.vpp) / self.vpp

    def words(self) -> str:
        return (f"tp {self.tp} x pp {self.pp} x cp {self.cp} x dp {self.dp}"
                + (f", ep {self.ep}" if self.ep > 1 else ""))


def layout(setup: TrainingSetup) -> Layout:
    tp, pp, cp, ep = setup.tp, setup.pp, setup.cp, setup.ep
    world = setup.world_size
    return Layout(tp=tp, pp=pp, cp=cp, ep=ep, vpp=setup.vpp, dp=world // (tp * pp * cp), expert_dp=world // (tp * ep * pp),
                  sequence_parallel=bool(setup.sequence_parallel) and tp > 1, recompute=setup.recompute,
                  distributed_optimizer=bool(setup.distributed_optimizer), microbatches=setup.grad_accum,
                  capacity_factor=setup.moe_capacity_factor,
                  pad_to_capacity=bool(setup.moe_pad_expert_input_to_capacity))


def setup_problems(setup: TrainingSetup) -> list[Problem]:
    """Rules that need only the setup (setup.py calls this from problems())."""
    p: list[Problem] = []
    if setup.recipe != "megatron":
        for name in MEGATRON_OPTIONS:
            if name in setup.explicit and getattr(setup, name) != BY_NAME[name].default:
                p.append(Problem(name, f"{{{name}}} is a Megatron layout option: it needs {{recipe}} megatron"))
        return p
    from ..recipes import RECIPES

    if setup.method not in RECIPES["megatron"].methods:
        p.append(Problem("method", f"{{recipe}} megatron models full training (Megatron-LM pretrain_gpt); "
                                   f"{{method}} {setup.method} is not modelled for it"))
    group = setup.tp * setup.pp * setup.cp
    if setup.world_size % group:
        p.append(Problem("tp", f"{{tp}} x {{pp}} x {{cp}} = {group} must divide the {setup.world_size} GPUs "
                               "({gpus} x {nodes}); the rest is data parallel"))
    elif setup.ep > 1 and setup.world_size % (setup.tp * setup.ep * setup.pp):
        p.append(Problem("ep", f"{{tp}} x {{ep}} x {{pp}} = {setup.tp * setup.ep * setup.pp} must divide the "
                               f"{setup.world_size} GPUs (experts are split over tensor x expert parallel ranks)"))
    if setup.vpp > 1 and setup.pp <= 2:
        # megatron/training/arguments.py:1004-1009 with overlap_p2p_comm off (model_parallel_config.py:385).
        p.append(Problem("vpp", "{vpp} (the interleaved schedule) needs {pp} 3 or more"))
    if setup.moe_pad_expert_input_to_capacity and setup.moe_capacity_factor is None:
        # megatron/core/transformer/transformer_config.py:1862-1866
        p.append(Problem("moe_pad_expert_input_to_capacity", "{moe_pad_expert_input_to_capacity} needs "
                                                              "{moe_capacity_factor} (Megatron pads to capacity)"))
    if setup.shard not in ("none", "ddp"):
        p.append(Problem("shard", f"{{recipe}} megatron shards optimizer state with {{distributed_optimizer}}, "
                                  f"not {{shard}} {setup.shard}"))
    if setup.offload != "none":
        p.append(Problem("offload", "{offload} is DeepSpeed/FSDP offload; it does not apply to {recipe} megatron"))
    if setup.grad_ckpt:
        p.append(Problem("grad_ckpt", "Megatron recomputes activations with {recompute} selective|full, not "
                                      "{grad_ckpt}"))
    if setup.precision in ("fp32",):
        p.append(Problem("precision", "memfit models Megatron's mixed precision (bf16 or fp16 parameters, fp32 "
                                      "main gradients and weights): {precision} fp32 is not it"))
    return p


def check_model(spec: ModelSpec, setup: TrainingSetup) -> None:
    """Rules that need the model's shape, each one clear error."""
    problems = []
    if spec.num_heads % setup.tp:
        problems.append(Problem("tp", f"{{tp}} {setup.tp} must divide the {spec.num_heads} attention heads of "
                                      f"{spec.name}"))
    elif spec.num_kv_heads % setup.tp:
        problems.append(Problem("tp", f"{{tp}} {setup.tp} must divide the {spec.num_kv_heads} key/value heads "
                                      f"(query groups) of {spec.name}"))
    if spec.num_layers % setup.pp:
        problems.append(Problem("pp", f"{{pp}} {setup.pp} must divide the {spec.num_layers} layers of {spec.name}"))
    elif spec.num_layers % (setup.pp * setup.vpp):
        problems.append(Problem("vpp", f"{{pp}} x {{vpp}} = {setup.pp * setup.vpp} must divide the "
                                       f"{spec.num_layers} layers of {spec.name}"))
    if setup.ep > 1 and not spec.is_moe:
        problems.append(Problem("ep", f"{{ep}} {setup.ep}: {spec.name} has no experts to split"))
    elif setup.ep > 1 and spec.num_experts % setup.ep:
        problems.append(Problem("ep", f"{{ep}} {setup.ep} must divide the {spec.num_experts} experts of "
                                      f"{spec.name}"))
    if setup.moe_capacity_factor is not None and not spec.is_moe:
        problems.append(Problem("moe_capacity_factor", f"{{moe_capacity_factor}}: {spec.name} has no experts"))
    if spec.is_moe and setup.tp > 1 and not setup.sequence_parallel:
        # megatron/core/transformer/moe/moe_layer.py:636-640 raises in training.
        problems.append(Problem("sequence_parallel", f"{spec.name} is MoE: Megatron trains MoE with {{tp}} > 1 "
                                                     "only with {sequence_parallel}"))
    if problems:
        raise InvalidSetupError(problems)


def padded_vocab(spec: ModelSpec, tp: int) -> int:
    multiple = VOCAB_DIVISIBLE_BY * tp
    return -(-spec.vocab_size // multiple) * multiple


@dataclass(frozen=True)
class StageParams:
    """Parameters on one GPU of the first pipeline stage, by how they are split."""
    dense: int        # tensor-parallel split or replicated: their optimizer state shards over dp x cp
    expert: int       # routed experts: optimizer state shards over expert data parallel

    @property
    def total(self) -> int:
        return self.dense + self.expert


def stage_params(spec: ModelSpec, lay: Layout, stage: str = "first") -> StageParams:
    """Parameters on one GPU of a stage, counted as Megatron's report counts them: 1/pp of the layers plus, on
    the first stage, the embedding and, on the last, the output layer (one matrix for both when pp = 1 and they
    are tied); the final norm is spread over the stages as the report spreads it."""
    tp_split = replicated = experts = 0
    for lin in layer_linears(spec):
        if lin.parts == ("experts",):
            experts += lin.params
        elif lin.parts == ("router",):
            replicated += lin.params
        else:
            tp_split += lin.params
    norms = spec.norms_per_layer * spec.hidden_size * (2 if spec.norm_bias else 1)
    if spec.qk_norm == "head":
        norms += 2 * spec.head_dim
    elif spec.qk_norm == "full":
        norms += spec.q_dim + spec.kv_dim
    replicated += norms
    final_norm = spec.hidden_size * (2 if spec.norm_bias else 1)
    embedding = padded_vocab(spec, lay.tp) * spec.hidden_size
    if lay.pp == 1:
        heads = 1 if spec.tied_embeddings else 2
    else:
        heads = 1       # the embedding on the first stage, the output layer (own copy when tied) on the last
    dense = ((tp_split * spec.num_layers / lay.pp + heads * embedding) / lay.tp
             + (replicated * spec.num_layers + final_norm) / lay.pp)
    expert = experts * spec.num_layers / lay.pp / (lay.tp * lay.ep)
    return StageParams(dense=round(dense), expert=round(expert))


def model_state_bytes(spec: ModelSpec, lay: Layout, stage: str = "first") -> dict[str, int]:
    """Weights, fp32 main gradients, fp32 master weights and Adam state on one GPU of a stage."""
    params = stage_params(spec, lay, stage)
    shard = lay.dp * lay.cp if lay.distributed_optimizer else 1
    expert_shard = lay.expert_dp if lay.distributed_optimizer else 1
    return {"weights": PARAM_BYTES * params.total,
            "gradients": MAIN_GRAD_BYTES * params.total,
            "master weights": round(MASTER_BYTES * (params.dense / shard + params.expert / expert_shard)),
            "optimizer state": round(ADAM_BYTES * (params.dense / shard + params.expert / expert_shard))}


def mlp_width(spec: ModelSpec) -> int:
    """The MLP width f a token passes through: the dense intermediate size, or the routed experts' (top-k x
    expert width) plus the shared expert's for MoE."""
    if spec.is_moe:
        return spec.experts_per_token * spec.moe_intermediate_size + (spec.shared_expert_intermediate_size or 0)
    return spec.intermediate_size


def layer_activation_bytes(spec: ModelSpec, setup: TrainingSetup, lay: Layout) -> float:
    """One layer, one micro-batch, this GPU's tokens, no recompute (Korthikanti Table 2 with f general)."""
    sbh = setup.batch_size * (setup.seq_len / lay.cp) * spec.hidden_size
    f = mlp_width(spec) / spec.hidden_size
    if lay.sequence_parallel:
        return sbh * (18 + 4 * f) / lay.tp
    return sbh * (10 + (8 + 4 * f) / lay.tp)


def activation_bytes(spec: ModelSpec, setup: TrainingSetup, lay: Layout, stage: str = "first") -> dict[str, int]:
    """The token-dependent parts of a stage's peak, named as memfit's components."""
    from . import megatron_moe

    b, s, h = setup.batch_size, setup.seq_len / lay.cp, spec.hidden_size
    v = padded_vocab(spec, lay.tp)
    layers_here = spec.num_layers // lay.pp
    one_layer = layer_activation_bytes(spec, setup, lay)
    split = lay.tp if lay.sequence_parallel else 1       # what sequence parallelism splits outside the TP regions
    out: dict[str, float] = {}
    held = lay.held_stages(stage)
    if lay.recompute == "full":
        out["checkpoints"] = 2 * s * b * h / split * layers_here * held
        out["recomputed layer"] = one_layer
    else:
        out["activations"] = one_layer * layers_here * held
    if stage == "first" or lay.pp == 1:
        out["embedding and head activations"] = (INDEX_BYTES * s * b + s * b * h) * held / split
    if stage == "last" or lay.pp == 1:
        if lay.sequence_parallel:
            out["logits and loss"] = 4 * s * b * h * (1 + v / h) / lay.tp
        else:
            out["logits and loss"] = 2 * (s * b * v / lay.tp + s * b * h)
    if not lay.sequence_parallel:
        out["activation temporaries"] = TEMPORARIES_SHARE * sum(out.values())
    # Outside Megatron's report (it prices no MoE activations): the router and token dispatch buffers.
    out["MoE dispatch buffers"] = megatron_moe.dispatch_bytes(spec, setup, lay, layers_here * held,
                                                              lay.recompute == "full")
    return {name: round(value) for name, value in out.items()}


def cp_buffer_bytes(spec: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """Ring attention's K/V chunks in flight in backward (Transformer Engine p2p), split over tp by heads."""
    from .context_parallel import buffer_bytes

    _, backward = buffer_bytes(spec, setup, PARAM_BYTES)
    return backward // lay.tp


def assumption(spec: ModelSpec, setup: TrainingSetup, lay: Layout, stage: str = "first") -> str:
    opt = ("distributed optimizer: fp32 master weights and Adam state sharded over "
           f"{lay.dp * lay.cp} data x context parallel GPUs" if lay.distributed_optimizer else
           "no distributed optimizer: every data-parallel replica keeps fp32 master weights and Adam state")
    where = ("the only pipeline stage" if lay.pp == 1 else f"the {stage} pipeline stage (the most loaded of first "
             "and last)")
    return (f"Megatron-Core per GPU on {where}: {lay.words()} over "
            f"{setup.world_size} GPUs; {opt}; bf16 params with fp32 main gradients; "
            f"{'sequence parallel, ' if lay.sequence_parallel else ''}recompute {lay.recompute}; "
            + (f"interleaved 1F1B with {lay.vpp} virtual stages per GPU ({lay.held_stages(stage):.2f} stages' "
               f"activations on the {stage} GPU); " if lay.vpp > 1 else
               f"1F1B schedule with {lay.held_stages(stage):g} micro-batch(es) in flight on the {stage} stage; ")
            + f"vocabulary padded to {padded_vocab(spec, lay.tp)}; activations per Korthikanti et al. 2022 as "
            "megatron/training/theoretical_memory_usage.py computes them (a GeLU-sized MLP: SwiGLU's extra "
            "saved projection is not in it)")
