"""Published mlx-lm "Peak mem" lines against memfit's MLX step model, each row run as its own release ran it.

Every row of ``shared/calibration/mlx-measured.csv`` is either mapped to the setup that its mlx-lm / MLX release
ran (physics/mlx_eras.py: the unit of "Peak mem", compiled or eager step, the loss's logits dtype and kernel,
attention under autodiff, the default LoRA keys) with the cause of each choice, or left out with the reason.
Nothing is fitted: the settings come from the row, the source at the row's date, or arithmetic on the row's own
figures (trainable-parameter counts, tokens per step), and the reason is printed next to the error.

Length evidence: mlx-lm pads a batch to its longest row, capped at ``max_seq_length`` (tuner/trainer.py
iterate_batches), and "Peak mem" is the high-water mark so far. Where the row shows its batches were full
length (tokens per step = batch x length) the setup is exact ("real"); where the row gives only the cap
("cap"), the estimate at the cap is an upper bound of the run's peak. Both medians are reported.

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


ALL = ALL_TARGETS
PUBLISHED: dict[str, Row | str] = {
    "M03": "real lengths unknown: 14,794 trained tokens in 30 steps (about 490 a step) under a cap of 8096, and "
           "the peak grows with the longest batch seen (28.3 GB at step 10, 45.7 at 30); also reported as a leak "
           "(mlx-examples#738)",
    "M04": Row("meta-llama/Llama-3.1-8B", "mlx-lm-2024", "lora", 16, 1, 8191, "cap", rank=64, targets=ALL,
               causes=("2024-10-30 is before mlx-examples#1094 (2024-11-07): 'Peak mem' = bytes / 2**30",
                       "trainable 83.886M = 16 layers x 81,920 x rank 64 on all seven projections (the q,v "
                       "default gives 13,312 per rank per layer, which no rank fits); 32 layers x rank 32 also "
                       "fits the count but their attention softmax alone (composite, mlx 0.18) would be "
                       "32 x 32 heads x 8191^2 x 2 B = 137 GB, above the reading",
                       "batch not visible: at mlx-lm's default batch 4 the 8192-token row would need 275 GB of "
                       "attention alone; batch 1 is the reading the peak allows",
                       "a 19,487-token row was truncated to 8192: the cap is reached, but not necessarily by step 10",
                       "eager step, float32 logits (fp32-composite loss), composite attention (mlx <= 0.20)")),
    "M05": Row("Qwen/Qwen3-8B", "mlx-lm-0.25", "full", 16, 1, 4999, "cap", ckpt=True,
               causes=("mlx-lm ~0.25 (2025-06): compiled step, loss on bf16 logits, composite cross-entropy "
                       "(no mx.fast.cross_entropy before mlx 0.32.2), composite attention under grad (mlx#2054)",
                       "full fine-tuning trains the last num_layers=16 layers (lora.py)",
                       "5000 is the cap: 26,805 tokens in 50 steps at batch 1 (about 540 a step; 964 in the "
                       "last 10), so the longest row seen is unknown")),
    "M07": "sequence length and batch not stated (about 1040 tokens a step); the peak grows with the longest batch "
           "(17.5 GB at step 10, 26.7 at 50)",
    "M08": "num_layers, batch and lengths not visible (config.yaml); about 1711 tokens a step, peak growing "
           "(56.5, 60.0, 64.9 GB at steps 5, 10, 15)",
    "M09": "lengths far below the 2048 cap and not stated: 171 tokens a step at batch 2 at step 2 (wikisql); "
           "unsloth's wrapper sets its own targets (6.816M trainable)",
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
    "M21": "num_layers, batch and max length not visible (config/mlx_gemma_training.yaml); about 200 tokens a step",
    "M22": "batch and layers not stated; step 1 only (199 tokens), whose peak includes the first validation pass",
    "M24": "max length not stated (runs/config-1.5b.yaml); the figure is prose, not the log line",
}
SKIP_KINDS = (("NOT mx peak", "an operating-system reading, not mx.get_peak_memory()"),
              ("trainer=", "a preference or RL trainer (mlx-tune DPO/ORPO/GRPO), not mlx-lm's SFT step"))


def _peak_gb(text: str) -> float | None:
    m = re.match(r"\s*~?([\d.]+)", text or "")
    return float(m.group(1)) if m else None


def estimate_row(row: Row):
    spec = load_model(row.model, allow_network=False)
    era = ERAS[row.era]
    kwargs = era.estimate_kwargs(spec, ALL_TARGETS)
    if row.targets is not None:
        kwargs["targets"] = row.targets
    return mlx_estimate(spec, method=row.method, batch_size=row.batch, seq_len=row.seq_len,
                        train_layers=row.layers, lora_rank=row.rank, quant_bits=row.quant_bits,
                        grad_ckpt=row.ckpt, dtype="bf16", backend="metal", **kwargs)


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
            out.append({"id": rid, "model": mapping.model, "era": mapping.era, "method": mapping.method,
                        "targets": ",".join(mapping.targets or era.default_targets(
                            load_model(mapping.model, allow_network=False).model_type, ALL_TARGETS)),
                        "batch": mapping.batch, "seq_len": mapping.seq_len, "layers": mapping.layers,
                        "grad_ckpt": mapping.ckpt, "lengths": mapping.lengths, "published": published,
                        "unit": "GiB" if era.peak_unit_bytes == 2 ** 30 else "GB",
                        "measured_gb": measured / 1e9, "estimated_gb": est.mlx_peak_bytes / 1e9,
                        "error": est.mlx_peak_bytes / measured - 1, "causes": list(mapping.causes)})
    errors = [abs(r["error"]) for r in out if "error" in r]
    real = [abs(r["error"]) for r in out if r.get("lengths") == "real"]
    return {"rows": out, "n": len(errors), "median_abs_error": statistics.median(errors) if errors else None,
            "worst_abs_error": max(errors) if errors else None, "n_real_lengths": len(real),
            "median_abs_error_real_lengths": statistics.median(real) if real else None}


def render(pub: dict) -> list[str]:
    lines = ["Published `Peak mem` lines of mlx-lm runs on Macs (`shared/calibration/mlx-measured.csv`), each "
             "estimated (`backend=\"metal\"`) as its own mlx-lm / MLX release ran it (`physics/mlx_eras.py`, "
             "mapping and causes in `benchmarks/mlx_published.py`). `lengths`: *real* where the row shows its "
             "batches were full length, *cap* where only the maximum length is known (the estimate is then an "
             "upper bound).", "",
             "| id | model | release | method | targets | B | S | layers | ckpt | lengths | published | "
             "estimate GB | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in pub["rows"]:
        if "error" in r:
            lines.append(f"| {r['id']} | {r['model']} | {r['era']} | {r['method']} | {r['targets']} | {r['batch']} "
                         f"| {r['seq_len']} | {r['layers']} | {'yes' if r['grad_ckpt'] else 'no'} | {r['lengths']} "
                         f"| {r['published']:.2f} {r['unit']} | {r['estimated_gb']:.2f} | {r['error']:+.1%} |")
    lines += ["", f"**Mapped rows: n = {pub['n']}, median |error| {pub['median_abs_error']:.1%}, worst "
              f"{pub['worst_abs_error']:.1%}; rows with real lengths: n = {pub['n_real_lengths']}, median "
              f"{pub['median_abs_error_real_lengths']:.1%}.**", "", "Causes per mapped row:", ""]
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
