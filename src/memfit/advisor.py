"""When a run does not fit (or only tightly): what exactly to change. Every suggestion is a re-estimate.

Levers are applied with ``TrainingSetup.replace`` (or another model) and run through the same ``estimate()`` and
the same ``verdict()``, so advice can never disagree with the estimate: a change offered as one that fits
re-checks as FITS (verdict.py's one rule). Combinations are searched, not just single levers: every subset of
the gentle levers, each with the largest micro-batch that then fits (gradient accumulation keeps the effective
batch), and only when that is not enough, a shorter max length. Candidates are ranked by what they cost the user:
first by their harshest lever, then by the sum of the levers' costs, then by memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Mapping

from .advice_trainers import COSTS as TRAINER_COSTS
from .advice_trainers import trainer_levers
from .errors import MemfitError
from .estimator import Estimate, estimate
from .hardware import Hardware
from .physics.optimizers import OPTIMIZER_FACTS
from .search import max_int
from .setup import TrainingSetup
from .spec import ModelSpec
from .verdict import verdict

# A change saving less than this share of the need is no advice (issue #13: "saves under 2%").
MIN_SAVING_SHARE = 0.02
# Without a dataset, lengths below this are assumed to cut typical instruction-tuning examples.
TYPICAL_LENGTH_FLOOR = 512
# How many fitting changes and how many partial ones to list.
MAX_FITTING, MAX_PARTIAL = 4, 4

# What each lever costs the user: (rank, words). Lower ranks are cheaper. Ranks order advice only.
COSTS = {
    "chunked-ce": (1, "needs a chunked or fused cross-entropy (Liger kernel, torchtune's chunked loss): no "
                      "quality cost"),
    "optimizer-8bit": (1, "8-bit optimizer states: no measurable quality cost in practice (Dettmers et al. 2021)"),
    "grad-accum": (1, "same effective batch through gradient accumulation: slower steps (less work per kernel)"),
    "grad-ckpt": (2, "about 20-30% slower: each layer is recomputed during backward"),
    "train-layers": (2, "fewer layers adapt (mlx-lm --num-layers): less capacity, a faster step"),
    "lora-smaller": (3, "a smaller adapter: slightly less capacity"),
    "qlora": (3, "4-bit frozen base: a small quality cost, slower matmuls (dequantization)"),
    # A shorter max length costs more the more of it is cut (kept >= 3/4, >= 1/2, >= 1/4, less).
    "seq-len": (3, "examples longer than the new length are cut: the model never sees their ends"),
    "seq-len-half": (4, "up to half of the max length is cut: long examples lose their ends"),
    "seq-len-quarter": (5, "more than half of the max length is cut: long examples lose most of their ends"),
    "seq-len-most": (6, "more than three quarters of the max length is cut"),
    "lora": (4, "trains an adapter instead of every weight"),
    "max-pixels": (3, "images downscaled to a quarter of the pixels (half each side): fine detail such as small "
                      "text and small objects is lost"),
    "fewer-images": (4, "half the images per sample: split multi-image samples or drop images"),
    "more-gpus": (5, "more GPUs: the same training, its state sharded across them (more hardware, some "
                     "communication)"),
    "smaller-model": (6, "a smaller model of the same family: lower quality"),
    "seq-len-short": (9, "cuts below the typical example: offered only because nothing else fits"),
    "wired-limit": (10, "raises the GPU's share of the Mac's RAM (sudo sysctl iogpu.wired_limit_mb=N, reset at "
                        "reboot): macOS and open apps keep only the rest, and the system may page or freeze; only "
                        "because nothing else fits"),
}
COSTS.update(TRAINER_COSTS)     # preference and RL levers (advice_trainers.py)
# On MLX a quantized base is a converted model, not a load-time option.
from .scale_advice import COSTS as _SCALE_COSTS, WORDS as _SCALE_WORDS  # noqa: E402

COSTS.update(_SCALE_COSTS)
MLX_QLORA_COST = ("convert the model first (mlx_lm.convert --hf-path MODEL -q: affine 4-bit, group 64): a small "
                  "quality cost")


@dataclass(frozen=True)
class Suggestion:
    change: str                       # what changes, in words
    changes: Mapping[str, object]     # option -> new value ("model" for another model), as resolved
    command: str                      # the complete `memfit estimate ...` that reproduces device_bytes
    device_bytes: int
    saving_bytes: int
    cost: str
    status: str                       # the changed run's verdict: fits | tight | does-not-fit
    rank: tuple

    @property
    def fits(self) -> bool:
        return self.status == "fits"


@dataclass(frozen=True)
class _Candidate:
    keys: frozenset          # the levers it uses
    setup: TrainingSetup
    spec: ModelSpec
    estimate: Estimate
    status: str


def suggest(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware, command_for, dataset=None,
            model_ref: str | None = None) -> list[Suggestion]:
    """The changes that make this run fit, best first, then the single levers that help but are not enough.
    `command_for(model_ref, setup)` writes the reproducing command; `dataset` (LengthStats) says which lengths
    cut typical examples."""
    base = estimate(spec, setup)
    floor = dataset.p50 if dataset is not None else TYPICAL_LENGTH_FLOOR
    levers = _levers(spec, setup, hardware)
    fitting: list[_Candidate] = []
    for n in range(len(levers) + 1):
        for subset in combinations(levers, n):
            candidate = _fit_with(spec, setup, hardware, subset, floor)
            if candidate is not None:
                fitting.append(candidate)
    fitting += [c for c in (_more_gpus(spec, setup, hardware), _smaller_model(spec, setup, hardware, base)) if c]
    # Nothing that keeps the typical example fits: raising a Mac's GPU wired limit, then a length below it.
    wired = _wired_limit(spec, setup, hardware, levers) if not fitting else None
    if not fitting and setup.seq_len > 64:
        short = _fit_with(spec, setup, hardware, levers, floor=64, short=True)
        fitting += [short] if short else []
    fitting = [c for c in fitting if base.device_bytes - c.estimate.device_bytes >= MIN_SAVING_SHARE *
               base.device_bytes]
    fitting = _undominated(fitting)
    fitting.sort(key=lambda c: (_rank(c.keys), c.estimate.device_bytes))
    out = [_suggestion(c, spec, setup, base, hardware, command_for, model_ref, dataset, floor)
           for c in _shortlist(fitting)]
    # Single levers that save memory but are not enough alone: what each is worth, biggest saving first.
    partial = []
    for lever in levers:
        new = lever[2](setup)
        est = estimate(spec, new)
        status = verdict(est, hardware).status
        if status != "fits" and base.device_bytes - est.device_bytes >= MIN_SAVING_SHARE * base.device_bytes:
            partial.append(_Candidate(frozenset({lever[0]}), new, spec, est, status))
    partial.sort(key=lambda c: c.estimate.device_bytes)
    out += [_suggestion(c, spec, setup, base, hardware, command_for, model_ref, dataset, floor)
            for c in partial[:MAX_PARTIAL]]
    if wired is not None:
        candidate, limit_mib = wired
        s = _suggestion(candidate, spec, setup, base, hardware, command_for, model_ref, dataset, floor)
        out.insert(0, Suggestion(
            change=f"{s.change} + GPU wired limit {limit_mib} MiB".removeprefix("no change + "),
            changes={**s.changes, "mac_wired_limit": f"{limit_mib}MiB"},
            command=command_for(model_ref, candidate.setup, {"mac_wired_limit": f"{limit_mib}MiB"}),
            device_bytes=s.device_bytes, saving_bytes=s.saving_bytes, cost=s.cost, status="fits", rank=s.rank))
    return out


# Whatever the wired limit, macOS keeps this much of the RAM for itself in this advice.
MAC_OS_RESERVE_BYTES = 4 * 2**30


def _wired_limit(spec, setup, hardware, levers):
    """Last resort on a Mac: the gentlest setup (every gentle lever) under a raised GPU wired limit, when that
    limit still leaves macOS MAC_OS_RESERVE_BYTES. Returns (candidate, limit in MiB) or None."""
    from .hardware import Hardware as _Hw

    if hardware.kind != "mac":
        return None
    gentle = setup
    for _, _, apply in levers:
        try:
            gentle = apply(gentle)
        except MemfitError:
            return None
    est = estimate(spec, gentle)
    limit = -(-est.range_high_bytes // 2**20)
    if limit * 2**20 > hardware.capacity_bytes - MAC_OS_RESERVE_BYTES:
        return None
    raised = _Hw(name=hardware.name, kind="mac", capacity_bytes=hardware.capacity_bytes,
                 usable_bytes=limit * 2**20, source="a raised iogpu.wired_limit_mb")
    if verdict(est, raised).status != "fits":
        return None
    keys = frozenset(k for k, _, _ in levers) | {"wired-limit"}
    return _Candidate(keys, gentle, spec, est, "fits"), limit


def _levers(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> list[tuple]:
    """(key, words, apply) for each gentle lever this stack and this hardware can use."""
    from .recipes import RECIPES

    from . import scale_advice

    if setup.recipe == "megatron":      # its own levers: recompute, sequence parallel, optimizer sharding, cp
        return scale_advice.levers(spec, setup, hardware)
    recipe = RECIPES[setup.recipe]
    mac = hardware.kind == "mac"
    out = []
    if not setup.chunked_ce and not mac and setup.recipe != "mlx" and "loss" not in setup.explicit:
        # Liger's and unsloth's fused losses are Triton kernels: CUDA only; mlx-lm has no chunked loss. A loss
        # given explicitly is the stack's own (LLaMA-Factory's and ms-swift's DPO take full logits): not a lever.
        out.append(("chunked-ce", "chunked cross-entropy", lambda s: s.replace(chunked_ce=True)))
    if setup.optimizer in ("adamw", "adamw-fused", "adamw-loop", "adamw-bnb", "paged-adamw") and not mac \
            and "adamw-8bit" in recipe.optimizers and not setup.optimizer_in_backward:
        out.append(("optimizer-8bit", "8-bit AdamW", lambda s: s.replace(optimizer="adamw-8bit")))
    if not setup.grad_ckpt:
        out.append(("grad-ckpt", "gradient checkpointing", lambda s: s.replace(grad_ckpt=True)))
    if setup.method in ("full", "lora") and (not mac or setup.recipe == "mlx"):
        out.append(("qlora", "QLoRA", lambda s: _switch_method(s, "qlora")))
    if setup.recipe == "mlx" and (setup.train_layers or spec.num_layers) > 1:
        out.append(("train-layers", "fewer trained layers",
                    lambda s: s.replace(train_layers=max(1, min(s.train_layers or spec.num_layers,
                                                                spec.num_layers) // 2))))
    if setup.method == "full":
        out.append(("lora", "LoRA", lambda s: _switch_method(s, "lora")))
    if spec.vision is not None:
        from .physics.vision import vision_levers

        out += vision_levers(spec, setup)
    return out + scale_advice.levers(spec, setup, hardware) + trainer_levers(spec, setup, hardware)


def _switch_method(setup: TrainingSetup, method: str) -> TrainingSetup:
    """The same run with another method: options that do not apply to it go back to the recipe's."""
    facts = OPTIMIZER_FACTS.get(setup.optimizer)
    if method != "full" and facts and facts.full_only:
        setup = setup.replace(optimizer=None)    # GaLore, APOLLO, Adam-mini: the adapter takes the recipe's own
    changed = setup.with_method(method)
    if changed.optimizer_in_backward and "optimizer_in_backward" in setup.explicit:
        changed = changed.replace(optimizer_in_backward=None)
    return changed


def _fit_with(spec, setup, hardware, subset, floor: int, short: bool = False) -> _Candidate | None:
    """`setup` with the levers of `subset`, at the largest micro-batch (a divisor of the batch, accumulation
    keeping batch x accumulation) that fits; failing that, at micro-batch 1 with the longest length >= floor."""
    changed = setup
    try:
        for _, _, apply in subset:
            changed = apply(changed)
    except MemfitError:
        return None
    keys = frozenset(k for k, _, _ in subset)
    effective = setup.batch_size * setup.grad_accum
    for batch in range(setup.batch_size, 0, -1):
        if setup.batch_size % batch:
            continue
        trial = changed if batch == setup.batch_size else _with_batch(changed, batch, effective)
        if trial is None:
            continue
        est = estimate(spec, trial)
        status = verdict(est, hardware).status
        if status == "fits":
            return _Candidate(keys | ({"grad-accum"} if batch < setup.batch_size else set()), trial, spec, est,
                              status)
    small = _with_batch(changed, 1, effective) if setup.batch_size > 1 else changed
    if small is None:
        return None
    longest = max_int(spec, small, hardware, "seq_len", step=64).value
    if not longest or longest < floor or longest >= setup.seq_len:
        return None
    trial = small.replace(seq_len=longest)
    est = estimate(spec, trial)
    extra = {"seq-len-short" if short else _length_key(longest / setup.seq_len)}
    return _Candidate(keys | extra | ({"grad-accum"} if setup.batch_size > 1 else set()), trial, spec, est,
                      "fits")


def _length_key(kept: float) -> str:
    return "seq-len" if kept >= 0.75 else "seq-len-half" if kept >= 0.5 else "seq-len-quarter" if kept >= 0.25 \
        else "seq-len-most"


_LENGTH_KEYS = frozenset({"seq-len", "seq-len-half", "seq-len-quarter", "seq-len-most", "seq-len-short"})


def _with_batch(setup: TrainingSetup, batch: int, effective: int) -> TrainingSetup | None:
    try:
        return setup.replace(batch_size=batch, grad_accum=effective // batch)
    except MemfitError:      # optimizer in backward cannot accumulate
        return None


def _more_gpus(spec, setup, hardware) -> _Candidate | None:
    """The fewest GPUs of this kind, and the lightest layout, that fit (up to 8 GPUs on one node)."""
    if setup.recipe == "megatron" and hardware.kind != "mac":
        from .scale_advice import fewest_megatron_gpus

        found = fewest_megatron_gpus(spec, setup, hardware)
        if found is None or found[0] == setup:
            return None
        key = "more-gpus" if found[0].world_size > setup.world_size else "megatron-layout"
        return _Candidate(frozenset({key}), found[0], spec, found[1], "fits")
    if hardware.kind == "mac" or setup.world_size > 1 or setup.recipe == "mlx":
        return None
    for gpus in (2, 4, 8):
        for ckpt in dict.fromkeys((setup.grad_ckpt, True)):
            for shard, offload in (("zero2", "none"), ("fsdp", "none"), ("zero3", "none"), ("zero3", "optimizer")):
                try:
                    candidate = setup.replace(gpus=gpus, shard=shard, offload=None if offload == "none" else offload,
                                              grad_ckpt=ckpt)
                except MemfitError:      # a layout this optimizer cannot run (GaLore, Muon, ... on ZeRO)
                    continue
                est = estimate(spec, candidate)
                if verdict(est, hardware).status == "fits":
                    keys = {"more-gpus"} | ({"grad-ckpt"} if ckpt != setup.grad_ckpt else set())
                    return _Candidate(frozenset(keys), candidate, spec, est, "fits")
    return None


def _smaller_model(spec, setup, hardware, base: Estimate) -> _Candidate | None:
    """The biggest model of the family that is smaller than this one in both senses: fewer parameters and less
    memory for the same run. Parameters alone mislead across MoE and dense members (Qwen3-32B has more parameters
    than Qwen3-30B-A3B, yet its QLoRA needs far less memory, its experts not being 16-bit: physics/moe.py), and
    memory alone would offer a bigger dense model as the "smaller" one."""
    if not spec.source.startswith("catalog:"):
        return None
    from .sources.catalog import family_members, find_entry, spec_from_entry
    from .verdict import fits

    entry = find_entry(spec.name)
    if not entry:
        return None
    members = sorted((e for e in family_members(entry["family"]) if e["params"] < entry["params"]),
                     key=lambda e: e["params"], reverse=True)
    for member in members:
        smaller = spec_from_entry(member)
        try:
            est = estimate(smaller, setup)
        except MemfitError:       # the setup does not apply to this model (LoRA on the experts of a dense one)
            continue
        if est.device_bytes < base.device_bytes and fits(est, hardware):
            return _Candidate(frozenset({"smaller-model"}), setup, smaller, est, verdict(est, hardware).status)
    return None


def _shortlist(ranked: list[_Candidate]) -> list[_Candidate]:
    """The best few, varied: at most two that cut the length, and more GPUs or a smaller model always shown
    when they fit (they change the hardware or the model, which the user may prefer to any setup change)."""
    out, cuts = [], 0
    for c in ranked:
        if c.keys & {"more-gpus", "smaller-model"}:
            continue
        if c.keys & _LENGTH_KEYS:
            if cuts == 2:
                continue
            cuts += 1
        if len(out) < MAX_FITTING:
            out.append(c)
    return out + [c for c in ranked if c.keys & {"more-gpus", "smaller-model"}]


def _rank(keys) -> tuple[int, int]:
    ranks = [COSTS[k][0] for k in keys] or [0]
    return max(ranks), sum(ranks)


def _undominated(candidates: list[_Candidate]) -> list[_Candidate]:
    """Drop a candidate when another uses a subset of its levers and is no worse in batch and length (a lever
    that is not needed is not advice), and drop repeats of the same run."""
    out, seen = [], set()
    for c in sorted(candidates, key=lambda c: (len(c.keys), _rank(c.keys))):
        key = (c.spec.name, c.setup)
        if key in seen:
            continue
        if any(d.keys < c.keys and d.spec is c.spec and d.setup.batch_size >= c.setup.batch_size
               and d.setup.seq_len >= c.setup.seq_len for d in out):
            continue
        seen.add(key)
        out.append(c)
    return out


_WORDS = {"grad_ckpt": lambda v: "gradient checkpointing" if v else "no gradient checkpointing",
          "chunked_ce": lambda v: "chunked cross-entropy" if v else "plain cross-entropy",
          "loss": lambda v: {"liger": "Liger fused cross-entropy", "unsloth": "unsloth fused cross-entropy",
                             "chunked": "chunked cross-entropy"}.get(v, f"{v} loss"),
          "optimizer": lambda v: f"optimizer {v}",
          "seq_len": lambda v: f"max length {v}",
          "method": lambda v: {"qlora": "QLoRA", "lora": "LoRA", "full": "full fine-tuning"}[v],
          "train_layers": lambda v: f"train the last {v} layers",
          "ckpt_offload": lambda v: "checkpoints offloaded" if v else "checkpoints on the GPU", **_SCALE_WORDS}


def _suggestion(c: _Candidate, spec, setup, base, hardware, command_for, model_ref, dataset, floor) -> Suggestion:
    changes = {name: getattr(c.setup, name) for name in _changed(setup, c.setup)}
    words = []
    if "batch_size" in changes:
        words.append(f"micro-batch {c.setup.batch_size} x accumulation {c.setup.grad_accum}")
    if "gpus" in changes:
        s = c.setup
        words.append(f"{s.world_size} GPUs with {s.shard}" + (f" ({s.offload} offloaded)" if s.offload != "none"
                                                               else "") if s.recipe != "megatron" else
                     f"{s.world_size} GPUs")
    # The loss kernel names the change; chunked_ce only says that it is a chunked one.
    skip = {"gpus", "shard", "offload"} | ({"chunked_ce"} if "loss" in changes else set())
    words += [_WORDS[k](v) for k, v in changes.items() if k in _WORDS and k not in skip]
    words += [f"{k.replace('_', ' ')} {v}" for k, v in changes.items()
              if k not in _WORDS and k not in ("batch_size", "grad_accum", "lora_targets", "quant", "gpus", "nodes",
                                               "shard", "offload")]
    if c.spec is not spec:
        changes["model"] = c.spec.name
        words.append(f"smaller model {c.spec.name}")
    costs = [MLX_QLORA_COST if k == "qlora" and c.setup.recipe == "mlx" else COSTS[k][1]
             for k in sorted(c.keys, key=lambda k: COSTS[k][0])]
    if c.keys & _LENGTH_KEYS:
        costs.append(_length_cost(c.setup.seq_len, dataset, floor))
    saving = base.device_bytes - c.estimate.device_bytes
    ref = model_ref if c.spec is spec else c.spec.name
    return Suggestion(change=" + ".join(words) or "no change", changes=changes, command=command_for(ref, c.setup),
                      device_bytes=c.estimate.device_bytes, saving_bytes=saving, cost="; ".join(costs),
                      status=c.status, rank=_rank(c.keys))


def _changed(before: TrainingSetup, after: TrainingSetup) -> list[str]:
    from .options import SETUP_FIELDS

    return [name for name in SETUP_FIELDS if getattr(before, name) != getattr(after, name)]


def _length_cost(length: int, dataset, floor: int) -> str:
    if dataset is None:
        return (f"without --dataset memfit cannot tell how many examples are longer than {length} (it never goes "
                f"below {TYPICAL_LENGTH_FLOOR} tokens unless nothing else fits)")
    cut = sum(n for a, b, n in dataset.histogram if a > length)
    covered = "still covered" if length >= dataset.p99 else "cut"
    return (f"p99 of your dataset is {dataset.p99} tokens ({covered}); about {cut / dataset.count:.0%} of "
            f"examples are longer than {length}")
