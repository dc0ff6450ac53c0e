"""Real mlx-lm training steps on MLX (CPU backend here), peak memory against ``mlx_estimate``.

Each setup builds mlx-lm's own model class from a real config scaled down (width, layers, vocabulary; the
head dim and the family's structure are kept), with random weights, quantizes it with ``nn.quantize``
(group 64) for QLoRA, applies ``linear_to_lora_layers`` (or unfreezes the last layers for full), and runs the
step exactly as ``mlx_lm/tuner/trainer.py:245-261`` (mlx-lm 0.32.2) does: ``nn.value_and_grad(model,
default_loss)`` and ``optimizer.update`` inside ``mx.compile(inputs=state, outputs=state)``, then
``mx.eval(state, ...)``. The second step is measured (the first one creates Adam's state), between
``mx.reset_peak_memory()`` and ``mx.get_peak_memory()``. The estimate uses ``backend="cpu"``.

Also compares ``mlx_estimate(backend="metal")`` with the published "Peak mem" rows of
``../shared/calibration/mlx-measured.csv`` that state enough of their setup (``--csv PATH``).

    PYTHONPATH=src python benchmarks/mlx_measure.py [--quick] [--csv ../shared/calibration/mlx-measured.csv]
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import re
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from memfit import load_model
from memfit.physics.mlx import ALL_TARGETS, mlx_estimate

RESULTS = Path(__file__).parent / "results" / "mlx_measure.json"

# Real configs (memfit's catalog), scaled to hidden 256: (catalog name, heads, kv heads, intermediate).
# The head dim, gating, QK-norm, biases and tying of the real model are kept.
FAMILIES = {
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B", 4, 1, 1408),        # 896/14/2/4864, head_dim 64, qkv bias, tied
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", 4, 1, 1024),  # 2048/32/8/8192, head_dim 64, tied
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B", 4, 2, 768),             # 1024/16/8/3072, head_dim 128 (q_dim > hidden), QK-norm
    "mistral-7b": ("mistralai/Mistral-7B-v0.1", 2, 1, 896),   # 4096/32/8/14336, head_dim 128, untied
}
HIDDEN = 256


def scaled_spec(family: str, layers: int, vocab: int):
    name, heads, kv, inter = FAMILIES[family]
    real = load_model(name, allow_network=False)
    return real.replace(name=f"{family} scaled", hidden_size=HIDDEN, num_heads=heads, num_kv_heads=kv,
                        intermediate_size=inter, num_layers=layers, vocab_size=vocab, hf_config_json=None,
                        exact_params=None)


def mlx_config(spec) -> dict:
    model_type = "llama" if spec.model_type == "mistral" else spec.model_type
    return dict(model_type=model_type, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                intermediate_size=spec.intermediate_size, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=1e-6,
                vocab_size=spec.vocab_size, tie_word_embeddings=spec.tied_embeddings, rope_theta=10000.0,
                max_position_embeddings=4096, attention_bias=spec.qkv_bias)


SETUPS = [
    # family, method, batch, seq_len, layers total, trained layers, grad ckpt, vocab, dtype
    ("qwen2.5-0.5b", "lora", 2, 128, 2, 2, False, 4096, "bf16"),
    ("qwen2.5-0.5b", "lora", 4, 128, 2, 2, False, 4096, "bf16"),
    ("qwen2.5-0.5b", "lora", 1, 512, 2, 2, False, 4096, "bf16"),
    ("qwen2.5-0.5b", "lora", 2, 256, 4, 2, False, 8192, "bf16"),
    ("qwen2.5-0.5b", "lora", 2, 256, 4, 4, True, 8192, "bf16"),
    ("qwen2.5-0.5b", "qlora", 2, 128, 2, 2, False, 4096, "bf16"),
    ("qwen2.5-0.5b", "full", 2, 128, 3, 2, False, 4096, "bf16"),
    ("qwen2.5-0.5b", "dora", 2, 128, 2, 2, False, 4096, "bf16"),
    ("llama-3.2-1b", "lora", 2, 128, 2, 2, False, 8192, "bf16"),
    ("llama-3.2-1b", "lora", 4, 256, 2, 2, False, 8192, "bf16"),
    ("llama-3.2-1b", "lora", 2, 256, 4, 4, True, 8192, "bf16"),
    ("llama-3.2-1b", "qlora", 2, 256, 2, 2, False, 8192, "bf16"),
    ("llama-3.2-1b", "qlora8", 2, 128, 2, 2, False, 8192, "bf16"),
    ("llama-3.2-1b", "full", 1, 256, 2, 2, False, 4096, "bf16"),
    ("llama-3.2-1b", "lora", 2, 128, 2, 2, False, 4096, "fp32"),
    ("qwen3-0.6b", "lora", 2, 128, 2, 2, False, 4096, "bf16"),
    ("qwen3-0.6b", "lora", 1, 512, 2, 2, False, 4096, "bf16"),
    ("qwen3-0.6b", "lora", 2, 256, 4, 4, True, 4096, "bf16"),
    ("qwen3-0.6b", "qlora", 4, 128, 2, 2, False, 4096, "bf16"),
    ("qwen3-0.6b", "full", 2, 128, 2, 1, False, 4096, "bf16"),
    ("mistral-7b", "lora", 2, 128, 2, 2, False, 4096, "bf16"),
    ("mistral-7b", "lora", 2, 256, 2, 1, False, 2048, "bf16"),
    ("mistral-7b", "qlora", 2, 256, 2, 2, True, 4096, "bf16"),
    ("mistral-7b", "full", 2, 128, 2, 2, False, 2048, "fp16"),
    ("mistral-7b", "lora", 4, 64, 2, 2, False, 8192, "fp16"),
    # LoRA on q,v only (mlx-lm `keys`, the default before ml-explore/mlx-lm#515): "lora-qv"
    ("llama-3.2-1b", "lora-qv", 2, 256, 2, 2, False, 8192, "bf16"),
    ("qwen2.5-0.5b", "lora-qv", 2, 256, 4, 4, False, 8192, "bf16"),
    ("qwen3-0.6b", "lora-qv", 1, 512, 2, 2, False, 4096, "bf16"),
]
QV_KEYS = ["self_attn.q_proj", "self_attn.v_proj"]


def measure(family, method, batch, seq_len, layers, trained, ckpt, vocab, dtype) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.trainer import default_loss, grad_checkpoint
    from mlx_lm.tuner.utils import linear_to_lora_layers

    spec = scaled_spec(family, layers, vocab)
    config = mlx_config(spec)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype({"bf16": mx.bfloat16, "fp16": mx.float16, "fp32": mx.float32}[dtype])
    bits = {"qlora": 4, "qlora8": 8}.get(method)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    model.freeze()
    if method == "full":
        for layer in model.layers[-trained:]:
            layer.unfreeze()
    else:
        config = {"rank": 8, "dropout": 0.0, "scale": 20.0}
        if method == "lora-qv":
            config["keys"] = QV_KEYS
        linear_to_lora_layers(model, trained, config, use_dora=method == "dora")
    if ckpt:
        grad_checkpoint(model.layers[0])
    optimizer = optim.Adam(learning_rate=1e-5)
    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch_, lengths_):
        (lvalue, toks), grad = loss_value_and_grad(model, batch_, lengths_)
        optimizer.update(model, grad)
        return lvalue, toks

    tokens = mx.random.randint(0, vocab, (batch, seq_len + 1)).astype(mx.int32)
    lengths = mx.array([[0, seq_len]] * batch)
    mx.eval(tokens, lengths)
    peaks = []
    for _ in range(2):
        mx.eval(state)
        mx.reset_peak_memory()
        lvalue, toks = step(tokens, lengths)
        mx.eval(state, lvalue, toks)
        peaks.append(mx.get_peak_memory())
    trainable = sum(v.nbytes for _, v in tree_flatten(model.trainable_parameters()))
    est = mlx_estimate(spec, method="qlora" if bits else ("lora" if method == "lora-qv" else method),
                       batch_size=batch, seq_len=seq_len, train_layers=trained, quant_bits=bits or 4, grad_ckpt=ckpt,
                       dtype=dtype, backend="cpu", targets=("q", "v") if method == "lora-qv" else ALL_TARGETS)
    measured = peaks[-1]
    # Clean up explicitly: the next setup's peak must not see this one's arrays.
    del model, optimizer, state, step, loss_value_and_grad
    mx.clear_cache()
    return {"setup": dict(family=family, method=method, batch_size=batch, seq_len=seq_len, layers=layers,
                          train_layers=trained, grad_ckpt=ckpt, vocab=vocab, dtype=dtype, hidden=HIDDEN),
            "measured": measured, "estimated": est.mlx_peak_bytes, "error": est.mlx_peak_bytes / measured - 1,
            "first_step_peak": peaks[0], "trainable_bytes_measured": trainable,
            "components": est.components(), "peak_phase": est.peak_phase}


# ---- published rows ---------------------------------------------------------------------------------------

def _first_int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def csv_rows(path: Path) -> list[dict]:
    """Rows with a mx peak (not OS readings), SFT, and a model memfit can resolve; setup read from the row."""
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            notes = (row.get("notes") or "") + (row.get("peak_mem_gb") or "")
            if "NOT mx peak" in notes or "trainer=" in notes or "(OS reading)" in notes:
                continue
            peak = re.match(r"\s*~?([\d.]+)", row["peak_mem_gb"] or "")
            seq = _first_int(row["max_seq_length"])
            if not peak or not seq:
                continue
            out.append(dict(row, peak_gb=float(peak.group(1)), seq=seq))
    return out


def _row_setup(row: dict) -> dict | None:
    model_ref = row["model"].split(" ")[0].split("(")[0]
    aliases = {"Qwen3-8B": "Qwen/Qwen3-8B", "Qwen3-0.6B": "Qwen/Qwen3-0.6B", "Qwen3-0.6B-bf16": "Qwen/Qwen3-0.6B",
               "mlx-community/llama-3.2-1B-Instruct-bf16": "meta-llama/Llama-3.2-1B",
               "unsloth/llama-3-8b": "meta-llama/Meta-Llama-3-8B"}
    model_ref = aliases.get(model_ref, model_ref)
    try:
        spec = load_model(model_ref, allow_network=False)
    except Exception:  # noqa: BLE001 - a row whose model is not resolvable offline is skipped, and said so
        return None
    quant = row["quant"].lower()
    method = row["method"] if row["method"] in ("lora", "dora", "full") else "lora"
    bits = 4 if quant.startswith("4bit") else 8 if quant.startswith("8bit") else None
    layers = _first_int(row["num_layers"]) or 16
    if "all" in (row["num_layers"] or ""):
        layers = spec.num_layers
    batch = _first_int(row["batch_size"]) or 1
    ckpt = (row["grad_checkpoint"] or "").startswith("yes")
    dtype = "fp16" if "fp16" in quant else "bf16"
    return dict(spec=spec, method="qlora" if bits and method == "lora" else method, bits=bits or 4,
                layers=layers, batch=batch, seq=row["seq"] - 1, ckpt=ckpt, dtype=dtype, targets=_row_targets(row))


def _row_targets(row: dict) -> tuple[str, ...]:
    """LoRA targets of a published run: what the row says, else its mlx-lm's default. Before
    ml-explore/mlx-lm#515 (merged 2025-09-30, mlx-lm 0.28) the default keys were q_proj and v_proj; after it,
    every Linear of the trained layers."""
    text = " ".join(row.get(k) or "" for k in ("source", "rank", "notes", "mlx_version"))
    if "(q, v)" in text or "q_proj, v_proj" in text or "2 keys" in text:
        return ("q", "v")
    version = row.get("mlx_version") or ""
    minor = re.search(r"0\.(\d+)", version)
    if "2026" in version or (minor and int(minor.group(1)) >= 28 and "mlx 0." not in version):
        return ALL_TARGETS
    return ("q", "v")


def compare_csv(path: Path) -> dict:
    results = []
    for row in csv_rows(path):
        setup = _row_setup(row)
        if setup is None:
            results.append({"id": row["id"], "skipped": f"model {row['model']!r} not resolvable offline"})
            continue
        est = mlx_estimate(setup["spec"], method=setup["method"], batch_size=setup["batch"], seq_len=setup["seq"],
                           train_layers=min(setup["layers"], setup["spec"].num_layers), quant_bits=setup["bits"],
                           grad_ckpt=setup["ckpt"], dtype=setup["dtype"], backend="metal",
                           targets=setup["targets"])
        measured = row["peak_gb"] * 1e9
        results.append({"id": row["id"], "model": row["model"], "method": setup["method"],
                        "targets": ",".join(setup["targets"]),
                        "batch": setup["batch"], "seq_len": setup["seq"], "layers": setup["layers"],
                        "grad_ckpt": setup["ckpt"], "measured_gb": row["peak_gb"],
                        "estimated_gb": est.mlx_peak_bytes / 1e9, "error": est.mlx_peak_bytes / measured - 1})
    errors = [abs(r["error"]) for r in results if "error" in r]
    return {"rows": results, "n": len(errors),
            "median_abs_error": statistics.median(errors) if errors else None}


def table(results: list[dict]) -> str:
    lines = ["| family | method | B | S | layers (trained) | ckpt | vocab | dtype | measured MB | estimate MB | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["setup"]
        lines.append(f"| {s['family']} | {s['method']} | {s['batch_size']} | {s['seq_len']} | {s['layers']} "
                     f"({s['train_layers']}) | {'yes' if s['grad_ckpt'] else 'no'} | {s['vocab']} | {s['dtype']} "
                     f"| {r['measured'] / 1e6:.2f} | {r['estimated'] / 1e6:.2f} | {r['error']:+.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 6 setups only (no results file)")
    parser.add_argument("--csv", type=Path, help="also compare with published rows (mlx-measured.csv)")
    parser.add_argument("--csv-only", action="store_true", help="skip the MLX measurements")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)   # measure SETUPS[i] and print its JSON
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite results/mlx_measure.md from the saved JSON (no measurement)")
    args = parser.parse_args(argv)
    if args.render_only:
        MARKDOWN.write_text(render_md(json.loads(RESULTS.read_text())), encoding="utf-8")
        return 0
    if args.one is not None:
        print(json.dumps(measure(*SETUPS[args.one])))
        return 0
    out: dict = {}
    if not args.csv_only:
        import mlx.core as mx
        import mlx_lm

        results = []
        for setup in SETUPS[:6] if args.quick else SETUPS:
            t0 = time.perf_counter()
            # Each setup in a fresh process: in one long process, later setups' peaks read lower than the same
            # setup measured alone (MLX's compile and buffer caches carry over), by up to a third.
            r = _measure_alone(SETUPS.index(setup))
            r["seconds"] = round(time.perf_counter() - t0, 2)
            results.append(r)
            print(f"{setup}: measured {r['measured']} estimated {r['estimated']} ({r['error']:+.1%})",
                  file=sys.stderr, flush=True)
        errors = [abs(r["error"]) for r in results]
        out.update({"mlx_version": mx.__version__, "mlx_lm_version": mlx_lm.__version__, "backend": "cpu",
                    "n": len(results), "median_abs_error": statistics.median(errors),
                    "worst_abs_error": max(errors), "results": results})
        print(table(results))
        print(f"\nn={len(results)}  median |error| {out['median_abs_error']:.1%}  worst {out['worst_abs_error']:.1%}")
    if args.csv:
        cmp = compare_csv(args.csv)
        out["published"] = cmp
        if args.csv_only and RESULTS.is_file():       # refresh the published comparison in the saved results
            saved = json.loads(RESULTS.read_text())
            saved["published"] = cmp
            RESULTS.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
            MARKDOWN.write_text(render_md(saved), encoding="utf-8")
        print("\n| id | model | method | B | S | layers | ckpt | published GB | estimate GB | error |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in cmp["rows"]:
            if "error" in r:
                print(f"| {r['id']} | {r['model']} | {r['method']} | {r['batch']} | {r['seq_len']} | {r['layers']} "
                      f"| {'yes' if r['grad_ckpt'] else 'no'} | {r['measured_gb']:.2f} | {r['estimated_gb']:.2f} "
                      f"| {r['error']:+.1%} |")
            else:
                print(f"| {r['id']} | skipped: {r['skipped']} |")
        if cmp["n"]:
            print(f"\npublished rows: n={cmp['n']}  median |error| {cmp['median_abs_error']:.1%}")
    if not args.quick and not args.csv_only:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        write_band(out["results"])
        MARKDOWN.write_text(render_md(out), encoding="utf-8")
    return 0


def _measure_alone(index: int) -> dict:
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--one", str(index)], capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


MARKDOWN = Path(__file__).parent / "results" / "mlx_measure.md"


def render_md(out: dict) -> str:
    """The MLX section of docs/accuracy.md (benchmarks/accuracy_doc.py includes it)."""
    lines = ["## MLX (mlx-lm on Apple silicon)", "",
             f"`benchmarks/mlx_measure.py` runs real mlx-lm {out['mlx_lm_version']} training steps (MLX "
             f"{out['mlx_version']}, its own model classes, `linear_to_lora_layers`, `default_loss`, Adam and the "
             "compiled step) on MLX's CPU backend, on real architectures scaled down to hidden size 256, each "
             "setup in a fresh process, and compares `mx.get_peak_memory()` after the second step with memfit's "
             "step model (physics/mlx.py, `backend=\"cpu\"`). "
             f"**n = {out['n']}: median |error| {out['median_abs_error']:.1%}, worst {out['worst_abs_error']:.1%}.**",
             "", table(out["results"]), ""]
    pub = out.get("published")
    if pub:
        lines += ["Published `Peak mem` lines of mlx-lm runs on Macs (`shared/calibration/mlx-measured.csv`, GB = "
                  "1e9), estimated with `backend=\"metal\"` and each row's stated settings (LoRA on q,v for "
                  "mlx-lm before ml-explore/mlx-lm#515):", "",
                  "| id | model | method | targets | B | S | layers | ckpt | published GB | estimate GB | error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in pub["rows"]:
            if "error" in r:
                lines.append(f"| {r['id']} | {r['model']} | {r['method']} | {r.get('targets', '')} | {r['batch']} | "
                             f"{r['seq_len']} | {r['layers']} | {'yes' if r['grad_ckpt'] else 'no'} | "
                             f"{r['measured_gb']:.2f} | {r['estimated_gb']:.2f} | {r['error']:+.1%} |")
            else:
                lines.append(f"| {r['id']} | skipped: {r['skipped']} | | | | | | | | | |")
        if pub["n"]:
            lines += ["", f"Published rows: n = {pub['n']}, median |error| {pub['median_abs_error']:.1%}. The step "
                      "model is measured only on the CPU backend; on Metal the published peaks are lower than it "
                      "predicts (it errs high): the Metal kernels' saved tensors (attention, fused norms, the "
                      "float32 adapter inputs) are not measured here, and several rows' real lengths are below "
                      "the max length the row states (M09: about 180 tokens a step). A Mac run is needed to close "
                      "this gap."]
    return "\n".join(lines) + "\n"


BAND = Path(__file__).resolve().parent.parent / "src" / "memfit" / "data" / "mlx_band.json"


def write_band(results: list[dict]) -> dict:
    """The step model's measured spread (error = estimate / measured - 1), which widens every MLX estimate's
    range (memfit/estimate_mlx.py). Written only by a full run of this benchmark: running it changes what
    memfit prints, so the file is reviewed in the diff like code."""
    errors = sorted(r["error"] for r in results)
    band = {"n": len(errors), "low": round(errors[0], 4), "high": round(errors[-1], 4),
            "median": round(statistics.median(errors), 4),
            "source": "benchmarks/mlx_measure.py: real mlx-lm steps on MLX's CPU backend"}
    BAND.write_text(json.dumps(band, indent=1) + "\n", encoding="utf-8")
    return band


if __name__ == "__main__":
    raise SystemExit(main())
