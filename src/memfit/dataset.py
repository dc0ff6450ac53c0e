"""The dataset check: how long your examples really are in tokens, and what a max length would cut.

Reads JSONL, JSON, CSV or Parquet (streamed), in the layouts fine-tuning tools use: `text`; `prompt` /
`completion`; `instruction` / `input` / `output` (Alpaca); chat `messages` (or `conversations`) as a list of
{role, content}. For a vision-language model, the images a row names (``image_refs``) add the tokens the model's
processor makes of them (vision.image_token_rule), their sizes read from the files' headers. Tokenizes with a tokenizer.json (the `tokenizers` library) or a model directory (transformers'
AutoTokenizer, which also applies the model's chat template to `messages`).
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import MissingExtraError, SourceError, shorten

DATASET_HINT = 'pip install "memfit[dataset]"  (tokenizers, pyarrow)'
HISTOGRAM_BINS = 12


@dataclass(frozen=True)
class LengthStats:
    count: int
    p50: int
    p90: int
    p99: int
    max: int
    mean: float
    histogram: tuple[tuple[int, int, int], ...]   # (from_tokens, to_tokens, examples)
    layout: str
    truncated_share: float | None                 # share of examples longer than seq_len
    seq_len: int | None
    image_tokens: tuple[int, int, int] | None = None  # a VLM's image tokens per example: (p50, p99, max)

    def as_dict(self) -> dict:
        return {"count": self.count, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max,
                "mean": round(self.mean, 1), "layout": self.layout, "seq_len": self.seq_len,
                "truncated_share": self.truncated_share,
                "image_tokens": None if self.image_tokens is None else dict(zip(("p50", "p99", "max"),
                                                                                self.image_tokens)),
                "histogram": [{"from": a, "to": b, "count": n} for a, b, n in self.histogram]}


# ---- reading ------------------------------------------------------------------------------------------------
# A long-context example in one CSV cell can pass csv's default 128 KB field limit; 256 MiB bounds the memory a
# single malformed (unterminated-quote) field can take while still reading any real example.
CSV_FIELD_LIMIT = 256 * 2**20
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))
_LAYOUT_KEYS = (("chat", ("messages",)), ("chat", ("conversations",)), ("prompt-completion", ("prompt", "completion")),
                ("instruction-output", ("instruction", "output")), ("text", ("text",)))


def iter_records(path: Path):
    """The examples of a dataset file, as dicts."""
    for _, record in iter_located_records(path):
        yield record


def iter_located_records(path: Path):
    """(where, record) for every example: `where` is "file:line" (JSONL, CSV), "file: item N" (JSON) or
    "file: row N" (Parquet), so every later error can name the example it is about."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise SourceError(f"{path}: no such dataset file")
    if suffix not in (".jsonl", ".ndjson", ".json", ".csv", ".parquet"):
        raise SourceError(f"{path}: unknown dataset format {suffix!r} (use .jsonl, .json, .csv or .parquet)")
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not head:
        raise SourceError(f"{path}: empty file")
    if suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            raise SourceError(f"{path}: the file is {encoding} text; save it as UTF-8")
    if suffix in (".jsonl", ".ndjson"):
        yield from _jsonl_rows(path)
    elif suffix == ".json":
        yield from _json_rows(path)
    else:
        yield from _csv_rows(path)


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}; "
                          f"latin-1 or Windows text? save the file as UTF-8)") from None


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise SourceError(f"{where}: JSON nested too deeply") from None


def _jsonl_rows(path: Path):
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, 1):
            where = f"{path}:{number}"
            line = _decode(raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw, where)
            if line.strip():
                yield where, _json_line(line, where)


def _json_line(line: str, where: str) -> dict:
    record = _loads(line, where)
    if not isinstance(record, dict):
        raise SourceError(f"{where}: expected one JSON object per line, got a JSON {_kind(record)}")
    return record


def _json_rows(path: Path):
    data = _loads(_decode(path.read_bytes().removeprefix(b"\xef\xbb\xbf"), str(path)), str(path))
    rows = data.get("data", data.get("train")) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise SourceError(f"{path}: expected a JSON list of examples (or {{\"data\": [...]}})")
    for index, record in enumerate(rows):
        where = f"{path}: item {index}"
        if not isinstance(record, dict):
            raise SourceError(f"{where}: expected a JSON object, got a JSON {_kind(record)}")
        yield where, record


def _csv_rows(path: Path):
    previous = csv.field_size_limit()
    csv.field_size_limit(max(previous, CSV_FIELD_LIMIT))
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh, strict=True)   # a stray quote is an error, not a silent merge
            try:
                for row in reader:
                    where = f"{path}:{reader.line_num}"
                    if None in row:
                        raise SourceError(f"{where}: {len(row[None])} more field(s) than the header's "
                                          f"{len(reader.fieldnames)} columns")
                    yield where, row
            except csv.Error as exc:
                # DictReader.line_num lags on errors; the underlying reader's counts the line being parsed
                raise SourceError(f"{path}:{reader.reader.line_num}: not valid CSV ({exc})") from None
            except UnicodeDecodeError as exc:
                raise SourceError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x}, near line "
                                  f"{reader.reader.line_num + 1}; latin-1 or Windows text? save the file as UTF-8)") from None
    finally:
        csv.field_size_limit(previous)


def _parquet_rows(path: Path):
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(f"reading Parquet needs pyarrow: {DATASET_HINT}") from None
    row = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                yield f"{path}: row {row}", record
                row += 1
    except (pyarrow.ArrowException, OSError) as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"{path}: not a readable Parquet file (at row {row}: {detail})") from None


def _kind(value) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def detect_layout(record: dict, where: str = "dataset") -> str:
    if not isinstance(record, dict):
        raise SourceError(f"{where}: dataset examples must be objects (dicts), one per line or list item")
    for layout, keys in _LAYOUT_KEYS:
        if all(k in record for k in keys):
            return layout
    keys = [shorten(k, 40) for k in sorted(map(str, record))[:8]]
    raise SourceError(f"{where}: cannot tell the dataset layout from its keys [{', '.join(keys)}]: expected text, "
                      f"prompt/completion, instruction/output or messages")


def checked_record(record: dict, layout: str, where: str) -> dict:
    """The fields `layout` needs, each checked: a missing or wrongly typed field names the example."""
    if layout == "chat":
        key = "messages" if "messages" in record else "conversations"
        if key not in record:
            raise SourceError(f"{where}: no 'messages' (the dataset's layout is chat, from its first example)")
        return {"messages": _messages(record[key], key, where)}
    needed = {"prompt-completion": ("prompt", "completion"), "instruction-output": ("instruction", "output"),
              "text": ("text",)}[layout]
    out = {}
    for key in needed:
        if key not in record:
            raise SourceError(f"{where}: no {key!r} field (the dataset's layout is {layout}, from its first "
                              f"example)")
        out[key] = _string(record[key], key, where)
    if layout == "instruction-output":
        value = record.get("input")
        out["input"] = "" if value is None else _string(value, "input", where)
    return out


def _string(value, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise SourceError(f"{where}: {key!r} must be text, got {'null' if value is None else _kind(value)} "
                          f"{shorten(value, 40) if value is not None else ''}".rstrip())
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:   # "\ud800" escapes in JSON: no tokenizer can encode a lone surrogate
        raise SourceError(f"{where}: {key!r} holds an unpaired UTF-16 surrogate (\\ud800-\\udfff escape)") from None
    return value


def _messages(messages, key: str, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise SourceError(f"{where}: {key!r} must be a non-empty list of {{role, content}} objects, got "
                          f"{_kind(messages)} {shorten(messages, 40)}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SourceError(f"{where}: {key}[{i}] must be an object with role and content, got {_kind(message)}")
        role = message.get("role", message.get("from", "user"))
        content = message.get("content", message.get("value", ""))
        if isinstance(content, list):     # multimodal-style parts: [{"type": "text", "text": ...}]
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("text") is not None]
            content = "".join(_string(p, f"{key}[{i}].content", where) for p in parts)
        out.append({"role": _string(role, f"{key}[{i}].role", where),
                    "content": "" if content is None else _string(content, f"{key}[{i}].content", where)})
    return out


# ---- tokenizing -------------------------------------------------------------------------------------------------
class _Tokenizer:
    """A tokenizer.json (tokenizers) or a model directory (transformers, with its chat template)."""

    def __init__(self, path: Path):
        self.chat = None
        if path.is_dir() and (path / "tokenizer_config.json").is_file():
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise MissingExtraError("a tokenizer directory needs transformers: pip install "
                                        "\"memfit[trace]\"; or pass its tokenizer.json") from None
            try:
                tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            except Exception as exc:   # transformers raises OSError, ValueError, JSON errors... for a bad folder
                detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                raise SourceError(f"{path}: cannot load its tokenizer ({detail})") from None
            self.encode = lambda text: len(tok(text, add_special_tokens=True)["input_ids"])
            if getattr(tok, "chat_template", None):
                self.chat = lambda messages: _count_ids(tok.apply_chat_template(messages, tokenize=True))
            return
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise SourceError(f"{path}: no tokenizer.json (pass a tokenizer.json or a model directory)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise MissingExtraError(f"the dataset check needs tokenizers: {DATASET_HINT}") from None
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:
            raise SourceError(f"{file}: not a tokenizer.json ({exc})") from None
        self.encode = lambda text: len(tok.encode(text).ids)

    def count(self, record: dict, layout: str) -> int:
        """Tokens of one example; `record` is what checked_record returned."""
        if layout == "chat":
            messages = record["messages"]
            if self.chat:
                return self.chat(messages)
            return self.encode("\n".join(f"{m['role']}: {m['content']}" for m in messages))
        if layout == "prompt-completion":
            return self.encode(f"{record['prompt']}{record['completion']}")
        if layout == "instruction-output":
            parts = [record["instruction"], record["input"], record["output"]]
            return self.encode("\n".join(p for p in parts if p))
        return self.encode(record["text"])


def _count_ids(encoded) -> int:
    """apply_chat_template returns a list of ids (transformers v4) or a BatchEncoding (v5)."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


# ---- the check ------------------------------------------------------------------------------------------------
def token_lengths(dataset: str, tokenizer: str, progress: bool = False, image_tokens=None,
                  image_counts: list | None = None) -> tuple[list[int], str]:
    """Tokens per example. With `image_tokens` (a VLM's rule: (width, height) -> tokens), each example's images
    are counted in too, and `image_counts` (a list) receives each example's image tokens."""
    path, tok = Path(dataset).expanduser(), _Tokenizer(Path(tokenizer).expanduser())
    from .dataset_images import ImageTokens

    images = ImageTokens(image_tokens, path.parent) if image_tokens else None
    lengths, layout, start = [], None, time.perf_counter()
    for where, raw in iter_located_records(path):
        layout = layout or detect_layout(raw, where)
        record = checked_record(raw, layout, where)
        extra = images.count(raw, where) if images else 0
        if image_counts is not None:
            image_counts.append(extra)
        try:
            lengths.append(tok.count(record, layout) + extra)
        except Exception as exc:   # a chat template that rejects these roles, a tokenizer's own error
            detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise SourceError(f"{where}: the tokenizer failed on this example ({type(exc).__name__}: "
                              f"{detail})") from None
        if progress and len(lengths) % 5000 == 0 and time.perf_counter() - start > 2:
            print(f"\rdataset: {len(lengths):,} examples tokenized", end="", file=sys.stderr, flush=True)
    if progress and time.perf_counter() - start > 2:
        print(file=sys.stderr)
    if not lengths:
        raise SourceError(f"{path}: no examples")
    return lengths, layout


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def length_stats(lengths: list[int], layout: str, seq_len: int | None,
                 image_counts: list[int] | None = None) -> LengthStats:
    values = sorted(lengths)
    images = sorted(image_counts) if image_counts else None
    top = values[-1]
    width = max(1, math.ceil((top + 1) / HISTOGRAM_BINS))
    counts = [0] * HISTOGRAM_BINS
    for v in values:
        counts[min(v // width, HISTOGRAM_BINS - 1)] += 1
    histogram = tuple((i * width, (i + 1) * width - 1, n) for i, n in enumerate(counts))
    truncated = sum(v > seq_len for v in values) / len(values) if seq_len else None
    return LengthStats(count=len(values), p50=_percentile(values, 0.5), p90=_percentile(values, 0.9),
                       p99=_percentile(values, 0.99), max=top, mean=sum(values) / len(values),
                       histogram=histogram, layout=layout, truncated_share=truncated, seq_len=seq_len,
                       image_tokens=(_percentile(images, 0.5), _percentile(images, 0.99), images[-1]) if images
                       else None)


def suggested_length(stats: LengthStats, multiple: int = 64) -> int:
    """p99 rounded up to a multiple of 64: 1% of examples may be cut, none of the typical ones."""
    return max(multiple, math.ceil(stats.p99 / multiple) * multiple)


def length_warnings(stats: LengthStats) -> list[dict]:
    if not stats.seq_len:
        return []
    out = []
    if stats.seq_len < stats.p50:
        out.append({"code": "length-below-typical",
                    "message": f"max length {stats.seq_len} is below the typical example ({stats.p50} tokens at "
                               f"the median): {stats.truncated_share:.0%} of examples are cut, and the model "
                               f"never sees the ends of their answers"})
    elif stats.truncated_share and stats.truncated_share > 0.01:
        out.append({"code": "length-cuts-examples",
                    "message": f"max length {stats.seq_len} cuts {stats.truncated_share:.1%} of examples (p99 is "
                               f"{stats.p99} tokens); their endings are lost"})
    return out


def render_stats(stats: LengthStats) -> str:
    lines = [f"dataset: {stats.count:,} examples ({stats.layout}); tokens p50 {stats.p50}, p90 {stats.p90}, "
             f"p99 {stats.p99}, max {stats.max}"]
    peak = max(n for _, _, n in stats.histogram) or 1
    for a, b, n in stats.histogram:
        lines.append(f"  {a:>7}-{b:<7} {'█' * round(30 * n / peak):<30} {n}")
    if stats.image_tokens:
        p50, p99, top = stats.image_tokens
        lines.append(f"  image tokens per example (in the lengths above): p50 {p50}, p99 {p99}, max {top}")
    if stats.seq_len:
        lines.append(f"  max length {stats.seq_len} truncates {stats.truncated_share:.1%} of examples")
    return "\n".join(lines)
