"""Advice past one GPU's worth of tokens (scale_advice.py): every answer is checked by re-estimating."""

from __future__ import annotations

from memfit import Request, TrainingSetup, estimate, load_hardware, load_model, report
from memfit.errors import MemfitError
from memfit.scale_advice import MAX_GPUS, TP_CHOICES, fewest_megatron_gpus, smallest_cp
from memfit.verdict import verdict


def _fits(spec, setup, hw) -> bool:
    return verdict(estimate(spec, setup), hw).status == "fits"


def test_smallest_cp_that_fits_and_no_smaller_one_does():
    spec, hw = load_model("llama-3.1-8b"), load_hardware(gpu="h100-80gb")
    setup = TrainingSetup(recipe="trl", method="full", gpus=8, shard="fsdp", seq_len=262144)
    assert not _fits(spec, setup, hw)
    chosen = smallest_cp(spec, setup, hw)
    assert chosen.cp > 1 and _fits(spec, chosen, hw)
    for n in range(2, chosen.cp):
        if 8 % n == 0:
            assert not _fits(spec, setup.replace(cp=n), hw)


def test_fewest_megatron_gpus_fits_and_half_as_many_cannot():
    spec, hw = load_model("llama-3.1-8b"), load_hardware(gpu="h100-80gb")
    setup = TrainingSetup(recipe="megatron", seq_len=131072)
    best, est = fewest_megatron_gpus(spec, setup, hw)
    assert verdict(est, hw).status == "fits" and est == estimate(spec, best)
    half = best.world_size // 2
    assert half >= 1 and best.world_size <= MAX_GPUS
    for tp in (t for t in TP_CHOICES if half % t == 0):
        for pp in (p for p in range(1, half // tp + 1) if (half // tp) % p == 0):
            for cp in (c for c in range(1, half // (tp * pp) + 1) if (half // (tp * pp)) % c == 0):
                try:
                    trial = TrainingSetup(recipe="megatron", seq_len=131072, gpus=min(half, 8),
                                          nodes=max(half // 8, 1), tp=tp, pp=pp, cp=cp, sequence_parallel=tp > 1,
                                          recompute="full", distributed_optimizer=half > tp * pp)
                    assert not _fits(spec, trial, hw), (tp, pp, cp)
                except MemfitError:
                    continue


def test_megatron_report_advises_its_own_levers():
    r = report(Request(model="llama-3.1-8b", gpu="h100-80gb",
                       setup=dict(recipe="megatron", gpus=8, tp=2, cp=4, sequence_parallel=True,
                                  recompute="selective", distributed_optimizer=True, seq_len=131072)))
    assert r.verdict.status == "does-not-fit"
    fitting = [s for s in r.suggestions if s.fits]
    assert any(s.changes.get("recompute") == "full" for s in fitting)
    for s in fitting:                      # every suggestion is a valid Megatron setup that the estimate says fits
        assert "grad_ckpt" not in s.changes and "method" not in s.changes


def test_long_context_report_offers_cp_and_offload():
    r = report(Request(model="llama-3.1-8b", gpu="h100-80gb",
                       setup=dict(recipe="trl", method="full", gpus=8, shard="fsdp", seq_len=131072)))
    changed = [set(s.changes) for s in r.suggestions if s.fits]
    assert {"cp"} in changed
    assert any("activation_offload" in c for c in changed)
