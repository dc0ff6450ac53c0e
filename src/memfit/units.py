"""Sizes: parsed from user text in one place, formatted in one place.

Inside memfit every size is an int of bytes. ``GB`` means 1e9 bytes and ``GiB`` 2**30 bytes, always; a label
matches its divisor (accelerate and llm-analysis print GiB values labelled "GB", a silent 7.4% error).
"""

from __future__ import annotations

import math
import re

from .errors import InvalidSetupError, shorten

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
# Host RAM is another scale: 4-32 TB servers exist (8-socket machines), so --host-ram has its own bound.
MAX_HOST_BYTES = 64 * 2**40
# A bare number is a byte count only when it is at least this large: every real device has over 1 GiB, and
# "--mac 36" or "--memory 1000000" is a size missing its unit, not 36 or 10^6 bytes.
MIN_BARE_BYTES = 2**30
# Upper bounds by the option a size is for; commands.py parses --host-ram through parse_size by its label.
_MAX_BYTES_FOR = {"--host-ram": (MAX_HOST_BYTES, "any machine's RAM (64 TiB)")}


def parse_size(text: str, what: str = "size", *, max_bytes: int | None = None) -> int:
    """Parse '24GB', '24GiB', '24G', '80 GB', '1.5TB' into bytes. Raises InvalidSetupError on anything else.

    The upper bound is `max_bytes`, else the bound for `what` (--host-ram: 64 TiB), else 2 TiB (one device)."""
    raw = str(text)
    shown = shorten(raw, 40)
    match = _SIZE_RE.match(raw) if len(raw) <= 100 else None
    if not match:
        raise InvalidSetupError(f"{what} {shown} is not a size (examples: 24GB, 24GiB, 80GB)")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise InvalidSetupError(f"{what} {shown} has an unknown unit {shorten(match.group(2), 20)} (use GB or GiB)")
    if unit == "" and number < MIN_BARE_BYTES:
        raise InvalidSetupError(f"{what} {shown} has no unit (write e.g. {raw.strip()}GB or {raw.strip()}GiB)")
    if not math.isfinite(number * _UNITS[unit]):
        raise InvalidSetupError(f"{what} {shown} is too large to be a size")
    nbytes = int(round(number * _UNITS[unit]))
    if nbytes <= 0:
        raise InvalidSetupError(f"{what} {shown} must be positive")
    limit, label = (max_bytes, f"{max_bytes:,} bytes") if max_bytes else \
        _MAX_BYTES_FOR.get(what, (MAX_DEVICE_BYTES, "any single device (2 TiB)"))
    if nbytes > limit:
        raise InvalidSetupError(f"{what} {shown} is larger than {label}; check the unit")
    return nbytes


def parse_host_ram(text: str) -> int:
    """--host-ram: a machine's RAM, up to 64 TiB (not a device's 2 TiB)."""
    return parse_size(text, "--host-ram", max_bytes=MAX_HOST_BYTES)


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
