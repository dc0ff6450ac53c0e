"""`memfit explain`: the bytes per weight of the chosen setup, set against the rule of thumb, and every phase.

The rule of thumb counts weight 2 + gradient 2 + Adam moments 4 + 4 = 12 B per trained weight (16 with an fp32
master copy). Real stacks differ: torch AdamW keeps its moments in the parameter's dtype (bf16 moments for bf16
weights, torch/optim/adam.py `zeros_like(p)`), foreach AdamW adds a parameter-sized temporary at the step, and
HF Trainer's bf16=True keeps no master copy at all (it is autocast).
"""

from __future__ import annotations

from dataclasses import dataclass

from .estimator import SCHEMA_VERSION, Estimate, estimate
from .physics import activations as act
from .physics import states
from .physics.stack import resolve_stack
from .rule import RULES
from .setup import TrainingSetup
from .spec import ModelSpec
from .units import gib


@dataclass(frozen=True)
class ExplainResult:
    rows: tuple[tuple[str, float, str], ...]   # (what, bytes per trained weight, note)
    rule_bytes_per_weight: float
    estimate: Estimate
    per_layer_activation_bytes: int
    checkpoint_bytes_per_layer: int
    differences: tuple[str, ...]

    @property
    def bytes_per_weight(self) -> float:
        return sum(r[1] for r in self.rows)

    def as_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "model": self.estimate.model_name,
                "bytes_per_trained_weight": [{"what": w, "bytes": b, "note": n} for w, b, n in self.rows],
                "total_bytes_per_trained_weight": self.bytes_per_weight,
                "rule_of_thumb_bytes_per_weight": self.rule_bytes_per_weight,
                "per_layer_activation_bytes": self.per_layer_activation_bytes,
                "checkpoint_bytes_per_layer": self.checkpoint_bytes_per_layer,
                "phases": [{"name": n, "allocated_bytes": b} for n, b in self.estimate.phases],
                "peak_phase": self.estimate.peak_phase, "differences": list(self.differences)}

    def text(self) -> str:
        est = self.estimate
        lines = [f"{est.model_name}, {est.setup.method}, {est.precision}, optimizer {est.setup.optimizer}", "",
                 "bytes per trained weight:"]
        for what, nbytes, note in self.rows:
            lines.append(f"  {what:<28} {nbytes:>6.3g} B   {note}")
        lines.append(f"  {'total':<28} {self.bytes_per_weight:>6.3g} B   (rule of thumb: "
                     f"{self.rule_bytes_per_weight:g} B)")
        lines += ["", "where this stack differs from the rule:"] + [f"  - {d}" for d in self.differences]
        lines += ["", f"activations: {gib(self.per_layer_activation_bytes)} per layer saved for backward; "
                      f"{gib(self.checkpoint_bytes_per_layer)} per layer with gradient checkpointing", "",
                  "candidate peaks of one step (allocated):"]
        for name, nbytes in est.phases:
            marker = "  <- peak" if name == est.peak_phase else ""
            lines.append(f"  {name:<26} {gib(nbytes):>11}{marker}")
        return "\n".join(lines)


def explain(spec: ModelSpec, setup: TrainingSetup) -> ExplainResult:
    est = estimate(spec, setup)
    if spec.is_rule_of_thumb:
        from .rule import rule_key

        per, _, what = RULES[rule_key(setup)]
        return ExplainResult(rows=((what, per, "rule of thumb"),), rule_bytes_per_weight=per, estimate=est,
                             per_layer_activation_bytes=0, checkpoint_bytes_per_layer=0,
                             differences=("a bare size has no architecture: name a model to see the real stack",))
    stack = resolve_stack(spec, setup)
    trained = max(states.trainable_params(spec, stack), 1)
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    opt_bytes, paged, _ = states.optimizer_state_bytes(spec, setup, stack)
    step_temp, step_note = states.optimizer_step_transient(spec, setup, stack)
    if stack.base_trainable:
        what = f"{stack.weight_dtype} trained weights"
    else:   # PEFT keeps adapters in fp32 unless the recipe casts them with the module (physics/stack.py)
        what = f"{'fp32' if p == 4 else stack.autocast_dtype or stack.weight_dtype} adapter"
    rows = [("weight", float(p), what),
            ("gradient", states.gradient_bytes(spec, setup, stack) / trained, "same dtype as the weight"),
            ("optimizer state", (opt_bytes + paged) / trained, setup.optimizer),
            ("optimizer step temporaries", step_temp / trained, step_note)]
    rule = RULES["full-master" if stack.weight_bytes == 4 else "full"][0]
    diffs = []
    if setup.optimizer in ("adamw", "adamw-fused", "adamw-loop") and p == 2:
        diffs.append("torch AdamW keeps exp_avg and exp_avg_sq in the parameter dtype: 2 + 2 B for bf16 "
                     "weights, not the rule's fp32 4 + 4")
    if stack.weight_bytes == 4 and stack.autocast:
        diffs.append("bf16-mixed: the fp32 weights are the master copy; autocast adds bf16 weight casts that "
                     "live from each layer's forward to its backward")
    elif stack.autocast:
        diffs.append("HF Trainer bf16=True on bf16 weights is autocast only: no fp32 master copy exists")
    if setup.optimizer == "adamw":
        diffs.append("foreach AdamW allocates one parameter-sized temporary inside step()")
    if setup.method != "full":
        base, _ = states.base_weight_bytes(spec, setup, stack)
        diffs.append(f"{setup.method}: the frozen base costs {base / spec.params:.3g} B per weight with no "
                     f"gradient or optimizer state; only the {trained:,} adapter weights above are trained")
    if not diffs:
        diffs.append("this setup matches the rule's assumptions")
    return ExplainResult(rows=tuple(rows), rule_bytes_per_weight=rule, estimate=est,
                         per_layer_activation_bytes=act.layer_activation_bytes(spec, setup, stack),
                         checkpoint_bytes_per_layer=act.checkpoint_bytes(spec, setup, stack),
                         differences=tuple(diffs))
