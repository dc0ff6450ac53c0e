"""Typed access to a trainer's config: each value checked with the options table's own rules (options.normalize /
check_range), so a bad value gets the words the command line uses, with the tool's key and its line; every problem
is collected. Also the pieces several tools share: DeepSpeed and FSDP settings, and safe path tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import InvalidSetupError
from ..options import BY_NAME, Option, check_range, normalize, tool_key

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def one_line(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped: a message quoting a config's value stays
    the one `error:` line the command line promises."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def show(value) -> str:
    """A value as a message quotes it: short, one line, in the config's spelling."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed(option: Option) -> str:
    """What an option accepts, in words (appended to a type error)."""
    if option.kind in ("int", "float"):
        what = "a whole number" if option.kind == "int" else "a number"
        low = _number(option.minimum) if option.minimum is not None else None
        if option.maximum is None:
            return f"{what}, at least {low}" if low else what
        high = f"to below {_number(option.maximum)}" if option.below_maximum else f"to {_number(option.maximum)}"
        return f"{what} from {low} {high}" if low else f"{what} {high}"
    if option.kind == "bool":
        return "true or false"
    if option.kind == "choice":
        return "one of " + ", ".join(option.choices)
    return ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_KIND_WORDS = {"int": "a whole number", "float": "a number", "choice": "one of {choices}", "text": "a string",
               "bool": "true or false", "targets": "all-linear or a list of module names"}


class Reader:
    """Typed access to a config that records which keys were read and every problem with their values."""

    def __init__(self, data: dict, tool: str, base_dir=None, lines: dict | None = None):
        self.data, self.tool, self.used = data, tool, []
        self.base_dir = base_dir     # the config's folder, for relative paths (a DeepSpeed JSON)
        self.lines = lines or {}     # dotted key -> line in the file (YAML)
        self.problems: list[tuple[int, str]] = []     # (line, message)
        self.notes: list[tuple[str, str]] = []
        self.defaults: list[str] = []

    # ---- where and what ----
    def where(self, key: str) -> str:
        """`line N: key` (YAML) or `key`: the prefix of a message about `key`."""
        line = self.lines.get(key)
        return f"line {line}: {key}" if line else key

    def problem(self, key: str, message: str) -> None:
        self.problems.append((self.lines.get(key, 0), one_line(f"{self.where(key)}: {message}")))

    def note(self, code: str, key: str, message: str) -> None:
        self.notes.append((code, one_line(f"{self.where(key)}: {message}")))

    def finish(self) -> None:
        if self.problems:   # in the file's order (keys without a line, JSON's, in the order read)
            ordered = [text for _, text in sorted(self.problems, key=lambda p: p[0])]
            raise InvalidSetupError(list(dict.fromkeys(ordered)))

    # ---- raw access (dotted keys walk nested mappings) ----
    def _lookup(self, key: str):
        node = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def has(self, key: str) -> bool:
        return self._lookup(key) is not None

    def get(self, key: str, default=None):
        value = self._lookup(key)
        if value is None:
            return default
        self.used.append(key.split(".")[0])
        return value

    # ---- typed access: a bad value is recorded as a problem and the default is returned ----
    def setting(self, name: str, default=None):
        """Option `name` read from the key the options table names for this tool."""
        return self.option(tool_key(name, self.tool), name, default)

    def option(self, key: str, name: str, default=None):
        """The value of `key` checked as memfit option `name` (its type, choices and range)."""
        value = self.get(key)
        if value is None:
            return default
        option = BY_NAME[name]
        if isinstance(value, (bool, list, dict)) and option.kind not in ("bool", "targets"):
            # Said in the config's words (true, a list), not Python's; the scalars get normalize's words.
            what = _KIND_WORDS[option.kind].format(choices=", ".join(option.choices))
            allowed = _allowed(option)
            self.problem(key, f"must be {what}, got {show(value)}"
                              + (f" ({allowed})" if allowed and allowed != what else ""))
            return default
        try:
            # A float option also takes the text YAML 1.1 leaves unparsed (PyYAML reads 5e-2 as a string).
            out = normalize(option, value, from_text=option.kind == "float" and isinstance(value, str))
        except ValueError as exc:
            allowed = _allowed(option)
            self.problem(key, f"{exc}" + (f" ({allowed})" if allowed and allowed not in str(exc) else ""))
            return default
        if option.kind == "float" and math.isinf(out):
            self.problem(key, f"must be a finite number, got {value} ({_allowed(option)})")
            return default
        why = check_range(option, out)
        if why:
            self.problem(key, why)
            return default
        return out

    def int(self, key: str, default: int | None = None, minimum: int = 0) -> int | None:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(key, f"must be a whole number, got {show(value)}")
            return default
        if value < minimum:
            self.problem(key, f"must be at least {minimum}, got {value}")
            return default
        return value

    def flag(self, key: str, default: bool = False, words: tuple[str, ...] = ()) -> bool:
        """true/false (and the spellings pydantic and HfArgumentParser accept: yes/no, on/off, 1/0); `words` are
        other values the tool takes that mean "on" (axolotl bf16: auto, gradient_checkpointing: offload)."""
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE or text in words:
                return True
            if text in _FALSE:
                return False
        extra = "".join(f", {w}" for w in words)
        self.problem(key, f"must be true or false{extra}, got {show(value)}")
        return default

    def text(self, key: str, default: str | None = None, what: str = "a string") -> str | None:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            self.problem(key, f"must be {what}, got {show(value)}")
            return default
        if len(value) > 4096 or any(ord(c) < 32 for c in value):
            self.problem(key, f"is not plausible as {what} (over 4096 characters, or control characters)")
            return default
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str | None, what: str) -> str | None:
        """A string from `choices` (lower-cased); anything else is a problem naming them and `what` reads them."""
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        self.problem(key, f"{show(value)} is not one of {', '.join(choices)} ({what})")
        return default

    def mapping(self, key: str) -> dict:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(key, f"must be a mapping of keys, got {show(value)}")
            return {}
        return value

    def targets(self, key: str, mapper=lambda t: t):
        """LoRA target modules: all-linear, a comma string or a list of module names."""
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, list) and not all(isinstance(t, str) for t in value):
            self.problem(key, f"must be a list of module names, got {show(value)} with a non-text item")
            return None
        if isinstance(value, list):
            value = [mapper(t) for t in value]
        return self.option_value(key, "lora_targets", value)

    def option_value(self, key: str, name: str, value):
        """`value` (already taken from `key`) checked as option `name`."""
        try:
            return normalize(BY_NAME[name], value)
        except ValueError as exc:
            self.problem(key, str(exc))
            return None



def read_precision(r: Reader, bf16: bool, fp16: bool, default: str = "auto") -> str:
    if fp16 and bf16:
        r.problem("bf16", "bf16 and fp16 are both enabled: pick one")
    if fp16:
        return "auto"   # fp16 mixed over the checkpoint dtype; memfit's auto keeps the loaded dtype
    return default


ATTENTION_NAMES = {"fa2": "flash", "fa3": "flash", "flash_attention_2": "flash", "flash_attention_3": "flash",
         "flash": "flash", "sdpa": "sdpa", "sdp_attention": "sdpa", "eager": "eager", "disabled": "eager"}


def read_attention(r: Reader, key: str) -> str | None:
    """An attention implementation named by `key`, or None for the recipe's default (auto, or unknown: noted)."""
    value = r.text(key, what="an attention implementation name")
    if value is None or value.lower() == "auto":
        return None
    known = ATTENTION_NAMES.get(value.strip().lower())
    if known is None:
        r.note("key-not-honoured", key, f"{value!r} is not an attention kernel memfit models (sdpa, flash, eager): "
                                        f"estimated with the recipe's default")
    return known


def quant4(r: Reader, qtype: str, double: bool, keys: str) -> str:
    """memfit's quant for a bitsandbytes 4-bit base of type `qtype` (nf4 | fp4), double-quantized or not."""
    if qtype == "nf4":
        return "nf4-dq" if double else "nf4"
    if double:
        # memfit has no fp4-dq: the bytes are nf4-dq's (4-bit codes, uint8 absmax + fp32 second level).
        r.defaults.append(f"{keys}: fp4 with double quantization, estimated as nf4-dq (the same bytes: "
                          f"4-bit codes with double-quantized constants)")
        return "nf4-dq"
    return "fp4"


def read_fsdp(r: Reader, setup: dict) -> None:
    """HF Trainer / TRL `fsdp: "full_shard auto_wrap"`, axolotl `fsdp: [full_shard, auto_wrap]`."""
    value = r.get("fsdp")
    if value is None or value is False:
        return
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = " ".join(value)
    elif isinstance(value, str):
        words = value
    else:
        r.problem("fsdp", f"must be FSDP options as text or a list (full_shard, shard_grad_op, hybrid_shard, "
                          f"offload, auto_wrap), got {show(value)}")
        return
    if "full_shard" in words or "hybrid_shard" in words:
        setup["shard"] = "hsdp" if "hybrid" in words else "fsdp"
    elif "shard_grad_op" in words:
        setup["shard"] = "fsdp-shard-grad-op"
    if "offload" in words:
        setup["offload"] = "optimizer+params"


def read_deepspeed(r: Reader, setup: dict) -> None:
    """A DeepSpeed config inline (a mapping) or as a path to its JSON sets the ZeRO stage and offload. A path is
    looked up next to the config, then in the folder memfit runs in (the trainer's working folder)."""
    ds = r.get("deepspeed")
    if ds is None:
        return
    source = None                 # the JSON file, when the config names one
    if isinstance(ds, str):
        given = expand_path(ds)
        candidates = [given] if given.is_absolute() else \
            ([Path(r.base_dir) / given] if r.base_dir is not None else []) + [Path.cwd() / given]
        source = next((p for p in candidates if is_file(p)), None)
        if source is None:
            r.problem("deepspeed", f"{ds} does not exist (looked at {' and '.join(str(p) for p in candidates)}): "
                                   f"the ZeRO stage and offload it sets cannot be read")
            return
        try:
            ds = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            r.problem("deepspeed", f"{ds} cannot be read as UTF-8 text")
            return
        except json.JSONDecodeError as exc:
            r.problem("deepspeed", f"{ds} is not a DeepSpeed JSON (line {exc.lineno}: {exc.msg})")
            return
        except (ValueError, RecursionError) as exc:
            r.problem("deepspeed", f"{ds} is not a DeepSpeed JSON ({exc or 'nested too deeply'})")
            return

    def bad(key: str, message: str) -> None:
        if source is None:            # inline: the nested key has a line of its own
            r.problem(f"deepspeed.{key}", message)
        else:
            r.problems.append((r.lines.get("deepspeed", 0), f"{r.where('deepspeed')}: {source}: {key}: {message}"))

    if not isinstance(ds, dict):
        r.problem("deepspeed", f"must be a DeepSpeed config (a mapping) or the path to its JSON, got {show(ds)}")
        return
    zero = ds.get("zero_optimization")
    if zero is None:
        return
    if not isinstance(zero, dict):
        bad("zero_optimization", f"must be a mapping, got {show(zero)}")
        return
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        bad("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {show(stage)}")
        return
    if stage == 0:
        return
    setup["shard"] = f"zero{stage}"
    devices = {}
    for part in ("offload_optimizer", "offload_param"):
        conf = zero.get(part)
        if isinstance(conf, dict):
            devices[part] = conf.get("device")
        elif conf is not None:
            bad(f"zero_optimization.{part}", f"must be a mapping, got {show(conf)}")
    if devices.get("offload_param") in ("cpu", "nvme") and stage == 3:
        setup["offload"] = "optimizer+params"
    elif devices.get("offload_optimizer") in ("cpu", "nvme"):
        setup["offload"] = "optimizer"
    if "nvme" in devices.values():
        r.note("key-not-honoured", "deepspeed", "NVMe offload is estimated as CPU offload (the GPU side is the same)")


def expand_path(text: str) -> Path:
    """`~/x` expanded; a `~user` that does not exist stays as written (the trainer would not find it either)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def is_file(path: Path) -> bool:
    """Path.is_file that answers False for a name the system refuses (too long, a NUL) instead of raising."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False
