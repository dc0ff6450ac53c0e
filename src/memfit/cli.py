"""The memfit command line. Every command takes --format text|json; errors are one line on stderr.

Exit codes: 0 success, 1 bad input (unknown model, bad number, impossible combination), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .errors import InvalidSetupError, MemfitError, UsageError

SETUP_FLAGS = {  # flag -> TrainingSetup field
    "method": "method", "batch_size": "batch_size", "seq_len": "seq_len", "precision": "precision",
    "optimizer": "optimizer", "grad_ckpt": "grad_ckpt", "attn": "attn", "lora_rank": "lora_rank",
    "lora_targets": "lora_targets", "lora_dropout": "lora_dropout", "quant": "quant", "grad_accum": "grad_accum",
    "chunked_ce": "chunked_ce", "optimizer_in_backward": "optimizer_in_backward", "gpus": "gpus",
    "kbit_upcast": "kbit_upcast", "padding": "padding", "reentrant": "ckpt_reentrant",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _int(text: str) -> int:
    try:
        return int(str(text).replace("_", ""))
    except ValueError:
        raise InvalidSetupError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidSetupError(f"{text!r} is not a number") from None


def add_setup_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training setup (defaults: the recipe's, marked * in the output)")
    g.add_argument("--method", choices=["full", "lora", "qlora"], help="default lora")
    g.add_argument("--batch-size", type=_int, help="micro-batch size per GPU (default 1)")
    g.add_argument("--seq-len", type=_int, help="max sequence length in tokens (default 2048)")
    g.add_argument("--precision", help="auto|bf16|fp16|fp32|bf16-mixed|fp16-mixed (default auto: the checkpoint dtype)")
    g.add_argument("--optimizer", help="adamw|adamw-fused|adamw-loop|adamw-bnb|adamw-8bit|paged-adamw|"
                                       "paged-adamw-8bit|sgd|adafactor (HF names like adamw_torch_fused work too)")
    g.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=None,
                   help="gradient checkpointing")
    g.add_argument("--reentrant", action="store_true", default=None,
                   help="reentrant gradient checkpointing (transformers v4's default; v5 uses non-reentrant)")
    g.add_argument("--attn", choices=["sdpa", "flash", "eager"])
    g.add_argument("--lora-rank", type=_int)
    g.add_argument("--lora-targets", help="all-linear or a list such as q,k,v,o,gate,up,down")
    g.add_argument("--lora-dropout", type=_float)
    g.add_argument("--quant", choices=["nf4", "nf4-dq", "fp4", "int8"], help="QLoRA base quantization")
    g.add_argument("--grad-accum", type=_int, help="gradient accumulation steps")
    g.add_argument("--chunked-ce", action=argparse.BooleanOptionalAction, default=None,
                   help="chunked cross-entropy (the recipe's own, torchtune-style for hf)")
    g.add_argument("--optimizer-in-backward", action="store_true", default=None)
    g.add_argument("--kbit-upcast", action="store_true", default=None,
                   help="QLoRA: prepare_model_for_kbit_training's fp32 upcast of norms/embeddings/lm_head")
    g.add_argument("--padding", action="store_true", default=None, help="batches carry a padding mask")
    g.add_argument("--recipe", default="hf", help="hf|torchtune|litgpt|unsloth|axolotl|pytorch|mlx (default hf)")
    g.add_argument("--gpus", type=_int, help="number of GPUs (only 1 is supported for now)")


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware (one of)")
    g.add_argument("--gpu", help="a GPU from `memfit gpus`, e.g. rtx-4090, a100-80gb; or auto (detect this machine's)")
    g.add_argument("--memory", help="a card's own memory, e.g. 24GiB (never system RAM)")
    g.add_argument("--mac", help="an Apple-silicon Mac's unified memory, e.g. 36GB")
    g.add_argument("--mac-wired-limit", help="override the Mac's GPU limit (sysctl iogpu.wired_limit_mb)")


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dataset check")
    g.add_argument("--dataset", help="JSONL, JSON, CSV or Parquet training data (text, prompt/completion, "
                                     "instruction/output or chat messages)")
    g.add_argument("--tokenizer", help="tokenizer.json or a model directory (with its chat template)")


def add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=["text", "json"], default="text")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="memfit", description="How much memory fine-tuning a model needs, and whether it fits.")
    parser.add_argument("--version", action="version", version=f"memfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("estimate", help="estimate the peak memory of a training step (and check a fit)")
    p.add_argument("model", help="catalog name or HF id, config.json, model directory, or a size like 7B")
    add_setup_args(p)
    add_hardware_args(p)
    add_dataset_args(p)
    add_format(p)

    p = sub.add_parser("trace", help="measure a real training step on fake tensors (or a real GPU)")
    p.add_argument("model")
    add_setup_args(p)
    add_hardware_args(p)
    p.add_argument("--compare", action="store_true", help="show the analytic estimate beside the trace")
    p.add_argument("--device", choices=["fake", "cuda"], default="fake",
                   help="fake: fake CPU tensors, no GPU needed (default); cuda: a real run with random weights")
    p.add_argument("--steps", type=_int, default=2, help="optimizer steps to run (at least 2)")
    add_format(p)

    p = sub.add_parser("max", help="the longest length, largest batch or biggest catalog model that fits")
    p.add_argument("model", nargs="?", help="the model (not needed with --what model)")
    p.add_argument("--what", required=True, choices=["seq-len", "batch-size", "model"])
    p.add_argument("--family", help="with --what model: only this family (e.g. qwen2.5)")
    add_setup_args(p)
    add_hardware_args(p)
    add_format(p)

    p = sub.add_parser("plan", help="the recommended setup for a model on your hardware, and the alternatives")
    p.add_argument("model")
    add_setup_args(p)
    add_hardware_args(p)
    add_dataset_args(p)
    add_format(p)

    p = sub.add_parser("explain", help="walk through the bytes per weight and every phase of the step")
    p.add_argument("model")
    add_setup_args(p)
    add_format(p)

    p = sub.add_parser("models", help="list the built-in model catalog")
    p.add_argument("--family", help="only this family (e.g. qwen2.5, llama-3)")
    add_format(p)

    p = sub.add_parser("gpus", help="list the GPU catalog and how Macs are handled")
    add_format(p)

    p = sub.add_parser("rule", help="print the rule-of-thumb table (GB = 1e9 bytes)")
    add_format(p)
    return parser


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
        return dumps(estimate_dict(est, ver, extra))
    from .dataset import render_stats

    head = render_stats(stats) + "\n\n" if stats is not None else ""
    return head + render_estimate(est, ver, explicit) + render_advice(ver, suggestions, warnings)


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


COMMANDS = {"estimate": cmd_estimate, "trace": cmd_trace, "max": cmd_max, "plan": cmd_plan, "explain": cmd_explain, "models": cmd_models, "gpus": cmd_gpus,
            "rule": cmd_rule}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        output = COMMANDS[args.command](args)
    except MemfitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    try:
        print(output)
    except BrokenPipeError:  # `memfit models | head`
        pass
    return 0
