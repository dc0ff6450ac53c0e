"""Published mlx-lm "Peak mem" lines against memfit's MLX step model, each row run as its own release ran it.

Every row of ``shared/calibration/mlx-measured.csv`` is either mapped to the setup that its mlx-lm / MLX release
ran (physics/mlx_eras.py: the unit of "Peak mem", compiled or eager step, the loss's logits dtype and kernel,
attention under autodiff, the default LoRA keys) with the cause of each choice, or left out with the reason.
Nothing is fitted: the settings come from the row, the source at the row's date, or arithmetic on the row's own
figures (trainable-parameter counts, tokens per step), and the reason is printed next to the error.

Length evidence: mlx-lm pads a batch to its longest row, capped at ``max_seq_length`` (tuner/trainer.py
iterate_batches), and "Peak mem" is the high-water mark so far. Where the row shows its batches were full
length (tokens per step = batch x length) the setup is exact ("real"). Where the row gives only the cap
("cap"), the run's padded length lies between a floor and the cap: the floor is the row's own trained tokens
per step / batch (mlx-lm counts unpadded, unmasked tokens, so the longest row seen is at least their mean),
or 1 token where the row gives no count. The estimate at the floor and at the cap bound the reading from
both sides; the row is scored by its distance to that range (0 inside it), next to the plain error at the cap,
and the length at which the estimate equals the reading is printed (a diagnostic, never used to score).
A row whose knobs are mlx-lm's defaults at its release is checked first: if the estimate at one token is
already above the reading, the run cannot have used those defaults and the row is left out with the figures.

    PYTHONPATH=src python benchmarks/mlx_published.py [--csv ../shared/calibration/mlx-measured.csv]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from memfit import load_model
from memfit.physics.mlx import ALL_TARGETS, mlx_estimate
from memfit.physics.mlx_eras import ERAS

CSV = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "mlx-measured.csv"


@dataclass(frozen=True)
class Row:
    model: str                      # memfit catalog name
    era: str                        # physics/mlx_eras.py
    method: str
    layers: int
    batch: int
    seq_len: int                    # the model's input length (batch length - 1)
    lengths: str                    # "real" | "cap"
    rank: int = 8
    targets: tuple[str, ...] | None = None   # None: the era's default keys
    ckpt: bool = False
    quant_bits: int = 4
    causes: tuple[str, ...] = field(default=())
    dtype: str = "bf16"
    floor_seq_len: int = 1          # "cap" rows: the row's trained tokens per step / batch (1: no count given)
    default_knobs: bool = False     # unstated knobs taken from mlx-lm's defaults at the release


ALL = ALL_TARGETS
PUBLISHED: dict[str, Row | str] = {
    "M03": Row("meta-llama/Meta-Llama-3-8B", "mlx-lm-2024", "lora", 32, 1, 8095, "cap", rank=128, targets=ALL,
               floor_seq_len=14794 // 30,
               causes=("2024-04-28 (mlx 0.11): mlx-examples llms/mlx_lm tuner/trainer.py printed "
                       "mx.metal.get_peak_memory() / 2**30, ran value_and_grad eagerly and cast the logits to "
                       "float32 before the loss (default_loss)",
                       "lora_layers 32 as the config says; trainable 335.544M = 32 layers x 81,920 x rank 128 on "
                       "all seven projections (the keys of the #738 config)",
                       "batch 1 and the cap 8096 as stated; 14,794 trained tokens in 30 steps: the longest row "
                       "seen is at least 493 tokens",
                       "the peak keeps growing past step 30 (reported as a leak, mlx-examples#738): Iter 30 used")),
    "M04": Row("meta-llama/Llama-3.1-8B", "mlx-lm-2024", "lora", 16, 1, 8191, "real", rank=64, targets=ALL,
               causes=("2024-10-30 is before mlx-examples#1094 (2024-11-07): 'Peak mem' = bytes / 2**30",
                       "trainable 83.886M = 16 layers x 81,920 x rank 64 on all seven projections (the q,v "
                       "default gives 13,312 per rank per layer, which no rank fits); 32 layers x rank 32 also "
                       "fits the count but their attention softmax alone (composite, mlx 0.18) would be "
                       "32 x 32 heads x 8191^2 x 2 B = 137 GB, above the reading",
                       "batch not visible: at mlx-lm's default batch 4 the 8192-token row would need 275 GB of "
                       "attention alone; batch 1 is the reading the peak allows",
                       "the cap is reached by step 10: the log prints 'The longest sentence 19487 will be truncated "
                       "to 8192' after the Iter 1 validation line and before 'Iter 10' (issue text), and "
                       "iterate_batches (llms/mlx_lm/tuner/trainer.py@2024-10) prints that warning while building "
                       "the batch it yields to the next step, padded to min(longest, max_seq_length)",
                       "eager step, float32 logits (fp32-composite loss), composite attention (mlx <= 0.20)")),
    "M05": Row("Qwen/Qwen3-8B", "mlx-lm-0.25", "full", 16, 1, 4999, "cap", ckpt=True,
               causes=("mlx-lm ~0.25 (2025-06): compiled step, loss on bf16 logits, composite cross-entropy "
                       "(no mx.fast.cross_entropy before mlx 0.32.2), composite attention under grad (mlx#2054)",
                       "full fine-tuning trains the last num_layers=16 layers (lora.py)",
                       "5000 is the cap: 26,805 tokens in 50 steps at batch 1 (about 540 a step; 964 in the "
                       "last 10), so the longest row seen is unknown, at least 536"),
               floor_seq_len=26805 // 50),
    "M07": Row("meta-llama/Meta-Llama-3-8B", "mlx-lm-2024", "dora", 1, 4, 2047, "cap", rank=8, targets=("q", "v"),
               floor_seq_len=54680 // 50 // 4, default_knobs=True,
               causes=("mid-2024 (mlx-examples#891, 2024-07-16): GiB, eager step, float32 logits (llms/mlx_lm "
                       "tuner/trainer.py), composite attention",
                       "DoRA on 1 layer, the default keys q,v, rank 8: 0.112M trainable = q (8192 x 8 + 4096) + "
                       "v (5120 x 8 + 1024)",
                       "batch and length not stated: mlx-lm's defaults then (llms/mlx_lm/lora.py CONFIG_DEFAULTS: "
                       "batch_size 4, max_seq_length 2048); 54,680 trained tokens in 50 steps: the padded length "
                       "is at least 273",
                       "weights unquantized: the 17.5 GB of step 10 is above the 4-bit model")),
    "M08": Row("google/gemma-2-9b", "mlx-lm-0.20", "lora", 42, 4, 2047, "cap", rank=8, targets=("q", "v"),
               floor_seq_len=27571 // 15 // 4, default_knobs=True,
               causes=("mlx-lm 0.22.0, 2025-03-17 (before mlx 0.24.0 of 2025-03-20 and mlx-lm#53): eager step, "
                       "float32 logits, 'Peak' in GB (1e9)",
                       "trainable 4.473M = 42 layers x 13,312 x rank 8 on q,v: every layer (num_layers -1), the "
                       "default keys for gemma2 (tuner/utils.py) and rank",
                       "9241.706M parameters printed: unquantized (a quantized model counts packed words)",
                       "batch and length not visible: mlx-lm 0.22.0 defaults (lora.py: batch_size 4, "
                       "max_seq_length 2048); 27,571 trained tokens in 15 steps: the padded length is at least 459",
                       "gemma2's four norms a layer, gelu_approx MLP and attention and final-logit soft-capping "
                       "(mlx_lm/models/gemma2.py: tanh on the S x S scores and on the 256,000-wide logits) are in "
                       "the step model (physics/mlx.py, measured on the gemma-2-9b setups)")),
    "M09": "unsloth's MLX wrapper (not mlx-lm's lora.py): 6.816M trainable = 13,312 x 512 fits q,v at rank 16 on 32 "
           "layers or rank 32 on 16, and its release of mlx-lm is 'latest' on 2025-06-01; lengths below the 2048 cap "
           "(about 90 tokens a row at step 2)",
    "M10": Row("meta-llama/Llama-3.2-1B", "mlx-lm-0.22", "lora", 16, 4, 4095, "real",
               causes=("2025-03-22: mlx-lm main before #53 (compile, 2025-03-25) and #63 (2025-04-03): eager step, "
                       "logits cast to float32 before the loss",
                       "mlx 0.24.0 (2025-03-20, mlx#1924) takes the fused SDPA with mlx-lm's mask array under grad "
                       "for head dim 64; its Custom::vjp recomputes the attention in the backward, so no layer "
                       "keeps its S x S softmax (kept, it alone would be 68.7 GB of the 69.8)",
                       "defaults: 16 layers, LoRA q,v (llama in the model-type list), rank 8, batch 4",
                       "16,380 tokens a step = 4 rows x 4095: every row is full length")),
    "M11": Row("Qwen/Qwen3-0.6B", "mlx-lm-0.28", "lora", 16, 1, 1023, "cap", rank=16, targets=("q", "v"),
               causes=("mlx-tune 2026-06 (mlx-lm >= 0.31, mlx 0.31): mlx_lm.tuner.train, compiled, composite "
                       "cross-entropy on bf16 logits, composite attention",
                       "16 layers q,v as the row says; rank 16 = mlx-tune get_peft_model default (r=16)",
                       "1024 is the context cap; the table does not give the data's lengths")),
    "M12": Row("Qwen/Qwen3-0.6B", "mlx-lm-0.28", "lora", 28, 1, 4095, "cap", rank=16, targets=ALL,
               causes=("'full LoRA': mlx-tune applies LoRA to every layer (model.py _apply_lora, num_layers None) "
                       "and its default target_modules are all seven projections; rank 16",
                       "4096 is the context cap; the table does not give the data's lengths")),
    "M21": "the mlx-lm release is not given within 2025 (the compiled step of mlx-lm#53 and the bf16 logits of #63 "
           "change the estimate) and batch and length are not visible (config/mlx_gemma_training.yaml)",
    "M22": Row("Qwen/Qwen3-8B", "mlx-lm-0.28", "qlora", 16, 4, 2047, "cap", rank=128, floor_seq_len=199 // 4,
               default_knobs=True,
               causes=("2026-05: mlx-lm 0.28.2-0.31 defaults (lora.py: 16 layers, batch 4, max_seq_length 2048; "
                       "every Linear since mlx-lm#515)",)),
    "M24": Row("Qwen/Qwen2.5-1.5B", "mlx-lm-0.28", "lora", 16, 4, 2047, "cap", rank=16, dtype="fp16",
               default_knobs=True,
               causes=("2026 (before mlx 0.32.1's shifted loss, 2026-08-12): compiled step, composite "
                       "cross-entropy on fp16 logits, every Linear of the 16 layers (mlx-lm#515)",
                       "batch 4, rank 16, 16 layers as the notes say; max_seq_length not stated: mlx-lm's default "
                       "2048 (lora.py CONFIG_DEFAULTS); no token count, so the floor is 1 token",
                       "the figure is prose ('peak mem 6.7 GB'), not the log line")),
}
SKIP_KINDS = (("NOT mx peak", "an operating-system reading (Activity Monitor), not mx.get_peak_memory(): it also counts "
                             "MLX's buffer cache, which the 2024 Metal allocator kept until active + cache reached "
                             "0.95 x the device's recommended working set (ml-explore/mlx v0.10.0 "
                             "mlx/backend/metal/allocator.cpp:141-190, gc_limit_; cache cap 1.5 x), so the reading "
                             "follows the machine's limit rather than the step"),
              ("trainer=", "a preference or RL trainer: mlx-tune's own steps (ARahim3/mlx-tune@9690fe1 "
                           "mlx_tune/losses.py dpo_loss:296, orpo_loss:387, grpo_loss:732; rl_trainers.py: chosen "
                           "and rejected forwards with a shared prompt at batch 1, GRPO rollouts with a KV cache), "
                           "not mlx-lm's SFT step that physics/mlx.py models; layers, rank (8-16) and targets are "
                           "not stated either"))


def _peak_gb(text: str) -> float | None:
    m = re.match(r"\s*~?([\d.]+)", text or "")
    return float(m.group(1)) if m else None


def estimate_row(row: Row, seq_len: int | None = None):
    spec = load_model(row.model, allow_network=False)
    era = ERAS[row.era]
    kwargs = era.estimate_kwargs(spec, ALL_TARGETS)
    if row.targets is not None:
        kwargs["targets"] = row.targets
    return mlx_estimate(spec, method=row.method, batch_size=row.batch, seq_len=seq_len or row.seq_len,
                        train_layers=row.layers, lora_rank=row.rank, quant_bits=row.quant_bits,
                        grad_ckpt=row.ckpt, dtype=row.dtype, backend="metal", **kwargs)


def implied_seq_len(row: Row, measured_bytes: float) -> int | None:
    """The length in [floor, cap] at which the estimate equals the reading (the estimate grows with the
    length); None outside that range. A diagnostic: it is printed, never scored."""
    lo, hi = row.floor_seq_len, row.seq_len
    if not estimate_row(row, lo).mlx_peak_bytes <= measured_bytes <= estimate_row(row, hi).mlx_peak_bytes:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_row(row, mid).mlx_peak_bytes <= measured_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def range_error(measured: float, low: float, high: float) -> float:
    """Signed distance of the estimate range [low, high] to the reading, relative to it: 0 inside."""
    if measured < low:
        return low / measured - 1
    if measured > high:
        return high / measured - 1
    return 0.0


def compare(path: Path = CSV) -> dict:
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            rid, text = raw["id"], (raw.get("notes") or "") + (raw.get("peak_mem_gb") or "")
            kind = next((why for key, why in SKIP_KINDS if key in text), None)
            mapping = PUBLISHED.get(rid, "no mapping for this row yet")
            if kind or isinstance(mapping, str):
                out.append({"id": rid, "model": raw["model"], "skipped": kind or mapping})
                continue
            published = _peak_gb(raw["peak_mem_gb"])
            era = ERAS[mapping.era]
            measured = published * era.peak_unit_bytes
            est = estimate_row(mapping)
            low = estimate_row(mapping, mapping.floor_seq_len) if mapping.lengths == "cap" else est
            if mapping.default_knobs and low.mlx_peak_bytes > measured:
                out.append({"id": rid, "model": raw["model"], "skipped": (
                    f"with mlx-lm's defaults at {mapping.era} ({mapping.layers} layers, batch {mapping.batch}, "
                    f"rank {mapping.rank}) the estimate at {mapping.floor_seq_len} tokens is already "
                    f"{low.mlx_peak_bytes / 1e9:.2f} GB, above the reading {measured / 1e9:.2f} GB: the run's "
                    "unstated knobs were not the defaults")})
                continue
            targets = mapping.targets or era.default_targets(
                load_model(mapping.model, allow_network=False).model_type, ALL_TARGETS)
            out.append({"id": rid, "model": mapping.model, "era": mapping.era, "method": mapping.method,
                        "targets": ",".join(targets), "batch": mapping.batch, "seq_len": mapping.seq_len,
                        "layers": mapping.layers, "grad_ckpt": mapping.ckpt, "lengths": mapping.lengths,
                        "floor_seq_len": mapping.floor_seq_len if mapping.lengths == "cap" else mapping.seq_len,
                        "default_knobs": mapping.default_knobs, "published": published,
                        "unit": "GiB" if era.peak_unit_bytes == 2 ** 30 else "GB",
                        "measured_gb": measured / 1e9, "estimated_gb": est.mlx_peak_bytes / 1e9,
                        "floor_estimated_gb": low.mlx_peak_bytes / 1e9,
                        "error": est.mlx_peak_bytes / measured - 1,
                        "range_error": range_error(measured, low.mlx_peak_bytes, est.mlx_peak_bytes),
                        "implied_seq_len": implied_seq_len(mapping, measured) if mapping.lengths == "cap" else None,
                        "causes": list(mapping.causes)})
    mapped = [r for r in out if "error" in r]
    errors = [abs(r["error"]) for r in mapped]
    real = [abs(r["error"]) for r in mapped if r["lengths"] == "real"]
    ranged = [abs(r["range_error"]) for r in mapped]
    cap = [r for r in mapped if r["lengths"] == "cap"]
    med = (lambda xs: statistics.median(xs) if xs else None)
    return {"rows": out, "n": len(errors), "median_abs_error": med(errors),
            "worst_abs_error": max(errors) if errors else None, "n_real_lengths": len(real),
            "median_abs_error_real_lengths": med(real), "median_abs_range_error": med(ranged),
            "worst_abs_range_error": max(ranged) if ranged else None, "n_cap": len(cap),
            "n_cap_inside": sum(r["range_error"] == 0 for r in cap)}


def _pct(x):
    return "n/a" if x is None else f"{x:.1%}"


def render(pub: dict) -> list[str]:
    lines = ["Published `Peak mem` lines of mlx-lm runs on Macs (`shared/calibration/mlx-measured.csv`), each "
             "estimated (`backend=\"metal\"`) as its own mlx-lm / MLX release ran it (`physics/mlx_eras.py`, "
             "mapping and causes in `benchmarks/mlx_published.py`). `lengths`: *real* where the row shows its "
             "batches were full length; *cap* where only the maximum length is known: the run's padded length "
             "lies between the floor (the row's trained tokens per step / batch, 1 without a count) and the cap, "
             "so the estimates at the two bound the reading; `range error` is the distance of that range to the "
             "reading (0 inside), `error` the estimate at the cap alone, `implied S` the length at which the "
             "estimate equals the reading (a diagnostic). `defaults`: unstated knobs are mlx-lm's defaults at "
             "the release.", "",
             "| id | model | release | method | targets | B | S floor..cap | layers | ckpt | lengths | defaults | "
             "published | estimate GB (floor..cap) | error at cap | range error | implied S |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in pub["rows"]:
        if "error" in r:
            lines.append(f"| {r['id']} | {r['model']} | {r['era']} | {r['method']} | {r['targets']} | {r['batch']} "
                         f"| {r['floor_seq_len']}..{r['seq_len']} | {r['layers']} | "
                         f"{'yes' if r['grad_ckpt'] else 'no'} | {r['lengths']} | "
                         f"{'yes' if r['default_knobs'] else 'no'} | {r['published']:.2f} {r['unit']} | "
                         f"{r['floor_estimated_gb']:.2f}..{r['estimated_gb']:.2f} | {r['error']:+.1%} | "
                         f"{r['range_error']:+.1%} | {r['implied_seq_len'] or '-'} |")
    lines += ["", f"**Mapped rows: n = {pub['n']}; distance to the estimate range: median "
              f"{_pct(pub['median_abs_range_error'])}, worst {_pct(pub['worst_abs_range_error'])}; rows with real "
              f"lengths: n = {pub['n_real_lengths']}, median |error| {_pct(pub['median_abs_error_real_lengths'])}; "
              f"cap rows: {pub['n_cap_inside']} of {pub['n_cap']} readings inside [floor, cap]; the estimate at the "
              f"cap alone: median |error| {_pct(pub['median_abs_error'])}, worst {_pct(pub['worst_abs_error'])}.**",
              "", "Causes per mapped row:", ""]
    for r in pub["rows"]:
        if "error" in r:
            lines.append(f"- **{r['id']}**: " + "; ".join(r["causes"]) + ".")
    lines += ["", "Rows left out:", ""]
    lines += [f"- **{r['id']}** ({r['model']}): {r['skipped']}." for r in pub["rows"] if "skipped" in r]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    args = parser.parse_args(argv)
    pub = compare(args.csv)
    print("\n".join(render(pub)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
