"""Real mlx-lm training steps on MLX (CPU backend here), peak memory against ``mlx_estimate``.

Each setup builds mlx-lm's own model class from a real config scaled down (width, layers, vocabulary; the
head dim and the family's structure are kept), with random weights, quantizes it with ``nn.quantize``
(group 64) for QLoRA, applies ``linear_to_lora_layers`` (or unfreezes the last layers for full), and runs the
step exactly as ``mlx_lm/tuner/trainer.py:245-261`` (mlx-lm 0.32.2) does: ``nn.value_and_grad(model,
default_loss)`` and ``optimizer.update`` inside ``mx.compile(inputs=state, outputs=state)``, then
``mx.eval(state, ...)``. The second step is measured (the first one creates Adam's state), between
``mx.reset_peak_memory()`` and ``mx.get_peak_memory()``. The estimate uses ``backend="cpu"``.

Also compares ``mlx_estimate(backend="metal")`` with the published "Peak mem" rows of
``../shared/calibration/mlx-measured.csv``, each as its release ran it (``--csv PATH``; benchmarks/mlx_published.py).

    PYTHONPATH=src python benchmarks/mlx_measure.py [--quick | --only I ...] [--csv ../shared/calibration/mlx-measured.csv]
"""

from __future__ import annotations

import argparse
import importlib
import json
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
    # 3584/16/8/14336, head_dim 256, 4 norms a layer, gelu_approx, attention and final-logit soft-capping
    "gemma-2-9b": ("google/gemma-2-9b", 2, 1, 1024),
    "gemma-3-4b": ("google/gemma-3-4b-it", 2, 1, 1024),       # 2560/8/4/10240, head_dim 256, QK-norm, no capping
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
    config = dict(model_type=model_type, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                  intermediate_size=spec.intermediate_size, num_attention_heads=spec.num_heads,
                  num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=1e-6,
                  vocab_size=spec.vocab_size, tie_word_embeddings=spec.tied_embeddings, rope_theta=10000.0,
                  max_position_embeddings=4096, attention_bias=spec.qkv_bias)
    if model_type.startswith("gemma"):      # mlx_lm/models/gemma2.py, gemma3_text.py ModelArgs
        config.update(query_pre_attn_scalar=spec.head_dim, attn_logit_softcapping=spec.attn_logit_softcap,
                      final_logit_softcapping=spec.final_logit_softcap,
                      # gemma3_text reads the mask of layer pattern-1 (5 local : 1 global); the scaled model has
                      # fewer layers, and the setups' lengths stay below the 512-token window
                      sliding_window_pattern=min(6, spec.num_layers))
    return config


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
    # Long attention (B x heads x S x S larger than the logits): the attention backward's S x S buffers.
    ("llama-3.2-1b", "lora-qv", 1, 2048, 2, 2, False, 1024, "bf16"),
    # Older releases' steps (physics/mlx_eras.py), reproduced here: uncompiled step, the loss as that release
    # computed it, and mlx 0.24's fused SDPA under grad (its Custom::vjp re-runs the fallback in the backward,
    # which is what mx.checkpoint around the attention does).
    ("llama-3.2-1b", "lora-qv", 2, 512, 2, 2, False, 16384, "bf16", "mlx-lm-2024"),
    ("llama-3.2-1b", "lora-qv", 2, 512, 2, 2, False, 16384, "bf16", "mlx-lm-0.22"),
    ("llama-3.2-1b", "lora-qv", 1, 2048, 2, 2, False, 1024, "bf16", "mlx-lm-2024"),
    ("llama-3.2-1b", "lora-qv", 1, 2048, 2, 2, False, 1024, "bf16", "mlx-lm-0.22"),
    ("qwen3-0.6b", "lora", 1, 1024, 2, 2, False, 8192, "bf16", "mlx-lm-0.28"),
    ("qwen2.5-0.5b", "full", 2, 256, 3, 2, False, 8192, "bf16", "mlx-lm-0.25"),
    # The published rows' shapes (benchmarks/mlx_published.py), small: DoRA on q,v of 1 of the layers in the
    # 2024 step (M07), full fine-tuning of the last layers with checkpointing in the compiled 0.25 step (M05),
    # every-linear LoRA in the 2024 step (M03, M04), fp16 every-linear LoRA in the 0.28 step (M24).
    ("llama-3.2-1b", "dora-qv", 4, 256, 2, 1, False, 8192, "bf16", "mlx-lm-2024"),
    ("qwen3-0.6b", "full", 1, 512, 3, 2, True, 8192, "bf16", "mlx-lm-0.25"),
    ("llama-3.2-1b", "lora", 1, 1024, 2, 2, False, 8192, "bf16", "mlx-lm-2024"),
    ("qwen2.5-0.5b", "lora", 4, 256, 3, 2, False, 8192, "fp16", "mlx-lm-0.28"),
    # Gemma: four norms a layer, gelu_approx, Gemma 2's soft-capping (M08's family, in its eager release too).
    ("gemma-2-9b", "lora", 2, 256, 2, 2, False, 8192, "bf16"),
    ("gemma-2-9b", "lora-qv", 4, 128, 3, 3, False, 8192, "bf16", "mlx-lm-0.20"),
    ("gemma-3-4b", "lora", 2, 256, 2, 2, False, 16384, "bf16"),
]
QV_KEYS = ["self_attn.q_proj", "self_attn.v_proj"]


def _era_loss(kernel: str):
    """The loss of an older release (mlx-lm tuner/trainer.py default_loss with that mlx's nn.losses.cross_entropy:
    take_along_axis + logsumexp, no max shift before mlx 0.32.1), the logits cast to float32 first for
    "fp32-composite" (mlx-lm before #63)."""
    import mlx.core as mx

    def loss(model, batch, lengths):
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(inputs)
        if kernel == "fp32-composite":
            logits = logits.astype(mx.float32)
        steps = mx.arange(1, targets.shape[1] + 1)
        mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
        score = mx.take_along_axis(logits, targets[..., None], axis=-1).squeeze(-1)
        ce = (mx.logsumexp(logits, axis=-1) - score) * mask
        ntoks = mask.sum()
        return ce.astype(mx.float32).sum() / ntoks, ntoks
    return loss


def measure(family, method, batch, seq_len, layers, trained, ckpt, vocab, dtype, era=None) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.trainer import default_loss, grad_checkpoint
    from mlx_lm.tuner.utils import linear_to_lora_layers

    spec = scaled_spec(family, layers, vocab)
    config = mlx_config(spec)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    era_args = {}
    loss_fn = default_loss
    if era:
        from memfit.physics.mlx_eras import ERAS
        e = ERAS[era]
        era_args = dict(compiled=e.compiled, attention_grad=e.attention_grad(spec.head_dim),
                        # on the CPU the installed mlx runs its shifted composite where a Mac runs the fused kernel
                        loss_kernel="composite-shifted" if e.loss_kernel == "fused" else e.loss_kernel)
        if e.loss_kernel != "fused":
            loss_fn = _era_loss(e.loss_kernel)
        if era_args["attention_grad"] == "recompute":
            fused = mx.fast.scaled_dot_product_attention

            def sdpa(q, k, v, cache=None, scale=1.0, mask=None, sinks=None):
                return mx.checkpoint(lambda a, b_, c: fused(a, b_, c, scale=scale, mask=mask))(q, k, v)
            module.scaled_dot_product_attention = sdpa   # this process only (each setup runs alone)
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
        if method.endswith("-qv"):
            config["keys"] = QV_KEYS
        linear_to_lora_layers(model, trained, config, use_dora=method.startswith("dora"))
    if ckpt:
        grad_checkpoint(model.layers[0])
    optimizer = optim.Adam(learning_rate=1e-5)
    loss_value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state, mx.random.state]

    def step(batch_, lengths_):
        (lvalue, toks), grad = loss_value_and_grad(model, batch_, lengths_)
        optimizer.update(model, grad)
        return lvalue, toks
    if era_args.get("compiled", True):
        step = partial(mx.compile, inputs=state, outputs=state)(step)

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
    est = mlx_estimate(spec, method="qlora" if bits else method.removesuffix("-qv"),
                       batch_size=batch, seq_len=seq_len, train_layers=trained, quant_bits=bits or 4, grad_ckpt=ckpt,
                       dtype=dtype, backend="cpu", targets=("q", "v") if method.endswith("-qv") else ALL_TARGETS,
                       **era_args)
    measured = peaks[-1]
    # Clean up explicitly: the next setup's peak must not see this one's arrays.
    del model, optimizer, state, step, loss_value_and_grad
    mx.clear_cache()
    return {"setup": _setup_dict(family, method, batch, seq_len, layers, trained, ckpt, vocab, dtype, era),
            "measured": measured, "estimated": est.mlx_peak_bytes, "error": est.mlx_peak_bytes / measured - 1,
            "first_step_peak": peaks[0], "trainable_bytes_measured": trainable,
            "components": est.components(), "peak_phase": est.peak_phase}


# ---- published rows: benchmarks/mlx_published.py maps each to the release it ran ----------------------------

def compare_csv(path: Path) -> dict:
    from mlx_published import compare
    return compare(path)


def table(results: list[dict]) -> str:
    lines = ["| family | method | release | B | S | layers (trained) | ckpt | vocab | dtype | measured MB | estimate MB "
             "| error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["setup"]
        lines.append(f"| {s['family']} | {s['method']} | {s.get('era', 'current')} | {s['batch_size']} | {s['seq_len']} "
                     f"| {s['layers']} "
                     f"({s['train_layers']}) | {'yes' if s['grad_ckpt'] else 'no'} | {s['vocab']} | {s['dtype']} "
                     f"| {r['measured'] / 1e6:.2f} | {r['estimated'] / 1e6:.2f} | {r['error']:+.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 6 setups only (no results file)")
    parser.add_argument("--csv", type=Path, help="also compare with published rows (mlx-measured.csv)")
    parser.add_argument("--csv-only", action="store_true", help="skip the MLX measurements")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)   # measure SETUPS[i] and print its JSON
    parser.add_argument("--only", type=int, nargs="+", metavar="I",
                        help="measure only SETUPS[I] (0-based) and merge them into the saved results, which keep "
                             "the other setups' earlier measurements (same mlx / mlx-lm versions required)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite results/mlx_measure.md from the saved JSON (no measurement)")
    args = parser.parse_args(argv)
    if args.render_only:
        MARKDOWN.write_text(render_md(json.loads(RESULTS.read_text())), encoding="utf-8")
        return 0
    if args.one is not None:
        print(json.dumps(measure(*SETUPS[args.one])))
        return 0
    if args.only:
        return _merge_only(args.only, args.csv)
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
        from mlx_published import render
        print("\n" + "\n".join(render(cmp)))
    if not args.quick and not args.csv_only:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        write_band(out["results"])
        MARKDOWN.write_text(render_md(out), encoding="utf-8")
    return 0


def _summary(results: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in results]
    return {"n": len(results), "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors)}


def _merge_only(indexes: list[int], csv_path: Path | None) -> int:
    """Measure a subset of SETUPS and merge it into the saved results (a full run takes about 45 minutes on two
    cores). Results are matched by setup; setups no longer in SETUPS are dropped; the order follows SETUPS."""
    import mlx.core as mx
    import mlx_lm

    saved = json.loads(RESULTS.read_text())
    if (saved["mlx_version"], saved["mlx_lm_version"]) != (mx.__version__, mlx_lm.__version__):
        raise SystemExit(f"saved results are for mlx {saved['mlx_version']} / mlx-lm {saved['mlx_lm_version']}, "
                         f"this is {mx.__version__} / {mlx_lm.__version__}: run the full matrix")
    by_setup = {json.dumps(r["setup"], sort_keys=True): r for r in saved["results"]}
    for i in indexes:
        if not 0 <= i < len(SETUPS):
            raise SystemExit(f"--only {i}: there are {len(SETUPS)} setups (0..{len(SETUPS) - 1})")
        t0 = time.perf_counter()
        r = _measure_alone(i)
        r["seconds"] = round(time.perf_counter() - t0, 2)
        by_setup[json.dumps(r["setup"], sort_keys=True)] = r
        print(f"{SETUPS[i]}: measured {r['measured']} estimated {r['estimated']} ({r['error']:+.1%})",
              file=sys.stderr, flush=True)
    keys = [json.dumps(_setup_dict(*s), sort_keys=True) for s in SETUPS]
    saved["results"] = [by_setup[k] for k in keys if k in by_setup]
    saved.update(_summary(saved["results"]))
    if csv_path:
        saved["published"] = compare_csv(csv_path)
    RESULTS.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    write_band(saved["results"])
    MARKDOWN.write_text(render_md(saved), encoding="utf-8")
    print(f"n={saved['n']}  median |error| {saved['median_abs_error']:.1%}  worst {saved['worst_abs_error']:.1%}")
    return 0


def _setup_dict(family, method, batch, seq_len, layers, trained, ckpt, vocab, dtype, era=None) -> dict:
    """The ``setup`` record measure() writes for a SETUPS entry."""
    return dict(family=family, method=method, batch_size=batch, seq_len=seq_len, layers=layers,
                train_layers=trained, grad_ckpt=ckpt, vocab=vocab, dtype=dtype, hidden=HIDDEN, era=era or "current")


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
             "step model (physics/mlx.py, `backend=\"cpu\"`). Setups with a release other than `current` run the "
             "step as that release did (physics/mlx_eras.py): eager, the loss on float32 or bf16 logits without "
             "the max shift, and mlx 0.24's fused attention under grad (recomputed in the backward, reproduced "
             "with `mx.checkpoint` around the attention). "
             f"**n = {out['n']}: median |error| {out['median_abs_error']:.1%}, worst {out['worst_abs_error']:.1%}.**",
             "", table(out["results"]), ""]
    pub = out.get("published")
    if pub and pub.get("n"):
        from mlx_published import render
        lines += render(pub)
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
