"""A bare model size ("7B", "0.5b", "1.5B", "350M"): only the seed's rule of thumb can use it."""

from __future__ import annotations

import re

from ..errors import InvalidSetupError
from ..spec import ModelSpec

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([bBmM])\s*$")


def looks_like_size(ref: str) -> bool:
    return bool(_SIZE_RE.match(ref))


def spec_from_size(ref: str) -> ModelSpec:
    number, unit = _SIZE_RE.match(ref).groups()
    params = float(number) * (1e9 if unit.lower() == "b" else 1e6)
    if params < 1e6:
        raise InvalidSetupError(f"model size {ref!r} is below a million parameters; is the unit right?")
    if params > 5e12:
        raise InvalidSetupError(f"model size {ref!r} is larger than any model that exists (5T); check it")
    return ModelSpec.from_size(int(round(params)), ref.strip().upper())
