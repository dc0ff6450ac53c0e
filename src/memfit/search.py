"""`memfit max`: the longest length, the largest batch, the biggest catalog model that fit, by exact search.

"Fits" is verdict.py's one rule (the whole range within usable memory). Memory never falls as length or batch
grow (a tested property), so a doubling-then-bisection search over `estimate()` finds the exact boundary: the
answer re-checks as FITS and the next step up does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidSetupError
from .estimator import estimate
from .hardware import Hardware
from .setup import MAX_BATCH, MAX_SEQ_LEN, TrainingSetup
from .spec import ModelSpec
from .verdict import fits


@dataclass(frozen=True)
class MaxResult:
    what: str                 # "seq_len" | "batch_size" | "model"
    value: int | str | None   # None: not even the smallest step fits
    device_bytes: int | None  # the estimate at the answer
    next_device_bytes: int | None   # the estimate one step above (proof that it is the maximum)
    usable_bytes: int


def _fits(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> tuple[bool, int]:
    est = estimate(spec, setup)
    return fits(est, hardware), est.device_bytes


def max_int(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware, field: str, step: int = 1) -> MaxResult:
    """The largest value of `field` (seq_len or batch_size, in multiples of `step`) whose estimate fits."""
    top = MAX_SEQ_LEN if field == "seq_len" else MAX_BATCH
    if step < 1 or step > top:
        raise InvalidSetupError(f"step {step} must be between 1 and {top}")
    at = lambda n: setup.replace(**{field: n * step})  # noqa: E731
    first = _first_valid(at, top // step)      # a row must hold a trainer's completion (physics/trainers.py)
    if first is None:
        return MaxResult(field, None, None, None, hardware.usable_bytes)
    ok, dev = _fits(spec, at(first), hardware)
    if not ok:
        return MaxResult(field, None, None, dev, hardware.usable_bytes)
    lo, hi = first, 2 * first
    while hi * step <= top and _fits(spec, at(hi), hardware)[0]:
        lo, hi = hi, hi * 2
    hi = min(hi, top // step + 1)
    while hi - lo > 1:               # invariant: lo fits, hi does not (or is past the limit)
        mid = (lo + hi) // 2
        if _fits(spec, at(mid), hardware)[0]:
            lo = mid
        else:
            hi = mid
    _, device = _fits(spec, at(lo), hardware)
    above = estimate(spec, at(lo + 1)).device_bytes if (lo + 1) * step <= top else None
    return MaxResult(field, lo * step, device, above, hardware.usable_bytes)


def _first_valid(at, last: int) -> int | None:
    """The smallest n whose setup is valid (validity only ever grows with length or batch), or None."""
    def valid(n: int) -> bool:
        try:
            at(n)
            return True
        except InvalidSetupError:
            return False

    if valid(1):
        return 1
    if not valid(last):
        return None
    lo, hi = 1, last                 # lo invalid, hi valid
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if valid(mid) else (mid, hi)
    return hi


def biggest_model(setup: TrainingSetup, hardware: Hardware, family: str | None = None) -> MaxResult:
    """The catalog model with the most parameters (optionally within a family) whose estimate fits."""
    from .sources.catalog import catalog_entries, family_members, spec_from_entry

    entries = family_members(family) if family else list(catalog_entries())
    if not entries:
        raise InvalidSetupError(f"no catalog family {family!r} (`memfit models` lists them)")
    ranked = sorted(entries, key=lambda e: e["params"], reverse=True)
    best, above = None, None
    for entry in ranked:
        try:
            ok, device = _fits(spec_from_entry(entry), setup, hardware)
        except InvalidSetupError:
            continue     # the setup does not apply to this model (LoRA on the experts of a dense model)
        if ok:
            best = (entry, device)
            break
        above = (entry, device)
    if best is None:
        return MaxResult("model", None, None, above[1] if above else None, hardware.usable_bytes)
    return MaxResult("model", best[0]["id"], best[1], above[1] if above else None, hardware.usable_bytes)
