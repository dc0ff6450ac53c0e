"""The command implementations behind cli.py: each takes the parsed arguments and returns the text to print."""

from __future__ import annotations

import argparse

from .units import gib

from .errors import InvalidSetupError

SETUP_FLAGS = {  # flag -> TrainingSetup field
    "method": "method", "batch_size": "batch_size", "seq_len": "seq_len", "precision": "precision",
    "optimizer": "optimizer", "grad_ckpt": "grad_ckpt", "attn": "attn", "lora_rank": "lora_rank",
    "lora_targets": "lora_targets", "lora_dropout": "lora_dropout", "quant": "quant", "grad_accum": "grad_accum",
    "chunked_ce": "chunked_ce", "optimizer_in_backward": "optimizer_in_backward", "gpus": "gpus",
    "kbit_upcast": "kbit_upcast", "padding": "padding", "reentrant": "ckpt_reentrant", "nodes": "nodes",
    "shard": "shard", "offload": "offload",
}


def setup_from_args(args: argparse.Namespace, spec=None):  # noqa: C901 (one check per flag)
    """TrainingSetup from the flags; returns (setup, the fields the user set)."""
    from .setup import TrainingSetup, normalize_optimizer, parse_targets

    values = {field: getattr(args, flag) for flag, field in SETUP_FLAGS.items() if getattr(args, flag) is not None}
    method = values.get("method", "lora")
    if method != "qlora" and "quant" in values:
        raise InvalidSetupError(f"--quant only applies to --method qlora (method is {method})")
    if method == "full":
        lora_flags = [f for f in ("lora_rank", "lora_targets", "lora_dropout") if f in values]
        if lora_flags:
            raise InvalidSetupError(f"--{lora_flags[0].replace('_', '-')} contradicts --method full")
    if "kbit_upcast" in values and method != "qlora":
        raise InvalidSetupError("--kbit-upcast only applies to --method qlora")
    if "lora_targets" in values:
        values["lora_targets"] = parse_targets(values["lora_targets"])
    if "optimizer" in values:
        values["optimizer"] = normalize_optimizer(values["optimizer"])
    setup = TrainingSetup.from_recipe(args.recipe, **values)
    return setup, frozenset(values) | ({"recipe"} if args.recipe != "hf" else set())


def hardware_args(args: argparse.Namespace, hardware=None) -> list[str]:
    """The hardware flags as given, to repeat them in suggested commands (a detected GPU by its catalog slug or
    its memory, so the command means the same on another machine)."""
    if getattr(args, "gpu", None) == "auto" and hardware is not None:
        if hardware.kind == "mac":
            return ["--mac", f"{hardware.capacity_bytes // 2**20}MiB", "--mac-wired-limit",
                    f"{hardware.usable_bytes // 2**20}MiB"]
        return ["--gpu", hardware.slug] if hardware.slug else ["--memory", f"{hardware.usable_bytes // 2**20}MiB"]
    out = []
    for name in ("gpu", "memory", "mac", "mac_wired_limit"):
        value = getattr(args, name, None)
        if value is not None:
            out += ["--" + name.replace("_", "-"), value]
    return out


def hardware_from_args(args: argparse.Namespace):
    from .hardware import load_hardware

    if all(getattr(args, name) is None for name in ("gpu", "memory", "mac", "mac_wired_limit")):
        return None
    if args.gpu == "auto":
        if args.memory or args.mac:
            raise InvalidSetupError("give exactly one of --gpu, --memory or --mac")
        from .detect import detect_hardware

        return detect_hardware()
    return load_hardware(gpu=args.gpu, memory=args.memory, mac=args.mac, mac_wired_limit=args.mac_wired_limit)


def cmd_estimate(args) -> str:
    from .estimator import estimate
    from .render.jsonout import dumps, estimate_dict
    from .render.text import render_estimate
    from .sources import load_model
    from .verdict import verdict

    from .advisor import suggest, warnings_for
    from .render.text import render_advice

    hardware = hardware_from_args(args)   # validate hardware flags before any model lookup
    spec = load_model(args.model)
    data = dataset_lengths(args)
    stats = None
    if data is not None:
        from .dataset import length_stats, length_warnings, suggested_length

        if args.seq_len is None:   # no --seq-len: the dataset's p99, rounded up to 64
            args.seq_len = suggested_length(length_stats(*data, None))
        stats = length_stats(*data, args.seq_len)
    setup, explicit = setup_from_args(args, spec)
    est = estimate(spec, setup)
    ver = verdict(est, hardware) if hardware else None
    warnings = warnings_for(spec, setup, est, hardware, ver)
    if stats is not None:
        warnings += length_warnings(stats)
    host = host_verdict(args, est)
    suggestions = []
    if ver is not None and ver.status != "fits" and not spec.is_rule_of_thumb:
        suggestions = suggest(spec, setup, hardware, args.model, hardware_args(args, hardware),
                              dataset=stats)
    if args.format == "json":
        extra = {"warnings": warnings}
        if ver is not None:
            extra["suggestions"] = [s.as_dict() for s in suggestions]
        if stats is not None:
            extra["dataset"] = stats.as_dict()
        if host:
            extra["host_verdict"] = host
        return dumps(estimate_dict(est, ver, extra))
    from .dataset import render_stats

    head = render_stats(stats) + "\n\n" if stats is not None else ""
    tail = ""
    if host:
        tail = (f"\nhost RAM: {host['status'].upper()}: offload needs {gib(host['needed_bytes'])} of "
                f"{gib(host['usable_bytes'])}")
    return head + render_estimate(est, ver, explicit) + tail + render_advice(ver, suggestions, warnings)


def host_verdict(args, est) -> dict | None:
    """The second verdict: the CPU RAM offload needs against --host-ram."""
    if getattr(args, "host_ram", None) is None:
        return None
    from .units import parse_size

    ram = parse_size(args.host_ram, "--host-ram")
    # Keep a quarter of the RAM for the OS, the data loader and the framework (a stated planning margin).
    usable = int(ram * 0.75)
    status = "fits" if est.host_bytes <= usable else "does-not-fit"
    return {"status": status, "needed_bytes": est.host_bytes, "ram_bytes": ram, "usable_bytes": usable,
            "margin_bytes": usable - est.host_bytes, "note": "usable = 3/4 of RAM (OS, data loading, framework)"}


def dataset_lengths(args):
    """(token lengths, layout) of --dataset with --tokenizer; None without a dataset."""
    if getattr(args, "dataset", None) is None:
        if getattr(args, "tokenizer", None) is not None:
            raise InvalidSetupError("--tokenizer only applies with --dataset")
        return None
    if args.tokenizer is None:
        raise InvalidSetupError("--dataset needs --tokenizer (a tokenizer.json or a model directory)")
    from .dataset import token_lengths

    return token_lengths(args.dataset, args.tokenizer, progress=args.format == "text")


def cmd_trace(args) -> str:
    from .render.jsonout import dumps, estimate_dict
    from .render.text import render_compare, render_estimate
    from .sources import load_model
    from .trace import require_trace_extra
    from .verdict import verdict

    require_trace_extra()
    hardware = hardware_from_args(args)
    spec = load_model(args.model)
    setup, explicit = setup_from_args(args, spec)
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
    text = render_estimate(measured, ver, explicit)
    return text + ("\n\n" + render_compare(rows) if rows is not None else "")


def cmd_max(args) -> str:
    from .render.jsonout import dumps
    from .search import biggest_model, max_int
    from .sources import load_model
    from .units import gib

    hardware = hardware_from_args(args)
    if hardware is None:
        raise InvalidSetupError("memfit max needs hardware: --gpu, --memory or --mac")
    if args.what == "model":
        if args.model:
            raise InvalidSetupError("--what model searches the catalog: give --family instead of a model")
        setup, _ = setup_from_args(args)
        result = biggest_model(setup, hardware, args.family)
    else:
        if not args.model:
            raise InvalidSetupError(f"--what {args.what} needs a model")
        spec = load_model(args.model)
        if spec.is_rule_of_thumb:
            raise InvalidSetupError("a bare size has no architecture: length and batch do not enter the rule")
        setup, _ = setup_from_args(args, spec)
        result = max_int(spec, setup, hardware, args.what.replace("-", "_"))
    key = {"seq-len": "seq_len", "batch-size": "batch_size", "model": "model"}[args.what]
    data = {"schema_version": 1, key: result.value, "device_bytes": result.device_bytes,
            "next_step_device_bytes": result.next_device_bytes, "usable_bytes": result.usable_bytes,
            "hardware": hardware.name}
    if args.format == "json":
        return dumps(data)
    if result.value is None:
        return (f"nothing fits on {hardware.name}: even the smallest step needs "
                f"{gib(result.next_device_bytes or 0)} of {gib(result.usable_bytes)}")
    above = f"; one step up needs {gib(result.next_device_bytes)}" if result.next_device_bytes else ""
    return (f"{key.replace('_', ' ')}: {result.value} ({gib(result.device_bytes)} of {gib(result.usable_bytes)} "
            f"usable on {hardware.name}{above})")


def cmd_plan(args) -> str:
    from .dataset import length_stats, render_stats, suggested_length
    from .plan import plan
    from .render.jsonout import dumps
    from .sources import load_model
    from .units import gib

    hardware = hardware_from_args(args)
    if hardware is None:
        raise InvalidSetupError("memfit plan needs hardware: --gpu, --memory, --mac or --gpu auto")
    spec = load_model(args.model)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to plan for; name a model or a config.json")
    data, stats = dataset_lengths(args), None
    if data is not None:
        if args.seq_len is None:
            args.seq_len = suggested_length(length_stats(*data, None))
        stats = length_stats(*data, args.seq_len)
    base, _ = setup_from_args(args, spec)
    methods = (base.method,) if args.method else ("full", "lora", "qlora")
    recommended, alternatives = plan(spec, base, hardware, args.model, hardware_args(args, hardware), methods)
    if args.format == "json":
        return dumps({"schema_version": 1, "model": spec.name, "hardware": hardware.name,
                      "usable_bytes": hardware.usable_bytes, "seq_len": base.seq_len,
                      "recommended": recommended.as_dict() if recommended else None,
                      "alternatives": [o.as_dict() for o in alternatives],
                      "dataset": stats.as_dict() if stats else None})
    lines = [render_stats(stats), ""] if stats else []
    lines.append(f"{spec.name} on {hardware.name} ({gib(hardware.usable_bytes)} usable), length {base.seq_len}")
    if recommended is None:
        lines.append("nothing fits at this length: try a shorter --seq-len or a smaller model (`memfit max`)")
    else:
        s = recommended.setup
        lines += [f"recommended: {recommended.method}, batch {s.batch_size} x accumulation {s.grad_accum}, "
                  f"{'gradient checkpointing' if s.grad_ckpt else 'no checkpointing'}, {s.optimizer}: "
                  f"{gib(recommended.device_bytes)}", f"  {recommended.trade_off}",
                  f"  run: {recommended.command}"]
    for option in alternatives:
        if option.setup is None:
            lines.append(f"alternative {option.method}: {'; '.join(option.notes)}")
        else:
            s = option.setup
            lines.append(f"alternative {option.method}: batch {s.batch_size} x {s.grad_accum}, "
                         f"{gib(option.device_bytes)} ({option.trade_off})")
    return "\n".join(lines)


def cmd_config(args) -> str:
    from pathlib import Path

    from .engine_config import render_config
    from .errors import SourceError
    from .sources import load_model

    spec = load_model(args.model)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to configure; name a model or a config.json")
    setup, _ = setup_from_args(args, spec)
    text = render_config(spec, setup, args.engine)
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as exc:
            raise SourceError(f"{args.output}: cannot write ({exc.strerror or exc})") from None
        return f"wrote {args.output} ({args.engine}, {setup.shard} over {setup.world_size} GPUs)"
    return text


def cmd_check(args) -> str:
    from .preflight import check_config
    from .preflight.check import write_suggested
    from .render.jsonout import dumps, estimate_dict, verdict_dict

    hardware = hardware_from_args(args)
    result = check_config(args.config, hardware, args.format_of, args.tokenizer, args.gpus)
    written = write_suggested(result, args.write_suggested) if args.write_suggested else None
    m = result.mapped
    if args.format == "json":
        return dumps({"schema_version": 1, "tool": result.tool, "model": m.model,
                      "setup": estimate_dict(result.estimate)["setup"], "used_keys": m.used,
                      "defaults_assumed": m.defaults, "ignored_keys": m.ignored,
                      "estimate": estimate_dict(result.estimate, result.verdict),
                      "verdict": verdict_dict(result.verdict) if result.verdict else None,
                      "suggestions": [s.as_dict() for s in result.suggestions], "warnings": result.warnings,
                      "dataset": result.dataset.as_dict() if result.dataset else None,
                      "written": {"path": args.write_suggested, "change": written.change} if written else None})
    from .render.text import render_verdict

    s = result.setup
    lines = [f"{result.path}: {result.tool} config for {m.model}",
             f"  read as: {s.method}, batch {s.batch_size} x accumulation {s.grad_accum}, length {s.seq_len}, "
             f"{'gradient checkpointing' if s.grad_ckpt else 'no checkpointing'}, {s.optimizer}, attn {s.attn}"
             + (f", LoRA r{s.lora_rank} {','.join(s.lora_targets)}" if s.method != "full" else "")
             + (f", {s.shard} over {s.world_size} GPUs" if s.shard != "none" else ""),
             f"  keys used: {', '.join(m.used)}"]
    lines += [f"  assumed: {d}" for d in m.defaults]
    if m.ignored:
        lines.append(f"  ignored (no effect on memory): {', '.join(m.ignored)}")
    est = result.estimate
    lines.append(f"  needs {gib(est.device_bytes)} per GPU (peak at {est.peak_phase}; "
                 f"{gib(est.peak_allocated_bytes)} allocated)")
    if result.verdict:
        lines.append(render_verdict(result.verdict))
    if result.suggestions:
        lines.append("edits, best first:")
        for sug in result.suggestions:
            if sug.unavailable:
                continue
            edits = "; ".join(f"`{k}: {sug.old.get(k)}` -> `{v}`" for k, v in sug.edits.items())
            mark = "" if sug.fits else " (still does not fit)"
            lines.append(f"  {edits}: {gib(sug.device_bytes)}{mark} ({sug.cost})")
    if written:
        lines.append(f"wrote {args.write_suggested} with: {written.change}")
    lines += [f"warning [{w['code']}]: {w['message']}" for w in result.warnings]
    return "\n".join(lines)


def cmd_plot(args) -> str:
    from .render.plot import plot
    from .sources import load_model

    if not str(args.output).lower().endswith((".png", ".svg")):
        raise InvalidSetupError("-o must name a .png or .svg file")
    hardware = hardware_from_args(args)
    spec = load_model(args.model)
    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to plot; name a model or a config.json")
    setup, _ = setup_from_args(args, spec)
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
    from .render.jsonout import dumps
    from .sources import load_model

    spec = load_model(args.model)
    setup, _ = setup_from_args(args, spec)
    result = explain(spec, setup)
    return dumps(result.as_dict()) if args.format == "json" else result.text()


def cmd_models(args) -> str:
    from .listing import render_models

    return render_models(args.family, args.format)


def cmd_gpus(args) -> str:
    from .listing import render_gpus

    return render_gpus(args.format)


def cmd_rule(args) -> str:
    from .listing import render_rule

    return render_rule(args.format)
