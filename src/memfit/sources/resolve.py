"""load_model(ref): one entry point for every way of naming a model."""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError, UnknownModelError, close_matches, printable, shorten
from ..spec import ModelSpec
from .catalog import catalog_entries, find_entry, slugs, spec_from_entry
from .hub import is_repo_id, load_from_cache, load_from_hub
from .local import load_config_file, load_model_dir
from .size import looks_like_size, spec_from_size

# Paths can be long, but not this long (Linux PATH_MAX is 4096); a longer reference is pasted text.
MAX_REF_CHARS = 4096


def load_model(ref: str, *, allow_network: bool = True, allow_paths: bool = True) -> ModelSpec:
    """A catalog name or HF id, a config.json, a model directory, or a bare size like '7B'. With
    ``allow_paths=False`` (the server) nothing on the local disk is read but the catalog and the HF cache."""
    if not isinstance(ref, str) or not ref.strip():
        raise UnknownModelError("no model given (a catalog name, HF id, config.json path, directory or size)")
    ref = ref.strip()
    if len(ref) > MAX_REF_CHARS:
        raise UnknownModelError(f"model name {shorten(ref, 40)} is too long to be a model name, Hub id or path "
                                f"(at most {MAX_REF_CHARS:,} characters)")
    if printable(ref) != ref:
        raise UnknownModelError(f"model name {shorten(ref)} contains control or invisible characters; type the "
                                f"name again")
    if looks_like_size(ref):
        return spec_from_size(ref)
    if not allow_paths:
        if ref.startswith((".", "/", "~")) or "\\" in ref or ".." in ref or ref.endswith(".json"):
            raise SourceError(f"{shorten(ref)}: this server takes catalog names and Hub ids, not paths")
    else:
        try:
            path = Path(ref).expanduser()
            is_file, is_dir = path.is_file(), path.is_dir()
        except (OSError, RuntimeError) as exc:   # over NAME_MAX, a parent we may not read, ~nouser
            raise SourceError(f"{shorten(ref)}: cannot be read as a path ({getattr(exc, 'strerror', None) or exc})") from None
        if is_file:
            return load_config_file(path)
        if is_dir:
            return load_model_dir(path)
    if ref.startswith((".", "/", "~")) or ref.endswith(".json"):
        raise SourceError(f"{shorten(ref)}: no such file or directory")
    entry = find_entry(ref)
    if entry is not None:
        return spec_from_entry(entry)
    candidates = suggestions(ref)
    hint = f"; did you mean {' or '.join(candidates)}?" if candidates else ""
    if ref.count("/") == 1:
        if not is_repo_id(ref):
            raise UnknownModelError(f"{shorten(ref)} is not a valid Hugging Face id (org/name: letters, digits, "
                                    f"'-', '_', '.', at most 96 characters each){hint}", name=ref,
                                    candidates=candidates)
        cached = load_from_cache(ref)
        if cached is not None:
            return cached
        if allow_network:
            try:
                return load_from_hub(ref, hint)
            except UnknownModelError as exc:
                exc.candidates = candidates
                raise
    raise UnknownModelError(f"unknown model {shorten(ref)}{hint} (`memfit models` lists them)", name=ref,
                            candidates=candidates)


def suggestions(ref: str) -> tuple[str, ...]:
    """Close catalog names: Hub ids for an 'org/name' reference (meta-lama/... -> meta-llama/...), else slugs."""
    if "/" in ref:
        return tuple(close_matches(ref, [entry["id"] for entry in catalog_entries()]))
    return tuple(close_matches(ref, slugs()))
