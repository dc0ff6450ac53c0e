"""Hugging Face ids outside the catalog: the local HF cache first (offline), then the Hub (config.json and
safetensors metadata only, never weights). huggingface_hub is imported only on this path.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SourceError, UnknownModelError
from ..spec import ModelSpec
from .local import load_model_dir, read_json_file


def _hub():
    import huggingface_hub  # imported here: the catalog path must not pay for it

    return huggingface_hub


def load_from_cache(repo_id: str) -> ModelSpec | None:
    """The snapshot of `repo_id` in the local HF cache (HF_HOME / HF_HUB_CACHE), or None."""
    try:
        path = _hub().try_to_load_from_cache(repo_id, "config.json")
    except Exception as exc:  # huggingface_hub validates ids and raises its own errors
        raise SourceError(f"{repo_id!r} is not a valid Hugging Face id ({exc})") from None
    if not isinstance(path, str):
        return None
    snapshot = Path(path).parent
    return load_model_dir(snapshot, name=repo_id, source=f"hf-cache:{snapshot}")


def load_from_hub(repo_id: str) -> ModelSpec:
    """Fetch config.json (a few KB) and the safetensors metadata of `repo_id` from the Hub."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UnknownModelError(f"{repo_id!r} is not in the catalog or the local HF cache, and HF_HUB_OFFLINE is "
                                f"set; download its config.json or pass a local path")
    hub = _hub()
    try:
        config_path = hub.hf_hub_download(repo_id, "config.json")
    except Exception as exc:
        raise UnknownModelError(_hub_error(repo_id, exc)) from None
    config = read_json_file(Path(config_path))
    spec = ModelSpec.from_hf_config(config, name=repo_id, source=f"hub:{repo_id}/config.json")
    try:
        meta = hub.HfApi().get_safetensors_metadata(repo_id)
    except Exception:
        return spec.replace(notes=spec.notes + ("no safetensors metadata on the Hub: parameter count from "
                                                "config.json",))
    return spec.replace(**_from_metadata(meta, spec))


def _from_metadata(meta, spec: ModelSpec) -> dict:
    params, quantized = 0, False
    for file_meta in getattr(meta, "files_metadata", {}).values():
        for name, info in file_meta.tensors.items():
            if spec.tied_embeddings and name.endswith("lm_head.weight"):
                continue
            if name.endswith(("inv_freq", "attn.bias", "attn.masked_bias")):
                continue
            if info.dtype in ("U8", "I8", "I32") or "absmax" in name or "qweight" in name:
                quantized = True
            params += info.parameter_count
    if quantized:
        return {"prequantized": spec.prequantized or "quantized safetensors"}
    return {"exact_params": params} if params else {}


def _hub_error(repo_id: str, exc: Exception) -> str:
    kind = type(exc).__name__
    if kind in ("RepositoryNotFoundError",):
        return f"{repo_id!r} is not on the Hugging Face Hub (or is private): check the id"
    if kind in ("GatedRepoError",):
        return f"{repo_id!r} is gated on the Hub: accept its licence and `hf auth login`, or pass a local path"
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return f"{repo_id!r} has no config.json on the Hub"
    return (f"could not fetch {repo_id}/config.json from the Hugging Face Hub ({kind}): are you offline? "
            f"Pass a local config.json or model directory instead")
