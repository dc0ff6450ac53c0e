"""The analytic estimate against the trace (real transformers/peft steps on fake tensors), over a matrix of
architecture families x method x batch x length x checkpointing x attention.

    python benchmarks/accuracy_vs_trace.py            # the full matrix (tens of minutes on 2 cores)
    python benchmarks/accuracy_vs_trace.py --quick    # one small setup per family and method (CI runs this)
    python benchmarks/accuracy_vs_trace.py --peft-only   # re-trace the PEFT-method cells, keep the rest

Reports, per counter and per component group, the median and worst relative error of the estimate against
the trace, and which component is off where. Writes benchmarks/results/accuracy_vs_trace.json (and .md).
The hf recipe's defaults (precision auto, fused AdamW, PEFT LoRA r8 on q,v) are used throughout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from memfit import TrainingSetup, estimate, load_model  # noqa: E402
from memfit.trace import trace  # noqa: E402
from memfit.options import PEFT_METHODS as _PEFT  # noqa: E402
from memfit.options import VIRTUAL_TOKEN_METHODS  # noqa: E402
from memfit.physics.adapters import LINEAR_ONLY_METHODS  # noqa: E402
from memfit.trace.measure import COUNTER_ROWS, compare  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# The smallest catalog model of each family: trace time grows with layers, not parameters.
FAMILIES = ["llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "gemma-2-2b", "gemma-3-1b", "phi-2", "phi-3-mini-4k",
            "smollm2-135m", "pythia-160m", "stablelm-2-1.6b", "olmo-2-1b", "gpt2", "tinyllama-1.1b", "bloom-560m"]


# Vision-language models (--vlm): the smallest catalog VLM of each family, over methods, image sizes, pixel limits,
# images per sample and checkpointing (the language model then runs text + image tokens).
VLM_CELLS = [
    ("qwen2.5-vl-3b", dict(method="lora", batch_size=1, seq_len=256, image_size="448x448")),
    ("qwen2.5-vl-3b", dict(method="lora", batch_size=1, seq_len=512, image_size="1280x720")),
    ("qwen2.5-vl-3b", dict(method="lora", batch_size=2, seq_len=256, image_size="640x480", images_per_sample=2)),
    ("qwen2.5-vl-3b", dict(method="lora", batch_size=1, seq_len=256, max_pixels=602112, grad_ckpt=True)),
    ("qwen2.5-vl-3b", dict(method="qlora", batch_size=1, seq_len=256, image_size="1024x1024")),
    ("qwen2.5-vl-3b", dict(method="full", batch_size=1, seq_len=256, image_size="1280x720", grad_ckpt=True)),
    ("qwen2.5-vl-3b", dict(method="lora", batch_size=1, seq_len=256, image_tokens=2048, attn="eager")),
    ("gemma-3-4b", dict(method="lora", batch_size=1, seq_len=256)),
    ("gemma-3-4b", dict(method="lora", batch_size=2, seq_len=512, images_per_sample=2, grad_ckpt=True)),
    ("gemma-3-4b", dict(method="qlora", batch_size=1, seq_len=1024, image_tokens=768)),
    ("gemma-3-4b", dict(method="full", batch_size=1, seq_len=256, grad_ckpt=True)),
    ("smolvlm2-500m", dict(method="lora", batch_size=1, seq_len=256, image_size="1280x720")),
    ("smolvlm2-500m", dict(method="full", batch_size=2, seq_len=512)),
    ("smolvlm2-500m", dict(method="lora", batch_size=1, seq_len=512, images_per_sample=3, grad_ckpt=True)),
    ("smolvlm2-500m", dict(method="qlora", batch_size=4, seq_len=256, image_size="640x480")),
    ("qwen2-vl-2b", dict(method="lora", batch_size=1, seq_len=256, image_size="448x448")),
    ("qwen2-vl-2b", dict(method="lora", batch_size=2, seq_len=512, image_size="1280x720")),
    ("qwen2-vl-2b", dict(method="lora", batch_size=1, seq_len=256, max_pixels=602112, grad_ckpt=True)),
    ("qwen3-vl-2b", dict(method="lora", batch_size=1, seq_len=256, image_size="448x448")),
    ("qwen3-vl-2b", dict(method="lora", batch_size=1, seq_len=512, images_per_sample=2, max_pixels=602112)),
    ("qwen3-vl-2b", dict(method="qlora", batch_size=2, seq_len=256, image_size="1280x720")),
    ("qwen3-vl-2b", dict(method="lora", batch_size=1, seq_len=256, image_size="1280x720", grad_ckpt=True)),
    # LLaVA-1.5's checkpoint is fp16, which the CPU trace cannot run under bf16 autocast: pure bf16.
    ("llava-1.5-7b", dict(method="lora", batch_size=1, seq_len=256, precision="bf16")),
    ("llava-1.5-7b", dict(method="lora", batch_size=2, seq_len=256, images_per_sample=2, precision="bf16")),
    ("internvl3-1b", dict(method="lora", batch_size=1, seq_len=256, image_size="1280x720")),
    ("internvl3-1b", dict(method="lora", batch_size=1, seq_len=512, image_size="448x448", images_per_sample=2)),
    ("internvl3-1b", dict(method="full", batch_size=1, seq_len=256, image_size="640x480")),
    ("internvl3-1b", dict(method="lora", batch_size=2, seq_len=256, image_size="1280x720", grad_ckpt=True)),
    ("llava-1.5-7b", dict(method="lora", batch_size=1, seq_len=512, grad_ckpt=True, precision="bf16")),
    ("llava-onevision-0.5b", dict(method="lora", batch_size=1, seq_len=256, image_size="800x600")),
    ("llava-onevision-0.5b", dict(method="lora", batch_size=1, seq_len=256, image_size="1280x720", grad_ckpt=True)),
    ("llava-onevision-0.5b", dict(method="full", batch_size=1, seq_len=256, image_size="448x448")),
    # LLaVA-NeXT: 336 px CLIP tiles on the any-res grid + the base image (fp16 checkpoint: pure bf16, as LLaVA-1.5).
    ("llava-v1.6-mistral-7b", dict(method="lora", batch_size=1, seq_len=256, image_size="800x600", precision="bf16")),
    ("llava-v1.6-mistral-7b", dict(method="lora", batch_size=1, seq_len=512, image_size="1280x720", grad_ckpt=True,
                                   precision="bf16")),
    ("llava-v1.6-vicuna-7b", dict(method="lora", batch_size=2, seq_len=256, image_size="640x480", images_per_sample=2,
                                  precision="bf16")),
    # Llama 3.2 Vision: cross-attention to 4 x 1601 vision tokens per image; the tower joins the graph under
    # checkpointing (QLoRA's default), and its eager attention is the forward's peak.
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=1, seq_len=256)),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=2, seq_len=512, images_per_sample=2)),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=1, seq_len=128, images_per_sample=6)),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=1, seq_len=512, images_per_sample=2, grad_ckpt=True)),
    ("llama-3.2-11b-vision", dict(method="qlora", batch_size=1, seq_len=1024, image_size="1280x720")),
    ("llama-3.2-11b-vision", dict(method="full", batch_size=1, seq_len=256)),
    ("llama-3.2-11b-vision", dict(method="full", batch_size=1, seq_len=512, grad_ckpt=True)),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=1, seq_len=256, attn="eager")),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=1, seq_len=2048, image_tokens=6404)),
    ("llama-3.2-11b-vision", dict(method="lora", batch_size=2, seq_len=1024, lora_targets="all-linear",
                                  grad_ckpt=True)),
    ("llama-3.2-90b-vision", dict(method="lora", batch_size=1, seq_len=512, images_per_sample=2)),
    ("llama-3.2-90b-vision", dict(method="qlora", batch_size=1, seq_len=1024)),
]
# The other PEFT methods (physics/adapters.py), each on a few families, with and without checkpointing.
# (Small vocabularies: the trace's time goes into the logits. qwen2.5-0.5b and gemma-3-1b were checked by hand.)
PEFT_FAMILIES = ["smollm2-135m", "pythia-160m"]
# (LLaMA-Adapter v2 runs LitGPT's model, which the trace does not build; v1 is PEFT's adaption_prompt, which wraps
# llama and mistral attention only: physics/litgpt_adapter.py.)
PEFT_METHODS = tuple(m for m in _PEFT if m != "llama-adapter-v2") + ("lisa",)
LLAMA_ONLY = ("llama-adapter",)
OUTER_TARGETS = "all-linear,head,embed"


def peft_cells():
    for method, model in itertools.product(PEFT_METHODS, PEFT_FAMILIES):
        if model == "pythia-160m" and method in VIRTUAL_TOKEN_METHODS + LLAMA_ONLY:
            # the CPU trace cannot run the virtual-token methods on this fp16 checkpoint under bf16 autocast
            # (docs/accuracy.md); PEFT's adaption_prompt has no GPT-NeoX attention
            continue
        yield model, dict(method=method, batch_size=1, seq_len=256)
    for method in PEFT_METHODS:
        if method != "prefix":     # PEFT refuses prefix tuning with checkpointing (setup.py says why)
            yield "smollm2-135m", dict(method=method, batch_size=2, seq_len=256, grad_ckpt=True)
    # On a quantized base (QDoRA and every other method PEFT trains on a bitsandbytes base: options.py).
    for method, quant in (("dora", "nf4-dq"), ("ia3", "nf4"), ("adalora", "int8"), ("lora-fa", "nf4-dq"),
                          ("vera", "nf4-dq"), ("oft", "nf4"), ("boft", "nf4-dq"), ("fourierft", "int8"),
                          ("loha", "int8"), ("lokr", "int8"), ("prefix", "nf4-dq"), ("prompt", "nf4"),
                          ("ptuning", "int8"), ("ln-tuning", "nf4-dq")):
        yield "smollm2-135m", dict(method=method, batch_size=1, seq_len=256, quant=quant)
    for method in ("dora", "adalora", "vera", "lora-fa"):
        yield "smollm2-135m", dict(method=method, batch_size=1, seq_len=256, lora_dropout=0.05)
    # Pure 16-bit weights (no autocast) and GPT-2's Conv1D modules.
    for method in PEFT_METHODS:
        if method not in LINEAR_ONLY_METHODS + LLAMA_ONLY:     # PEFT cannot put these on GPT-2's Conv1D (refused)
            yield "gpt2", dict(method=method, batch_size=1, seq_len=256, precision="bf16")


# The memory-saving optimizers that run on fake tensors (APOLLO's and AdaLomo's steps read tensor values in Python;
# bitsandbytes' are accounted from their layout): full fine-tuning of three families, each optimizer. (Adam-mini
# cannot split Gemma 3's q_proj into heads of hidden^2 / heads elements; memfit says so, as the package fails.)
OPTIMIZER_FAMILIES = ["llama-3.2-1b", "qwen2.5-0.5b", "smollm2-135m"]
TRACED_OPTIMIZERS = ["galore", "muon", "adam-mini", "lion", "came", "lomo"]


def optimizer_cells(quick: bool):
    from memfit.trace.optimizers import PACKAGES, _MODULES
    import importlib.util

    lengths = (256,) if quick else (256, 2048)
    for model, opt, length in itertools.product(OPTIMIZER_FAMILIES, TRACED_OPTIMIZERS, lengths):
        if opt in PACKAGES and importlib.util.find_spec(_MODULES[PACKAGES[opt]]) is None:
            continue                       # the optimizer's package is not installed here
        yield model, dict(method="full", optimizer=opt, batch_size=1, seq_len=length)


def matrix(quick: bool, vlm: bool = False, only_optimizers: bool = False):
    if only_optimizers:
        yield from optimizer_cells(quick)
        return
    if vlm:
        yield from VLM_CELLS
        return
    if not quick:                          # the quick run (CI) leaves them to --optimizers
        yield from optimizer_cells(quick)
    if quick:
        for model, method in itertools.product(FAMILIES, ("full", "lora", "qlora")):
            yield model, dict(method=method, batch_size=1, seq_len=256)
        for model in FAMILIES:   # LoRA on the embedding and lm_head too (physics/lora_outer.py)
            yield model, dict(method="lora", batch_size=1, seq_len=256, lora_targets=OUTER_TARGETS)
        yield from peft_cells()
        return
    cells = []
    for method, batch, length, ckpt, attn, model in itertools.product(
            ("full", "lora", "qlora"), (1, 4), (256, 2048, 8192), (False, True), ("sdpa", "eager"), FAMILIES):
        if length == 8192 and (batch > 1 or attn == "eager"):
            continue   # skipped for time here: (b4, 8192) and eager at 8192 (s^2 scores) take minutes each
        cells.append((model, dict(method=method, batch_size=batch, seq_len=length, grad_ckpt=ckpt, attn=attn)))
    # A fixed shuffle: when the time budget cuts the run short, what was traced is a sample of every
    # dimension (family, method, batch, length, checkpointing, attention), not the first rows of one.
    for model, ckpt in itertools.product(FAMILIES, (False, True)):
        cells.append((model, dict(method="lora", batch_size=1, seq_len=2048, grad_ckpt=ckpt,
                                  lora_targets=OUTER_TARGETS)))
    random.Random(0).shuffle(cells)
    yield from peft_cells()
    yield from cells


# Preference trainers traced through TRL's own loss (src/memfit/trace/trainers.py): the small families.
TRAINER_FAMILIES = ["smollm2-135m", "qwen2.5-0.5b", "gpt2", "pythia-160m", "qwen3-0.6b", "llama-3.2-1b"]


def trainer_matrix():
    """Trainer x method x reference x checkpointing x shape, on the small families (a fixed shuffle)."""
    cells = []
    for trainer, method, ref, ckpt, (batch, length, prompt), model in itertools.product(
            ("dpo", "ipo", "kto"), ("lora", "full", "qlora"), ("auto", "precomputed", "copy"), (True, False),
            ((2, 256, 128), (2, 512, 64)), TRAINER_FAMILIES):
        if method == "qlora" and ref == "copy":
            continue   # TRL loads a quantized copy; the trace builds 16-bit copies only
        cells.append((model, dict(recipe="trl", trainer=trainer, method=method, ref_model=ref, grad_ckpt=ckpt,
                                  batch_size=batch, seq_len=length, prompt_len=prompt)))
    random.Random(0).shuffle(cells)
    yield from cells


# ORPO, CPO/SimPO, GRPO and GKD through TRL's own losses (trace/rl_trainers.py); GKD distils from the next size up
# of the same family (TRL refuses teachers of another vocabulary, gkd_trainer.py:178-187).
RL_TEACHERS = {"smollm2-135m": "smollm2-360m", "qwen2.5-0.5b": "qwen2.5-1.5b", "gpt2": "gpt2-medium",
               "llama-3.2-1b": "llama-3.2-3b", "qwen3-0.6b": "qwen3-1.7b"}


def rl_trainer_cells():
    cells = []
    combos = list(itertools.product(("smollm2-135m",), ("lora", "full"), (True, False)))
    combos += [("qwen2.5-0.5b", "lora", True), ("qwen2.5-0.5b", "full", False)]    # its 152k vocabulary: slower
    for model, method, ckpt in combos:
        for trainer, length, prompt in (("orpo", 256, 128), ("simpo", 512, 64), ("cpo", 256, 128)):
            cells.append((model, dict(recipe="trl", trainer=trainer, method=method, grad_ckpt=ckpt, batch_size=2,
                                      seq_len=length, prompt_len=prompt)))
        # GRPO: beta 0 (no reference, TRL's default) and beta > 0 (the adapter switched off, or a reference copy)
        for ref in ("none", "adapter-off" if method == "lora" else "copy"):
            cells.append((model, dict(recipe="trl", trainer="grpo", method=method, ref_model=ref, grad_ckpt=ckpt,
                                      batch_size=2, prompt_len=128, completion_len=128, num_generations=2)))
        cells.append((model, dict(recipe="trl", trainer="gkd", teacher=RL_TEACHERS[model], method=method,
                                  grad_ckpt=ckpt, batch_size=2, prompt_len=128, completion_len=128)))
    # Other families (GPT-2's fp32 checkpoint, a tied 128k vocabulary), longer rows, a 4-bit base for GRPO
    for model in ("gpt2", "llama-3.2-1b", "qwen3-0.6b"):
        cells.append((model, dict(recipe="trl", trainer="orpo", method="lora", grad_ckpt=True, batch_size=1,
                                  seq_len=1024, prompt_len=256)))
        cells.append((model, dict(recipe="trl", trainer="grpo", method="full", ref_model="copy", grad_ckpt=True,
                                  batch_size=2, grad_accum=2, prompt_len=256, completion_len=256,
                                  num_generations=4)))
        cells.append((model, dict(recipe="trl", trainer="gkd", teacher=RL_TEACHERS[model], method="lora",
                                  grad_ckpt=True, batch_size=1, prompt_len=256, completion_len=256)))
    cells.append(("smollm2-135m", dict(recipe="trl", trainer="grpo", method="qlora", ref_model="adapter-off",
                                       grad_ckpt=True, batch_size=4, prompt_len=128, completion_len=384,
                                       num_generations=4)))
    random.Random(0).shuffle(cells)
    return cells


def run(quick: bool, max_minutes: float, trainers: bool = False, vlm: bool = False, cells=None,
        only_optimizers: bool = False) -> dict:
    rows, start = [], time.perf_counter()
    if cells is None:
        cells = trainer_matrix() if trainers else matrix(quick, vlm, only_optimizers)
    for model, kw in cells:
        if time.perf_counter() - start > max_minutes * 60:
            rows.append({"model": model, "setup": kw, "skipped": "time budget reached"})
            continue
        spec = load_model(model)
        setup = TrainingSetup.from_recipe(**{"recipe": "hf", **kw})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                measured = trace(spec, setup)
        except Exception as exc:  # report, do not hide
            rows.append({"model": model, "setup": kw, "error": str(exc)[:300]})
            continue
        est = estimate(spec, setup)
        groups = {r["component"]: r for r in compare(est, measured)}
        rows.append({"model": model, "setup": kw, "trace_phase": measured.peak_phase, "estimate_phase": est.peak_phase,
                     "peak_allocated_error": est.peak_allocated_bytes / measured.peak_allocated_bytes - 1,
                     "trace_bytes": measured.peak_allocated_bytes, "estimate_bytes": est.peak_allocated_bytes,
                     "groups": {k: {"estimate": v["estimate_bytes"], "trace": v["trace_bytes"]}
                                for k, v in groups.items()}})
        print(f"{model:18} {json.dumps(kw):80} err {rows[-1]['peak_allocated_error']:+.2%}", flush=True)
    return {"rows": rows, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    done = [r for r in rows if "peak_allocated_error" in r]
    errors = [abs(r["peak_allocated_error"]) for r in done]
    out = {"setups": len(rows), "traced": len(done), "errors": sum("error" in r for r in rows),
           "skipped": sum("skipped" in r for r in rows)}
    if errors:
        out["peak_allocated"] = {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
                                 "within_2pct": sum(e <= 0.02 for e in errors) / len(errors),
                                 "within_5pct": sum(e <= 0.05 for e in errors) / len(errors)}
    for method in ("full", "lora", "qlora") + PEFT_METHODS:
        errs = [abs(r["peak_allocated_error"]) for r in done if r["setup"]["method"] == method]
        if errs:
            out[method] = {"n": len(errs), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs)}
    per_trainer = {}
    for r in done:
        if "trainer" in r["setup"]:
            per_trainer.setdefault(r["setup"]["trainer"], []).append(abs(r["peak_allocated_error"]))
    if per_trainer:
        out["per_trainer"] = {t: {"n": len(e), "median_abs_error": statistics.median(e), "worst_abs_error": max(e)}
                              for t, e in per_trainer.items()}
    per_optimizer = {}
    for r in done:
        if "optimizer" in r["setup"]:
            per_optimizer.setdefault(r["setup"]["optimizer"], []).append(abs(r["peak_allocated_error"]))
    out["per_optimizer"] = {o: {"n": len(e), "median_abs_error": statistics.median(e), "worst_abs_error": max(e)}
                            for o, e in per_optimizer.items()}
    per_model = {}
    for r in done:
        per_model.setdefault(r["model"], []).append(abs(r["peak_allocated_error"]))
    out["per_family"] = {m: {"n": len(e), "median_abs_error": statistics.median(e), "worst_abs_error": max(e)}
                         for m, e in per_model.items()}
    return out


def markdown(report: dict, quick: bool, vlm: bool = False) -> str:
    s = report["summary"]
    pa = s.get("peak_allocated", {})
    if "per_trainer" in s:
        flag, title = " --trainers", "## Preference and RL trainers against the trace (TRL's own loss)"
    else:
        flag = " --vlm" if vlm else " --quick" if quick else ""
        title = "## Against the trace" + (": vision-language models" if vlm else "")
    lines = [title, "",
             f"`benchmarks/accuracy_vs_trace.py{flag}`: {s['traced']} setups traced "
             f"({s['errors']} failed to trace, {s['skipped']} skipped for time).", ""]
    if pa:
        lines += [f"peak_allocated_bytes: median error {pa['median_abs_error']:.2%}, "
                  f"worst {pa['worst_abs_error']:.2%}; "
                  f"{pa['within_2pct']:.1%} of setups within 2%, {pa['within_5pct']:.1%} within 5%.", "",
                  "| family | n | median | worst |", "|---|---|---|---|"]
        for model, st in s["per_family"].items():
            lines.append(f"| {model} | {st['n']} | {st['median_abs_error']:.2%} | {st['worst_abs_error']:.2%} |")
        if "per_trainer" in s:
            lines += ["", "| trainer | n | median | worst |", "|---|---|---|---|"]
            for trainer, st in s["per_trainer"].items():
                lines.append(f"| {trainer} | {st['n']} | {st['median_abs_error']:.2%} | {st['worst_abs_error']:.2%} |")
        methods = [m for m in ("full", "lora", "qlora") + PEFT_METHODS if m in s]
        if methods:
            lines += ["", "| method | n | median | worst |", "|---|---|---|---|"]
            for m in methods:
                lines.append(f"| {m} | {s[m]['n']} | {s[m]['median_abs_error']:.2%} | {s[m]['worst_abs_error']:.2%} |")
    if s.get("per_optimizer"):
        lines += ["", "| optimizer (full fine-tuning) | n | median | worst |", "|---|---|---|---|"]
        for opt, st in s["per_optimizer"].items():
            lines.append(f"| {opt} | {st['n']} | {st['median_abs_error']:.2%} | {st['worst_abs_error']:.2%} |")
    worst = sorted((r for r in report["rows"] if "peak_allocated_error" in r),
                   key=lambda r: -abs(r["peak_allocated_error"]))[:10]
    lines += ["", "Worst setups (which component is off):", "",
              "| model | setup | error | trace phase | component (estimate - trace) |", "|---|---|---|---|---|"]
    for r in worst:
        parts = {k: v for k, v in r["groups"].items() if k not in COUNTER_ROWS}
        off = max(parts.items(), key=lambda kv: abs(kv[1]["estimate"] - kv[1]["trace"]))
        delta = (off[1]["estimate"] - off[1]["trace"]) / 2**20
        setup = ", ".join(f"{k}={v}" for k, v in r["setup"].items())
        lines.append(f"| {r['model']} | {setup} | {r['peak_allocated_error']:+.2%} | {r['trace_phase']} | "
                     f"{off[0]}: {delta:+.1f} MiB |")
    failed = [r for r in report["rows"] if "error" in r]
    if failed:
        lines += ["", "Setups that could not be traced:", ""]
        lines += [f"- {r['model']} {r['setup']}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trainers", action="store_true",
                        help="the preference and RL trainers (dpo, ipo, kto, orpo, cpo, simpo, grpo, gkd) through TRL's own "
                             "loss, not the SFT matrix")
    parser.add_argument("--vlm", action="store_true", help="the vision-language models' matrix only")
    parser.add_argument("--optimizers", action="store_true",
                        help="only the memory-saving optimizers' rows (results in accuracy_vs_trace_optimizers.*)")
    parser.add_argument("--max-minutes", type=float, default=90.0)
    parser.add_argument("--peft-only", action="store_true",
                        help="trace only the PEFT-method cells and merge them into the saved results")
    parser.add_argument("--rl-only", action="store_true",
                        help="with --trainers: trace only the ORPO/CPO/SimPO/GRPO/GKD cells and merge them into the "
                             "saved trainer results")
    parser.add_argument("--models", default=None,
                        help="with --vlm: trace only these models' cells (comma-separated) and merge them into the "
                             "saved results")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the markdown from the saved JSON results without tracing again")
    parser.add_argument("--fail-over", type=float, default=None,
                        help="exit 1 if the median peak error exceeds this fraction or a setup fails to trace")
    args = parser.parse_args()
    name = ("accuracy_vs_trace_trainers" if args.trainers else "accuracy_vs_trace_vlm" if args.vlm else
            "accuracy_vs_trace_optimizers" if args.optimizers else
            "accuracy_vs_trace_quick" if args.quick else "accuracy_vs_trace")
    if args.render_only:
        report = json.loads((RESULTS / f"{name}.json").read_text())
    elif args.rl_only:
        fresh = run(False, args.max_minutes, cells=rl_trainer_cells())["rows"]
        new = {r["setup"]["trainer"] for r in fresh}
        kept = [r for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"]
                if r["setup"].get("trainer") not in new]
        report = {"rows": kept + fresh, "summary": summarize(kept + fresh)}
    elif args.peft_only:
        # Trace the PEFT-method cells only and replace those rows in the saved results (the other cells are
        # unchanged by the adapter physics).
        fresh = run(args.quick, args.max_minutes, cells=list(peft_cells()))["rows"]
        kept = [r for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"]
                if r["setup"]["method"] not in PEFT_METHODS]
        report = {"rows": kept + fresh, "summary": summarize(kept + fresh)}
    elif args.models:
        only = set(args.models.split(","))
        fresh = run(args.quick, args.max_minutes, cells=[c for c in matrix(args.quick, args.vlm) if c[0] in only])["rows"]
        kept = [r for r in json.loads((RESULTS / f"{name}.json").read_text())["rows"] if r["model"] not in only]
        report = {"rows": kept + fresh, "summary": summarize(kept + fresh)}
    else:
        report = run(args.quick, args.max_minutes, trainers=args.trainers, vlm=args.vlm,
                     only_optimizers=args.optimizers)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report, args.quick, args.vlm)
    if args.optimizers:
        text = text.replace("## Against the trace", "## Against the trace: memory-saving optimizers", 1) \
            .replace("accuracy_vs_trace.py", "accuracy_vs_trace.py --optimizers", 1)
    (RESULTS / f"{name}.md").write_text(text)
    print(text)
    if args.fail_over is not None:
        s = report["summary"]
        if s["errors"] or s.get("peak_allocated", {}).get("median_abs_error", 1.0) > args.fail_over:
            raise SystemExit(f"accuracy check failed: {s['errors']} setups untraceable, median error "
                             f"{s.get('peak_allocated', {}).get('median_abs_error')}")


if __name__ == "__main__":
    main()
    import accuracy_doc  # noqa: E402  (same folder)

    accuracy_doc.main()
