"""When a run does not fit (or barely does): what exactly to change. Every suggestion is a re-estimate.

Each lever is applied with TrainingSetup.replace (or another model) and run through the same estimate(), so
advice can never disagree with the estimate; each carries its new total, the saving, its cost and the exact
`memfit estimate` command that reproduces it. Ranked by least cost among those that fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MemfitError
from .estimator import Estimate, estimate
from .hardware import Hardware
from .search import biggest_model, max_int
from .setup import TrainingSetup
from .spec import ModelSpec
from .units import GB, gib

# Cost ranks: lower is cheaper. The sentence is what the change costs the user.
COSTS = {
    "optimizer-8bit": (1, "8-bit optimizer states: no measurable quality cost in practice (Dettmers et al. 2021)"),
    "optimizer-paged": (2, "paged 8-bit states live in CUDA managed memory, moved to host RAM under pressure: "
                           "slower when it pages"),
    "grad-ckpt": (2, "about 20-30% slower: each layer is recomputed during backward"),
    "chunked-ce": (2, "needs a chunked or fused cross-entropy (Liger kernel, torchtune's chunked loss)"),
    "grad-accum": (2, "same effective batch, slower steps (less work per kernel)"),
    "lora-smaller": (3, "a smaller adapter: slightly less capacity"),
    "seq-len": (3, "examples longer than the new length are cut: the model never sees their ends"),
    "qlora": (4, "4-bit frozen base: a small quality cost, slower matmuls (dequantization)"),
    "lora": (5, "trains an adapter instead of every weight"),
    "smaller-model": (6, "a smaller model of the same family: lower quality"),
    "more-gpus": (4, "more GPUs: the same training, its state sharded across them (more hardware, some "
                     "communication overhead)"),
}


@dataclass(frozen=True)
class Suggestion:
    change: str                  # short name of the lever(s)
    args: dict                   # the flags that change, e.g. {"--seq-len": 2048}
    command: str                 # the complete `memfit estimate ...` that reproduces device_bytes
    device_bytes: int
    saving_bytes: int
    cost: str
    fits: bool
    rank: int

    def as_dict(self) -> dict:
        return {"change": self.change, "args": self.args, "command": self.command,
                "device_bytes": self.device_bytes, "saving_bytes": self.saving_bytes, "cost": self.cost,
                "fits": self.fits}


def command_for(model_ref: str, setup: TrainingSetup, hardware_args: list[str]) -> str:
    """The `memfit estimate` command line that reproduces `setup` (flags that differ from the recipe's
    defaults for its method, plus the hardware flags)."""
    defaults = TrainingSetup.from_recipe(setup.recipe, method=setup.method)
    parts = ["memfit", "estimate", _quote(model_ref), "--method", setup.method]
    if setup.recipe != "hf":
        parts += ["--recipe", setup.recipe]
    flags = [("batch_size", "--batch-size"), ("seq_len", "--seq-len"), ("precision", "--precision"),
             ("optimizer", "--optimizer"), ("attn", "--attn"), ("grad_accum", "--grad-accum")]
    if setup.method != "full":
        flags += [("lora_rank", "--lora-rank"), ("lora_dropout", "--lora-dropout")]
    if setup.method == "qlora":
        flags.append(("quant", "--quant"))
    for field, flag in flags:
        value = getattr(setup, field)
        if value != getattr(defaults, field) or field in ("batch_size", "seq_len"):
            parts += [flag, str(value)]
    if setup.method != "full" and setup.lora_targets != defaults.lora_targets:
        parts += ["--lora-targets", ",".join(setup.lora_targets)]
    for field, flag in (("grad_ckpt", "--grad-ckpt"), ("chunked_ce", "--chunked-ce")):
        if getattr(setup, field) != getattr(defaults, field):
            parts.append(flag if getattr(setup, field) else "--no-" + flag[2:])
    for field, flag in (("gpus", "--gpus"), ("nodes", "--nodes"), ("shard", "--shard"), ("offload", "--offload")):
        if getattr(setup, field) != getattr(defaults, field):
            parts += [flag, str(getattr(setup, field))]
    for field, flag in (("optimizer_in_backward", "--optimizer-in-backward"), ("kbit_upcast", "--kbit-upcast"),
                        ("padding", "--padding"), ("ckpt_reentrant", "--reentrant")):
        if getattr(setup, field):
            parts.append(flag)
    return " ".join(parts + hardware_args)


def _quote(text: str) -> str:
    return f"'{text}'" if any(c in text for c in " \"'$") else text


def suggest(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware, model_ref: str,
            hardware_args: list[str], dataset=None) -> list[Suggestion]:
    """Every lever that saves memory here, re-estimated; `dataset` (LengthStats) tells what a shorter length
    would cut."""
    base = estimate(spec, setup)
    candidates = [c for c in _levers(spec, setup, hardware) if c is not None]
    out: list[Suggestion] = []
    seen = set()
    for change, args, new_setup, new_spec, key in candidates:
        if (new_spec.name, new_setup) in seen or (new_setup == setup and new_spec is spec):
            continue
        seen.add((new_spec.name, new_setup))
        est = estimate(new_spec, new_setup)
        if est.device_bytes >= base.device_bytes:
            continue                       # a lever that does not save memory here is no advice
        ref = model_ref if new_spec is spec else new_spec.name
        rank, cost = COSTS[key]
        if key == "seq-len" and new_setup.seq_len * 2 < setup.seq_len:
            rank += 4      # cutting more than half the length is the most damaging single change
        if key == "seq-len" and dataset is not None:
            cut = sum(n for a, b, n in dataset.histogram if a > new_setup.seq_len)
            covered = "still covered" if new_setup.seq_len >= dataset.p99 else "cut"
            cost = (f"{cost} (p99 of your dataset is {dataset.p99} tokens: {covered}; about "
                    f"{cut / dataset.count:.0%} of examples are longer)")
        out.append(Suggestion(change=change, args=args, command=command_for(ref, new_setup, hardware_args),
                              device_bytes=est.device_bytes, saving_bytes=base.device_bytes - est.device_bytes,
                              cost=_honest(cost, base, est), fits=est.device_bytes <= hardware.usable_bytes,
                              rank=rank))
    # The cheapest combination of the gentle levers, whether or not a single (harsher) change also fits.
    combo = _combination(spec, setup, hardware, model_ref, hardware_args, base)
    if combo and all(combo.command != s.command for s in out):
        out.append(combo)
    out.sort(key=lambda s: (not s.fits, s.rank, s.device_bytes))
    return out


def _honest(cost: str, base: Estimate, new: Estimate) -> str:
    saving = base.device_bytes - new.device_bytes
    if saving < 0.03 * base.device_bytes:
        return f"{cost}; the saving is small here ({gib(saving)})"
    return cost


def _levers(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware):
    """(change, args, new setup, new spec, cost key) for every single lever that applies."""
    if setup.optimizer in ("adamw", "adamw-fused", "adamw-loop", "adamw-bnb", "paged-adamw"):
        yield ("8-bit optimizer", {"--optimizer": "adamw-8bit"}, setup.replace(optimizer="adamw-8bit"), spec,
               "optimizer-8bit")
    if setup.method == "full" and setup.optimizer != "paged-adamw-8bit":
        yield ("paged 8-bit optimizer", {"--optimizer": "paged-adamw-8bit"},
               setup.replace(optimizer="paged-adamw-8bit"), spec, "optimizer-paged")
    if not setup.grad_ckpt:
        yield ("gradient checkpointing", {"--grad-ckpt": True}, setup.replace(grad_ckpt=True), spec, "grad-ckpt")
    if not setup.chunked_ce:
        yield ("chunked cross-entropy", {"--chunked-ce": True}, setup.replace(chunked_ce=True), spec, "chunked-ce")
    if setup.batch_size > 1:
        smaller = _smaller_batch(spec, setup, hardware)
        if smaller:
            yield (f"batch {smaller.batch_size} with gradient accumulation {smaller.grad_accum}",
                   {"--batch-size": smaller.batch_size, "--grad-accum": smaller.grad_accum}, smaller, spec,
                   "grad-accum")
    if setup.seq_len > 64:
        longest = max_int(spec, setup, hardware, "seq_len", step=64).value
        if longest and longest < setup.seq_len:
            yield (f"max length {longest}", {"--seq-len": longest}, setup.replace(seq_len=longest), spec, "seq-len")
        elif not longest:
            yield ("max length 64", {"--seq-len": 64}, setup.replace(seq_len=64), spec, "seq-len")
    if setup.method in ("lora", "qlora") and (setup.lora_rank > 8 or len(setup.lora_targets) > 2):
        yield ("LoRA r8 on q,v", {"--lora-rank": 8, "--lora-targets": "q,v"},
               setup.replace(lora_rank=8, lora_targets=("q", "v")), spec, "lora-smaller")
    if setup.method in ("full", "lora"):
        yield ("QLoRA", {"--method": "qlora"}, TrainingSetup.from_recipe(
            setup.recipe, method="qlora", batch_size=setup.batch_size, seq_len=setup.seq_len,
            grad_ckpt=setup.grad_ckpt, attn=setup.attn, grad_accum=setup.grad_accum), spec, "qlora")
    if setup.method == "full":
        yield ("LoRA instead of full fine-tuning", {"--method": "lora"}, TrainingSetup.from_recipe(
            setup.recipe, method="lora", batch_size=setup.batch_size, seq_len=setup.seq_len,
            grad_ckpt=setup.grad_ckpt, attn=setup.attn, grad_accum=setup.grad_accum), spec, "lora")
    sharded = _sharded(spec, setup, hardware)
    if sharded:
        yield (f"{sharded.world_size} GPUs with {sharded.shard}"
               + (f" and {sharded.offload} offload" if sharded.offload != "none" else ""),
               {"--gpus": sharded.gpus, "--shard": sharded.shard, "--offload": sharded.offload}, sharded, spec,
               "more-gpus")
    if spec.source.startswith("catalog:"):
        from .sources.catalog import find_entry, spec_from_entry

        entry = find_entry(spec.name)
        result = biggest_model(setup, hardware, entry["family"]) if entry else None
        if result and result.value and result.value != spec.name:
            yield (f"smaller model {result.value}", {"model": result.value}, setup,
                   spec_from_entry(find_entry(result.value)), "smaller-model")


def _sharded(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> TrainingSetup | None:
    """The fewest GPUs of this kind, and the lightest layout, that fit (up to 8 GPUs on one node)."""
    if setup.nodes > 1:
        return None
    layouts = (("zero2", "none"), ("fsdp", "none"), ("zero3", "none"), ("zero3", "optimizer"))
    for gpus in (2, 4, 8):
        if gpus <= setup.gpus:
            continue
        for shard, offload in layouts:
            candidate = setup.replace(gpus=gpus, shard=shard, offload=offload)
            if estimate(spec, candidate).device_bytes <= hardware.usable_bytes:
                return candidate
    return None


def _smaller_batch(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> TrainingSetup | None:
    """The largest divisor of the batch that fits, with accumulation keeping batch x accumulation."""
    for batch in range(setup.batch_size - 1, 0, -1):
        if setup.batch_size % batch:
            continue
        candidate = setup.replace(batch_size=batch, grad_accum=setup.grad_accum * setup.batch_size // batch)
        if estimate(spec, candidate).device_bytes <= hardware.usable_bytes or batch == 1:
            return candidate
    return None


_DIFF_FLAGS = (("method", "--method"), ("grad_ckpt", "--grad-ckpt"), ("chunked_ce", "--chunked-ce"),
               ("optimizer", "--optimizer"), ("seq_len", "--seq-len"), ("batch_size", "--batch-size"),
               ("grad_accum", "--grad-accum"), ("lora_rank", "--lora-rank"), ("gpus", "--gpus"),
               ("shard", "--shard"), ("offload", "--offload"))


def setup_diff(before: TrainingSetup, after: TrainingSetup) -> dict:
    """The flags that turn `before` into `after` (what a combined suggestion changes)."""
    args = {flag: getattr(after, field) for field, flag in _DIFF_FLAGS
            if getattr(after, field) != getattr(before, field)}
    if after.lora_targets != before.lora_targets:
        args["--lora-targets"] = ",".join(after.lora_targets)
    return args


def _combination(spec, setup, hardware, model_ref, hardware_args, base: Estimate) -> Suggestion | None:
    """No single lever is enough: the cheapest set of levers that fits together (every subset is tried, by
    total cost); if none does, all of them plus the longest length that then fits."""
    from itertools import combinations

    levers = [("grad-ckpt", "gradient checkpointing", lambda s: s.replace(grad_ckpt=True)),
              ("chunked-ce", "chunked cross-entropy", lambda s: s.replace(chunked_ce=True))]
    if setup.method == "full" and setup.optimizer != "adamw-8bit":
        levers.append(("optimizer-8bit", "8-bit optimizer", lambda s: s.replace(optimizer="adamw-8bit")))
    if setup.method in ("full", "lora"):
        levers.append(("qlora", "QLoRA", lambda s: s.replace(method="qlora", optimizer_in_backward=False)))
    if setup.method == "full":
        levers.append(("lora", "LoRA", lambda s: s.replace(method="lora", optimizer_in_backward=False)))
    subsets = [c for n in range(2, len(levers) + 1) for c in combinations(levers, n)
               if not ({"qlora", "lora"} <= {k for k, _, _ in c})]
    subsets.sort(key=lambda c: sum(COSTS[k][0] for k, _, _ in c))
    chosen = None
    for subset in subsets:
        candidate = setup
        for _, _, apply in subset:
            candidate = apply(candidate)
        if estimate(spec, candidate).device_bytes <= hardware.usable_bytes:
            chosen = (subset, candidate)
            break
    if chosen is None:
        subset = max(subsets, key=len) if subsets else tuple(levers)
        candidate = setup
        for _, _, apply in subset:
            candidate = apply(candidate)
        longest = max_int(spec, candidate, hardware, "seq_len", step=64).value
        if not longest:
            return None
        candidate = candidate.replace(seq_len=longest)
        subset = subset + (("seq-len", f"max length {longest}", None),)
        chosen = (subset, candidate)
    subset, combo = chosen
    est = estimate(spec, combo)
    return Suggestion(change=" + ".join(name for _, name, _ in subset), args=setup_diff(setup, combo),
                      command=command_for(model_ref, combo, hardware_args), device_bytes=est.device_bytes,
                      saving_bytes=base.device_bytes - est.device_bytes,
                      cost="; ".join(COSTS[key][1] for key, _, _ in subset),
                      fits=est.device_bytes <= hardware.usable_bytes,
                      rank=sum(COSTS[key][0] for key, _, _ in subset))


# ---- common-mistake warnings --------------------------------------------------------------------------------
def warnings_for(spec: ModelSpec, setup: TrainingSetup, est: Estimate, hardware: Hardware | None,
                 verdict=None) -> list[dict]:
    out = []
    if est.download_bytes:
        ratio = est.device_bytes / est.download_bytes
        out.append({"code": "download-vs-training",
                    "message": f"the download is {est.download_bytes / GB:.1f} GB of 16-bit weights; this "
                               f"training run needs {est.device_bytes / GB:.1f} GB, {ratio:.1f}x the download"})
    if hardware is None:
        return out
    if hardware.kind == "mac" and hardware.usable_bytes >= 0.95 * hardware.capacity_bytes:
        out.append({"code": "mac-whole-ram",
                    "message": "the GPU limit given is the Mac's whole RAM; macOS and open apps need their share: "
                               "plan on about three quarters (Metal's recommendedMaxWorkingSetSize)"})
    if hardware.kind == "memory" and _looks_like_system_ram(hardware.capacity_bytes):
        out.append({"code": "memory-looks-like-system-ram",
                    "message": f"{hardware.capacity_bytes / GB:.0f} GB matches no single GPU but is a common "
                               f"system-RAM size: only the card's own memory counts (see `memfit gpus`)"})
    if verdict is not None and verdict.fits and verdict.margin_bytes < 0.10 * verdict.usable_bytes:
        try:
            grow_len = max_int(spec, setup, hardware, "seq_len", step=64).value
            grow_batch = max_int(spec, setup, hardware, "batch_size").value
        except MemfitError:
            grow_len = grow_batch = None
        out.append({"code": "thin-margin",
                    "message": f"only {gib(verdict.margin_bytes)} to spare: raising length or batch will not fit "
                               f"(longest length at this batch: {grow_len}; largest batch at this length: "
                               f"{grow_batch})"})
    return out


def _looks_like_system_ram(nbytes: int) -> bool:
    from .hardware import gpu_catalog

    if nbytes < 60 * GB:
        return False
    return not any(abs(nbytes - g["memory_bytes"]) <= 0.06 * g["memory_bytes"] for g in gpu_catalog())
