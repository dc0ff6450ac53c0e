"""The model-load phase as text (`memfit estimate --load-peak`) and JSON (the `load` object)."""

from __future__ import annotations

from ..estimator import LOAD_PHASE, Estimate
from ..units import gib


def load_lines(est: Estimate) -> list[str]:
    parts = est.extra.get("load")
    if not parts:
        return ["model load: not modelled for this estimate kind"]
    total = sum(parts.values())
    step = max((nbytes for name, nbytes in est.phases if name != LOAD_PHASE), default=0)
    width = max(len(name) for name in parts)
    counter = "torch.mps.current_allocated_memory()" if est.kind == "mps" else "torch.cuda.max_memory_allocated"
    lines = [f"model load (before the first step; allocated, as {counter} would read):"]
    lines += [f"  {name:<{width}}  {gib(nbytes):>11}" for name, nbytes in parts.items() if nbytes > 0]
    lines.append(f"  {'total':<{width}}  {gib(total):>11}   vs {gib(step)} at the step's peak: "
                 + ("the load is the peak, and the verdict uses it" if total > step else
                    "the step is the peak"))
    return lines


def load_dict(est: Estimate) -> dict | None:
    parts = est.extra.get("load")
    if not parts:
        return None
    return {"phase": LOAD_PHASE, "allocated_bytes": sum(parts.values()),
            "components": [{"name": name, "bytes": nbytes} for name, nbytes in parts.items()]}
