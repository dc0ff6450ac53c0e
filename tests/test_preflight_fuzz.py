"""`memfit check` on garbage (issues #14, #15; user trial D12): whatever the file holds, the answer is a result or
one MemfitError, never another exception and never a hang; through the command line, exit 0 or 1 and on error
exactly one `error:` line on stderr and nothing on stdout.

Configs of the five tools (test_preflight.CONFIGS) get random keys, nested ones included, replaced by values of
every JSON/YAML type or dropped; raw text, YAML-token soup and random bytes are read too. Bounded: about 30 s on
two cores (MEMFIT_FUZZ_SCALE multiplies the examples for a longer search).
"""

import copy
import json
import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from memfit import load_hardware
from memfit.cli import main
from memfit.errors import MemfitError
from memfit.preflight import CheckResult, check_config
from memfit.preflight.check import write_suggested

from test_preflight import CONFIGS

SECONDS_PER_CHECK = 20          # far above the ~0.1 s a check takes: only a hang trips it


def fuzz(examples: int) -> settings:
    """Bounded for the default run; MEMFIT_FUZZ_SCALE=20 searches twenty times as long."""
    return settings(max_examples=examples * int(os.environ.get("MEMFIT_FUZZ_SCALE", "1")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.sampled_from([0, 1, -1, 2**16, 2**21 + 1, 2**63]) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12)
           | st.sampled_from(["", "lora", "qlora", "full", "auto", "true", "false", "all", "all-linear", "q_proj",
                              "5e-2", "high", "nf4", "fp4", "~", "~nosuchuser-memfit/x", "x" * 300, "../..",
                              "freeze", "dora", "fa2", "offload", "adamw_bnb_8bit", "sgd", "zero3.json"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6) | st.sampled_from(["_component_", "stage", "path",
                                                                               "zero_optimization", "rank"]),
                                        inner, max_size=3), max_leaves=6)
# Keys the readers look at that the sample configs leave out, so garbage reaches them too.
EXTRA_KEYS = ["load_in_4bit", "load_in_8bit", "quantization_bit", "quantization_type", "double_quantization",
              "quantization_method", "deepspeed", "fsdp", "datasets", "dataset", "dataset_dir", "bnb_config_kwargs",
              "use_bnb_nested_quant", "bnb_4bit_quant_type", "max_seq_length", "attn_implementation", "flash_attn",
              "optim", "optimizer", "pure_bf16", "fp16", "num_layers", "optimizer_in_bwd", "lora_target",
              "lora_target_modules", "lora_target_linear", "sdp_attention", "use_liger_kernel", "adapter",
              "finetuning_type", "fine_tune_type", "grad_accumulation_steps", "enable_liger_kernel", "dtype"]


def _dotted_keys(data: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        out.append(prefix + key)
        if isinstance(value, dict):
            out += _dotted_keys(value, prefix + key + ".")
    return out


def _set(data: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        if not isinstance(data.get(key), dict):
            return
        data = data[key]
    if value is _DROP:
        data.pop(last, None)
    else:
        data[last] = value


_DROP = object()


@contextmanager
def _bounded():
    def alarm(signum, frame):
        raise TimeoutError(f"a check ran past {SECONDS_PER_CHECK} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS_PER_CHECK)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _event(text: str) -> None:
    """Counted in --hypothesis-show-statistics (how many examples got past the readers); a no-op outside @given."""
    try:
        event(text)
    except InvalidArgument:
        pass


def _check(path: str, **kwargs):
    with _bounded():
        try:
            result = check_config(path, **kwargs)
        except MemfitError as exc:
            assert str(exc).strip() and "\n" not in str(exc), repr(str(exc))
            _event(f"error: {type(exc).__name__}")
            return exc
    assert isinstance(result, CheckResult)
    _event("result" + (" with suggestions" if result.suggestions else ""))
    return result


def _cli(capsys, path: str) -> None:
    capsys.readouterr()
    with _bounded():
        code = main(["check", path])
    out, err = capsys.readouterr()
    assert code in (0, 1), (code, err)
    if code == 1:
        assert out == ""
        assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    else:
        assert out and err == ""


def _write(folder: str, name: str, data, ext: str) -> str:
    path = Path(folder) / f"{name}.{ext}"
    text = json.dumps(data) if ext == "json" else yaml.safe_dump(data, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


@st.composite
def mutated_configs(draw):
    tool = draw(st.sampled_from(sorted(CONFIGS)))
    ext, base = CONFIGS[tool]
    data = copy.deepcopy(base)
    keys = _dotted_keys(data) + EXTRA_KEYS
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True)):
        _set(data, key, draw(st.just(_DROP) | values))
    return tool, draw(st.sampled_from([ext, "yml", "json"])), data


@fuzz(400)
@given(case=mutated_configs(), deepspeed=values)
def test_mutated_configs_give_a_result_or_one_error(case, deepspeed):
    tool, ext, data = case
    with tempfile.TemporaryDirectory() as folder:
        # `deepspeed: zero3.json` (one of the drawn strings) finds a DeepSpeed JSON of garbage next to the config.
        (Path(folder) / "zero3.json").write_text(json.dumps(deepspeed), encoding="utf-8")
        path = _write(folder, "config", data, ext)
        _check(path)
        _check(path, format_of=tool)


HARDWARE = load_hardware(gpu="rtx-4090")


@fuzz(100)
@given(case=mutated_configs())
def test_mutated_configs_with_advice(case):
    """With a GPU the advice is turned into edits of the mutated file, and the best one written and checked
    again: that must not break either."""
    tool, ext, data = case
    with tempfile.TemporaryDirectory() as folder:
        result = _check(_write(folder, "config", data, ext), hardware=HARDWARE, format_of=tool)
        if isinstance(result, CheckResult) and any(s.fits and s.edits and not s.unavailable
                                                   for s in result.suggestions):
            out = str(Path(folder) / f"fixed.{ext}")
            with _bounded():
                write_suggested(result, out)
            _check(out, hardware=HARDWARE, format_of=tool)


@fuzz(120)
@given(case=mutated_configs())
def test_mutated_configs_through_the_cli(capsys, case):
    _, ext, data = case
    with tempfile.TemporaryDirectory() as folder:
        _cli(capsys, _write(folder, "config", data, ext))


YAML_TOKENS = ["base_model:", "adapter:", "model:", "_component_:", "lora_r:", "datasets:", "deepspeed:", "&a", "*a",
               "&b", "*b", "<<:", "[", "]", "{", "}", ",", "- ", ": ", "? ", "\n", "\n  ", "\n    ", "'", '"', "#",
               "!!binary", "!!str", "!!python/object:x", "lora", "5", "-1", ".nan", ".inf", "null", "~", "true",
               "2024-13-45", "0x1F", "1e999", "|", ">", "---", "...", "%YAML 1.1", "\t", "\\u0000", "é"]


@fuzz(200)
@given(tokens=st.lists(st.sampled_from(YAML_TOKENS), max_size=40), ext=st.sampled_from(["yml", "json"]))
def test_yaml_token_soup(capsys, tokens, ext):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"c.{ext}"
        path.write_text(" ".join(tokens), encoding="utf-8")
        _check(str(path))
        _cli(capsys, str(path))


@fuzz(150)
@given(content=st.text(max_size=200) | st.binary(max_size=200), ext=st.sampled_from(["yml", "yaml", "json", "txt"]))
def test_raw_text_and_bytes(capsys, content, ext):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"c.{ext}"
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        else:
            path.write_bytes(content)
        _check(str(path))
        _cli(capsys, str(path))


@pytest.mark.parametrize("tool", sorted(CONFIGS))
def test_every_single_key_replaced_by_every_kind_of_value(tool):
    """Exhaustive over one axis: each key of each sample config (nested ones too) set to one value of each type."""
    ext, base = CONFIGS[tool]
    kinds = [None, True, False, 0, -1, 10**30, 1.5, float("nan"), float("inf"), "", "garbage", [], [1, "x"], {},
             {"a": {"b": 1}}]
    with tempfile.TemporaryDirectory() as folder:
        for key in _dotted_keys(base):
            for value in kinds:
                data = copy.deepcopy(base)
                _set(data, key, value)
                _check(_write(folder, "config", data, ext))
