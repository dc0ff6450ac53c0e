"""--compile: the compiled layer's saved set (physics/compile.py) against the closed forms of the min-cut
partitioner's rules, the measured share, the option's faces, and the trace's refusal."""

import subprocess
import sys

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.physics import activations as act
from memfit.physics import compile as compiled
from memfit.physics.stack import resolve_stack


def _coeffs(spec, **kw):
    setup = TrainingSetup(precision="bf16", grad_ckpt=False, batch_size=1, seq_len=1024, **kw)
    return act.layer_coefficients(spec, setup, resolve_stack(spec, setup))


def test_partitioner_saved_set_for_llama_full_fine_tuning(monkeypatch):
    """With the whole ideal saving: each norm keeps its bf16 input and fp32 rstd, attention keeps q, k, v, out and
    the logsumexp, the MLP keeps gate and up outputs: 4h + 4qd + 4kvd + 4i + 4a + 8 bytes per token, against the
    eager 16h + 4qd + 4kvd + 8i + 4a + 8 (memory-physics.md section 3.3)."""
    spec = load_model("llama-3.2-3b")
    h, qd, kvd, i, a = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size, spec.num_heads
    assert _coeffs(spec, method="full") == (16 * h + 4 * qd + 4 * kvd + 8 * i + 4 * a + 8, 0)
    monkeypatch.setattr(compiled, "COMPILE_REALIZED_SHARE", 1.0)
    assert _coeffs(spec, method="full", compile=True) == (4 * h + 4 * qd + 4 * kvd + 4 * i + 4 * a + 8, 0)
    monkeypatch.setattr(compiled, "COMPILE_REALIZED_SHARE", 0.0)
    assert _coeffs(spec, method="full", compile=True) == _coeffs(spec, method="full")


def test_realized_share_sits_between_eager_and_ideal():
    spec = load_model("llama-3.2-3b")
    eager = _coeffs(spec, method="full")[0]
    h, qd, kvd, i, a = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size, spec.num_heads
    ideal = 4 * h + 4 * qd + 4 * kvd + 4 * i + 4 * a + 8
    got = _coeffs(spec, method="full", compile=True)[0]
    assert got == round(eager - compiled.COMPILE_REALIZED_SHARE * (eager - ideal))
    assert ideal < got < eager


def test_compiled_lora_drops_dropout_masks_and_keeps_adapter_outputs(monkeypatch):
    spec = load_model("llama-3.2-3b")
    monkeypatch.setattr(compiled, "COMPILE_REALIZED_SHARE", 1.0)
    plain = _coeffs(spec, method="lora", lora_dropout=0.0, compile=True)
    dropped = _coeffs(spec, method="lora", lora_dropout=0.1, compile=True)
    assert plain == dropped                       # philox replay: no mask, no dropout output saved
    assert _coeffs(spec, method="lora", lora_dropout=0.1)[0] > plain[0]


def test_compile_changes_only_activations_and_says_so():
    spec = load_model("llama-3.2-3b")
    base = dict(method="full", precision="bf16", grad_ckpt=False, batch_size=2, seq_len=4096, recipe="torchtune",
                loss="plain")
    eager, comp = estimate(spec, TrainingSetup(**base)), estimate(spec, TrainingSetup(**base, compile=True))
    assert comp.component("weights") == eager.component("weights")
    assert comp.component("activations") < eager.component("activations")
    assert any("torch.compile" in a for a in comp.assumptions)
    assert not any("torch.compile" in a for a in eager.assumptions)


def test_trace_refuses_a_compiled_step():
    pytest.importorskip("torch")
    from memfit.trace.measure import trace_fake

    with pytest.raises(InvalidSetupError, match="compile"):
        trace_fake(load_model("llama-3.2-1b"), TrainingSetup(compile=True, batch_size=1, seq_len=16))


def test_cli_flag():
    out = subprocess.run([sys.executable, "-m", "memfit", "estimate", "llama-3.2-1b", "--compile", "--format",
                          "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "torch.compile" in out.stdout
