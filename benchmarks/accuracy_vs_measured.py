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
from memfit.setup import parse_targets  # noqa: E402
from memfit.spec import ModelSpec  # noqa: E402

DEFAULT_CSV = ROOT.parent / "shared" / "calibration" / "measured.csv"
RESULTS = ROOT / "benchmarks" / "results" / "accuracy_vs_measured.json"
COUNTER_ATTR = {"allocated": "peak_allocated_bytes", "reserved": "peak_reserved_bytes", "nvml": "device_bytes"}
RECIPE_OF = {"litgpt": "litgpt", "peft-custom": "hf", "hf": "hf", "plain-torch": "pytorch", "torchtune": "torchtune",
             "qwen-hf": "hf"}  # Qwen finetune.py is the HF Trainer (with DeepSpeed)


# Gradient accumulation of the litgpt FSDP rows, from the scripts and configs that produced them (the CSV has no
# column for it; it decides whether FSDP1's no_sync() keeps unsharded gradients, physics/sharding.py).
# LG-28..38: lit-gpt@0cc02afa finetune/lora.py:40-42, batch_size 128, gradient_accumulation_iters =
# batch_size // micro_batch_size. LGC: litgpt config_hub/finetune/<model>/full.yaml (litgpt@26857050),
# global_batch_size // (devices * micro_batch_size) (litgpt/args.py:56-64).
LITGPT_FSDP_GRAD_ACCUM = {"LGC-03": 16 // (4 * 1), "LGC-12": 64 // (4 * 4), "LGC-15": 64 // (4 * 4),
                          "LGC-27": 8 // (2 * 4), "LGC-33": 8 // (2 * 1)}


def litgpt_fsdp_grad_accum(row: dict) -> int:
    if row["framework"] != "litgpt" or row["shard"] != "fsdp":
        return 1
    if row["group"] == "LG":
        return 128 // int(row["micro_batch"])
    return LITGPT_FSDP_GRAD_ACCUM.get(row["id"], 1)


class Unexpressible(Exception):
    pass


def row_spec(row: dict) -> ModelSpec:
    """The architecture as the row's framework built it (the CSV's facts, e.g. LitGPT's untied heads)."""
    mt = row["model_type"]
    config = {"model_type": mt, "vocab_size": int(row["vocab_size"]), "tie_word_embeddings": row["tied"] == "true",
              "torch_dtype": "bfloat16"}
    h, layers, heads = int(row["hidden_size"]), int(row["num_layers"]), int(row["num_heads"])
    if mt == "gpt2":
        config.update(n_embd=h, n_layer=layers, n_head=heads, n_inner=int(row["intermediate_size"]),
                      resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)
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


def row_setup(row: dict) -> tuple[TrainingSetup, list[str]]:
    """The memfit setup a row describes, and the approximations taken (empty when exact)."""
    notes = []
    if row["method"] == "other":
        raise Unexpressible(f"PEFT method {row['variant']} is not modelled (LoRA, QLoRA and full only)")
    gpus = int(row["n_gpus"])
    shard = row["shard"] if row["shard"] != "none" else ("ddp" if gpus > 1 else "none")
    if shard not in ("none", "ddp", "fsdp", "zero2", "zero3"):
        raise Unexpressible(f"sharding {row['shard']} has no memfit equivalent")
    if row["optimizer"] == "other":
        raise Unexpressible("optimizer 'other' has no memfit equivalent")
    if row["quant"] not in ("none", "nf4", "nf4-dq", "int8"):
        raise Unexpressible(f"quantization {row['quant']} is not modelled")
    if "compile" in row["notes"] or "compiled" in row["notes"]:
        raise Unexpressible("torch.compile fuses kernels and frees intermediates memfit counts: not modelled")
    if row["framework"] not in RECIPE_OF:
        raise Unexpressible(f"framework {row['framework']} has no memfit recipe")
    recipe = RECIPE_OF[row["framework"]]
    kw = dict(method=row["method"], batch_size=int(row["micro_batch"]), seq_len=int(row["seq_len"]),
              precision=row["precision"], optimizer=row["optimizer"], grad_ckpt=row["grad_ckpt"] == "1",
              attn=row["attn"], chunked_ce=row["chunked_ce"] == "1",
              optimizer_in_backward=row["optimizer_in_backward"] == "1", gpus=gpus, shard=shard,
              grad_accum=litgpt_fsdp_grad_accum(row))
    if row["method"] in ("lora", "qlora"):
        targets = row["lora_targets"]
        if "head" in targets:
            notes.append("LoRA on lm_head not modelled (its adapter and input copy are small)")
            targets = ",".join(t for t in targets.split(",") if t != "head")
        kw["lora_targets"] = parse_targets(targets)
        kw["lora_rank"] = int(row["lora_rank"])
        kw["lora_dropout"] = 0.05 if recipe == "litgpt" else 0.0
    if row["method"] == "qlora":
        kw["quant"] = row["quant"]
    if row["framework"] == "plain-torch":
        notes.append("nanoGPT-style GPT-2 approximated by the HF GPT-2 layer walk")
    return TrainingSetup.from_recipe(recipe, **kw), notes


def evaluate(rows: list[dict]) -> dict:
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
        low, high = est.range_low_bytes, est.range_high_bytes
        if row["counter"] == "allocated":   # the range is for the device counter; shift it to allocated
            low, high = low - est.device_bytes + predicted, high - est.device_bytes + predicted
        entry = {"id": row["id"], "model": row["model_key"], "method": row["method"], "counter": row["counter"],
                 "bound": row["bound"], "measured": measured, "predicted": predicted, "low": low, "high": high,
                 "peak_phase": est.peak_phase, "notes": notes, "confidence": row["confidence"]}
        if row["bound"] == "lower":      # ran out of memory: the prediction must exceed the card
            entry["ok"] = predicted > measured
        else:
            entry["error"] = (predicted - measured) / measured
            entry["in_range"] = low <= measured <= high
        results.append(entry)
    return {"results": results, "skipped": skipped, "summary": summarize(results, len(rows))}


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


def summarize(results: list[dict], total_rows: int) -> dict:
    measured = [r for r in results if "error" in r]
    out = {"rows": total_rows, "expressed": len(results), "coverage": len(results) / total_rows,
           "overall": _stats([r["error"] for r in measured]),
           "range_covers_measured": (sum(r["in_range"] for r in measured) / len(measured)) if measured else None,
           "oom_rows_predicted_over_capacity": f"{sum(r['ok'] for r in results if 'ok' in r)}"
                                               f"/{sum('ok' in r for r in results)}"}
    for method in ("full", "lora", "qlora"):
        out[method] = _stats([r["error"] for r in measured if r["method"] == method])
    return out


def error_bands(report: dict) -> dict:
    """Per method, the 2.5th and 97.5th percentile of the signed error (predicted / measured - 1): the band the
    estimate states. Methods with fewer than 5 measured rows fall back to all rows."""
    measured = [r for r in report["results"] if "error" in r]

    def band(errors: list[float]) -> dict:
        errors = sorted(errors)
        pick = lambda q: errors[min(len(errors) - 1, max(0, int(round(q * (len(errors) - 1)))))]  # noqa: E731
        return {"n": len(errors), "low": round(pick(0.025), 4), "high": round(pick(0.975), 4),
                "median": round(statistics.median(errors), 4)}

    overall = band([r["error"] for r in measured])
    out = {"source": "benchmarks/accuracy_vs_measured.py over shared/calibration/measured.csv "
                     "(signed error = predicted / measured - 1; 2.5th-97.5th percentile)", "overall": overall}
    for method in ("full", "lora", "qlora"):
        errors = [r["error"] for r in measured if r["method"] == method]
        out[method] = band(errors) if len(errors) >= 5 else dict(overall, note="fewer than 5 rows: overall band")
    return out


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = ["## Against published measurements", "",
             f"`benchmarks/accuracy_vs_measured.py` over `shared/calibration/measured.csv`: {s['rows']} rows, "
             f"{s['expressed']} expressed ({s['coverage']:.0%}); OOM rows predicted above the card: "
             f"{s['oom_rows_predicted_over_capacity']}.", "",
             "| set | n | median abs error | p90 abs error | within 10% | within 20% | under-predicted |",
             "|---|---|---|---|---|---|---|"]
    for name in ("overall", "full", "lora", "qlora"):
        st = s.get(name) or {}
        if st:
            lines.append(f"| {name} | {st['n']} | {st['median_abs_error']:.1%} | {st['p90_abs_error']:.1%} | "
                         f"{st['within_10pct']:.0%} | {st['within_20pct']:.0%} | {st['under_prediction_rate']:.0%} |")
    cover = s["range_covers_measured"]
    lines += ["", f"The reported range covers the measured value in {cover:.0%} of rows." if cover is not None else "",
              "", "Worst rows:", "",
              "| id | model | method | counter | measured GB | predicted GB | error | peak phase | notes |",
              "|---|---|---|---|---|---|---|---|---|"]
    worst = sorted((r for r in report["results"] if "error" in r), key=lambda r: -abs(r["error"]))[:10]
    for r in worst:
        lines.append(f"| {r['id']} | {r['model']} | {r['method']} | {r['counter']} | {r['measured'] / 1e9:.2f} | "
                     f"{r['predicted'] / 1e9:.2f} | {r['error']:+.1%} | {r['peak_phase']} | {'; '.join(r['notes'])} |")
    lines += ["", "Rows not expressed:", ""]
    lines += [f"- {r['id']}: {r['reason']}" for r in report["skipped"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = parser.parse_args()
    if not args.csv.is_file():
        raise SystemExit(f"error: {args.csv} not found (the calibration set lives in ../shared/calibration)")
    with args.csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    report = evaluate(rows)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    (ROOT / "benchmarks" / "results" / "accuracy_vs_measured.md").write_text(markdown(report))
    bands = error_bands(report)
    (ROOT / "src" / "memfit" / "data" / "error_bands.json").write_text(json.dumps(bands, indent=1) + "\n")
    print(markdown(report))


if __name__ == "__main__":
    main()
    import accuracy_doc  # noqa: E402  (same folder)

    accuracy_doc.main()
