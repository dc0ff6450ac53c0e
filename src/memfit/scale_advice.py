"""Advice past one GPU's worth of tokens: the smallest context-parallel degree or activation offload that fits,
and the Megatron layout with the fewest GPUs. Each lever is a re-estimate (advisor.py ranks and words them).

- `--cp`: the smallest degree among the divisors of the GPU count (and of the length) that fits; every larger
  degree splits a sequence further for more communication and no gain once it fits.
- `--activation-offload`: one switch, for the stacks that have it.
- Megatron: recompute (selective, then full), sequence parallelism with tp > 1, the distributed optimizer, and
  the layout search `fewest_megatron_gpus`: the fewest GPUs (powers of two up to MAX_GPUS) with any valid
  tp x pp x cp that fits, preferring the smallest model-parallel product (the most data parallel, the least
  communication) and the lightest recompute.
"""

from __future__ import annotations

from .errors import MemfitError
from .estimator import estimate
from .hardware import Hardware
from .physics.context_parallel import CP_RECIPES, OFFLOAD_RECIPES
from .setup import TrainingSetup
from .spec import ModelSpec
from .verdict import verdict

MAX_GPUS = 64
GPUS_PER_NODE = 8
TP_CHOICES = (1, 2, 4, 8)            # tensor parallelism stays inside a node (NVLink)

COSTS = {
    "activation-offload": (2, "activations copied to pinned host RAM and back: slower steps where the copies do not "
                              "overlap compute; needs host RAM (see host figures)"),
    "context-parallel": (2, "each sequence split over several GPUs: attention communicates every layer (all-to-all "
                            "or a K/V ring), fewer sequences in parallel"),
    "recompute": (2, "Megatron recomputes activations in backward: selective (core attention) costs little, full "
                     "about a third more compute"),
    "sequence-parallel": (1, "Megatron sequence parallelism: no extra communication volume over tensor parallelism"),
    "distributed-optimizer": (1, "Megatron's distributed optimizer: the same all-reduce volume, as reduce-scatter "
                                 "+ all-gather"),
    "megatron-layout": (5, "another Megatron layout (tensor, pipeline, context parallel degrees)"),
}

WORDS = {"cp": lambda v: f"context parallel {v}",
         "activation_offload": lambda v: "activation offload" if v else "no activation offload",
         "recompute": lambda v: f"recompute {v}",
         "sequence_parallel": lambda v: "sequence parallel" if v else "no sequence parallel",
         "distributed_optimizer": lambda v: "distributed optimizer" if v else "no distributed optimizer"}


def _fits(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> bool:
    return verdict(estimate(spec, setup), hardware).status == "fits"


def _valid(spec: ModelSpec, setup: TrainingSetup, **changes) -> TrainingSetup | None:
    try:
        changed = setup.replace(**changes)
        estimate(spec, changed)          # model-dependent rules (heads, layers) raise here
        return changed
    except MemfitError:
        return None


def smallest_cp(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> TrainingSetup:
    """The setup with the smallest valid context-parallel degree above the current one that fits (or the largest
    valid one when none fits: the most it can do)."""
    group = setup.tp * setup.pp if setup.recipe == "megatron" else 1
    last = setup
    for n in range(setup.cp + 1, setup.world_size // group + 1):
        candidate = _valid(spec, setup, cp=n) if setup.world_size % (group * n) == 0 else None
        if candidate is None:
            continue
        last = candidate
        if _fits(spec, candidate, hardware):
            return candidate
    return last


def levers(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> list[tuple]:
    """(key, words, apply) for the long-context and Megatron levers this stack has."""
    out = []
    if setup.recipe in CP_RECIPES and setup.world_size > setup.cp and hardware.kind != "mac":
        out.append(("context-parallel", "context parallelism", lambda s: smallest_cp(spec, s, hardware)))
    # Not offered under hf: the plain HF Trainer has no switch (hf accepts it only because `memfit check` reads
    # TRL configs as hf).
    if setup.recipe in OFFLOAD_RECIPES and setup.recipe != "hf" and not setup.activation_offload \
            and not setup.ckpt_offload:
        out.append(("activation-offload", "activation offload", lambda s: s.replace(activation_offload=True)))
    if setup.recipe == "megatron":
        if setup.recompute != "full":
            out.append(("recompute", "more recompute",
                        lambda s: s.replace(recompute="full" if s.recompute == "selective" else "selective")))
        if setup.tp > 1 and not setup.sequence_parallel:
            out.append(("sequence-parallel", "sequence parallelism", lambda s: s.replace(sequence_parallel=True)))
        if setup.world_size > setup.tp * setup.pp and not setup.distributed_optimizer:
            out.append(("distributed-optimizer", "distributed optimizer",
                        lambda s: s.replace(distributed_optimizer=True)))
    return out


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def fewest_megatron_gpus(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware):
    """(setup, estimate) of the Megatron layout with the fewest GPUs that fits, or None up to MAX_GPUS. Sequence
    parallelism and the distributed optimizer are on (they only save memory); the length, micro-batch and
    micro-batch count stay."""
    gpus = 1
    while gpus <= MAX_GPUS:
        found = []
        for tp in [t for t in TP_CHOICES if t <= min(gpus, GPUS_PER_NODE) and gpus % t == 0]:
            for pp in _divisors(gpus // tp, spec.num_layers):
                for cp in _divisors(gpus // (tp * pp), gpus):
                    for recompute in ("selective", "full"):
                        per_node = min(gpus, GPUS_PER_NODE)
                        candidate = _valid(spec, setup, gpus=per_node, nodes=gpus // per_node, tp=tp, pp=pp,
                                           cp=cp, ep=None, sequence_parallel=tp > 1, recompute=recompute,
                                           distributed_optimizer=gpus > tp * pp or None, shard=None)
                        if candidate is None:
                            continue
                        est = estimate(spec, candidate)
                        if verdict(est, hardware).status == "fits":
                            found.append(((tp * pp * cp, recompute == "full", est.device_bytes), candidate, est))
                            break
        if found:
            _, best, est = min(found, key=lambda f: f[0])
            return best, est
        gpus *= 2
    return None
