"""Local sources: a config.json file, or a model directory (config.json plus safetensors headers).

A safetensors file starts with an 8-byte little-endian header length and a JSON header listing every tensor's
dtype and shape (https://github.com/huggingface/safetensors, "Format"). Reading only that header gives the exact
parameter count and the stored dtype without touching the weights. Sharded checkpoints list their files in
model.safetensors.index.json ("weight_map").
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from pathlib import Path

from ..errors import SourceError
from ..spec import ModelSpec

MAX_HEADER_BYTES = 100 * 2**20   # safetensors caps headers at 100 MB
_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
# Buffers some checkpoints store that are not parameters: rotary inv_freq, GPT-2's causal-mask buffers.
_NOT_PARAMS = ("inv_freq", "attn.bias", "attn.masked_bias")
_QUANT_MARKERS = ("absmax", "quant_map", "quant_state", "qweight", "qzeros", "g_idx", ".SCB")


def read_json_file(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object")
    return data


def read_safetensors_header(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise SourceError(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES:
                raise SourceError(f"{path}: safetensors header claims {length} bytes; not a safetensors file")
            header = fh.read(length)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SourceError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: safetensors header is not a JSON object")
    return data


def summarize_headers(headers: list[dict], tied: bool) -> dict:
    """Exact parameter count, stored dtype and quantization markers from safetensors headers."""
    params, by_dtype, quantized = 0, Counter(), False
    for header in headers:
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            if name.endswith(_NOT_PARAMS):
                continue
            if tied and name.endswith("lm_head.weight"):
                continue   # stored, but transformers ties it to the embedding
            if any(marker in name for marker in _QUANT_MARKERS):
                quantized = True
            shape = info.get("shape")
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise SourceError(f"safetensors tensor {name!r} has a malformed shape {shape!r}")
            numel = math.prod(shape)
            params += numel
            by_dtype[str(info.get("dtype"))] += numel
    dtype = by_dtype.most_common(1)[0][0] if by_dtype else None
    if dtype in ("U8", "I8", "I32"):
        quantized = True
    return {"params": params, "dtype": _DTYPES.get(dtype or ""), "quantized": quantized}


def load_config_file(path: Path) -> ModelSpec:
    config = read_json_file(path)
    name = str(config.get("_name_or_path") or path.parent.name or path.name)
    return ModelSpec.from_hf_config(config, name=name, source=str(path))


def load_model_dir(folder: Path, name: str | None = None, source: str | None = None) -> ModelSpec:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{folder}: no config.json in this directory")
    config = read_json_file(config_path)
    spec = ModelSpec.from_hf_config(config, name=name or folder.name, source=source or str(folder))
    shards = _shard_files(folder)
    if not shards:
        return spec
    missing = [p for p in shards if not p.is_file()]
    if missing:
        return spec.replace(notes=spec.notes + (f"{len(missing)} safetensors shard(s) missing: parameter count "
                                                f"taken from config.json",))
    summary = summarize_headers([read_safetensors_header(p) for p in shards], spec.tied_embeddings)
    changes: dict = {}
    if summary["quantized"]:
        changes["prequantized"] = spec.prequantized or "quantized safetensors"
        changes["notes"] = spec.notes + ("the checkpoint is pre-quantized: parameter count from config.json",)
    else:
        changes["exact_params"] = summary["params"]
        if summary["dtype"]:
            changes["checkpoint_dtype"] = summary["dtype"]
    return spec.replace(**changes)


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_file(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise SourceError(f"{index}: no weight_map")
        return [folder / f for f in sorted(set(map(str, weight_map.values())))]
    return sorted(folder.glob("*.safetensors"))
