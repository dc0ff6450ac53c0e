"""memfit's estimate against published peak-memory measurements of real fine-tuning runs.

    python benchmarks/accuracy_vs_measured.py [--csv PATH]     # default: ../shared/calibration/measured.csv

Each row is mapped to a memfit setup (model facts as the row's framework built it, method, recipe, precision,
optimizer, checkpointing, attention) and compared on the counter the row was published in (allocated,
reserved, or nvml = device). Rows memfit cannot express are listed with the reason. Writes
benchmarks/results/accuracy_vs_measured.json and the measured-runs section of docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from memfit import TrainingSetup, estimate  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.options import LINEAR_ADAPTER_METHODS, VIRTUAL_TOKEN_METHODS  # noqa: E402
from memfit.physics.overhead import overheads  # noqa: E402
from memfit.setup import parse_targets  # noqa: E402
from memfit.spec import ModelSpec  # noqa: E402

DEFAULT_CSV = ROOT.parent / "shared" / "calibration" / "measured.csv"
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_vs_measured.json"
# "active" (torch.cuda.memory_stats active_bytes.all.peak) counts blocks in use, as allocated does.
COUNTER_ATTR = {"allocated": "peak_allocated_bytes", "active": "peak_allocated_bytes",
                "reserved": "peak_reserved_bytes", "nvml": "device_bytes"}
RECIPE_OF = {"fsdp_qlora": "fsdp-qlora", "litgpt": "litgpt-0.4", "peft-custom": "hf", "hf": "hf", "plain-torch": "pytorch", "torchtune": "torchtune",
             "qwen-hf": "hf"}  # Qwen finetune.py is the HF Trainer (with DeepSpeed)
# Every litgpt row (groups LG, LGC, LGT) was published before LitGPT 0.5.5 moved off bitsandbytes 0.42.0 (the
# LGC table's QLoRA rows: Lightning-AI/litgpt@e5493986, July 2024; 0.5.5: @d2ed13c3, Dec 2024): recipe litgpt-0.4.
# Answer.AI fsdp_qlora (AnswerDotAI/fsdp_qlora train.py; rows from benchmarks_03_2024.md): a transformers model with
# PEFT LoRA or bitsandbytes QLoRA in its own loop, wrapped in FSDP1 even for "ddp" (NO_SHARD), bf16, dummy data of
# fixed length; the published template command sets --reentrant_checkpointing True. train.py@1a9fddfb: lora_dropout
# 0.1, lora_target_modules "all" = k,q,v,up,down,gate (no o_proj), and the loop holds `output` (the logits, fp32 from
# the model's own logits.float() in transformers of early 2024) through loss.backward(): recipe fsdp-qlora.
REENTRANT_FRAMEWORKS = ("fsdp_qlora",)
FSDP_QLORA_TARGETS = ("q", "k", "v", "gate", "up", "down")
# The stack each row's group ran, for the per-stack report (groups AX and US are published as HF Trainer rows).
STACK_OF_GROUP = {"AX": "axolotl", "US": "unsloth", "QL": "hf", "PEFT": "hf", "LIG": "hf", "MMQA": "hf",
                  "RB": "pytorch", "TT": "torchtune", "LG": "litgpt", "LGC": "litgpt", "LGT": "litgpt",
                  "QW": "hf", "AAI": "fsdp_qlora", "LR": "llama-recipes"}

# The RB rows are rasbt/LLMs-from-scratch ch05/10_llm-training-speed (00_orig.py, 01_opt_single_gpu.py,
# 02_opt_multi_gpu_ddp.py; README "Single GPU speed comparisons" numbers each step). GPT_CONFIG_124M sets
# drop_rate 0.1 (01_opt_single_gpu.py, end of file): dropout after the embedding, on both residual branches and
# inside attention. Until step 6 the model uses the book's own GELU, 0.5*x*(1+tanh(c*(x+0.044715*x**3))), which
# saves what transformers' gelu_new saves; from step 6 on nn.GELU(approximate="tanh"), one saved input. From step 3
# AdamW is fused=True. Step per row from the notes (RB-08: 02_opt_multi_gpu_ddp.py has every step).
RASBT_STEP = {"RB-01": 0, "RB-02": 5, "RB-03": 6, "RB-04": 7, "RB-05": 8, "RB-06": 9, "RB-07": 10, "RB-08": 10}
RASBT_DROPOUT = 0.1


# Gradient accumulation of the litgpt rows, from the scripts and configs that produced them (the CSV has no column
# for it). With FSDP it decides whether FSDP1's no_sync() keeps unsharded gradients (physics/sharding.py); on one
# device, full fine-tuning keeps the previous micro-batch's gradients through the next forward (litgpt@26857050
# finetune/full.py:280-291 steps and zero_grad()s only when not is_accumulating).
# LG-28..38: lit-gpt@0cc02afa finetune/lora.py:40-42, batch_size 128, gradient_accumulation_iters =
# batch_size // micro_batch_size. LGC: litgpt config_hub/finetune/<model>/full.yaml (litgpt@26857050),
# global_batch_size // (devices * micro_batch_size) (litgpt/args.py:56-64); tiny-llama/full.yaml: global 32,
# micro 4, devices 1.
LITGPT_GRAD_ACCUM = {"LGC-03": 16 // (4 * 1), "LGC-12": 64 // (4 * 4), "LGC-15": 64 // (4 * 4),
                     "LGC-27": 8 // (2 * 4), "LGC-33": 8 // (2 * 1), "LGC-36": 32 // (1 * 4)}


def litgpt_grad_accum(row: dict) -> int:
    if row["framework"] != "litgpt":
        return 1
    if row["group"] == "LG" and row["shard"] == "fsdp":
        return 128 // int(row["micro_batch"])
    return LITGPT_GRAD_ACCUM.get(row["id"], 1)


def row_compiled(row: dict) -> bool:
    """The CSV has no column for torch.compile: the notes say it ("compile on", "torch.compile", "(compiled)"),
    and "no compile" says it was off (TT-10)."""
    notes = row["notes"]
    return ("compile" in notes or "compiled" in notes) and "no compile" not in notes


# measured.csv `variant` of method=other rows -> memfit's method (options.PEFT_METHODS).
PEFT_VARIANTS = {"dora": "dora", "lora-fa": "lora-fa", "ia3": "ia3", "prompt-tuning": "prompt",
                 "prefix-tuning": "prefix", "loha": "loha", "lokr": "lokr", "vera": "vera", "adalora": "adalora",
                 "layernorm-tuning": "ln-tuning", "p-tuning": "ptuning", "oft": "oft", "boft": "boft",
                 "osf": "osf", "tinylora": "tinylora",
                 # LitGPT's finetune/adapter.py and adapter_v2.py (physics/litgpt_adapter.py)
                 "llama-adapter": "llama-adapter", "llama-adapter-v2": "llama-adapter-v2"}
# PEFT MetaMathQA experiments whose training_params.json sets autocast_adapter_dtype false (bf16 adapters):
# method_comparison/MetaMathQA/experiments/osf/llama-3.2-3B-rank128/training_params.json.
MMQA_16BIT_ADAPTERS = ("osf",)


class Unexpressible(Exception):
    pass


def row_spec(row: dict) -> ModelSpec:
    """The architecture as the row's framework built it (the CSV's facts, e.g. LitGPT's untied heads)."""
    mt = row["model_type"]
    if mt == "qwen":
        # Qwen-1 (remote code, Qwen/Qwen-7B modeling_qwen.py): RMSNorm, rotary, fused c_attn with bias, c_proj
        # without, SwiGLU MLP w1/w2/c_proj with ffn width config.intermediate_size // 2 (the CSV's width), untied
        # head: Qwen2's layout tensor for tensor (the parameter counts of all four sizes match the CSV exactly).
        mt = "qwen2"
    config = {"model_type": mt, "vocab_size": int(row["vocab_size"]), "tie_word_embeddings": row["tied"] == "true",
              "torch_dtype": "bfloat16"}
    h, layers, heads = int(row["hidden_size"]), int(row["num_layers"]), int(row["num_heads"])
    if mt == "gpt2":
        config.update(n_embd=h, n_layer=layers, n_head=heads, n_inner=int(row["intermediate_size"]),
                      resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)
        if row["id"] in RASBT_STEP:
            native = RASBT_STEP[row["id"]] >= 6
            config.update(resid_pdrop=RASBT_DROPOUT, attn_pdrop=RASBT_DROPOUT, embd_pdrop=RASBT_DROPOUT,
                          activation_function="gelu_pytorch_tanh" if native else "gelu_new")
    elif mt == "bloom":
        # bloomz-7b1 config.json: hidden_dropout and attention_dropout 0.0 (catalog bloom-7b1.json note).
        config.update(hidden_size=h, n_layer=layers, n_head=heads, hidden_dropout=0.0, attention_dropout=0.0)
    elif mt == "falcon":
        config.update(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                      multi_query=int(row["num_kv_heads"]) == 1, parallel_attn=True, bias=False)
    else:
        config.update(hidden_size=h, intermediate_size=int(row["intermediate_size"]), num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=int(row["num_kv_heads"]),
                      head_dim=int(row["head_dim"]))
        if mt == "gpt_neox":
            config.update(rotary_pct=0.25, use_parallel_residual=True)
        if mt == "phi":
            config.update(partial_rotary_factor=0.4, resid_pdrop=0.0)
    return ModelSpec.from_hf_config(config, name=row["model_key"], source=f"measured.csv:{row['id']}")


def optimizer_from_notes(row: dict) -> str:
    """memfit's name for the optimizer an `other` row's notes name (GaLore, APOLLO, Muon, Lion, CAME, LOMO, ...;
    physics/optimizers.py), or Unexpressible."""
    import re

    from memfit.options import OPTIMIZER_ALIASES
    from memfit.physics.optimizers import OPTIMIZER_FACTS

    for word in re.findall(r"[A-Za-z0-9_-]+", row["notes"]):
        if word == "came":
            continue                     # the English verb; the optimizer is written CAME
        name = OPTIMIZER_ALIASES.get(word.lower(), word.lower())
        if name in OPTIMIZER_FACTS:
            return name
    raise Unexpressible("optimizer 'other': its notes name none of the optimizers memfit models "
                        f"({', '.join(OPTIMIZER_FACTS)})")


def row_setup(row: dict) -> tuple[TrainingSetup, list[str]]:
    """The memfit setup a row describes, and the approximations taken (empty when exact)."""
    notes = []
    method = row["method"]
    if method == "other":
        method = PEFT_VARIANTS.get(row["variant"])
        if method is None:
            raise Unexpressible(f"PEFT method {row['variant']} is not modelled")
        if row["optimizer"] == "other" and method == "lora-fa":
            row = dict(row, optimizer="adamw")   # the LoRA-FA optimizer is AdamW over B with A frozen
    gpus = int(row["n_gpus"])
    shard = row["shard"] if row["shard"] != "none" else ("ddp" if gpus > 1 else "none")
    if shard not in ("none", "ddp", "fsdp", "zero2", "zero3"):
        raise Unexpressible(f"sharding {row['shard']} has no memfit equivalent")
    optimizer = row["optimizer"] if row["optimizer"] != "other" else optimizer_from_notes(row)
    if row["quant"] not in ("none", "nf4", "nf4-dq", "int8", "gptq-int4", "awq-int4"):
        raise Unexpressible(f"quantization {row['quant']} is not modelled")
    if row["quant"] != "none" and row["method"] == "full":
        raise Unexpressible(f"full fine-tuning of a {row['quant']} base has no memfit equivalent")
    if row["framework"] not in RECIPE_OF:
        raise Unexpressible(f"framework {row['framework']} has no memfit recipe")
    recipe = RECIPE_OF[row["framework"]]
    if row["group"] == "LG":
        recipe = "lit-gpt"   # the 2023 resource tables (lit-gpt@8641822): the longest sample runs first
    # LoRA on a quantized frozen base (LLM.int8, GPTQ, AWQ) is memfit's qlora with that --quant.
    method = "qlora" if row["quant"] != "none" and method == "lora" else method
    kw = dict(method=method, batch_size=int(row["micro_batch"]), seq_len=int(row["seq_len"]),
              precision=row["precision"], optimizer=optimizer, grad_ckpt=row["grad_ckpt"] == "1",
              attn=row["attn"], chunked_ce=row["chunked_ce"] == "1",
              optimizer_in_backward=row["optimizer_in_backward"] == "1", gpus=gpus, shard=shard,
              grad_accum=litgpt_grad_accum(row))
    if row_compiled(row):
        kw["compile"] = True
    if row["framework"] in REENTRANT_FRAMEWORKS and row["grad_ckpt"] == "1":
        kw["ckpt_reentrant"] = True
    if method in LINEAR_ADAPTER_METHODS and row["lora_targets"]:
        targets = row["lora_targets"]
        if method not in ("lora", "qlora") and "head" in targets:
            notes.append(f"{method} on lm_head not modelled (LoRA's is: physics/lora_outer.py)")
            targets = ",".join(t for t in targets.split(",") if t != "head")
        kw["lora_targets"] = parse_targets(targets)
        if row["lora_rank"] and method == "oft":
            # OFTConfig(r=32, oft_block_size=0): r blocks over the adapted modules' input width (q, v: hidden)
            # (peft method_comparison/MetaMathQA/experiments/oft/llama-3.2-3B-rank32/adapter_config.json).
            kw["oft_block_size"] = int(row["hidden_size"]) // int(row["lora_rank"])
        elif row["lora_rank"]:
            kw["lora_rank"] = int(row["lora_rank"])
        if method in ("lora", "qlora"):
            kw["lora_dropout"] = 0.05 if recipe.startswith(("litgpt", "lit-gpt")) else 0.0
        if row["framework"] == "fsdp_qlora":
            kw["lora_targets"], kw["lora_dropout"] = FSDP_QLORA_TARGETS, 0.1
    if row["quant"] != "none":
        kw["quant"] = row["quant"]
    if row["group"] == "MMQA" and method in MMQA_16BIT_ADAPTERS:
        kw["adapter_fp32"] = False
    if method == "osf" and row["group"] == "MMQA":
        # osf/llama-3.2-3B-rank128/adapter_config.json: rank_pattern effective_rank 2944 (q, o, gate, up, down) and
        # 896 (k, v): min(out, in) - 128, a trainable rank of 128 everywhere (the row's lora_rank).
        notes.append("published as max reserved over the whole run (PEFT's per-module SVD at init and eval "
                     "generation included); memfit prices the training step")
    if method in VIRTUAL_TOKEN_METHODS and row["group"] == "MMQA":
        # peft method_comparison/MetaMathQA/experiments/{prompt_tuning,prefixtuning}/llama-3.2-3B-lr_0.001/
        # adapter_config.json: num_virtual_tokens 200.
        kw["num_virtual_tokens"] = 200
    if row["framework"] == "plain-torch":
        step = RASBT_STEP.get(row["id"], 10)
        if step >= 3:
            kw["optimizer"] = "adamw-fused"
        notes.append("LLMs-from-scratch GPT-2 walked as HF GPT-2 with its dropout and GELU"
                     + ("; its own LayerNorm (saves more) is priced as nn.LayerNorm" if step < 6 else ""))
    return TrainingSetup.from_recipe(recipe, **kw), notes


def evaluate(rows: list[dict]) -> dict:
    """Every row's estimate on its counter. The printed range is rebuilt here from the estimate's own intervals
    (physics/overhead.py) and an error band fitted on the measured rows, so that the band can be refitted without
    a source (leave-one-source-out) and the coverage of each fit scored honestly."""
    results, skipped = [], []
    for row in rows:
        try:
            setup, notes = row_setup(row)
            est = estimate(row_spec(row), setup)
        except (Unexpressible, MemfitError) as exc:
            skipped.append({"id": row["id"], "reason": str(exc)})
            continue
        measured = int(row["peak_bytes"])
        predicted = getattr(est, COUNTER_ATTR.get(row["counter"], "device_bytes"))
        own = overheads(est.peak_allocated_bytes)
        entry = {"id": row["id"], "group": row["group"], "stack": STACK_OF_GROUP.get(row["group"], row["framework"]),
                 "model": row["model_key"],
                 "method": "peft" if row["method"] == "other" else setup.method, "counter": row["counter"],
                 "bound": row["bound"], "measured": measured, "predicted": predicted, "device": est.device_bytes,
                 "own_low": min(own.range_low, est.device_bytes), "own_high": max(own.range_high, est.device_bytes),
                 "peak_phase": est.peak_phase, "notes": notes, "confidence": row["confidence"]}
        if row["bound"] == "lower":      # ran out of memory: the prediction must exceed the card
            entry["ok"] = predicted > measured
        elif row["bound"] == "upper":    # "fits in": the prediction must be within the stated memory
            entry["ok"] = predicted <= measured
        else:
            entry["error"] = (predicted - measured) / measured
        results.append(entry)
    measured_rows = [r for r in results if "error" in r]
    bands = fit_bands(measured_rows)
    for r in measured_rows:
        r["low"], r["high"] = printed_range(r, bands.get(r["method"]))
        r["in_range"] = r["low"] <= r["measured"] <= r["high"]
    report = {"results": results, "skipped": skipped, "bands": bands}
    report["loso"] = leave_one_source_out(measured_rows)
    report["summary"] = summarize(results, len(rows), report["loso"])
    return report


def _band(errors: list[float]) -> dict:
    errors = sorted(errors)
    pick = lambda q: errors[min(len(errors) - 1, max(0, int(round(q * (len(errors) - 1)))))]  # noqa: E731
    return {"n": len(errors), "low": round(pick(0.025), 4), "high": round(pick(0.975), 4),
            "median": round(statistics.median(errors), 4)}


def fit_bands(measured: list[dict]) -> dict:
    """Per method, the 2.5th and 97.5th percentile of the signed error (predicted / measured - 1) over `measured`:
    the band an estimate states. Methods with fewer than 5 rows take the band of all rows."""
    overall = _band([r["error"] for r in measured])
    out = {"overall": overall}
    for method in ("full", "lora", "qlora", "peft"):
        errors = [r["error"] for r in measured if r["method"] == method]
        out[method] = _band(errors) if len(errors) >= 5 else dict(overall, note="fewer than 5 rows: overall band")
    return out


def printed_range(r: dict, band: dict | None) -> tuple[int, int]:
    """The range memfit prints for row `r` with error band `band` (estimator.estimate's rule), on the row's
    counter: the range is for the device counter, shifted by (counter - device)."""
    low, high = r["own_low"], r["own_high"]
    if band:
        low = min(low, int(r["device"] / (1 + band["high"])))
        high = max(high, int(r["device"] / (1 + band["low"])))
    shift = r["predicted"] - r["device"]
    return low + shift, high + shift


def leave_one_source_out(measured: list[dict]) -> dict:
    """For each source group: fit the bands on every other group, score this one (coverage of the range it would
    print, median |error|, share under-predicted). The point estimate's one measured constant is the share of the
    compile saving (physics/compile.py, from sources TT and RB); elsewhere its errors are the same in and out of
    sample, and only the range's coverage can differ."""
    per_group, covered = {}, []
    for group in sorted({r["group"] for r in measured}):
        inside = [r for r in measured if r["group"] == group]
        bands = fit_bands([r for r in measured if r["group"] != group])
        hits = []
        for r in inside:
            low, high = printed_range(r, bands.get(r["method"]))
            hits.append(low <= r["measured"] <= high)
        covered += hits
        per_group[group] = dict(_stats([r["error"] for r in inside]), coverage=sum(hits) / len(hits))
    medians = [g["median_abs_error"] for g in per_group.values()]
    return {"groups": per_group, "coverage": sum(covered) / len(covered) if covered else None,
            "median_abs_error": statistics.median(abs(r["error"]) for r in measured) if measured else None,
            "median_of_group_medians": statistics.median(medians) if medians else None}


def _stats(errors: list[float]) -> dict:
    if not errors:
        return {}
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, int(round(0.9 * (len(absolute) - 1))))]
    return {"n": len(errors), "median_abs_error": statistics.median(absolute), "p90_abs_error": p90,
            "within_10pct": sum(a <= 0.10 for a in absolute) / len(absolute),
            "within_20pct": sum(a <= 0.20 for a in absolute) / len(absolute),
            "under_prediction_rate": sum(e < 0 for e in errors) / len(errors),
            "median_signed_error": statistics.median(errors)}


def summarize(results: list[dict], total_rows: int, loso: dict) -> dict:
    measured = [r for r in results if "error" in r]
    bounds = [r for r in results if "ok" in r]
    out = {"rows": total_rows, "expressed": len(results), "coverage": len(results) / total_rows,
           "overall": _stats([r["error"] for r in measured]),
           "range_covers_measured": (sum(r["in_range"] for r in measured) / len(measured)) if measured else None,
           "loso_range_covers_measured": loso["coverage"],
           "oom_rows_predicted_over_capacity": f"{sum(r['ok'] for r in bounds if r['bound'] == 'lower')}"
                                               f"/{sum(r['bound'] == 'lower' for r in bounds)}",
           "fits_in_rows_predicted_within": f"{sum(r['ok'] for r in bounds if r['bound'] == 'upper')}"
                                            f"/{sum(r['bound'] == 'upper' for r in bounds)}"}
    for method in ("full", "lora", "qlora", "peft"):
        out[method] = _stats([r["error"] for r in measured if r["method"] == method])
    for key in ("stack", "counter", "method"):
        out[f"by_{key}"] = {}
        for value in sorted({r[key] for r in measured}):
            group = [r for r in measured if r[key] == value]
            out[f"by_{key}"][value] = dict(_stats([r["error"] for r in group]),
                                           range_covers=sum(r["in_range"] for r in group) / len(group))
    return out


def error_bands(report: dict) -> dict:
    """The bands fitted on every measured row (what the shipped estimate prints), with where they come from."""
    return {"source": "benchmarks/accuracy_vs_measured.py over shared/calibration/measured.csv "
                      "(signed error = predicted / measured - 1; 2.5th-97.5th percentile)", **report["bands"]}


_HEAD = ("| {} | n | median abs error | p90 abs error | within 10% | within 20% | under-predicted | range covers |",
         "|---|---|---|---|---|---|---|---|")


def _row(name: str, st: dict, cover) -> str:
    return (f"| {name} | {st['n']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
            f"{st['within_10pct']:.0%} | {st['within_20pct']:.0%} | {st['under_prediction_rate']:.0%} | "
            f"{cover:.0%} |")


def markdown(report: dict) -> str:
    s = report["summary"]
    measured = [r for r in report["results"] if "error" in r]
    loso = report["loso"]
    lines = ["## Against published measurements", "",
             f"`benchmarks/accuracy_vs_measured.py` over `shared/calibration/measured.csv`: {s['rows']} rows, "
             f"{s['expressed']} expressed ({s['coverage']:.0%}), {len(measured)} of them measured points; OOM rows "
             f"predicted above the card: {s['oom_rows_predicted_over_capacity']}; \"fits in\" rows predicted within "
             f"the stated memory: {s['fits_in_rows_predicted_within']}.", "",
             _HEAD[0].format("set"), _HEAD[1]]
    lines.append(_row("overall", s["overall"], s["range_covers_measured"]))
    for key, title in (("method", "method"), ("stack", "stack"), ("counter", "counter")):
        lines += ["", f"By {title}:", "", _HEAD[0].format(title), _HEAD[1]]
        for name, st in s[f"by_{key}"].items():
            lines.append(_row(name, st, st["range_covers"]))
    lines += ["", f"The printed range covers the measured value in {s['range_covers_measured']:.0%} of rows with the "
                  f"error bands fitted on all rows (in sample), and in {loso['coverage']:.0%} when each source's "
                  "rows are scored with bands fitted on the other sources only (leave one source out). The point "
                  "estimate's one measured constant is the share of the torch.compile saving (physics/compile.py, "
                  "from sources TT and RB); elsewhere its errors are the same in and out of sample "
                  f"(median {loso['median_abs_error']:.1%}; median of the per-source medians "
                  f"{loso['median_of_group_medians']:.1%}).", "",
              "Leave one source out (bands fitted without the source):", "",
              "| source | n | median abs error | under-predicted | range covers |", "|---|---|---|---|---|"]
    for group, st in loso["groups"].items():
        lines.append(f"| {group} | {st['n']} | {st['median_abs_error']:.1%} | {st['under_prediction_rate']:.0%} | "
                     f"{st['coverage']:.0%} |")
    lines += ["", "Worst rows:", "",
              "| id | model | method | counter | measured GB | predicted GB | error | peak phase | notes |",
              "|---|---|---|---|---|---|---|---|---|"]
    worst = sorted(measured, key=lambda r: -abs(r["error"]))[:12]
    for r in worst:
        lines.append(f"| {r['id']} | {r['model']} | {r['method']} | {r['counter']} | {r['measured'] / 1e9:.2f} | "
                     f"{r['predicted'] / 1e9:.2f} | {r['error']:+.1%} | {r['peak_phase']} | {'; '.join(r['notes'])} |")
    lines += ["", "Rows not expressed:", ""]
    lines += [f"- {r['id']}: {r['reason']}" for r in report["skipped"]]
    return "\n".join(lines) + "\n"


README = ROOT / "README.md"
README_MARKS = ("<!-- accuracy-measured:start -->", "<!-- accuracy-measured:end -->")


def readme_headline(report: dict) -> str:
    """The README's sentence on published runs, from this report (between README_MARKS)."""
    s, loso = report["summary"], report["loso"]
    o = s["overall"]
    return (f"Against {s['expressed']} of {s['rows']} published runs that memfit can express "
            f"({len([r for r in report['results'] if 'error' in r])} measured peaks), the median error is "
            f"{o['median_abs_error']:.1%} (90th percentile {o['p90_abs_error']:.0%}), "
            f"{o['under_prediction_rate']:.0%} are predicted below the measured peak, and the printed range covers "
            f"{s['range_covers_measured']:.0%} of them ({loso['coverage']:.0%} when each source is left out of the "
            f"error bands).")


def write_readme_headline(report: dict) -> None:
    text = README.read_text()
    start, end = README_MARKS
    if start not in text or end not in text:
        return
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    README.write_text(f"{head}{start}\n{readme_headline(report)}\n{end}{tail}")


def main() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--no-write", action="store_true",
                        help="print the report only; leave the results, error bands, docs and README as they are")
    args = parser.parse_args()
    if not args.csv.is_file():
        raise SystemExit(f"error: {args.csv} not found (the calibration set lives in ../shared/calibration)")
    with args.csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    report = evaluate(rows)
    if args.no_write:
        print(markdown(report))
        return False
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    (ROOT / "benchmarks" / "results" / "accuracy_vs_measured.md").write_text(markdown(report))
    bands = error_bands(report)
    (ROOT / "src" / "memfit" / "data" / "error_bands.json").write_text(json.dumps(bands, indent=1) + "\n")
    write_readme_headline(report)
    print(markdown(report))
    return True


if __name__ == "__main__":
    if main():
        import accuracy_doc  # noqa: E402  (same folder)

        accuracy_doc.main()
