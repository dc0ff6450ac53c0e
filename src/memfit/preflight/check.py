"""Read a training config, estimate the run it describes, and give advice as edits to that file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidSetupError, MemfitError, SourceError
from ..estimator import Estimate, estimate
from ..hardware import Hardware
from ..setup import TrainingSetup
from .edits import apply_edits, edits_for, get_dotted
from .formats import FORMATS, READERS, Mapped, detect_format


@dataclass
class EditSuggestion:
    change: str
    edits: dict                 # dotted key -> new value (None: remove the key)
    old: dict                   # dotted key -> value in the file
    device_bytes: int
    saving_bytes: int
    status: str                 # the edited config's verdict (verdict.py's one rule)
    cost: str
    unavailable: str | None = None

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    def as_dict(self) -> dict:
        return {"change": self.change, "edits": {k: {"from": self.old.get(k), "to": v} for k, v in self.edits.items()},
                "device_bytes": self.device_bytes, "saving_bytes": self.saving_bytes, "status": self.status,
                "fits": self.fits, "cost": self.cost, "unavailable": self.unavailable}


@dataclass
class CheckResult:
    path: str
    tool: str
    mapped: Mapped
    setup: TrainingSetup
    estimate: Estimate
    verdict: object = None
    suggestions: list[EditSuggestion] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    warnings: list[dict] = field(default_factory=list)
    dataset: object = None


def load_config(path: Path) -> dict:
    if not path.is_file():
        raise SourceError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise SourceError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a mapping of keys at the top level")
    return data


def check_config(path: str, hardware: Hardware | None = None, format_of: str | None = None,
                 tokenizer: str | None = None, gpus: int | None = None) -> CheckResult:
    """`gpus`: GPUs per node for a sharded config (the count lives in the launcher, not in these files)."""
    from ..advisor import suggest, warnings_for
    from ..options import command_line
    from ..sources import load_model
    from ..verdict import verdict

    file = Path(path).expanduser()
    data = load_config(file)
    tool = format_of or detect_format(data)
    if tool not in FORMATS:
        raise InvalidSetupError(f"--format-of {tool!r} is not one of {', '.join(FORMATS)}")
    try:
        mapped = READERS[tool](data, base_dir=file.parent)
    except InvalidSetupError as exc:
        raise InvalidSetupError(f"{file}: {exc}") from None
    model_key = mapped.keys.get("model") or {"axolotl": "base_model", "llamafactory": "model_name_or_path",
                                             "trl": "model_name_or_path", "mlx": "model",
                                             "torchtune": "model._component_"}[tool]
    if not mapped.model:
        raise InvalidSetupError(f"{file}: no model ({model_key} is missing)")
    try:
        spec = load_model(str(mapped.model))
        if mapped.setup.get("shard"):
            mapped.setup["gpus"] = gpus or 1
            mapped.defaults.append(f"{gpus or 1} GPU(s) per node (the launcher sets it; --gpus to change)")
        setup = TrainingSetup.from_recipe(mapped.setup.pop("recipe", "hf"), **mapped.setup)
    except MemfitError as exc:
        raise type(exc)(f"{file}: {model_key}: {exc}") from None
    est = estimate(spec, setup)
    ver = verdict(est, hardware) if hardware else None
    result = CheckResult(str(file), tool, mapped, setup, est, ver, data=data,
                         warnings=warnings_for(spec, setup, est, hardware, ver))
    result.dataset = _dataset_check(mapped, file, spec, setup, tokenizer, result)
    if ver is not None and ver.status != "fits":
        for s in suggest(spec, setup, hardware,
                         lambda ref, new, hw=None: command_line("estimate", ref, {**new.overrides(), **(hw or {})}),
                         model_ref=str(mapped.model)):
            edits, reason = edits_for(tool, dict(s.changes), data)
            if not edits and reason is None:
                continue                 # nothing to write: the file already says it
            old = {k: get_dotted(data, k) for k in edits}
            result.suggestions.append(EditSuggestion(s.change, edits, old, s.device_bytes, s.saving_bytes, s.status,
                                                     s.cost, reason))
    return result


def _dataset_check(mapped: Mapped, file: Path, spec, setup, tokenizer: str | None, result: CheckResult):
    """The length check when the config names a local dataset file and a tokenizer is at hand."""
    if not mapped.dataset or not isinstance(mapped.dataset, str):
        return None
    dataset = Path(mapped.dataset).expanduser()
    if not dataset.is_absolute():
        dataset = (file.parent / dataset)
    model_dir = Path(str(mapped.model)).expanduser()
    tok = tokenizer or (str(model_dir) if model_dir.is_dir() else None)
    if not dataset.is_file() or tok is None:
        return None
    from ..dataset import length_stats, length_warnings, token_lengths

    from ..advisor import Caution

    lengths, layout = token_lengths(str(dataset), tok)
    stats = length_stats(lengths, layout, setup.seq_len)
    result.warnings += [Caution(w["code"], w["message"]) for w in length_warnings(stats)]
    return stats


def write_suggested(result: CheckResult, out: str, in_place: bool = False) -> EditSuggestion:
    """Write the config with the best suggestion that fits applied, in the input's format, keeping its comments
    and key order (ruamel.yaml round trip). Refuses to overwrite the input unless `in_place`."""
    usable = [s for s in result.suggestions if s.fits and s.unavailable is None and s.edits]
    if not usable:
        raise InvalidSetupError("no suggested change that fits can be written as edits to this config")
    best = usable[0]
    source, path = Path(result.path), Path(out).expanduser()
    if not in_place and path.exists() and path.resolve() == source.resolve():
        raise InvalidSetupError(f"{out} is the config being checked: pass --in-place to overwrite it, or another "
                                f"file name")
    try:
        if source.suffix.lower() == ".json":
            text = json.dumps(apply_edits(result.data, best.edits), indent=2) + "\n"
        else:
            text = _round_trip_yaml(source, best.edits)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return best


def _round_trip_yaml(source: Path, edits: dict) -> str:
    import io

    from ruamel.yaml import YAML

    yaml = YAML()            # round-trip mode: comments, key order and quoting survive
    yaml.preserve_quotes = True
    data = yaml.load(source.read_text(encoding="utf-8"))
    stream = io.StringIO()
    yaml.dump(apply_edits(data, edits), stream)
    return stream.getvalue()
