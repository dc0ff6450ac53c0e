"""report(request) -> Report: the one answer every face gives (Python, the CLI, the web page, `memfit check`).

A Request is what a user asks: a model, the setup options they set (the rest is the recipe's), hardware, and
optionally a dataset. ``report`` resolves it the same way for everyone: it loads the model, picks the length from
the dataset when none is given, builds the TrainingSetup, estimates, judges the fit against the hardware (and host
RAM for offload), checks the setup against the model and the hardware, and, when the run does not fit, searches the
changes that do. Renderers (render/) turn a Report into text, JSON or markdown and compute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .advisor import Suggestion, suggest
from .cautions import Caution, length_cautions, warnings_for
from .errors import InvalidSetupError, Problem, UnknownModelError
from .estimator import Estimate, estimate
from .hardware import Hardware
from .options import HARDWARE_FIELDS, command_line
from .setup import TrainingSetup
from .spec import ModelSpec
from .verdict import Verdict, verdict

# Offload moves state to host RAM; a quarter of it stays with the OS, the data loader and the framework.
HOST_USABLE_SHARE = 0.75


@dataclass(frozen=True)
class Request:
    """What the user asked. ``setup`` holds only the options they set (absent or None: the recipe's default)."""

    model: str | None = None
    config: Mapping | None = None            # a config.json's contents (the web page's upload) instead of model
    setup: Mapping[str, object] = field(default_factory=dict)
    gpu: str | None = None                   # a catalog slug, or "auto" (this machine's)
    memory: str | int | None = None
    mac: str | int | None = None
    mac_wired_limit: str | int | None = None
    host_ram: str | int | None = None
    dataset: str | None = None
    tokenizer: str | None = None
    local_paths: bool = True                 # may `model` name a file or folder (the server says no)
    advice: bool = True

    @classmethod
    def from_values(cls, values: Mapping[str, object], **kw) -> "Request":
        """A request from option values keyed as in options.py (setup and request options mixed)."""
        from .options import SETUP_FIELDS

        setup = {k: v for k, v in values.items() if k in SETUP_FIELDS and v is not None}
        rest = {k: v for k, v in values.items() if k not in SETUP_FIELDS and v is not None}
        return cls(setup=setup, **rest, **kw)


@dataclass(frozen=True)
class HostVerdict:
    status: str                              # "fits" | "does-not-fit"
    needed_bytes: int
    ram_bytes: int
    usable_bytes: int

    @property
    def margin_bytes(self) -> int:
        return self.usable_bytes - self.needed_bytes


@dataclass(frozen=True)
class Report:
    request: Request
    model_ref: str
    spec: ModelSpec
    setup: TrainingSetup
    estimate: Estimate
    hardware: Hardware | None
    verdict: Verdict | None
    host_verdict: HostVerdict | None
    warnings: tuple[Caution, ...]
    suggestions: tuple[Suggestion, ...]
    dataset: object = None                   # dataset.LengthStats
    hardware_values: Mapping[str, object] = field(default_factory=dict)   # this hardware, as options

    def command(self, setup: TrainingSetup | None = None, model_ref: str | None = None,
                hardware_changes: Mapping | None = None) -> str:
        """The `memfit estimate` command that reproduces this report (or `setup`, on this hardware with
        `hardware_changes`)."""
        setup = setup or self.setup
        return command_line("estimate", model_ref or self.model_ref,
                            {**setup.overrides(), **self.hardware_values, **(hardware_changes or {})})


def load_request_model(request: Request) -> tuple[ModelSpec, str]:
    """The model and how to name it in a command."""
    from .sources import load_model

    if request.config is not None:
        if request.model is not None:
            raise InvalidSetupError("give a model or a config, not both")
        if not isinstance(request.config, Mapping):
            raise InvalidSetupError("config must be a JSON object (the contents of a config.json)")
        name = str(request.config.get("_name_or_path") or "uploaded config.json")[:200]
        spec = ModelSpec.from_hf_config(dict(request.config), name=name, source="uploaded config.json")
        return spec, "config.json"
    if not isinstance(request.model, str) or not request.model.strip():
        raise UnknownModelError("no model given (a catalog name, HF id, config.json path, directory or size)")
    return load_model(request.model, allow_paths=request.local_paths), request.model.strip()


def load_request_hardware(request: Request) -> tuple[Hardware | None, dict]:
    """The hardware, and the options that name it in a reproducing command (a detected GPU by its catalog slug
    or its memory, so the command means the same on another machine)."""
    from .hardware import load_hardware

    given = {name: getattr(request, name) for name in HARDWARE_FIELDS if name != "host_ram"
             and getattr(request, name) is not None}
    if not given:
        return None, {}
    if request.gpu == "auto":
        if request.memory is not None or request.mac is not None:
            raise InvalidSetupError(Problem("gpu", "give exactly one of {gpu}, {memory} or {mac}"))
        from .detect import detect_hardware

        hw = detect_hardware()
        if hw.kind == "mac":
            return hw, {"mac": f"{hw.capacity_bytes // 2**20}MiB", "mac_wired_limit": f"{hw.usable_bytes // 2**20}MiB"}
        return hw, ({"gpu": hw.slug} if hw.slug else {"memory": f"{hw.usable_bytes // 2**20}MiB"})
    hw = load_hardware(gpu=request.gpu, memory=request.memory, mac=request.mac,
                       mac_wired_limit=request.mac_wired_limit)
    return hw, given


def resolve_setup(request: Request, dataset=None, hardware: Hardware | None = None) -> TrainingSetup:
    """The setup a request asks for. On a Mac the recipe is mlx-lm's unless one is given (people train there
    with mlx-lm; `--recipe hf` keeps the PyTorch model)."""
    values = dict(request.setup)
    if hardware is not None and hardware.kind == "mac" and values.get("recipe") is None:
        values["recipe"] = "mlx"
    if dataset is not None and values.get("seq_len") is None:
        from .dataset import suggested_length

        values["seq_len"] = suggested_length(dataset)   # no length given: the dataset's p99, rounded up to 64
    if hardware is not None and values.get("generation") == "vllm-colocate":
        values["card_bytes"] = hardware.capacity_bytes     # vLLM reserves a fraction of the whole card
    return TrainingSetup(**values)


def dataset_stats(request: Request, progress: bool = False, spec: ModelSpec | None = None):
    """(lengths, layout, stats for choosing a length, per-example image tokens) of the request's dataset, or None.
    For a vision-language model the lengths include each example's image tokens (dataset_images.py) and the
    length is chosen from the text alone: the estimate adds the image tokens of its image settings on top."""
    if request.dataset is None:
        if request.tokenizer is not None:
            raise InvalidSetupError(Problem("tokenizer", "{tokenizer} only applies with {dataset}"))
        return None
    if request.tokenizer is None:
        raise InvalidSetupError(Problem("dataset", "{dataset} needs {tokenizer} (a tokenizer.json or a model "
                                                   "directory)"))
    from .dataset import length_stats, token_lengths

    rule, counts = None, None
    if spec is not None and spec.vision is not None:
        from .vision import image_token_rule

        rule, counts = image_token_rule(spec.vision, request.setup.get("min_pixels"),
                                        request.setup.get("max_pixels")), []
    lengths, layout = token_lengths(request.dataset, request.tokenizer, progress=progress, image_tokens=rule,
                                    image_counts=counts)
    text = [n - i for n, i in zip(lengths, counts)] if counts else lengths
    return lengths, layout, length_stats(text, layout, None), counts


def check_against(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware | None) -> list[Caution]:
    """What the setup asks of this model and this hardware that cannot be (errors) or is unusual (cautions)."""
    problems, cautions = [], []
    if hardware is not None and hardware.kind == "mac" and setup.world_size > 1:
        problems.append(Problem("gpus", "a Mac has one GPU: {gpus} and {nodes} do not apply"))
    if hardware is not None and hardware.kind != "mac" and setup.recipe == "mps":
        problems.append(Problem("recipe", "{recipe} mps is PyTorch on an Apple-silicon Mac: give {mac} (or use the "
                                          "hf recipe on this GPU)"))
    if not spec.is_rule_of_thumb and setup.method in ("lora", "qlora"):
        from .params import layer_linears

        widths = [min(lin.d_in, lin.d_out) for lin in layer_linears(spec) if set(lin.parts) & set(setup.lora_targets)]
        if widths and setup.lora_rank > min(widths):
            problems.append(Problem("lora_rank", f"{{lora_rank}} {setup.lora_rank} is above the width of the "
                                                 f"adapted layers ({min(widths)}): the adapter would be larger "
                                                 f"than the layer"))
    context = spec.max_positions
    if context and setup.seq_len > context:
        cautions.append(Caution("past-context", f"length {setup.seq_len} is past {spec.name}'s context of "
                                                f"{context} tokens (max_position_embeddings): the model was not "
                                                f"trained on such positions"))
    if problems:
        raise InvalidSetupError(problems)
    return cautions


def report(request: Request, progress: bool = False) -> Report:
    hardware, hardware_values = load_request_hardware(request)   # hardware errors before any model lookup
    spec, model_ref = load_request_model(request)
    data = dataset_stats(request, progress, spec)
    setup = resolve_setup(request, data[2] if data else None, hardware)
    stats = None
    if data is not None:
        from .dataset import length_stats

        stats = length_stats(data[0], data[1], setup.seq_len, data[3])
    cautions = check_against(spec, setup, hardware)
    est = estimate(spec, setup)
    ver = verdict(est, hardware) if hardware else None
    warnings = warnings_for(spec, setup, est, hardware, ver) + cautions
    if stats is not None:
        warnings += length_cautions(stats)
    host = host_verdict(est, request.host_ram)
    partial = Report(request, model_ref, spec, setup, est, hardware, ver, host, tuple(warnings), (), stats,
                     hardware_values)
    if not (request.advice and ver is not None and ver.status != "fits" and not spec.is_rule_of_thumb):
        return partial
    suggestions = suggest(spec, setup, hardware, lambda ref, s, hw=None: partial.command(s, ref, hw),
                          dataset=stats, model_ref=model_ref)
    return Report(request, model_ref, spec, setup, est, hardware, ver, host, tuple(warnings), tuple(suggestions),
                  stats, hardware_values)


def host_verdict(est: Estimate, host_ram) -> HostVerdict | None:
    """The second verdict: the CPU RAM that offload needs against the machine's RAM."""
    if host_ram is None:
        return None
    from .units import parse_host_ram

    ram = host_ram if isinstance(host_ram, int) else parse_host_ram(host_ram)
    usable = int(ram * HOST_USABLE_SHARE)
    return HostVerdict("fits" if est.host_bytes <= usable else "does-not-fit", est.host_bytes, ram, usable)


CURVE_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def method_setups(setup: TrainingSetup) -> dict[str, TrainingSetup]:
    """The same request with each method (what a method doesn't take goes back to the recipe's default)."""
    out = {}
    for method in ("full", "lora", "qlora"):
        try:
            out[method] = setup.with_method(method)
        except InvalidSetupError:      # e.g. an explicit fp32 precision, which QLoRA cannot use
            continue
    return out


def method_curves(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware | None,
                  lengths: tuple[int, ...] = CURVE_LENGTHS) -> dict:
    """Device bytes against max length for each method, and the longest length that fits (verdict.py's rule)."""
    from .verdict import fits

    out = {"lengths": list(lengths), "methods": {}}
    for method, base in method_setups(setup).items():
        points, longest = [], None
        for length in lengths:
            est = estimate(spec, base.replace(seq_len=length))
            points.append(est.device_bytes)
            if hardware is not None and fits(est, hardware):
                longest = length
        out["methods"][method] = {"device_bytes": points, "longest_fitting_length": longest}
    return out
