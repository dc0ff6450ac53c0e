"""ORPO, CPO/SimPO, GRPO and GKD: TRL 1.16's own losses traced on fake tensors are the oracle for the estimate
(trace/rl_trainers.py, physics/trainers.py concatenated_logits_loss and gkd_loss_bytes)."""

import warnings

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.physics import trainers as physics

from conftest import small_llama


def _both(spec, setup):
    from memfit.trace import trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    return estimate(spec, setup), measured


@pytest.mark.parametrize("kw", [
    dict(trainer="orpo", method="lora", batch_size=2, seq_len=256, prompt_len=128),
    dict(trainer="simpo", method="full", batch_size=1, seq_len=256, prompt_len=64, grad_ckpt=False),
    dict(trainer="cpo", method="lora", batch_size=1, seq_len=128, prompt_len=64, grad_ckpt=False),
])
def test_orpo_and_cpo_match_their_concatenated_forward(kw):
    pytest.importorskip("trl")
    est, measured = _both(small_llama(), TrainingSetup(recipe="trl", **kw))
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01
    # the loss holds three fp32 logits buffers of the 2B rows at its backward peak (the docstring's count)
    rows_tokens_vocab = 2 * kw["batch_size"] * kw["seq_len"] * 32000
    assert measured.component("logits and loss") >= 3 * 4 * rows_tokens_vocab


@pytest.mark.parametrize("ref", ["none", "adapter-off"])
def test_grpo_step_with_and_without_a_reference(ref):
    pytest.importorskip("trl")
    setup = TrainingSetup(recipe="trl", trainer="grpo", method="lora", ref_model=ref, batch_size=2, grad_accum=2,
                          prompt_len=128, completion_len=128, num_generations=4)
    est, measured = _both(small_llama(), setup)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01
    # generation is accounted from the formula, on top of the traced state, and said so
    phases = dict(measured.phases)
    kv = physics.kv_cache_bytes(small_llama(), 4, 256, 2)       # B x grad_accum sequences of 256 tokens, bf16
    assert phases["generation (accounted)"] > kv
    assert any("generation not traced" in a for a in measured.assumptions)


def test_gkd_teacher_and_jsd_match_the_trace():
    pytest.importorskip("trl")
    spec = load_model("smollm2-135m", allow_network=False)
    setup = TrainingSetup(recipe="trl", trainer="gkd", teacher="smollm2-360m", method="lora", batch_size=1,
                          prompt_len=64, completion_len=64)
    est, measured = _both(spec, setup)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01
    assert measured.component("teacher model") == pytest.approx(est.component("teacher model"), rel=0.01)
    # the old count (teacher logits + 10 V-sized tensors in the compute dtype) was a third too low
    assert est.component("teacher logits and JSD") == physics.gkd_loss_bytes(spec, setup, _stack(spec, setup))


def _stack(spec, setup):
    from memfit.physics.stack import resolve_stack

    return resolve_stack(spec, physics.micro_setup(setup))


def test_gkd_refuses_a_teacher_of_another_vocabulary():
    from memfit.errors import InvalidSetupError

    spec = load_model("smollm2-135m", allow_network=False)
    setup = TrainingSetup(recipe="trl", trainer="gkd", teacher="qwen2.5-0.5b", batch_size=1, prompt_len=64,
                          completion_len=64)
    with pytest.raises(InvalidSetupError, match="vocabulary"):
        estimate(spec, setup)


def test_grpo_peak_at_generation_is_the_traced_state_plus_the_formulas_kv_cache():
    """Long completions of many sequences: the KV cache outgrows the training step, so the trace's peak is the
    generation phase, made of the state it traced after the optimizer step and HF generate's accounted parts."""
    pytest.importorskip("trl")
    spec = small_llama(num_hidden_layers=16, vocab_size=1000)
    setup = TrainingSetup(recipe="trl", trainer="grpo", method="lora", batch_size=2, grad_accum=16, prompt_len=64,
                          completion_len=1984, num_generations=8)
    est, measured = _both(spec, setup)
    assert measured.peak_phase == "generation (accounted)"
    # 32 sequences (batch x accumulation) of 2048 tokens: K and V of 16 layers x 2 heads x 64 in bf16
    assert measured.component("generation KV cache") == 2 * 16 * 2 * 64 * 2048 * 32 * 2
    assert measured.component("gradients") == 0          # set_to_none after the step: none while generating
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01
