"""The memfit command line. Every command takes --format text|json; errors are one line on stderr.

Exit codes: 0 success, 1 bad input (unknown model, bad number, impossible combination), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .errors import InvalidSetupError, MemfitError, UsageError  # noqa: F401



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
    g.add_argument("--gpus", type=_int, help="GPUs per node (default 1)")
    g.add_argument("--nodes", type=_int, help="nodes (default 1)")
    g.add_argument("--shard", choices=["none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-shard-grad-op",
                                       "hsdp"], help="data-parallel layout (default none; required above 1 GPU)")
    g.add_argument("--offload", choices=["none", "optimizer", "optimizer+params"],
                   help="ZeRO / FSDP CPU offload (default none)")


def add_hardware_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware (one of)")
    g.add_argument("--gpu", help="a GPU from `memfit gpus`, e.g. rtx-4090, a100-80gb; "
                                 "or auto (detect this machine's)")
    g.add_argument("--memory", help="a card's own memory, e.g. 24GiB (never system RAM)")
    g.add_argument("--mac", help="an Apple-silicon Mac's unified memory, e.g. 36GB")
    g.add_argument("--mac-wired-limit", help="override the Mac's GPU limit (sysctl iogpu.wired_limit_mb)")
    g.add_argument("--host-ram", help="the machine's RAM, checked against what --offload moves to it (e.g. 256GB)")


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

    p = sub.add_parser("config", help="print a DeepSpeed JSON or accelerate FSDP config for the plan")
    p.add_argument("model")
    p.add_argument("--engine", required=True, choices=["deepspeed", "accelerate-fsdp"])
    p.add_argument("-o", "--output", help="write the config to this file instead of printing it")
    add_setup_args(p)

    p = sub.add_parser("check", help="pre-flight a training config (axolotl, LLaMA-Factory, torchtune, TRL, "
                                     "mlx-lm): does it fit, and what to edit")
    p.add_argument("config", help="the training config file (YAML or JSON)")
    p.add_argument("--format-of", choices=["axolotl", "llamafactory", "torchtune", "trl", "mlx"],
                   help="force the tool (detected from the content otherwise)")
    p.add_argument("--write-suggested", metavar="OUT", help="write the config with the best fitting change applied")
    p.add_argument("--tokenizer", help="tokenizer for the length check of the config's local dataset")
    p.add_argument("--gpus", type=_int, help="GPUs per node, for a config that shards (DeepSpeed, FSDP)")
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

    p = sub.add_parser("rule", help="print the rule-of-thumb table (GB = 1e9 bytes)")
    add_format(p)
    return parser


from .commands import (  # noqa: E402  (after the parser helpers they use)
    cmd_check, cmd_config, cmd_estimate, cmd_explain, cmd_gpus, cmd_max, cmd_models, cmd_plan, cmd_plot, cmd_rule,
    cmd_serve, cmd_trace)

COMMANDS = {"estimate": cmd_estimate, "trace": cmd_trace, "max": cmd_max, "plan": cmd_plan,
            "explain": cmd_explain, "models": cmd_models, "gpus": cmd_gpus, "rule": cmd_rule,
            "config": cmd_config, "check": cmd_check, "plot": cmd_plot, "serve": cmd_serve}


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
