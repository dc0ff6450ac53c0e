"""Bounded fuzzing of every input reader: whatever the bytes, the answer is a valid result or a MemfitError with
a one-line message, never another exception. Kept to a few seconds (max_examples, no deadline)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit import load_hardware
from memfit.errors import MemfitError
from memfit.sources.catalog import catalog_entries
from memfit.sources.local import load_config_file
from memfit.spec import ModelSpec
from memfit.units import MAX_DEVICE_BYTES, parse_size

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
CONFIGS = [entry["config"] for entry in catalog_entries()]
ONE_LINE_ERROR_CHARS = 2000


def _clean(exc: MemfitError) -> None:
    message = str(exc)
    assert message and "\n" not in message and "\x1b" not in message and len(message) < ONE_LINE_ERROR_CHARS


# ---- (a) mutated real config.json files -------------------------------------------------------------------------
_garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.sampled_from([10**9, -1, 0, 2**63, 10**30]) |
    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


@st.composite
def mutated_configs(draw):
    config = dict(draw(st.sampled_from(CONFIGS)))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(sorted(config) + ["text_config", "torch_dtype", "quantization_config"]))
        action = draw(st.sampled_from(["drop", "garbage", "scale", "negate"]))
        if action == "drop":
            config.pop(key, None)
        elif action == "garbage":
            config[key] = draw(_garbage)
        elif isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool):
            factor = draw(st.sampled_from([0, 10**6, 10**9, 0.5, 1e300]))
            config[key] = config[key] * factor if action == "scale" else -config[key]
    return config


@FUZZ
@given(config=mutated_configs())
def test_mutated_config_json_gives_a_spec_or_a_memfit_error(tmp_path, config):
    path = tmp_path / "config.json"
    # allow_nan: the file holds NaN / Infinity literals, as a hand-edited config.json can
    path.write_text(json.dumps(config, allow_nan=True))
    try:
        spec = load_config_file(path)
    except MemfitError as exc:
        _clean(exc)
        return
    assert isinstance(spec, ModelSpec)
    assert all(getattr(spec, f) > 0 for f in ("hidden_size", "num_layers", "num_heads", "head_dim", "vocab_size"))
    assert 0 < spec.params <= 10**14 and math.isfinite(spec.partial_rotary_factor)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_random_bytes_as_config_json(tmp_path, raw):
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    with pytest.raises(MemfitError) as info:
        load_config_file(path)
    _clean(info.value)


# ---- (b) garbage dataset files in every format ------------------------------------------------------------------
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["w0 w1 w2 w3"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) |
    st.dictionaries(st.sampled_from(["text", "prompt", "completion", "instruction", "input", "output",
                                     "messages", "role", "content", "x"]), inner, max_size=4),
    max_leaves=8)


@st.composite
def dataset_files(draw):
    fmt = draw(st.sampled_from(["jsonl", "json", "csv", "parquet"]))
    kind = draw(st.sampled_from(["bytes", "structured"]))
    if kind == "bytes" or fmt == "parquet" and draw(st.booleans()):
        prefix = draw(st.sampled_from([b"", b"PAR1", b'{"text": "w1"}\n', b"text\n", b"\xff\xfe"]))
        return fmt, prefix + draw(st.binary(max_size=200))
    rows = draw(st.lists(_json_values, min_size=0, max_size=4))
    if fmt == "jsonl":
        return fmt, "\n".join(json.dumps(r) for r in rows).encode()
    if fmt == "json":
        return fmt, json.dumps(rows if draw(st.booleans()) else {"data": rows}).encode()
    if fmt == "csv":
        cells = draw(st.lists(st.text(alphabet='w0 1,"\n\r\\x', max_size=12), min_size=1, max_size=6))
        return fmt, ("text,prompt\n" + "\n".join(cells)).encode()
    return fmt, None      # parquet from rows: written below with pyarrow when the rows form a table


@FUZZ
@given(case=dataset_files(), rows=st.lists(st.dictionaries(st.sampled_from(["text", "prompt", "x"]),
                                                         st.none() | st.integers() | st.text(max_size=8),
                                                         max_size=2), max_size=3))
def test_garbage_dataset_files(tmp_path, tokenizer, case, rows):
    from memfit.dataset import token_lengths

    fmt, content = case
    path = tmp_path / f"data.{fmt}"
    if content is None:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowException, TypeError, OverflowError):
            return     # rows pyarrow itself cannot type (or ints past int64): nothing to write
        pq.write_table(table, path)
    else:
        path.write_bytes(content)
    try:
        lengths, layout = token_lengths(str(path), tokenizer)
    except MemfitError as exc:
        _clean(exc)
        return
    assert lengths and all(isinstance(n, int) and n >= 0 for n in lengths)
    assert layout in ("text", "prompt-completion", "instruction-output", "chat")


# ---- (c) size strings -------------------------------------------------------------------------------------------
_size_text = st.one_of(
    st.text(max_size=30),
    st.builds(lambda n, u: f"{n}{u}", st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**30, 10**30),
              st.sampled_from(["", "B", "GB", "GiB", "G", "TB", "tib", "MB", " gb", "XB", "e9"])),
    st.builds(lambda d, u: d + u, st.text(alphabet="0123456789.", min_size=1, max_size=400),
              st.sampled_from(["GB", "GiB", "", "M"])),
    # literals past float range (1e309 and up) overflowed int(round(inf)) once
    st.builds(lambda n, u: "9" * n + u, st.integers(300, 420), st.sampled_from(["GB", "", "TiB"])))


@FUZZ
@given(text=_size_text)
def test_parse_size_returns_bounded_bytes_or_an_error(text):
    try:
        nbytes = parse_size(text, "--memory")
    except MemfitError as exc:
        _clean(exc)
        return
    assert isinstance(nbytes, int) and 0 < nbytes <= MAX_DEVICE_BYTES


@FUZZ
@given(text=_size_text, which=st.sampled_from(["memory", "mac", "wired"]))
def test_load_hardware_returns_a_sane_device_or_an_error(text, which):
    kwargs = {"memory": {"memory": text}, "mac": {"mac": text},
              "wired": {"mac": "64GB", "mac_wired_limit": text}}[which]
    try:
        hw = load_hardware(**kwargs)
    except MemfitError as exc:
        _clean(exc)
        return
    assert 0 < hw.usable_bytes <= hw.capacity_bytes <= MAX_DEVICE_BYTES
    assert hw.usable_bytes >= 426 * 2**20      # never below the CUDA context


# ---- (d) the command line on garbage files: exit 1, nothing on stdout, one `error:` line on stderr ------------
@pytest.mark.parametrize("name,content", [
    ("config.json", bytes(range(256))),
    ("config.json", b'{"model_type": "llama", "hidden_size": NaN}'),
    ("config.json", b"[" * 100_000),
    ("config.json", json.dumps({"model_type": "llama\x1b[31m\u202e", "hidden_size": 1}).encode()),
    ("weights.safetensors", b"\x10\0\0\0\0\0\0\0{}"),
    ("cfg.json", json.dumps(dict(CONFIGS[0], hidden_size=-1, num_hidden_layers="x")).encode()),
])
def test_cli_on_garbage_files(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    src = str(Path(__file__).resolve().parents[1] / "src")
    # `python -m memfit` (memfit/__main__.py): cli.py itself has no __main__ guard
    proc = subprocess.run([sys.executable, "-m", "memfit", "estimate", str(path)], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
