"""The memfit command line. Every command takes --format text|json; errors are one line on stderr.

Exit codes: 0 success, 1 bad input (unknown model, bad number, impossible combination), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .errors import InvalidSetupError, MemfitError, UsageError
from .engine_config import ENGINES
from .options import add_options, flag_name


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


def _int(text: str) -> int:
    try:
        return int(str(text).replace("_", ""))
    except ValueError:
        raise InvalidSetupError(f"{text!r} is not a whole number") from None


def add_setup_args(p: argparse.ArgumentParser) -> None:
    add_options(p, "setup")


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    add_options(p, "hardware")


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    add_options(p, "dataset")


def add_format(p: argparse.ArgumentParser, choices=("text", "json")) -> None:
    p.add_argument("--format", choices=list(choices), default="text")


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
    add_format(p, ("text", "json", "markdown"))
    p.add_argument("--load-peak", action="store_true",
                   help="also print the model-load phase (checkpoint read, quantized or sharded) beside the step")

    p = sub.add_parser("trace", help="measure a real training step on fake tensors (or a real GPU)")
    p.add_argument("model")
    add_setup_args(p)
    add_hardware_args(p)
    p.add_argument("--compare", action="store_true", help="show the analytic estimate beside the trace")
    p.add_argument("--device", choices=["fake", "cuda"], default="fake",
                   help="fake: fake CPU tensors, no GPU needed (default); cuda: a real run with random weights")
    p.add_argument("--steps", type=_int, default=2, help="optimizer steps to run (2 to 20)")
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

    p = sub.add_parser("config", help="print a DeepSpeed JSON or accelerate FSDP config, or Megatron-LM "
                                      "arguments, for the plan")
    p.add_argument("model")
    p.add_argument("--engine", required=True, choices=list(ENGINES))
    p.add_argument("-o", "--output", help="write the config to this file instead of printing it")
    add_setup_args(p)

    p = sub.add_parser("check", help="pre-flight a training config (axolotl, LLaMA-Factory, torchtune, TRL, "
                                     "mlx-lm, ms-swift): does it fit, and what to edit")
    p.add_argument("config", help="the training config file (YAML or JSON)")
    from .preflight.formats import FORMATS

    p.add_argument("--format-of", choices=list(FORMATS),
                   help="force the tool (detected from the content otherwise)")
    p.add_argument("--write-suggested", metavar="OUT", help="write the config with the best fitting change applied "
                                                             "(never over the input, unless --in-place)")
    p.add_argument("--in-place", action="store_true", help="with --write-suggested: allow OUT to be the input")
    add_options(p, "dataset", ("tokenizer",))
    add_options(p, "setup", ("gpus",))
    add_hardware_args(p)
    add_format(p)

    p = sub.add_parser("plot", help="draw the breakdown and memory against length and batch (PNG or SVG)")
    p.add_argument("model")
    p.add_argument("-o", "--output", required=True, help="FILE.png or FILE.svg")
    p.add_argument("--with-trace", action="store_true", help="add estimate vs trace (needs the [trace] extra)")
    add_setup_args(p)
    add_hardware_args(p)

    p = sub.add_parser("serve", help="a local web page over the same estimate (localhost only by default)")
    p.add_argument("--port", type=_int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")

    p = sub.add_parser("explain", help="walk through the bytes per weight and every phase of the step")
    p.add_argument("model")
    add_setup_args(p)
    add_format(p)

    p = sub.add_parser("models", help="list the built-in model catalog")
    p.add_argument("--family", help="only this family (e.g. qwen2.5, llama-3)")
    add_format(p)

    p = sub.add_parser("gpus", help="list the GPU catalog and how Macs are handled")
    add_format(p)

    p = sub.add_parser("macs", help="list the Apple-silicon Macs and their GPU working-set limits")
    add_format(p)

    p = sub.add_parser("rule", help="print the rule-of-thumb table (GB = 1e9 bytes)")
    add_format(p)
    return parser


from .commands import (  # noqa: E402  (after the parser helpers they use)
    cmd_check, cmd_config, cmd_estimate, cmd_explain, cmd_gpus, cmd_max, cmd_models, cmd_macs, cmd_plan, cmd_plot, cmd_rule,
    cmd_serve, cmd_trace)

COMMANDS = {"estimate": cmd_estimate, "trace": cmd_trace, "max": cmd_max, "plan": cmd_plan,
            "explain": cmd_explain, "models": cmd_models, "gpus": cmd_gpus, "macs": cmd_macs, "rule": cmd_rule,
            "config": cmd_config, "check": cmd_check, "plot": cmd_plot, "serve": cmd_serve}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        output = COMMANDS[args.command](args)
    except InvalidSetupError as exc:
        print(f"error: {exc.render(flag_name)}", file=sys.stderr)
        return exc.exit_code
    except MemfitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line (MEMFIT_DEBUG=1 shows the traceback)
        import os

        if os.environ.get("MEMFIT_DEBUG"):
            raise
        print(f"error: internal error ({type(exc).__name__}); please report it with the command you ran "
              f"(MEMFIT_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 3
    try:
        print(output)
    except BrokenPipeError:  # `memfit models | head`
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
