"""The memory-saving optimizers against the packages themselves: each one steps a small model (a catalog config,
shrunk) on real CPU tensors under the trace's allocation tracker, and the bytes it keeps and the peak of its
step's temporaries must be what physics/optimizers.py says.

Needs the optimizer packages (pip install galore-torch apollo-torch adam-mini lion-pytorch came-pytorch
lomo-optim q-galore-torch; bitsandbytes for the 8-bit ones); each test skips when its package is missing.
"""

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memfit import TrainingSetup, estimate, load_model  # noqa: E402
from memfit.errors import InvalidSetupError  # noqa: E402
from memfit.physics import optimizers  # noqa: E402
from memfit.physics.stack import resolve_stack  # noqa: E402
from memfit.spec import ModelSpec  # noqa: E402

# bitsandbytes runs its 8-bit optimizers on the CPU with fp32 fallbacks, not the CUDA kernels that allocate nothing:
# their state layout is checked, their step temporaries are not.
CPU_KERNELS_DIFFER = ("lion-8bit", "galore-8bit")
STEPPED = ("galore", "galore-8bit", "apollo", "muon", "adam-mini", "lion", "lion-8bit", "came")
# Ranks below the matrices' sides, so the projection is really low-rank at this size.
KNOBS = {"galore": {"galore_rank": 32}, "galore-8bit": {"galore_rank": 32}, "apollo": {"apollo_rank": 16}}


def small_catalog_model() -> ModelSpec:
    """Llama 3.2 1B's catalog config (tied embeddings, GQA, SwiGLU), two layers of width 256, vocabulary 512: the
    MLP matrices are the largest tensors, as in a real model."""
    config = json.loads(load_model("llama-3.2-1b").hf_config_json)
    config.update(num_hidden_layers=2, hidden_size=256, intermediate_size=688, vocab_size=512,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    return ModelSpec.from_hf_config(config, name="small-llama-3.2", source="test")


def _real_model(spec, setup):
    from memfit.trace.build import build
    from memfit.trace.step import materialize

    stack = resolve_stack(spec, setup)
    built = build(spec, setup, stack)
    materialize(built, fake=False)
    return built.model, stack


def _measure_step(name, setup, monkeypatch, since_start=False):
    """(bytes the optimizer keeps after two steps, the largest step's temporaries), counted by the tracker.
    `since_start`: temporaries above what was alive when the step began (not when it ended), for an optimizer
    whose step shrinks the gradients it leaves behind."""
    from memfit.trace.optimizers import make
    from memfit.trace.tracker import PeakTracker

    # galore-torch's 8-bit step calls torch.cuda.synchronize() (adamw8bit.py:65): nothing to wait for on a CPU.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    # GaLore / APOLLO refresh the projection on every step here (trace/optimizers.py UPDATE_PROJ_GAP): the second
    # step is a refresh with all state alive
    spec = small_catalog_model()
    model, stack = _real_model(spec, setup)
    params = [p for p in model.parameters() if p.requires_grad]
    tracker = PeakTracker(round_to=1)
    for t in list(model.parameters()) + list(model.buffers()):
        tracker.add(t, "weights")
    weights = tracker.current
    temps = []
    with tracker, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = make(name, model, setup)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            tracker.peak = start = tracker.current
            optimizer.step()
            # the first step also allocates the state: use the second
            temps.append(tracker.peak - (start if since_start else tracker.current))
            for p in params:
                p.grad = None
    return spec, stack, tracker.current - weights, temps[-1]


@pytest.mark.parametrize("name", STEPPED)
def test_state_and_step_temporaries_are_what_the_package_allocates(name, monkeypatch):
    package = optimizers.OPTIMIZER_FACTS[name]
    if name != "muon":
        from memfit.trace.optimizers import PACKAGES, _MODULES
        pytest.importorskip(_MODULES[PACKAGES[name]])
    setup = TrainingSetup(method="full", precision="bf16", optimizer=name, **KNOBS.get(name, {}))
    spec, stack, kept, temp = _measure_step(name, setup, monkeypatch)
    state, note = optimizers.state_bytes(spec, setup, stack)
    assert package.package in note
    # bitsandbytes' CPU path keeps a few hundred bytes of quantization maps the CUDA one shares
    assert state == pytest.approx(kept, rel=1e-3, abs=2048)
    if name not in CPU_KERNELS_DIFFER:
        # GaLore's first step: LAPACK's SVD workspace is not modelled (2% here)
        assert optimizers.step_temp_bytes(spec, setup, stack)[0] == pytest.approx(temp, rel=0.03)


def test_q_galore_step_temporaries_around_the_in_place_update(monkeypatch):
    # bitsandbytes' CUDA blockwise 8-bit Adam updates the parameter and both states in place, allocating nothing;
    # its CPU fallback does not, and q-galore-torch 1.0 calls it with bitsandbytes < 0.50's arguments (absmax2 is
    # missing in 0.50.2's signature). With the update stubbed, what remains is q-galore-torch's own step (projection,
    # weight clone, project_back) and the state init_state allocates, which the formulas price. The step frees
    # each target's full gradient (p.grad = its projection), so its peak is measured from the step's start.
    pytest.importorskip("q_galore_torch")
    import bitsandbytes.functional as bnb_functional

    for kernel in ("optimizer_update_8bit_blockwise", "optimizer_update_32bit"):
        monkeypatch.setattr(bnb_functional, kernel, lambda *a, **k: None)
    setup = TrainingSetup(method="full", precision="bf16", optimizer="q-galore", galore_rank=32)
    spec, stack, kept, temp = _measure_step("q-galore", setup, monkeypatch, since_start=True)
    assert optimizers.state_bytes(spec, setup, stack)[0] == pytest.approx(kept, rel=1e-3, abs=2048)
    assert optimizers.step_temp_bytes(spec, setup, stack)[0] == pytest.approx(temp, rel=0.03)


def test_q_galore_stores_the_projection_in_a_quarter_of_galore_8bit_s_bytes():
    # The same moments; the r x min(m, n) projection in uint8 (+ a 16-bit scale and zero per 256) instead of bf16.
    spec = small_catalog_model()
    q8 = {}
    for name in ("galore-8bit", "q-galore"):
        setup = TrainingSetup(method="full", precision="bf16", optimizer=name, galore_rank=32)
        q8[name] = optimizers.state_bytes(spec, setup, resolve_stack(spec, setup))[0]
    stack = resolve_stack(spec, TrainingSetup(method="full", precision="bf16", optimizer="q-galore"))
    projections = sum(32 * min(s.rows, s.cols) * s.count for s in optimizers.trainable_shapes(spec, stack)
                      if s.role == "matrix")
    vectors = sum(min(s.rows, s.cols) * s.count for s in optimizers.trainable_shapes(spec, stack)
                  if s.role == "matrix")
    assert q8["galore-8bit"] - q8["q-galore"] == 2 * projections - (projections + 4 * projections // 256) - 2 * vectors


@pytest.mark.parametrize("name", ("lomo", "adalomo"))
def test_lomo_keeps_its_state_and_frees_each_gradient_in_backward(name, monkeypatch):
    lomo_optim = pytest.importorskip("lomo_optim")
    from memfit.trace.tracker import PeakTracker

    # AdaLomo creates its states with .cuda() (adalomo.py:93-96): keep them on the CPU for the count.
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    setup = TrainingSetup(method="full", precision="bf16", optimizer=name)
    assert setup.optimizer_in_backward          # implied: LOMO updates inside backward
    spec = small_catalog_model()
    model, stack = _real_model(spec, setup)
    tracker = PeakTracker(round_to=1)
    for p in model.parameters():
        tracker.add(p, "weights")
    weights = tracker.current
    with tracker, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = (lomo_optim.AdaLomo if name == "adalomo" else lomo_optim.Lomo)(model, lr=1e-4)
        kept = tracker.current - weights
        largest = max(model.parameters(), key=lambda p: p.numel())
        largest.grad = torch.randn_like(largest)
        tracker.peak = before = tracker.current
        optimizer.grad_func(0)                  # the hook backward runs once this gradient is ready
        temp = tracker.peak - before
        assert largest.grad is None             # freed inside the update
    assert optimizers.state_bytes(spec, setup, stack)[0] == kept
    # the formula also holds the next gradient, computed but not yet accumulated when the hook runs in backward;
    # this isolated call has none
    next_gradient = 2 * largest.numel()
    assert optimizers.step_temp_bytes(spec, setup, stack)[0] == pytest.approx(temp + next_gradient, rel=0.01)
    # the estimate keeps one tensor's gradient at a time, not all of them
    from memfit.physics.states import gradient_bytes

    full = TrainingSetup(method="full", precision="bf16", optimizer="adamw")
    assert gradient_bytes(spec, setup, stack) == 2 * largest.numel() < gradient_bytes(spec, full, stack) / 4


def test_low_rank_state_follows_the_rank_and_undercuts_adamw():
    spec = load_model("llama-3.2-1b")
    adamw = estimate(spec, TrainingSetup(method="full", optimizer="adamw")).component("optimizer state")
    r128 = estimate(spec, TrainingSetup(method="full", optimizer="galore")).component("optimizer state")
    r512 = estimate(spec, TrainingSetup(method="full", optimizer="galore", galore_rank=512)).component(
        "optimizer state")
    assert r128 < r512 < adamw
    # the decoder matrices' share: 16 layers x 7 matrices, 2 r x larger side + r x smaller side, bf16
    stack = resolve_stack(spec, TrainingSetup(method="full", optimizer="galore"))
    shapes = optimizers.trainable_shapes(spec, stack)
    matrices = sum(2 * s.count * (2 * 128 * max(s.rows, s.cols) + 128 * min(s.rows, s.cols))
                   for s in shapes if s.role == "matrix")
    others = sum(2 * 2 * s.count * s.numel for s in shapes if s.role != "matrix")
    assert r128 == matrices + others


def test_setup_rules_for_these_optimizers():
    with pytest.raises(InvalidSetupError, match="method"):
        TrainingSetup(method="lora", optimizer="galore")
    with pytest.raises(InvalidSetupError, match="galore_rank"):
        TrainingSetup(method="full", optimizer="adamw", galore_rank=64)
    with pytest.raises(InvalidSetupError, match="optimizer_in_backward"):
        TrainingSetup(method="full", optimizer="lomo", optimizer_in_backward=False)
    with pytest.raises(InvalidSetupError, match="accumulate"):
        TrainingSetup(method="full", optimizer="lomo", grad_accum=4)
    with pytest.raises(InvalidSetupError, match="ZeRO"):
        TrainingSetup(method="full", optimizer="muon", gpus=2, shard="zero2")
    assert TrainingSetup(method="full", optimizer="muon", gpus=2, shard="fsdp").shard == "fsdp"
    with pytest.raises(InvalidSetupError, match="adam-mini cannot split"):
        estimate(load_model("gemma-3-1b"), TrainingSetup(method="full", optimizer="adam-mini"))
    assert TrainingSetup(method="full", optimizer="galore_adamw").optimizer == "galore"   # the HF name
    assert TrainingSetup(method="lora", optimizer="lion").optimizer_in_backward is False


def test_readme_optimizer_table_is_the_facts_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("<!-- optimizers -->\n", 1)[1].split("\n<!-- /optimizers -->", 1)[0]
    assert table == optimizers.readme_table(), "run python tools/readme_flags.py"
    from memfit.options import OPTIMIZERS

    assert set(optimizers.OPTIMIZER_FACTS) <= set(OPTIMIZERS)


@pytest.mark.parametrize("name", ("galore", "muon", "adam-mini", "lion", "came", "lomo", "lion-8bit"))
def test_trace_runs_the_optimizer_and_agrees_with_the_estimate(name):
    from memfit.trace import trace
    from memfit.trace.optimizers import PACKAGES, _MODULES

    if name in PACKAGES:
        pytest.importorskip(_MODULES[PACKAGES[name]])
    spec = small_catalog_model()
    # short sequences: the optimizer's own memory decides the peak
    setup = TrainingSetup(method="full", precision="bf16", optimizer=name, batch_size=1, seq_len=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    predicted = estimate(spec, setup)
    assert predicted.peak_allocated_bytes == pytest.approx(measured.peak_allocated_bytes, rel=0.01)


def test_untraceable_optimizers_say_so():
    from memfit.errors import SourceError
    from memfit.trace import trace

    pytest.importorskip("apollo_torch")
    setup = TrainingSetup(method="full", precision="bf16", optimizer="apollo", batch_size=1, seq_len=32)
    with pytest.raises(SourceError, match="memfit estimate"):
        trace(small_catalog_model(), setup)
