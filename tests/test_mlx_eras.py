"""Older mlx-lm / MLX releases (physics/mlx_eras.py) and the published "Peak mem" rows mapped to them.

Formula tests run everywhere; the measured ones run a real (eager or compiled) mlx-lm step of the release in a
fresh process and skip without mlx; the published-row checks skip without the shared calibration file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit import load_model
from memfit.errors import InvalidSetupError
from memfit.physics.mlx import ALL_TARGETS, mlx_estimate
from memfit.physics.mlx_eras import ERAS

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SMALL = dict(hidden_size=256, num_heads=4, num_kv_heads=1, intermediate_size=1024, num_layers=2, vocab_size=8192,
             hf_config_json=None, exact_params=None)


def small_llama():
    return load_model("meta-llama/Llama-3.2-1B", allow_network=False).replace(name="llama small", **SMALL)


def test_recompute_keeps_no_softmax_and_rebuilds_one_layer_of_it():
    spec, b, s, n = small_llama(), 2, 512, 2
    kw = dict(batch_size=b, seq_len=s, train_layers=n, targets=("q", "v"))
    comp = mlx_estimate(spec, attention_grad="composite", **kw)
    rec = mlx_estimate(spec, attention_grad="recompute", **kw)
    softmax_one_layer = b * spec.num_heads * s * s * 2            # (B, heads, S, S) bf16
    assert comp.saved_activations - rec.saved_activations == n * softmax_one_layer
    assert rec.backward_workspace - comp.backward_workspace == softmax_one_layer


def test_loss_kernels_count_their_logit_buffers():
    spec, tokens = small_llama(), 2 * 512
    logits = tokens * spec.vocab_size
    by_kernel = {k: mlx_estimate(spec, batch_size=2, seq_len=512, train_layers=2, loss_kernel=k).logits_and_loss
                 for k in ("fused", "composite", "composite-shifted", "fp32-composite")}
    assert by_kernel == {"fused": 2 * logits * 2, "composite": 3 * logits * 2, "composite-shifted": 4 * logits * 2,
                         "fp32-composite": 4 * logits * 4}
    with pytest.raises(InvalidSetupError):
        mlx_estimate(spec, loss_kernel="liger")
    with pytest.raises(InvalidSetupError):
        mlx_estimate(spec, attention_grad="flash")


def test_eager_step_peaks_at_the_larger_transient():
    spec = small_llama()
    kw = dict(batch_size=2, seq_len=512, train_layers=2, loss_kernel="fp32-composite")
    eager, compiled = mlx_estimate(spec, compiled=False, **kw), mlx_estimate(spec, compiled=True, **kw)
    base = eager.persistent + eager.gradients + eager.saved_activations
    assert eager.mlx_peak_bytes == base + max(eager.logits_and_loss, eager.backward_workspace)
    assert compiled.mlx_peak_bytes == base + eager.logits_and_loss + eager.backward_workspace


def test_eras_follow_their_sources():
    llama = load_model("meta-llama/Llama-3.2-1B", allow_network=False)      # model_type llama, head dim 64
    qwen3 = load_model("Qwen/Qwen3-0.6B", allow_network=False)               # qwen3: not in the q,v list
    assert ERAS["mlx-lm-2024"].peak_unit_bytes == 2 ** 30 and ERAS["mlx-lm-0.20"].peak_unit_bytes == 1e9
    assert ERAS["mlx-lm-0.22"].estimate_kwargs(llama, ALL_TARGETS) == dict(
        loss_kernel="fp32-composite", attention_grad="recompute", compiled=False, targets=("q", "v"))
    assert ERAS["mlx-lm-0.25"].default_targets(qwen3.model_type, ALL_TARGETS) == ALL_TARGETS
    assert ERAS["mlx-lm-0.28"].default_targets(llama.model_type, ALL_TARGETS) == ALL_TARGETS
    assert ERAS["current"].loss_kernel == "fused" and ERAS["current"].compiled


@pytest.mark.parametrize("era,batch,seq,vocab", [("mlx-lm-2024", 2, 256, 16384), ("mlx-lm-0.22", 1, 512, 1024)])
def test_era_step_matches_a_real_mlx_step(era, batch, seq, vocab):
    """The release's step run for real (benchmarks/mlx_measure.py measure(), in its own process)."""
    pytest.importorskip("mlx_lm")
    code = (f"import sys, json; sys.path.insert(0, {str(BENCH)!r}); import mlx_measure as m; "
            f"print(json.dumps(m.measure('llama-3.2-1b', 'lora-qv', {batch}, {seq}, 2, 2, False, {vocab}, 'bf16', "
            f"{era!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert abs(r["error"]) < 0.12, r


def _published():
    sys.path.insert(0, str(BENCH))
    import mlx_published
    if not mlx_published.CSV.is_file():
        pytest.skip("shared/calibration/mlx-measured.csv not present")
    return mlx_published.compare(mlx_published.CSV)


def test_every_published_row_is_mapped_or_explained():
    pub = _published()
    assert pub["rows"] and all(("error" in r) != ("skipped" in r) for r in pub["rows"])
    assert all(r["skipped"] != "no mapping for this row yet" for r in pub["rows"] if "skipped" in r)
    mapped = {r["id"]: r for r in pub["rows"] if "error" in r}
    # The rows whose padded length is known (M10: every row full length; M04: the cap reached by the step
    # reported) check the model; a row that gives only the cap must fall between the estimates at its floor
    # (its own tokens per step / batch) and at the cap.
    assert {"M04", "M10"} <= {i for i, r in mapped.items() if r["lengths"] == "real"}
    assert all(abs(r["error"]) <= 0.12 for r in mapped.values() if r["lengths"] == "real")
    cap = [r for r in mapped.values() if r["lengths"] == "cap"]
    assert cap and all(r["range_error"] == 0 and r["floor_estimated_gb"] <= r["measured_gb"] <= r["estimated_gb"]
                       for r in cap)
    assert mapped["M04"]["unit"] == "GiB"


def test_default_knobs_that_cannot_fit_the_reading_leave_the_row_out():
    # M22: rank 128 on every Linear of mlx-lm's default 16 layers (adapters, gradients and Adam in float32)
    # plus the 4-bit Qwen3-8B is above the 5.0 GB reading at any length.
    skipped = {r["id"]: r["skipped"] for r in _published()["rows"] if "skipped" in r}
    assert "not the defaults" in skipped["M22"]


def test_implied_length_is_where_the_estimate_crosses_the_reading():
    sys.path.insert(0, str(BENCH))
    import mlx_published
    row = mlx_published.PUBLISHED["M05"]
    low, high = (mlx_published.estimate_row(row, s).mlx_peak_bytes for s in (row.floor_seq_len, row.seq_len))
    reading = (low + high) / 2
    s = mlx_published.implied_seq_len(row, reading)
    assert row.floor_seq_len <= s < row.seq_len
    assert mlx_published.estimate_row(row, s).mlx_peak_bytes <= reading < mlx_published.estimate_row(
        row, s + 1).mlx_peak_bytes
    assert mlx_published.implied_seq_len(row, high * 1.01) is None
    assert mlx_published.range_error(reading, low, high) == 0
    assert mlx_published.range_error(high / 2, low, high) == pytest.approx(low / (high / 2) - 1)


def test_gemma2_soft_capping_keeps_one_tanh_output_each():
    gemma2 = load_model("google/gemma-2-9b", allow_network=False).replace(
        name="gemma2 small", hidden_size=256, num_heads=2, num_kv_heads=1, intermediate_size=1024, num_layers=2,
        vocab_size=8192, hf_config_json=None, exact_params=None)
    uncapped = gemma2.replace(attn_logit_softcap=None, final_logit_softcap=None)
    b, s, n = 2, 256, 2
    kw = dict(batch_size=b, seq_len=s, train_layers=n)
    capped, plain = mlx_estimate(gemma2, **kw), mlx_estimate(uncapped, **kw)
    assert capped.saved_activations - plain.saved_activations == n * b * s * gemma2.num_heads * s * 2
    assert capped.logits_and_loss - plain.logits_and_loss == b * s * gemma2.vocab_size * 2
    # four norms and gelu_approx: two more (tokens, hidden) norm inputs and two more (tokens, intermediate)
    llama_like = uncapped.replace(norms_per_layer=2, activation="silu")
    assert (plain.activation_bytes_per_token_layer - mlx_estimate(llama_like, **kw).activation_bytes_per_token_layer
            == 2 * 256 * 2 + 2 * 1024 * 2)


@pytest.mark.parametrize("family,method,era", [("gemma-2-9b", "lora", None), ("gemma-2-9b", "lora-qv", "mlx-lm-0.20")])
def test_gemma_step_matches_a_real_mlx_step(family, method, era):
    """mlx-lm's own gemma2 model class, scaled (benchmarks/mlx_measure.py measure(), in its own process)."""
    pytest.importorskip("mlx_lm")
    code = (f"import sys, json; sys.path.insert(0, {str(BENCH)!r}); import mlx_measure as m; "
            f"print(json.dumps(m.measure({family!r}, {method!r}, 2, 128, 2, 2, False, 8192, 'bf16', {era!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert abs(r["error"]) < 0.10, r
