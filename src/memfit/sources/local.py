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

from ..errors import SourceError, printable, shorten
from ..spec import MAX_PARAMS, ModelSpec

MAX_HEADER_BYTES = 100 * 2**20   # safetensors caps headers at 100 MB
# The largest real config.json files (with tokenizer-sized id2label maps) are a few hundred KB; a bigger
# file is weights or a dataset passed by mistake, and reading it whole would only waste memory.
MAX_CONFIG_BYTES = 16 * 2**20
MAX_NAME_CHARS = 200
# The dtypes the safetensors format defines (safetensors/src/tensor.rs, Dtype).
SAFETENSORS_DTYPES = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2",
                      "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"}
_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
# Buffers some checkpoints store that are not parameters: rotary inv_freq, GPT-2's causal-mask buffers.
_NOT_PARAMS = ("inv_freq", "attn.bias", "attn.masked_bias")
_QUANT_MARKERS = ("absmax", "quant_map", "quant_state", "qweight", "qzeros", "g_idx", ".SCB")
_QUANT_DTYPES = ("U8", "I8", "I32", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2")


class _NonFinite:
    """Stands in for NaN / Infinity while parsing, so the key that held it can be named afterwards."""

    def __init__(self, text: str):
        self.text = text


def parse_json(text: str | bytes, where: str) -> object:
    """json.loads without Python's extensions: NaN, Infinity and -Infinity are refused with the key that held
    them; nesting too deep for the parser is a SourceError, not a RecursionError."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")     # json.loads would guess UTF-16/32 from the bytes; the formats say UTF-8
        except UnicodeDecodeError as exc:
            raise SourceError(f"{where}: not UTF-8 text (byte {text[exc.start]:#04x} at offset {exc.start})") from None
    try:
        data = json.loads(text, parse_constant=_NonFinite, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise SourceError(f"{where}: JSON nested too deeply to be a config") from None
    bad = _find_non_finite(data)
    if bad is not None:
        key, value = bad
        raise SourceError(f"{where}: {key or 'the document'} is {value}, which JSON does not allow "
                          f"(a finite number is needed)")
    return data


def _finite_float(text: str):
    """1e400 parses to inf in Python; keep the literal so the key can be named."""
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _find_non_finite(data) -> tuple[str, str] | None:
    """(dotted key, 'NaN') of the first non-finite constant, walking iteratively (no recursion limit)."""
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _NonFinite):
            return printable(path)[:200], value.text
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def read_json_file(path: Path) -> dict:
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise SourceError(f"{path}: {size:,} bytes is too large for a config.json (weights or data given "
                              f"as the model?)")
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not a text file (byte {raw[exc.start]:#04x} at offset {exc.start} is not "
                          f"UTF-8): a model is a config.json or a model directory") from None
    data = parse_json(text, str(path))
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object, got a JSON {_json_kind(data)}")
    return data


def _json_kind(value) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


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
    if len(header) < length:
        raise SourceError(f"{path}: truncated safetensors file (header claims {length:,} bytes, "
                          f"{len(header):,} present)")
    return parse_safetensors_header(header, str(path))


def parse_safetensors_header(header: bytes, where: str) -> dict:
    data = parse_json(header, f"{where}: safetensors header")
    if not isinstance(data, dict):
        raise SourceError(f"{where}: safetensors header is not a JSON object")
    return data


def summarize_headers(headers: list[dict], tied: bool, where: str = "safetensors") -> dict:
    """Exact parameter count, stored dtype and quantization markers from safetensors headers."""
    params, by_dtype, quantized = 0, Counter(), False
    for header in headers:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(info, dict):
                raise SourceError(f"{where}: tensor {shorten(name)} has no dtype/shape entry")
            if name.endswith(_NOT_PARAMS):
                continue
            if tied and name.endswith("lm_head.weight"):
                continue   # stored, but transformers ties it to the embedding
            if any(marker in name for marker in _QUANT_MARKERS):
                quantized = True
            numel = _numel(name, info, where)
            params += numel
            by_dtype[info["dtype"]] += numel
    if params > MAX_PARAMS:
        raise SourceError(f"{where}: the headers add up to {params:.3g} parameters, more than any model "
                          f"({MAX_PARAMS:.0e}); the files are not a real checkpoint")
    dtype = by_dtype.most_common(1)[0][0] if by_dtype else None
    if dtype in _QUANT_DTYPES:
        quantized = True
    return {"params": params, "dtype": _DTYPES.get(dtype or ""), "quantized": quantized}


def _numel(name: str, info: dict, where: str) -> int:
    dtype, shape = info.get("dtype"), info.get("shape")
    if dtype not in SAFETENSORS_DTYPES:
        raise SourceError(f"{where}: tensor {shorten(name)} has an unknown dtype {shorten(dtype)} "
                          f"(safetensors dtypes: F32, F16, BF16, I8, U8, ...)")
    if not isinstance(shape, list) or len(shape) > 8 or \
            not all(type(d) is int and 0 <= d <= MAX_PARAMS for d in shape):
        raise SourceError(f"{where}: tensor {shorten(name)} has a malformed shape {shorten(shape)} "
                          f"(a list of at most 8 non-negative integers)")
    numel = math.prod(shape)
    if numel > MAX_PARAMS:
        raise SourceError(f"{where}: tensor {shorten(name)} claims {numel:.3g} elements (shape {shape}); "
                          f"not a real checkpoint")
    return numel


def name_from_config(config: dict, fallback: str) -> str:
    """The model's name from `_name_or_path`, made safe to print: it is text from a file."""
    raw = config.get("_name_or_path")
    name = raw if isinstance(raw, str) and raw.strip() else fallback
    name = printable(name.strip())
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "…"


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def load_config_file(path: Path) -> ModelSpec:
    if path.suffix.lower() in WEIGHT_SUFFIXES:
        raise SourceError(f"{path}: a weights file, not a config.json: pass the model directory that holds "
                          f"it and its config.json")
    config = read_json_file(path)
    name = name_from_config(config, path.parent.name or path.name)
    return ModelSpec.from_hf_config(config, name=name, source=str(path))


def load_model_dir(folder: Path, name: str | None = None, source: str | None = None) -> ModelSpec:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{folder}: no config.json in this directory")
    config = read_json_file(config_path)
    spec = ModelSpec.from_hf_config(config, name=printable(name or folder.name), source=source or str(folder))
    shards = _shard_files(folder)
    if not shards:
        return spec
    missing = [p for p in shards if not p.is_file()]
    if missing:
        return spec.replace(notes=spec.notes + (f"{len(missing)} safetensors shard(s) missing: parameter count "
                                                f"taken from config.json",))
    summary = summarize_headers([read_safetensors_header(p) for p in shards], spec.tied_embeddings, str(folder))
    return spec.replace(**changes_from_summary(spec, summary))


def changes_from_summary(spec: ModelSpec, summary: dict) -> dict:
    """What safetensors headers change in a spec read from config.json alone."""
    if summary["quantized"]:
        return {"prequantized": spec.prequantized or "quantized safetensors",
                "notes": spec.notes + ("the checkpoint is pre-quantized: parameter count from config.json",)}
    changes: dict = {"exact_params": summary["params"]} if summary["params"] else {}
    if summary["dtype"]:
        changes["checkpoint_dtype"] = summary["dtype"]
    return changes


def shard_names(weight_map, where: str) -> list[str]:
    """The shard file names of an index's weight_map; each must be a plain *.safetensors name in the folder
    (an index is text from a file or the Hub: "../x" must not reach outside the model)."""
    if not isinstance(weight_map, dict) or not weight_map:
        raise SourceError(f"{where}: no weight_map (a JSON object of tensor name -> shard file)")
    names = sorted({str(v) for v in weight_map.values()})
    for name in names:
        parts = name.split("/")
        if not name.endswith(".safetensors") or name.startswith("/") or ".." in parts or "\\" in name:
            raise SourceError(f"{where}: weight_map names {shorten(name)}, not a .safetensors file inside the "
                              f"model directory")
    return names


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / f for f in shard_names(read_json_file(index).get("weight_map"), str(index))]
    return sorted(folder.glob("*.safetensors"))
