"""Context (sequence) parallelism and activation offload: how a long sequence's activations leave one GPU.

Context parallelism, `--cp N`: every sequence is cut into N chunks of S/N tokens, one per GPU, so everything that
grows with tokens (saved activations, checkpoints, logits and loss, backward temporaries) is that of S/N tokens.
Weights and optimizer state are untouched by it: the data-parallel layout (`--shard`) still shards them over all
GPUs (accelerate 1.16 parallelism_config.py:375, FSDP2 shards over the joint `dp_shard_cp` mesh; DeepSpeed's
Ulysses runs inside ZeRO's data-parallel group). What differs between engines is attention, the one op that needs
every token:

- Ulysses (all-to-all on heads): before attention an all-to-all swaps the split from tokens to heads, so each
  GPU attends over all S tokens with num_heads/N heads, and a second all-to-all swaps back (transformers 5.18
  docs/source/en/deepspeed_alst.md; accelerate 1.16 parallelism_config.py:55-57 sp_backend "deepspeed"). The
  saved q, k, v and output are S x heads/N: the same bytes as S/N x all heads. K/V heads cannot be split
  finer than one: with fewer KV heads than N, each GPU keeps a whole replicated KV head. Needs num_heads % N == 0.
  The all-to-all needs its output beside its input: one layer's q, k, v for the full sequence over N ranks.
- Ring with an all-gather of K/V: torch's context_parallel as accelerate drives it (accelerate 1.16
  utils/dataclasses.py:2107 TorchContextParallelConfig cp_comm_strategy default "allgather") and
  ring-flash-attn's llama3_flash_attn_varlen_func that axolotl uses (zhuzilin/ring-flash-attention README;
  axolotl-ai-cloud/axolotl PR #2412): each GPU keeps its S/N queries and gathers every rank's K and V for the
  layer, 2 x S x kv_dim per layer while it runs, and in backward the gradient of that gathered K/V as well,
  before it is reduce-scattered (research/frontier.md 2.9).
- Ring with point-to-point K/V exchange: Megatron-Core through Transformer Engine (Megatron-LM
  megatron/training/arguments.py:3221 --cp-comm-type default "p2p"): a K/V chunk computed on and one received,
  2 x 2 x S/N x kv_dim, and in backward the same again for the dK/dV chunk that travels with it.

Activation offload, `--activation-offload`: saved_tensors_hooks copy what autograd saves to pinned host memory in
forward and bring it back in backward (torchtune training/_activation_offloading.py OffloadActivations,
meta-pytorch/torchtune PR #1443/#1847; TRL SFTConfig activation_offloading, the same hooks). With gradient
checkpointing only the checkpointed inputs are offloaded (torchtune PR #1948), which is exactly memfit's
`--ckpt-offload` (unsloth's offloaded checkpointing): setup.py resolves one into the other, and the host holds
num_layers x tokens x hidden in the residual dtype (transformers PR #48444's measured "layers x sequence x
hidden" figure). Without checkpointing every layer's activations go to the host; on the GPU remain the layer
being computed and the one in flight on the offload stream (use_streams=True, torchtune's default), so two
layers' worth. The lm_head's input stays on the GPU (torchtune wraps the output projection in NoOpManager).
"""

from __future__ import annotations

from ..errors import InvalidSetupError, Problem
from ..setup import TrainingSetup
from ..spec import ModelSpec

# The stacks that can split a sequence, and how each does attention (see the module docstring for sources).
# hf/trl go through accelerate: ZeRO layouts use DeepSpeed's Ulysses (ParallelismConfig sp_size, sp_backend
# "deepspeed"), the others torch's context_parallel (cp_size, FSDP2) with its all-gather default.
CP_RECIPES = ("hf", "trl", "trl-1.14", "axolotl", "ms-swift", "megatron")
# The stacks with an activation-offload switch: torchtune enable_activation_offloading, TRL/axolotl
# activation_offloading (TRL's hooks), unsloth's offloaded checkpointing.
# `memfit check` reads a TRL SFTConfig as the hf recipe (preflight/formats.py read_trl), so hf carries TRL's switch.
OFFLOAD_RECIPES = ("torchtune", "trl", "trl-1.14", "axolotl", "unsloth", "hf")
# GPU-resident layers' worth of activations under offload without checkpointing: the current and the in-flight one.
OFFLOAD_RESIDENT_LAYERS = 2


def style(setup: TrainingSetup) -> str:
    """How attention crosses the GPUs of one sequence: "ulysses", "ring-allgather" or "ring-p2p"."""
    if setup.recipe == "megatron":
        return "ring-p2p"
    if setup.recipe == "ms-swift" or (setup.recipe in ("hf", "trl", "trl-1.14") and setup.shard.startswith("zero")):
        return "ulysses"
    return "ring-allgather"


STYLE_WORDS = {"ulysses": "Ulysses all-to-all on heads (DeepSpeed ALST)",
               "ring-allgather": "ring attention with an all-gather of K/V (torch context_parallel, ring-flash-attn "
                                 "llama3)",
               "ring-p2p": "ring attention, K/V chunks passed point to point (Transformer Engine, cp_comm_type p2p)"}


def setup_problems(setup: TrainingSetup) -> list[Problem]:
    """The rules that need only the setup (setup.py calls this from problems())."""
    p: list[Problem] = []
    if setup.cp > 1:
        if setup.recipe not in CP_RECIPES:
            p.append(Problem("cp", f"{{cp}} {setup.cp}: the {setup.recipe} recipe has no context or sequence "
                                   f"parallelism (recipes with it: {', '.join(CP_RECIPES)})"))
        if setup.world_size % setup.cp:
            p.append(Problem("cp", f"{{cp}} {setup.cp} must divide the {setup.world_size} GPUs ({{gpus}} x {{nodes}})"))
        if setup.recipe in ("hf", "trl", "trl-1.14") and setup.shard not in ("fsdp", "fsdp-shard-grad-op") \
                and not setup.shard.startswith("zero"):
            # accelerate 1.16 state.py:959-969: torch context parallelism needs an FSDP2 plugin; Ulysses (sp_size)
            # runs under DeepSpeed.
            p.append(Problem("cp", f"{{cp}} through accelerate needs FSDP2 ({{shard}} fsdp, torch context "
                                   f"parallelism) or DeepSpeed ({{shard}} zero1|zero2|zero3, Ulysses); shard is "
                                   f"{setup.shard}"))
        if setup.attn == "eager" and setup.recipe != "megatron":
            p.append(Problem("cp", "{cp} needs a flash or SDPA attention kernel: context parallelism splits those "
                                   "kernels, not {attn} eager"))
    if setup.activation_offload and setup.grad_ckpt and not setup.ckpt_offload:
        p.append(Problem("activation_offload", "{activation_offload} with {grad_ckpt} offloads the checkpoints: it "
                                               "contradicts {ckpt_offload} off; give one of them"))
    if setup.activation_offload and setup.recipe not in OFFLOAD_RECIPES:
        p.append(Problem("activation_offload", f"{{activation_offload}}: the {setup.recipe} recipe has no activation "
                                               f"offload (recipes with it: {', '.join(OFFLOAD_RECIPES)})"))
    return p


def check_model(spec: ModelSpec, setup: TrainingSetup) -> None:
    """Rules that need the model: Ulysses splits heads."""
    if setup.cp > 1 and style(setup) == "ulysses" and spec.num_heads % setup.cp:
        raise InvalidSetupError(Problem("cp", f"{{cp}} {setup.cp}: Ulysses splits attention heads over the GPUs of "
                                              f"a sequence, and {spec.name} has {spec.num_heads} heads (not a "
                                              "multiple)"))


def local_setup(setup: TrainingSetup) -> TrainingSetup:
    """The setup one GPU runs: S/N tokens per sequence (and no more splitting). A length that N does not divide
    is padded up to a multiple of it (axolotl, accelerate and Megatron pad or require equal chunks)."""
    if setup.cp == 1:
        return setup
    return setup.replace(seq_len=-(-setup.seq_len // setup.cp), cp=None)


def buffer_bytes(spec: ModelSpec, setup: TrainingSetup, compute_bytes: int) -> tuple[int, int]:
    """(forward, backward) bytes of attention's cross-GPU buffers for one layer at a time, per GPU."""
    n = setup.cp
    if n == 1:
        return 0, 0
    b, s, d = setup.batch_size, setup.seq_len, spec.head_dim
    kv = spec.num_kv_heads
    kind = style(setup)
    if kind == "ulysses":
        # all-to-all output of q, k, v (heads/N of the whole sequence); KV heads never below one per GPU.
        kv_heads_here = max(kv / n, 1)
        qkv = b * s * d * (spec.num_heads / n + 2 * kv_heads_here) * compute_bytes
        return int(qkv), int(qkv)
    if kind == "ring-allgather":
        gathered = 2 * b * s * spec.kv_dim * compute_bytes
        return gathered, 2 * gathered
    chunks = 2 * 2 * b * -(-s // n) * spec.kv_dim * compute_bytes
    return chunks, 2 * chunks


def ulysses_kv_extra_bytes(spec: ModelSpec, setup: TrainingSetup, compute_bytes: int) -> int:
    """Per layer: the saved K and V beyond S/N tokens' worth when there are fewer KV heads than GPUs (Ulysses
    keeps a whole KV head per GPU)."""
    n = setup.cp
    if n == 1 or style(setup) != "ulysses" or spec.num_kv_heads >= n:
        return 0
    b, s, d, kv = setup.batch_size, setup.seq_len, spec.head_dim, spec.num_kv_heads
    return int(2 * b * s * d * (1 - kv / n) * compute_bytes)


def offloaded_checkpoint_bytes(spec: ModelSpec, local: TrainingSetup, residual_bytes: int) -> int:
    """Host bytes of offloaded checkpoints: every layer's input hidden states (per GPU's tokens)."""
    return spec.num_layers * local.batch_size * local.seq_len * spec.hidden_size * residual_bytes


def assumption(setup: TrainingSetup) -> str:
    words = []
    if setup.cp > 1:
        words.append(f"context parallel {setup.cp}: each GPU holds {-(-setup.seq_len // setup.cp)} of the "
                     f"{setup.seq_len} tokens of a sequence, attention by {STYLE_WORDS[style(setup)]}")
    if setup.activation_offload:
        words.append("activation offload: " + (
            "checkpoints in pinned host memory (only checkpointed inputs are offloaded)" if setup.grad_ckpt else
            f"saved activations in pinned host memory, {OFFLOAD_RESIDENT_LAYERS} layers' worth on the GPU "
            "(the current and the in-flight one)"))
    return "; ".join(words)
