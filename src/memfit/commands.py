"""The command implementations behind cli.py: each turns its arguments into a request, asks the library, and
returns what a renderer makes of the answer. No physics, policy or formatting lives here."""

from __future__ import annotations

import argparse

from .errors import InvalidSetupError
from .options import REQUEST_OPTIONS, SETUP_FIELDS, command_line, values_from_args
from .report import Request
from .render.jsonout import dumps

MAX_TRACE_STEPS = 20


def request_from_args(args: argparse.Namespace, **kw) -> Request:
    """The request a command line stands for: the options given (unset ones stay the recipe's)."""
    names = tuple(n for n in SETUP_FIELDS + tuple(o.name for o in REQUEST_OPTIONS) if hasattr(args, n))
    values = values_from_args(args, names)
    model = getattr(args, "model", None)
    return Request.from_values(values, model=model, **kw)


def cmd_estimate(args) -> str:
    from .render.jsonout import report_dict
    from .render.markdown import render_report_markdown
    from .render.text import render_report
    from .report import report

    result = report(request_from_args(args), progress=args.format == "text")
    if args.format == "json":
        return dumps(report_dict(result))
    if args.format == "markdown":
        return render_report_markdown(result)
    if getattr(args, "load_peak", False) and result.estimate is not None:
        from .render.load import load_lines

        return render_report(result) + "\n" + "\n".join(load_lines(result.estimate)) + "\n"
    return render_report(result)


def cmd_trace(args) -> str:
    from .render.jsonout import estimate_dict
    from .render.text import render_compare, render_estimate
    from .report import load_request_hardware, load_request_model, resolve_setup
    from .verdict import verdict

    if not 2 <= args.steps <= MAX_TRACE_STEPS:   # before importing torch: a bad number fails at once
        raise InvalidSetupError(f"--steps {args.steps}: trace 2 to {MAX_TRACE_STEPS} optimizer steps (the peak "
                                f"repeats from the second on)")
    request = request_from_args(args)
    hardware, _ = load_request_hardware(request)
    setup = resolve_setup(request, hardware=hardware)
    from .trace import require_trace_extra

    require_trace_extra()
    spec, _ = load_request_model(request)
    if args.device == "cuda":
        from .trace.cuda import trace_cuda

        measured = trace_cuda(spec, setup, steps=args.steps)
    else:
        from .trace import trace

        measured = trace(spec, setup, steps=args.steps, progress=args.format == "text")
    ver = verdict(measured, hardware) if hardware else None
    rows = None
    if args.compare:
        from .estimator import estimate
        from .trace.measure import compare

        rows = compare(estimate(spec, setup), measured)
    if args.format == "json":
        extra = {"trace": measured.extra}
        if rows is not None:
            extra["compare"] = rows
        return dumps(estimate_dict(measured, ver, extra))
    text = render_estimate(measured, ver)
    return text + ("\n\n" + render_compare(rows) if rows is not None else "")


def cmd_max(args) -> str:
    from .estimator import SCHEMA_VERSION
    from .render.text import render_max
    from .report import load_request_hardware, load_request_model, resolve_setup
    from .search import biggest_model, max_int

    request = request_from_args(args)
    hardware, _ = load_request_hardware(request)
    if hardware is None:
        raise InvalidSetupError("memfit max needs hardware: --gpu, --memory or --mac")
    setup = resolve_setup(request, hardware=hardware)
    if args.what == "model":
        if args.model:
            raise InvalidSetupError("--what model searches the catalog: give --family instead of a model")
        result = biggest_model(setup, hardware, args.family)
    else:
        if not args.model:
            raise InvalidSetupError(f"--what {args.what} needs a model")
        spec, _ = load_request_model(request)
        if spec.is_rule_of_thumb:
            raise InvalidSetupError("a bare size has no architecture: length and batch do not enter the rule")
        result = max_int(spec, setup, hardware, args.what.replace("-", "_"))
    if args.format == "json":
        return dumps({"schema_version": SCHEMA_VERSION, result.what: result.value,
                      "device_bytes": result.device_bytes, "next_step_device_bytes": result.next_device_bytes,
                      "usable_bytes": result.usable_bytes, "hardware": hardware.name})
    return render_max(result, hardware)


def cmd_plan(args) -> str:
    from .estimator import SCHEMA_VERSION
    from .plan import plan
    from .render.text import render_plan
    from .report import dataset_stats, load_request_hardware, load_request_model, resolve_setup

    request = request_from_args(args)
    hardware, hardware_values = load_request_hardware(request)
    if hardware is None:
        raise InvalidSetupError("memfit plan needs hardware: --gpu, --memory, --mac or --gpu auto")
    spec, model_ref = load_request_model(request)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to plan for; name a model or a config.json")
    data = dataset_stats(request, progress=args.format == "text", spec=spec)
    base = resolve_setup(request, data[2] if data else None, hardware)
    stats = None
    if data is not None:
        from .dataset import length_stats

        stats = length_stats(data[0], data[1], base.seq_len, data[3])
    methods = (base.method,) if "method" in base.explicit else ("full", "lora", "qlora")
    recommended, alternatives = plan(
        spec, base, hardware, lambda s: command_line("estimate", model_ref, {**s.overrides(), **hardware_values}),
        methods)
    if args.format == "json":
        return dumps({"schema_version": SCHEMA_VERSION, "model": spec.name, "hardware": hardware.name,
                      "usable_bytes": hardware.usable_bytes, "seq_len": base.seq_len,
                      "recommended": recommended.as_dict() if recommended else None,
                      "alternatives": [o.as_dict() for o in alternatives],
                      "dataset": stats.as_dict() if stats else None})
    return render_plan(spec, hardware, base, recommended, alternatives, stats)


def cmd_config(args) -> str:
    from pathlib import Path

    from .engine_config import render_config
    from .errors import SourceError
    from .report import load_request_model, resolve_setup

    request = request_from_args(args)
    if args.engine == "megatron" and "recipe" not in request.setup:
        from dataclasses import replace

        request = replace(request, setup={**request.setup, "recipe": "megatron"})   # the layout is Megatron's
    spec, _ = load_request_model(request)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to configure; name a model or a config.json")
    setup = resolve_setup(request)
    text = render_config(spec, setup, args.engine)
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as exc:
            raise SourceError(f"{args.output}: cannot write ({exc.strerror or exc})") from None
        layout = f"tp {setup.tp} x pp {setup.pp} x cp {setup.cp}" if args.engine == "megatron" else setup.shard
        return f"wrote {args.output} ({args.engine}, {layout} over {setup.world_size} GPUs)"
    return text


def cmd_check(args) -> str:
    from .preflight import check_config
    from .preflight.check import write_suggested
    from .render.jsonout import check_dict
    from .render.text import render_check
    from .report import load_request_hardware

    request = request_from_args(args)
    hardware, _ = load_request_hardware(request)
    gpus = request.setup.get("gpus")
    result = check_config(args.config, hardware, args.format_of, args.tokenizer, gpus)
    written = None
    if args.write_suggested:
        written = write_suggested(result, args.write_suggested, in_place=args.in_place)
    if args.format == "json":
        return dumps(check_dict(result, args.write_suggested if written else None, written))
    return render_check(result, args.write_suggested if written else None, written)


def cmd_plot(args) -> str:
    from pathlib import Path

    from .errors import SourceError
    from .render.plot import plot
    from .report import load_request_hardware, load_request_model, resolve_setup

    if not str(args.output).lower().endswith((".png", ".svg")):
        raise InvalidSetupError("-o must name a .png or .svg file")
    folder = Path(args.output).expanduser().parent
    if not folder.is_dir():
        raise SourceError(f"{args.output}: the folder {folder} does not exist")
    request = request_from_args(args)
    hardware, _ = load_request_hardware(request)
    spec, _ = load_request_model(request)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to plot; name a model or a config.json")
    setup = resolve_setup(request, hardware=hardware)
    traced = None
    if args.with_trace:
        from .trace import trace

        traced = trace(spec, setup)
    plot(spec, setup, hardware, args.output, traced)
    return f"wrote {args.output}"


def cmd_serve(args) -> str:
    from .server import serve

    if not 0 <= args.port <= 65535:
        raise InvalidSetupError(f"--port {args.port} is not a port number")
    serve(args.host, args.port)
    return ""


def cmd_explain(args) -> str:
    from .explain import explain
    from .report import load_request_model, resolve_setup

    request = request_from_args(args)
    spec, _ = load_request_model(request)
    result = explain(spec, resolve_setup(request))
    return dumps(result.as_dict()) if args.format == "json" else result.text()


def cmd_models(args) -> str:
    from .listing import render_models

    return render_models(args.family, args.format)


def cmd_gpus(args) -> str:
    from .listing import render_gpus

    return render_gpus(args.format)


def cmd_macs(args) -> str:
    from .listing import render_macs

    return render_macs(args.format)


def cmd_rule(args) -> str:
    from .listing import render_rule

    return render_rule(args.format)
