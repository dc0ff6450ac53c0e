"""The dataset check: how long your examples really are in tokens, and what a max length would cut.

Reads JSONL, JSON, CSV or Parquet (streamed), in the layouts fine-tuning tools use: `text`; `prompt` /
`completion`; `instruction` / `input` / `output` (Alpaca); chat `messages` (or `conversations`) as a list of
{role, content}. Tokenizes with a tokenizer.json (the `tokenizers` library) or a model directory (transformers'
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

from .errors import MissingExtraError, SourceError

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

    def as_dict(self) -> dict:
        return {"count": self.count, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max,
                "mean": round(self.mean, 1), "layout": self.layout, "seq_len": self.seq_len,
                "truncated_share": self.truncated_share,
                "histogram": [{"from": a, "to": b, "count": n} for a, b, n in self.histogram]}


# ---- reading ------------------------------------------------------------------------------------------------
def iter_records(path: Path):
    suffix = path.suffix.lower()
    if not path.is_file():
        raise SourceError(f"{path}: no such dataset file")
    try:
        if suffix in (".jsonl", ".ndjson"):
            with path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, 1):
                    if line.strip():
                        yield _json_line(line, path, number)
        elif suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            rows = data.get("data", data.get("train")) if isinstance(data, dict) else data
            if not isinstance(rows, list):
                raise SourceError(f"{path}: expected a JSON list of examples (or {{\"data\": [...]}})")
            yield from rows
        elif suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as fh:
                yield from csv.DictReader(fh)
        elif suffix == ".parquet":
            yield from _parquet_rows(path)
        else:
            raise SourceError(f"{path}: unknown dataset format {suffix!r} (use .jsonl, .json, .csv or .parquet)")
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise SourceError(f"{path}: not UTF-8 text") from None


def _json_line(line: str, path: Path, number: int) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def _parquet_rows(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(f"reading Parquet needs pyarrow: {DATASET_HINT}") from None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def detect_layout(record: dict) -> str:
    if not isinstance(record, dict):
        raise SourceError("dataset examples must be objects (dicts), one per line or list item")
    for layout, keys in (("chat", ("messages",)), ("chat", ("conversations",)), ("prompt-completion",
                         ("prompt", "completion")), ("instruction-output", ("instruction", "output")),
                         ("text", ("text",))):
        if all(k in record for k in keys):
            return layout
    raise SourceError(f"cannot tell the dataset layout from its keys {sorted(record)[:8]}: expected text, "
                      f"prompt/completion, instruction/output or messages")


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
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
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
        if layout == "chat":
            messages = record.get("messages") or record.get("conversations") or []
            messages = [{"role": m.get("role", m.get("from", "user")), "content": m.get("content", m.get("value", ""))}
                        for m in messages]
            if self.chat:
                return self.chat(messages)
            return self.encode("\n".join(f"{m['role']}: {m['content']}" for m in messages))
        if layout == "prompt-completion":
            return self.encode(f"{record['prompt']}{record['completion']}")
        if layout == "instruction-output":
            parts = [record["instruction"], record.get("input") or "", record["output"]]
            return self.encode("\n".join(p for p in parts if p))
        return self.encode(str(record["text"]))


def _count_ids(encoded) -> int:
    """apply_chat_template returns a list of ids (transformers v4) or a BatchEncoding (v5)."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


# ---- the check ------------------------------------------------------------------------------------------------
def token_lengths(dataset: str, tokenizer: str, progress: bool = False) -> tuple[list[int], str]:
    path, tok = Path(dataset).expanduser(), _Tokenizer(Path(tokenizer).expanduser())
    lengths, layout, start = [], None, time.perf_counter()
    for record in iter_records(path):
        layout = layout or detect_layout(record)
        lengths.append(tok.count(record, layout))
        if progress and len(lengths) % 5000 == 0 and time.perf_counter() - start > 2:
            print(f"\rdataset: {len(lengths):,} examples tokenized", end="", file=sys.stderr, flush=True)
    if progress and time.perf_counter() - start > 2:
        print(file=sys.stderr)
    if not lengths:
        raise SourceError(f"{path}: no examples")
    return lengths, layout


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def length_stats(lengths: list[int], layout: str, seq_len: int | None) -> LengthStats:
    values = sorted(lengths)
    top = values[-1]
    width = max(1, math.ceil((top + 1) / HISTOGRAM_BINS))
    counts = [0] * HISTOGRAM_BINS
    for v in values:
        counts[min(v // width, HISTOGRAM_BINS - 1)] += 1
    histogram = tuple((i * width, (i + 1) * width - 1, n) for i, n in enumerate(counts))
    truncated = sum(v > seq_len for v in values) / len(values) if seq_len else None
    return LengthStats(count=len(values), p50=_percentile(values, 0.5), p90=_percentile(values, 0.9),
                       p99=_percentile(values, 0.99), max=top, mean=sum(values) / len(values),
                       histogram=histogram, layout=layout, truncated_share=truncated, seq_len=seq_len)


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
    if stats.seq_len:
        lines.append(f"  max length {stats.seq_len} truncates {stats.truncated_share:.1%} of examples")
    return "\n".join(lines)
