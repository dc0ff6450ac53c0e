"""LitGPT's own memory facts (physics/litgpt.py), each checked against the torch ops LitGPT's code runs.

The code paths are small copies of Lightning-AI/litgpt@e5493986 (litgpt/model.py CausalSelfAttention.forward's
qkv split, litgpt/lora.py LoRAQKVLinear.zero_pad) and of bitsandbytes@0.42.0 MatMul4Bit's ctx.tensors, run on
real CPU tensors under saved-tensor hooks or with weak references."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from memfit import TrainingSetup, estimate  # noqa: E402
from memfit.estimator import _as_built_by  # noqa: E402
from memfit.physics import activations as act  # noqa: E402
from memfit.physics import litgpt  # noqa: E402
from memfit.physics.stack import resolve_stack  # noqa: E402
from memfit.spec import ModelSpec  # noqa: E402

H, HEADS, GROUPS, HEAD_DIM, FFN, VOCAB, LAYERS = 256, 8, 2, 32, 704, 1000, 2


def _spec(model_type="llama", kv_heads=GROUPS, **extra):
    config = dict(model_type=model_type, hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=kv_heads, head_dim=HEAD_DIM, vocab_size=VOCAB,
                  torch_dtype="bfloat16", tie_word_embeddings=False, **extra)
    return ModelSpec.from_hf_config(config, name="tiny", source="test")


def _setup(recipe="litgpt-0.4", **kw):
    base = dict(recipe=recipe, method="lora", batch_size=2, seq_len=64, lora_rank=8, lora_targets=("q", "v"),
                lora_dropout=0.05)
    base.update(kw)
    return TrainingSetup(**base)


def _saved_bytes(fn):
    """Bytes of the distinct storages autograd saves while fn runs (parameters excluded by the caller)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, storages


def test_grouped_kv_reaches_sdpa_repeated_to_every_head():
    """litgpt model.py: qkv.view -> permute -> split, k/v expanded to q_per_kv and reshaped (a copy): SDPA saves
    q-sized k and v; the walk counts them so, and nothing of the fused qkv output."""
    B, T = 2, 16
    qpk = HEADS // GROUPS
    qkv = torch.randn(B, T, (HEADS + 2 * GROUPS) * HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)

    def attention():
        x = qkv.view(B, T, GROUPS, qpk + 2, HEAD_DIM).permute(0, 2, 3, 1, 4)
        q, k, v = x.split((qpk, 1, 1), dim=2)
        k = k.expand(B, GROUPS, qpk, T, HEAD_DIM).reshape(B, -1, T, HEAD_DIM)
        v = v.expand(B, GROUPS, qpk, T, HEAD_DIM).reshape(B, -1, T, HEAD_DIM)
        q = q.reshape(B, -1, T, HEAD_DIM)
        q, k = torch.cat((q * 1, q[..., HEAD_DIM:]), -1), torch.cat((k * 1, k[..., HEAD_DIM:]), -1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    _, saved = _saved_bytes(attention)
    sizes = sorted(saved.values())
    q_bytes = B * T * HEADS * HEAD_DIM * 2
    assert sizes.count(q_bytes) >= 3                       # q, k, v (and the output) all q-sized
    assert qkv.untyped_storage().nbytes() not in sizes       # the fused output is not kept

    spec, setup = _spec(), _setup()
    built = _as_built_by(spec, setup)
    with_repeat = act.layer_coefficients(built, setup, resolve_stack(built, setup))[0]
    hf = _setup(recipe="lit-gpt")          # repeats grouped k/v too: same walk
    assert act.layer_coefficients(built, hf, resolve_stack(built, hf))[0] == with_repeat
    # Against the walk without repeated k/v (the HF rule: kv-sized k/v plus the fused output v keeps alive).
    stack = resolve_stack(built, setup)
    from dataclasses import replace
    plain = act.layer_coefficients(built, setup, replace(stack, repeats_kv=""))[0]
    qd, kvd = built.q_dim, built.kv_dim
    assert with_repeat - plain == 2 * (2 * qd - 2 * kvd) - 2 * (qd + kvd)


def test_multi_query_kv_repeated_by_litgpt_not_by_2023_lit_gpt():
    spec = _spec(kv_heads=1)
    for recipe, repeated in (("litgpt-0.4", True), ("lit-gpt", False)):
        setup = _setup(recipe=recipe)
        built = _as_built_by(spec, setup)
        assert litgpt.repeats_kv(built, resolve_stack(built, setup)) is repeated


def test_zero_pad_index_copy_saves_its_source():
    """lora.py zero_pad: result.index_copy_(-1, lora_ind, x) saves x (derivatives.yaml expand_as(source))."""
    B, T, out, enabled = 2, 16, (HEADS + 2 * GROUPS) * HEAD_DIM, (HEADS + GROUPS) * HEAD_DIM
    x = torch.randn(B, T, enabled, dtype=torch.bfloat16, requires_grad=True)
    source = x * 1
    ind = torch.arange(enabled)
    _, saved = _saved_bytes(lambda: source.new_zeros(B, T, out).index_copy_(-1, ind, source))
    assert source.untyped_storage().nbytes() in saved.values()

    spec, setup = _spec(), _setup()
    built = _as_built_by(spec, setup)
    stack = resolve_stack(built, setup)
    assert litgpt.zero_pad_saved_per_token(built, setup, stack) == (built.q_dim + built.kv_dim) * 2
    every = _setup(lora_targets=("q", "k", "v"))
    assert litgpt.zero_pad_saved_per_token(built, every, resolve_stack(built, every)) == 0


def test_bnb_ctx_tensors_outlive_backward_while_the_output_lives():
    """bitsandbytes 0.42.0 MatMul4Bit keeps ctx.tensors = (A, B): backward frees saved variables, not ctx
    attributes, so A lives as long as any output of the graph (LitGPT's loop keeps `logits`)."""
    class MatMul4Bit042(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            ctx.tensors = (a, w)
            return a @ w.t()

        @staticmethod
        def backward(ctx, grad):
            return grad @ ctx.tensors[1], None

    a = torch.randn(4, 8, requires_grad=True) * 1
    ref = weakref.ref(a.untyped_storage())
    logits = MatMul4Bit042.apply(a, torch.randn(16, 8)).float()
    del a
    logits.sum().backward()
    gc.collect()
    assert ref() is not None                 # still held by the graph that `logits` keeps
    del logits
    gc.collect()
    assert ref() is None


def test_previous_step_is_in_the_forward_phase_only_where_the_loop_keeps_it():
    spec = _spec()
    tokens = 2 * 64
    keeps = estimate(spec, _setup(method="qlora", quant="nf4"))
    first = estimate(spec, _setup(recipe="lit-gpt", method="qlora", quant="nf4"))
    assert first.component("previous step's outputs") == 0
    built = _as_built_by(spec, _setup())
    stack = resolve_stack(built, _setup(method="qlora", quant="nf4"))
    from memfit.physics import quantized_base
    bnb = tokens * (LAYERS * quantized_base.saved_per_token_bytes(built, _setup(method="qlora", quant="nf4"), stack)
                    + quantized_base.head_saved_per_token_bytes(built, _setup(method="qlora", quant="nf4"), stack))
    expected = 4 * tokens * VOCAB + bnb
    assert litgpt.previous_step_bytes(built, _setup(method="qlora", quant="nf4"), stack, bnb) == expected
    assert bnb > 0
    if keeps.peak_phase == "forward (end)":
        assert keeps.component("previous step's outputs") == expected


def test_fabric_fp32_logits_are_kept_and_log_softmaxed_in_fp32():
    """Fabric's convert_output casts the chunks to fp32; chunked_cross_entropy's log-softmax is then fp32."""
    chunk = torch.randn(2, 16, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    logits = chunk.to(torch.float32)
    _, saved = _saved_bytes(lambda: torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), torch.zeros(32, dtype=torch.long), reduction="none"))
    assert 4 * 32 * VOCAB in saved.values()
    spec, setup = _spec(), _setup()
    built = _as_built_by(spec, setup)
    saved_b, _, _ = litgpt.chunked_loss_bytes(built, 2 * 64, 2 * 64, resolve_stack(built, setup))
    assert saved_b == 2 * 4 * 2 * 64 * VOCAB


def test_quantized_head_weights_and_dequant():
    spec = _spec()
    lora = estimate(spec, _setup(method="qlora", quant="nf4"))
    hf = estimate(spec, TrainingSetup(recipe="hf", method="qlora", quant="nf4", batch_size=2, seq_len=64))
    head = VOCAB * H
    # LitGPT's head is 4-bit: its bf16 copy is gone, its packed data and absmax are there.
    assert hf.component("weights") - lora.component("weights") == head * 2 - head // 2
    built = _as_built_by(spec, _setup())
    stack = resolve_stack(built, _setup(method="qlora", quant="nf4"))
    assert litgpt.head_dequant_bytes(built, stack) == 4 * head


def test_phi_gelu_is_torch_gelu_in_litgpt():
    spec = _spec(model_type="phi", partial_rotary_factor=0.5, resid_pdrop=0.0)
    assert spec.activation == "gelu_new"
    assert _as_built_by(spec, _setup()).activation == "gelu_pytorch_tanh"
    assert _as_built_by(spec, TrainingSetup(recipe="hf")).activation == "gelu_new"


def test_a_loop_that_holds_its_logits_keeps_them_through_the_layers_backward():
    """LitGPT's fit() and fsdp_qlora's train.py hold the logits until backward is over: the layer-backward phases
    carry them; the HF Trainer (which keeps only the loss) does not."""
    spec = _spec()
    tokens = 2 * 64
    for recipe, kept in (("litgpt-0.4", 4 * tokens * VOCAB), ("fsdp-qlora", 4 * tokens * VOCAB), ("hf", 0)):
        setup = _setup(recipe=recipe) if recipe != "hf" else TrainingSetup(recipe="hf", method="lora", batch_size=2,
                                                                           seq_len=64)
        from memfit.estimator import _phases, _static_parts, _token_parts
        built = _as_built_by(spec, setup)
        static = _static_parts(built, setup)
        phases = _phases(built, setup, static["stack"], _token_parts(built, setup, static))
        assert phases["layer backward (top)"]["logits and loss"] == kept


def test_fsdp_qlora_cross_entropy_holds_the_fp32_logits_and_their_shifted_copy():
    """transformers 4.38 Llama: logits.float() kept by the loop (4 B), log-softmax of the shifted .contiguous()
    copy (4 B saved; the copy itself, 4 B, only while log_softmax runs)."""
    from memfit.physics.loss import loss_memory
    spec = _spec()
    setup = TrainingSetup(recipe="fsdp-qlora", method="lora", batch_size=2, seq_len=64)
    loss = loss_memory(spec, setup, resolve_stack(spec, setup))
    TV = 2 * 64 * VOCAB
    assert (loss.saved, loss.forward_extra, loss.backward_extra, loss.kept) == (8 * TV, 4 * TV, 8 * TV, 4 * TV)
    hf = TrainingSetup(recipe="hf", method="lora", batch_size=2, seq_len=64, precision="bf16")
    assert loss_memory(spec, hf, resolve_stack(spec, hf)).saved == 4 * TV


def test_full_logits_chunked_cross_entropy_peaks_at_twelve_bytes_a_logit():
    """chunked_cross_entropy on whole fp32 logits (litgpt/utils.py: reshape, split(128), cross_entropy per chunk):
    in backward SplitBackward concatenates the chunks' grads beside them and the kept logits (12 B a logit)."""
    from memfit.trace.tracker import PeakTracker
    T, V = 512, 1024
    bf16 = torch.randn(T, V, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.zeros(T, dtype=torch.long)
    tracker = PeakTracker(round_to=1)
    with tracker:
        logits = bf16.to(torch.float32)                  # Fabric's convert_output, kept by the loop
        start = tracker.current
        chunks = [torch.nn.functional.cross_entropy(x, y, reduction="none")
                  for x, y in zip(logits.split(128), targets.split(128))]
        loss = torch.cat(chunks).sum()
        del chunks
        tracker.peak = tracker.current
        loss.backward(inputs=[logits])
    saved, _, backward_extra = litgpt.full_logits_loss_bytes(T * V)
    assert start == 4 * T * V
    assert tracker.peak - start + 4 * T * V == pytest.approx(saved + backward_extra, rel=0.02)
