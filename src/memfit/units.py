"""Sizes: parsed from user text in one place, formatted in one place.

Inside memfit every size is an int of bytes. ``GB`` means 1e9 bytes and ``GiB`` 2**30 bytes, always; a label
matches its divisor (accelerate and llm-analysis print GiB values labelled "GB", a silent 7.4% error).
"""

from __future__ import annotations

import re

from .errors import InvalidSetupError

GiB = 2**30
GB = 10**9
MiB = 2**20

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    # A bare "G"/"M"/"T" is ambiguous; we read it as the SI unit, like GB, and say so where it matters.
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")

# Nothing in this field has more than 2 TiB on one device; a larger number is a typo.
MAX_DEVICE_BYTES = 2 * 2**40


def parse_size(text: str, what: str = "size") -> int:
    """Parse '24GB', '24GiB', '24G', '80 GB', '1.5TB' into bytes. Raises InvalidSetupError on anything else."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise InvalidSetupError(f"{what} {text!r} is not a size (examples: 24GB, 24GiB, 80GB)")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise InvalidSetupError(f"{what} {text!r} has an unknown unit {match.group(2)!r} (use GB or GiB)")
    if unit in ("", "b") and number < 1e6:
        raise InvalidSetupError(f"{what} {text!r} has no unit (write e.g. {text}GB or {text}GiB)")
    nbytes = int(round(number * _UNITS[unit]))
    if nbytes <= 0:
        raise InvalidSetupError(f"{what} {text!r} must be positive")
    if nbytes > MAX_DEVICE_BYTES:
        raise InvalidSetupError(f"{what} {text!r} is larger than any single device (2 TiB); check the unit")
    return nbytes


def gib(nbytes: int | float) -> str:
    return f"{nbytes / GiB:.2f} GiB"


def gb(nbytes: int | float) -> str:
    return f"{nbytes / GB:.2f} GB"


def human(nbytes: int | float) -> str:
    """GiB for large sizes, MiB for small ones; the label always matches the divisor."""
    if abs(nbytes) >= GiB / 10:
        return gib(nbytes)
    return f"{nbytes / MiB:.1f} MiB"


def count(n: int) -> str:
    """12_345_678_901 -> '12.35B', 41_943_040 -> '41.94M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)
