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
from .formats import FORMATS, MODEL_KEYS, READERS, Mapped, detect_format
from .reader import expand_path, is_file, one_line


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


def load_config(path: Path, lines: dict | None = None) -> dict:
    """The config's top-level mapping (configfile.py: every unreadable file is one SourceError naming it); `lines`
    is filled with {dotted key: line} for YAML."""
    from .configfile import load_config as _load

    return _load(Path(path), lines)


def check_config(path: str, hardware: Hardware | None = None, format_of: str | None = None,
                 tokenizer: str | None = None, gpus: int | None = None) -> CheckResult:
    """`gpus`: GPUs per node for a sharded config (the count lives in the launcher, not in these files)."""
    from ..advisor import suggest
    from ..cautions import Caution, warnings_for
    from ..options import command_line, tool_key
    from ..sources import load_model
    from ..verdict import verdict

    file = expand_path(str(path))
    lines: dict = {}
    data = load_config(file, lines)
    tool = format_of or detect_format(data)
    if tool not in FORMATS:
        raise InvalidSetupError(f"--format-of {tool!r} is not one of {', '.join(FORMATS)}")
    try:
        mapped = READERS[tool](data, base_dir=file.parent, lines=lines)
    except InvalidSetupError as exc:
        raise InvalidSetupError(f"{file}: {exc}") from None
    model_key = MODEL_KEYS[tool]
    if not mapped.model:
        raise InvalidSetupError(f"{file}: no model ({model_key} is missing)")
    if str(mapped.model).startswith("~") and expand_path(str(mapped.model)) == Path(str(mapped.model)):
        # sources/resolve.py calls Path.expanduser(), which raises RuntimeError for a ~user with no home folder.
        raise SourceError(f"{file}: {model_key}: {mapped.model}: no such user's home folder")
    try:
        spec = load_model(str(mapped.model))
    except MemfitError as exc:
        raise type(exc)(one_line(f"{file}: {model_key}: {exc}")) from None
    except OSError as exc:           # a name the file system refuses (too long) while looking for a local model
        raise SourceError(f"{file}: {model_key}: cannot be looked up ({exc.strerror or exc})") from None
    from .swift import apply_model
    from .vision import apply_to

    apply_to(mapped, spec)
    apply_model(mapped, spec)
    if mapped.setup.get("shard") or mapped.setup.get("cp", 1) > 1:      # a layout over GPUs
        mapped.setup["gpus"] = gpus or 1
        mapped.defaults.append(f"{gpus or 1} GPU(s) per node (the launcher sets it; --gpus to change)")
    if hardware is not None and mapped.setup.get("generation") == "vllm-colocate":
        mapped.setup["card_bytes"] = hardware.capacity_bytes   # vLLM reserves a fraction of the whole card
    try:
        setup = TrainingSetup.from_recipe(mapped.setup.pop("recipe", "hf"), **mapped.setup)
    except InvalidSetupError as exc:
        # The setup's own rules, worded in this tool's keys (optimizer_in_backward -> optimizer_in_bwd).
        def namer(name):
            return mapped.keys.get(name) or tool_key(name, tool) or ("--gpus" if name == "gpus" else name)
        raise InvalidSetupError(f"{file}: {exc.render(namer)}") from None
    est = estimate(spec, setup)
    ver = verdict(est, hardware) if hardware else None
    result = CheckResult(str(file), tool, mapped, setup, est, ver, data=data,
                         warnings=[Caution(code, message) for code, message in mapped.notes]
                         + warnings_for(spec, setup, est, hardware, ver))
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
    from ..cautions import Caution, length_cautions

    dataset = expand_path(mapped.dataset)
    if not dataset.is_absolute():
        dataset = (file.parent / dataset)
    key = mapped.dataset_key or "dataset"
    if not is_file(dataset):
        result.warnings.append(Caution("dataset-not-checked", one_line(
            f"{key}: {mapped.dataset} is not a file (looked at {dataset}; a Hub dataset, or a missing path): its "
            f"lengths were not checked")))
        return None
    model_dir = expand_path(str(mapped.model))
    tok = tokenizer or (str(model_dir) if _is_dir(model_dir) else None)
    if tok is None:
        mapped.defaults.append(one_line(f"{key}: {mapped.dataset} not length-checked: no tokenizer at hand "
                                        f"(--tokenizer, or a local model directory)"))
        return None
    from ..dataset import length_stats, token_lengths

    rule, counts = None, None
    if spec is not None and getattr(spec, "vision", None) is not None:
        from ..vision import image_token_rule

        # The run's pixel bounds (the trainer's image keys, preflight/vision.py) bound each image's tokens.
        rule, counts = image_token_rule(spec.vision, setup.min_pixels, setup.max_pixels), []
    lengths, layout = token_lengths(str(dataset), tok, image_tokens=rule, image_counts=counts)
    stats = length_stats(lengths, layout, setup.seq_len, counts)
    result.warnings += length_cautions(stats)
    return stats


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def write_suggested(result: CheckResult, out: str, in_place: bool = False) -> EditSuggestion:
    """Write the config with the best suggestion that fits applied, in the input's format, keeping its comments
    and key order (ruamel.yaml round trip). Refuses to overwrite the input unless `in_place`."""
    usable = [s for s in result.suggestions if s.fits and s.unavailable is None and s.edits]
    if not usable:
        raise InvalidSetupError("no suggested change that fits can be written as edits to this config")
    best = usable[0]
    source, path = Path(result.path), Path(out).expanduser()
    if source.suffix.lower() == ".sh":
        raise InvalidSetupError(f"{source}: a launch script's command line is not rewritten (edits are written to "
                                "YAML or JSON configs); the suggested keys are listed above")
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
