"""load_model(ref): one entry point for every way of naming a model."""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError, UnknownModelError, did_you_mean
from ..spec import ModelSpec
from .catalog import find_entry, slugs, spec_from_entry
from .hub import load_from_cache, load_from_hub
from .local import load_config_file, load_model_dir
from .size import looks_like_size, spec_from_size


def load_model(ref: str, *, allow_network: bool = True, allow_paths: bool = True) -> ModelSpec:
    """A catalog name or HF id, a config.json, a model directory, or a bare size like '7B'. With
    ``allow_paths=False`` (the server) nothing on the local disk is read but the catalog and the HF cache."""
    if not isinstance(ref, str) or not ref.strip():
        raise UnknownModelError("no model given (a catalog name, HF id, config.json path, directory or size)")
    ref = ref.strip()
    if looks_like_size(ref):
        return spec_from_size(ref)
    if not allow_paths:
        if ref.startswith((".", "/", "~")) or "\\" in ref or ".." in ref or ref.endswith(".json"):
            raise SourceError(f"{ref}: this server takes catalog names and Hub ids, not paths")
    else:
        path = Path(ref).expanduser()
        if path.is_file():
            return load_config_file(path)
        if path.is_dir():
            return load_model_dir(path)
    if ref.startswith((".", "/", "~")) or ref.endswith(".json"):
        raise SourceError(f"{ref}: no such file or directory")
    entry = find_entry(ref)
    if entry is not None:
        return spec_from_entry(entry)
    if "/" in ref and ref.count("/") == 1:
        cached = load_from_cache(ref)
        if cached is not None:
            return cached
        if allow_network:
            return load_from_hub(ref)
    raise UnknownModelError(f"unknown model {ref!r}" + did_you_mean(ref, slugs(), "memfit models"))
