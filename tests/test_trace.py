"""The trace against real execution: the same training steps run on real CPU tensors under PyTorch's own
MemTracker (torch.distributed._tools.mem_tracker) must peak where the fake-tensor trace says, within 2%.

Small models (2-4 million parameters) of several families, full FT / LoRA / QLoRA, checkpointing on
and off, SDPA and eager. Skipped without the [trace] extra.
"""

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from memfit import TrainingSetup, estimate  # noqa: E402
from memfit.errors import SourceError  # noqa: E402
from memfit.physics.stack import resolve_stack  # noqa: E402
from memfit.spec import ModelSpec  # noqa: E402
from memfit.trace import trace  # noqa: E402
from memfit.trace.build import build  # noqa: E402
from memfit.trace.step import (cuda_like_kernels, make_inputs, make_optimizer, materialize,  # noqa: E402
                               run_steps, train_step)
from memfit.trace.tracker import PeakTracker  # noqa: E402

TINY = {
    "llama": dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True),
    "gemma2": dict(model_type="gemma2", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh"),
    "phi3": dict(model_type="phi3", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=4096, pad_token_id=0),
}
SETUPS = {
    "full": dict(method="full", precision="bf16", optimizer="adamw"),
    "full-mixed-fused": dict(method="full", precision="bf16-mixed", optimizer="adamw-fused"),
    "lora": dict(method="lora", lora_targets=("q", "k", "v", "o", "gate", "up", "down"), lora_rank=8),
    "lora-gc": dict(method="lora", grad_ckpt=True, optimizer="adamw"),
    "full-gc-eager": dict(method="full", precision="bf16", grad_ckpt=True, attn="eager", optimizer="adamw"),
}


def _spec(family):
    return ModelSpec.from_hf_config(dict(TINY[family], torch_dtype="bfloat16"), name=f"tiny-{family}",
                                    source="test")


def _fake_peak(spec, setup):
    tracker = PeakTracker(round_to=1)        # real CPU tensors are not rounded: compare like with like
    stack = resolve_stack(spec, setup)
    run_steps(spec, setup, stack, build(spec, setup, stack), tracker)
    return tracker.peak


class _NoHandle:
    def remove(self):
        pass


def _real_peak(spec, setup, monkeypatch):
    from torch.distributed._tools.mem_tracker import MemTracker

    # MemTracker registers grad hooks on every parameter of a module it enters, frozen ones included, which
    # torch refuses; a frozen parameter never gets a gradient, so skipping its hook loses nothing.
    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, hook, original=original:
                            original(self, hook) if self.requires_grad else _NoHandle())

    stack = resolve_stack(spec, setup)
    built = build(spec, setup, stack)
    materialize(built, fake=False)
    model = built.model
    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], setup)
    inputs = make_inputs(spec, setup)
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *inputs.values())
    names = PeakTracker()
    with cuda_like_kernels(setup, None), tracker:
        for step in range(2):
            train_step(model, optimizer, inputs, stack, 1, names)
            if step == 0:
                tracker.reset_mod_stats()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("name", sorted(SETUPS))
def test_trace_matches_real_execution(family, name, monkeypatch):
    spec = _spec(family)
    setup = TrainingSetup(batch_size=2, seq_len=128, **SETUPS[name])
    if family == "gemma2" and setup.attn == "sdpa":
        setup = setup.replace(attn="eager")  # transformers has no SDPA path for Gemma 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake, real = _fake_peak(spec, setup), _real_peak(spec, setup, monkeypatch)
    assert fake == pytest.approx(real, rel=0.02)


def test_trace_reports_components_phase_and_the_4bit_accounting():
    spec = _spec("llama")
    measured = trace(spec, TrainingSetup(method="qlora", batch_size=2, seq_len=64))
    assert measured.kind == "trace"
    names = {c.name for c in measured.components}
    assert {"weights", "activations", "logits and loss", "CUDA context"} <= names
    assert measured.peak_phase.startswith(("forward", "backward", "loss", "optimizer step"))
    assert any("4-bit storage" in line for line in measured.extra["accounted"])
    assert sum(c.bytes for c in measured.components) == measured.device_bytes


def test_trace_and_estimate_agree_on_a_llama_layer():
    # The activation walk and the trace agree to the byte per layer (memory-physics §9.1 shape).
    def layer_bytes(layers):
        spec = ModelSpec.from_hf_config(dict(model_type="llama", hidden_size=512, intermediate_size=1408,
                                             num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                                             head_dim=64, vocab_size=32000, tie_word_embeddings=False),
                                        name="s", source="t")
        setup = TrainingSetup(method="full", precision="bf16", optimizer="adamw", batch_size=2, seq_len=256)
        return trace(spec, setup).component("activations"), estimate(spec, setup).component("activations")
    (t2, e2), (t4, e4) = layer_bytes(2), layer_bytes(4)
    assert (t4 - t2) / 2 == (e4 - e2) / 2 == 11_292_672


def test_untraceable_setups_are_clear_errors():
    from memfit import load_model

    with pytest.raises(Exception, match="bare size"):
        trace(load_model("7B"), TrainingSetup())
    bad = ModelSpec.from_hf_config(dict(TINY["llama"], auto_map={"AutoModel": "x.Y"}), name="remote", source="t")
    with pytest.raises(SourceError, match="remote code"):
        trace(bad, TrainingSetup())
