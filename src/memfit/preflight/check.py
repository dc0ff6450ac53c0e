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
    edits: dict                 # dotted key -> new value
    old: dict                   # dotted key -> value in the file
    device_bytes: int
    saving_bytes: int
    fits: bool
    cost: str
    unavailable: str | None = None

    def as_dict(self) -> dict:
        return {"change": self.change, "edits": {k: {"from": self.old.get(k), "to": v} for k, v in self.edits.items()},
                "device_bytes": self.device_bytes, "saving_bytes": self.saving_bytes, "fits": self.fits,
                "cost": self.cost, "unavailable": self.unavailable}


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
        for s in suggest(spec, setup, hardware, str(mapped.model), []):
            edits, reason = edits_for(tool, {k: v for k, v in s.args.items()}, data)
            old = {k: get_dotted(data, k) for k in edits}
            result.suggestions.append(EditSuggestion(s.change, edits, old, s.device_bytes, s.saving_bytes, s.fits,
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

    lengths, layout = token_lengths(str(dataset), tok)
    stats = length_stats(lengths, layout, setup.seq_len)
    result.warnings += length_warnings(stats)
    return stats


def write_suggested(result: CheckResult, out: str) -> EditSuggestion:
    """Write the config with the best suggestion that fits applied (same format as the input)."""
    usable = [s for s in result.suggestions if s.fits and s.unavailable is None and s.edits]
    if not usable:
        raise InvalidSetupError("no suggested change that fits can be written as edits to this config")
    best = usable[0]
    edited = apply_edits(result.data, best.edits)
    path = Path(out)
    try:
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(edited, indent=2) + "\n")
        else:
            import yaml

            path.write_text(yaml.safe_dump(edited, sort_keys=False))
    except OSError as exc:
        raise SourceError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return best
