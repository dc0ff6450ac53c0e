"""Properties of the estimate that must hold for every model and setup (hypothesis)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from memfit import TrainingSetup, estimate
from memfit.recipes import RECIPES
from memfit.render.jsonout import estimate_dict
from memfit.sources.catalog import catalog_entries, spec_from_entry

SPECS = [spec_from_entry(e) for e in catalog_entries()]
# Text models for every recipe; the VLMs are drawn only where they run (mlx-lm trains text models: a VLM under
# the mlx recipe is refused, tests/test_vision.py).
models = st.sampled_from(SPECS)
TEXT_ONLY = {"mlx"}
methods = st.sampled_from(["full", "lora", "qlora"])
lengths = st.integers(min_value=16, max_value=16384)
batches = st.integers(min_value=1, max_value=16)
common = dict(
    optimizer=st.sampled_from(["adamw", "adamw-fused", "adamw-8bit", "sgd", "paged-adamw-8bit", "adafactor"]),
    grad_ckpt=st.booleans(), attn=st.sampled_from(["sdpa", "flash", "eager"]),
    recipe=st.sampled_from(["hf", "torchtune", "litgpt", "unsloth", "axolotl", "mlx"]),
    precision=st.sampled_from(["auto", "bf16", "bf16-mixed", "fp32"]),
)


def _setup(method, batch, length, spec=None, **kw):
    if spec is not None and spec.vision is not None and kw.get("recipe") in TEXT_ONLY:
        kw["recipe"] = "hf"
    if method == "qlora" and kw.get("precision") == "fp32":
        kw["precision"] = "bf16"
    recipe = kw.pop("recipe")
    if recipe == "mlx" and str(kw.get("precision")).endswith("-mixed"):
        kw["precision"] = "bf16"          # MLX has no autocast
    if kw.get("optimizer") not in RECIPES[recipe].optimizers:
        kw["optimizer"] = None            # mlx-lm has no bitsandbytes optimizers: the recipe's own
    return TrainingSetup.from_recipe(recipe, method=method, batch_size=batch, seq_len=length, **kw)


@settings(max_examples=150, deadline=None)
@given(models, methods, batches, lengths, st.fixed_dictionaries(common))
def test_memory_never_falls_as_batch_or_length_grow(spec, method, batch, length, kw):
    base = estimate(spec, _setup(method, batch, length, spec, **kw))
    more_batch = estimate(spec, _setup(method, batch + 1, length, spec, **kw))
    longer = estimate(spec, _setup(method, batch, length + 64, spec, **kw))
    assert more_batch.peak_allocated_bytes >= base.peak_allocated_bytes
    assert longer.peak_allocated_bytes >= base.peak_allocated_bytes
    assert more_batch.device_bytes >= base.device_bytes and longer.device_bytes >= base.device_bytes


@settings(max_examples=150, deadline=None)
@given(models, batches, lengths, st.fixed_dictionaries({k: common[k] for k in ("grad_ckpt", "attn", "recipe")}))
def test_qlora_never_above_lora(spec, batch, length, kw):
    if spec.norm_kind == "layernorm":
        return   # see test_layernorm_qlora_runs_its_mlp_in_fp32: a real exception
    if kw["recipe"] == "litgpt" and spec.vocab_size * spec.hidden_size > spec.params / 4:
        return   # see test_litgpt_qlora_dequantizes_a_large_head: a real exception
    qlora, lora = (estimate(spec, _setup(m, batch, length, spec, **kw)).device_bytes for m in ("qlora", "lora"))
    assert qlora <= lora


def test_litgpt_qlora_dequantizes_a_large_head():
    # Lightning's bitsandbytes plugin quantizes lm_head too, and each forward dequantizes it to fp16 and casts it
    # to bf16 (physics/litgpt.py): 4 B per head weight in flight against the 1.5 B it saves. Where the head is most
    # of the model (Gemma 3 270M: 262,144 x 640), QLoRA needs more than LoRA.
    from memfit import load_model

    spec = load_model("gemma-3-270m")
    lora, qlora = (estimate(spec, TrainingSetup(method=m, recipe="litgpt", batch_size=1, seq_len=16))
                   for m in ("lora", "qlora"))
    head = spec.vocab_size * spec.hidden_size
    assert qlora.component("logits and loss") - lora.component("logits and loss") >= 3 * head   # ~4 B, less phase
    assert qlora.device_bytes > lora.device_bytes


def test_layernorm_qlora_runs_its_mlp_in_fp32():
    # A LayerNorm under autocast returns fp32 and bitsandbytes' Linear4bit keeps its input's dtype, so QLoRA
    # saves fp32 MLP activations where LoRA's bf16 linears save bf16 ones (traced: tests via accuracy_vs_trace).
    from memfit import load_model

    spec = load_model("falcon-7b")
    lora = estimate(spec, TrainingSetup(method="lora", batch_size=12, seq_len=705))
    qlora = estimate(spec, TrainingSetup(method="qlora", batch_size=12, seq_len=705, grad_ckpt=False))
    assert qlora.component("activations") > lora.component("activations")
    assert qlora.component("weights") < lora.component("weights") / 2


@settings(max_examples=150, deadline=None)
@given(models, st.integers(1, 4), st.integers(16, 2048),
       st.fixed_dictionaries({k: common[k] for k in ("grad_ckpt", "attn", "recipe")}))
def test_lora_below_full_at_ordinary_token_counts(spec, batch, length, kw):
    # With a light adapter (r8 on q,v) and up to 8k tokens per micro-batch, the gradients and optimizer state
    # that full FT adds dominate. Same optimizer for both (torchtune's full recipe defaults to a paged 8-bit
    # optimizer stepped in backward). Heavy adapters on small models can cross over: see the test below.
    lora = estimate(spec, _setup("lora", batch, length, spec, optimizer="adamw", lora_rank=8, lora_targets=("q", "v"),
                                 lora_dropout=0.0, **kw)).device_bytes
    full = estimate(spec, _setup("full", batch, length, spec, optimizer="adamw", optimizer_in_backward=False,
                                 **kw)).device_bytes
    assert lora <= full


def test_lora_can_exceed_full_at_long_context():
    # Real physics, not a bug (huggingface/peft#1514, AutoGPTQ#185): PEFT casts each adapted module's input to
    # fp32 and saves it, so at long context LoRA's activations outgrow the states full FT adds.
    from memfit import load_model

    spec = load_model("tinyllama-1.1b")
    setup = dict(batch_size=8, seq_len=4096, lora_targets=("q", "k", "v", "o", "gate", "up", "down"),
                 precision="bf16", optimizer="adamw-8bit")
    lora = estimate(spec, TrainingSetup(method="lora", **setup))
    full = estimate(spec, TrainingSetup(method="full", **{k: v for k, v in setup.items() if k != "lora_targets"}))
    assert lora.component("activations") > full.component("activations")
    assert lora.device_bytes > full.device_bytes


@settings(max_examples=150, deadline=None)
@given(models, methods, batches, lengths, st.fixed_dictionaries(common))
def test_checkpointing_never_raises_memory(spec, method, batch, length, kw):
    kw = dict(kw, grad_ckpt=False)
    off = estimate(spec, _setup(method, batch, length, spec, **kw))
    on = estimate(spec, _setup(method, batch, length, spec, **dict(kw, grad_ckpt=True)))
    # When the peak is the bottom layer's backward (full FT, nearly all gradients alive), checkpointing holds
    # that layer's checkpoint on top of the same recomputed activations: at most one hidden state more.
    one_checkpoint = batch * length * spec.hidden_size * 4
    # A VLM's frozen vision tower joins the graph only under checkpointing (transformers'
    # enable_input_require_grads hooks the patch embedding): its blocks' checkpoints are added on top.
    tower = on.component("vision tower checkpoints")
    if on.peak_phase == "vision tower backward":
        # Llama 3.2 Vision: its frozen tower, in the graph only under checkpointing, is backpropagated through
        # (to the hooked patch embedding): that backward's working set exists only then.
        tower += on.component("backward temporaries")
    assert on.peak_allocated_bytes <= off.peak_allocated_bytes + one_checkpoint + tower


@settings(max_examples=80, deadline=None)
@given(models, methods, st.integers(min_value=4096, max_value=16384))
def test_eager_costs_more_than_sdpa_at_long_length(spec, method, length):
    # Without checkpointing (with it, the scores are recomputed one layer at a time and may not reach the peak).
    sdpa = estimate(spec, TrainingSetup(method=method, seq_len=length, attn="sdpa", grad_ckpt=False))
    eager = estimate(spec, TrainingSetup(method=method, seq_len=length, attn="eager", grad_ckpt=False))
    if spec.sdpa_supported:
        assert eager.peak_allocated_bytes > sdpa.peak_allocated_bytes
    else:   # Gemma 2 runs eager attention whatever is asked
        assert eager.peak_allocated_bytes == sdpa.peak_allocated_bytes


@settings(max_examples=150, deadline=None)
@given(models, methods, batches, lengths, st.fixed_dictionaries(common))
def test_totals_are_sums_of_components_and_json_round_trips(spec, method, batch, length, kw):
    est = estimate(spec, _setup(method, batch, length, spec, **kw))
    if est.kind == "mlx":     # one counter on Apple silicon: mx.get_peak_memory()
        assert {c.counter for c in est.components} == {"mlx"}
        assert sum(c.bytes for c in est.components) == est.device_bytes == est.extra["mlx_peak_bytes"]
        assert est.range_low_bytes <= est.device_bytes <= est.range_high_bytes
        return
    allocated = sum(c.bytes for c in est.components if c.counter == "allocated")
    reserved = allocated + sum(c.bytes for c in est.components if c.counter == "reserved")
    assert allocated == est.peak_allocated_bytes
    assert reserved == est.peak_reserved_bytes
    assert sum(c.bytes for c in est.components) == est.device_bytes
    assert est.range_low_bytes <= est.device_bytes <= est.range_high_bytes
    assert max(b for _, b in est.phases) == est.peak_allocated_bytes
    data = estimate_dict(est)
    assert json.loads(json.dumps(data)) == data
    assert sum(c["bytes"] for c in data["components"]) == data["device_bytes"]


@settings(max_examples=100, deadline=None)
@given(methods, st.sampled_from(["hf", "torchtune", "litgpt", "unsloth", "axolotl", "pytorch", "mlx"]))
def test_the_python_api_resolves_recipes_as_every_face_does(method, recipe):
    """TrainingSetup never carries a default that disagrees with the recipe (issue #13: the API said 20.01 GiB
    for QLoRA where the CLI said 10.13 GiB)."""
    direct = TrainingSetup(recipe=recipe, method=method)
    assert direct == TrainingSetup.from_recipe(recipe, method=method)
    r = RECIPES[recipe]
    for name in ("precision", "optimizer", "grad_ckpt", "attn", "quant"):
        assert getattr(direct, name) == r.default(name, method), name
    assert direct.explicit == {"recipe", "method"}
    # A field set and then changed keeps what was set; the rest follow the recipe for the new method.
    assert TrainingSetup(recipe=recipe, method="lora").replace(method=method) == direct


def test_shape_free_key_covers_every_field_but_batch_and_length():
    import dataclasses

    setup = TrainingSetup()
    names = [f.name for f in dataclasses.fields(setup) if f.compare]
    assert len(setup.shape_free_key()) == len(names) - 2

