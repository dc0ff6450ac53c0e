"""`memfit plan`: the recommended setup for a model on given hardware, with the alternatives and trade-offs.

Preference: the highest-quality method that fits (full, then LoRA, then QLoRA), at the largest micro-batch up to
8 without checkpointing, else with checkpointing, else with an 8-bit optimizer (full only); gradient
accumulation brings the effective batch to 16. Every number is an estimate() of the setup it describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .advisor import COSTS
from .estimator import estimate
from .hardware import Hardware
from .setup import TrainingSetup
from .spec import ModelSpec
from .verdict import fits

EFFECTIVE_BATCH = 16
BATCHES = (8, 4, 2, 1)
TRADE_OFFS = {
    "full": "trains every weight: the best quality, the most memory",
    "lora": "a 16-bit frozen base and a small adapter: close to full quality for most fine-tunes",
    "qlora": "a 4-bit frozen base: the least memory, a small quality cost and slower matmuls",
}


@dataclass(frozen=True)
class PlanOption:
    method: str
    setup: TrainingSetup | None     # None: nothing fits with this method
    device_bytes: int | None
    command: str | None
    trade_off: str
    notes: tuple[str, ...]

    def as_dict(self) -> dict:
        s = self.setup
        return {"method": self.method, "fits": s is not None, "device_bytes": self.device_bytes,
                "command": self.command, "trade_off": self.trade_off, "notes": list(self.notes),
                "setup": None if s is None else {
                    "batch_size": s.batch_size, "grad_accum": s.grad_accum, "seq_len": s.seq_len,
                    "grad_ckpt": s.grad_ckpt, "optimizer": s.optimizer, "precision": s.precision,
                    "recipe": s.recipe}}


def best_for_method(spec: ModelSpec, base: TrainingSetup, method: str, hardware: Hardware) -> tuple:
    """(setup, device_bytes, notes) for the cheapest-to-train setup of `method` that fits, or (None, ...)."""
    from .recipes import RECIPES

    options = [dict(grad_ckpt=False), dict(grad_ckpt=True)] if base.recipe != "megatron" else \
        [dict(recompute="selective"), dict(recompute="full")]        # Megatron recomputes its own way
    if method == "full" and "adamw-8bit" in RECIPES[base.recipe].optimizers:
        options.append(dict(grad_ckpt=True, optimizer="adamw-8bit"))
    smallest = None
    for extra in options:
        for batch in BATCHES:
            # Accumulation brings the effective batch to 16, except where the optimizer steps inside backward
            # (torchtune's full recipe), which cannot accumulate.
            accum = 1 if base.with_method(method).optimizer_in_backward else max(1, EFFECTIVE_BATCH // batch)
            setup = base.with_method(method).replace(batch_size=batch, grad_accum=accum, **extra)
            est = estimate(spec, setup)
            device = est.device_bytes
            smallest = device if smallest is None else min(smallest, device)
            if fits(est, hardware):
                notes = []
                if setup.grad_ckpt:
                    notes.append(COSTS["grad-ckpt"][1])
                if setup.optimizer == "adamw-8bit":
                    notes.append("8-bit AdamW states")
                return setup, device, tuple(notes)
    return None, smallest, ("does not fit even at batch 1 with checkpointing",)


def plan(spec: ModelSpec, base: TrainingSetup, hardware: Hardware, command_for,
         methods: tuple[str, ...] = ("full", "lora", "qlora")) -> tuple[PlanOption | None, list[PlanOption]]:
    """`command_for(setup)` writes the command that reproduces a setup."""
    from .recipes import RECIPES

    options = []
    for method in (m for m in methods if m in RECIPES[base.recipe].methods):
        setup, device, notes = best_for_method(spec, base, method, hardware)
        command = command_for(setup) if setup else None
        options.append(PlanOption(method, setup, device, command, TRADE_OFFS[method], notes))
    recommended = next((o for o in options if o.setup is not None), None)
    return recommended, [o for o in options if o is not recommended]
