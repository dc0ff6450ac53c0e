"""verdict(estimate, hardware): fits, tight or does-not-fit, judged on device_bytes (what nvidia-smi shows).

fits:          the whole estimated range (its high end) is within usable memory
tight:         the point estimate fits but the high end of the range does not: it may run out of memory
does-not-fit:  the point estimate exceeds usable memory

This is memfit's one meaning of "fits": `memfit max`, `memfit plan`, the suggestions and `memfit check` all
ask ``fits(estimate, hardware)``, so whatever they offer as fitting re-checks as FITS.
"""

from __future__ import annotations

from dataclasses import dataclass

from .estimator import Estimate
from .hardware import Hardware


@dataclass(frozen=True)
class Verdict:
    status: str              # "fits" | "tight" | "does-not-fit"
    usable_bytes: int
    needed_bytes: int        # the estimate's device_bytes
    margin_bytes: int        # usable - needed; negative when it does not fit
    high_margin_bytes: int   # usable - the range's high end
    hardware: Hardware

    @property
    def fits(self) -> bool:
        return self.status == "fits"


def verdict(estimate: Estimate, hardware: Hardware) -> Verdict:
    usable = hardware.usable_bytes
    needed = estimate.device_bytes
    if needed > usable:
        status = "does-not-fit"
    elif estimate.range_high_bytes > usable:
        status = "tight"
    else:
        status = "fits"
    return Verdict(status=status, usable_bytes=usable, needed_bytes=needed, margin_bytes=usable - needed,
                   high_margin_bytes=usable - estimate.range_high_bytes, hardware=hardware)


def fits(estimate: Estimate, hardware: Hardware) -> bool:
    """The one decision rule: the high end of the estimate's range is within usable memory."""
    return estimate.range_high_bytes <= hardware.usable_bytes and estimate.device_bytes <= hardware.usable_bytes
