"""PEFT methods besides LoRA, and LISA (physics/adapters.py): PEFT itself is the oracle.

- the trainable parameters the estimate counts are the ones peft 0.21.2 builds (numel of requires_grad tensors);
- the estimate's peak and activations match the trace (real PEFT forward/backward on fake tensors);
- what PEFT refuses is refused with a clear message.
"""

import warnings

import pytest

from memfit import TrainingSetup, estimate
from memfit.errors import InvalidSetupError
from memfit.options import LITGPT_METHODS, PEFT_METHODS
from memfit.physics import adapters
from memfit.spec import ModelSpec

LLAMA = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False, torch_dtype="bfloat16")
METHODS = PEFT_METHODS + ("lisa",)
# LLaMA-Adapter v2 is LitGPT's only (its own model: estimated, never traced); v1 outside LitGPT is PEFT's
# adaption_prompt, traced like the others.
TRACED = tuple(m for m in METHODS if m != "llama-adapter-v2")


def _recipe(method):
    return "litgpt" if method == "llama-adapter-v2" else None


def _spec(**overrides):
    return ModelSpec.from_hf_config(dict(LLAMA, **overrides), name="tiny-llama", source="test")


def test_every_method_is_described_and_estimated():
    spec = _spec()
    lora = estimate(spec, TrainingSetup(method="lora", seq_len=256))
    for method in METHODS:
        assert method in adapters.METHODS, method        # one record (README table, assumption line) each
        est = estimate(spec, TrainingSetup(method=method, seq_len=256, recipe=_recipe(method)))
        assert est.trainable_params > 0
        assert any(method in line for line in est.assumptions)
        assert est.peak_allocated_bytes != lora.peak_allocated_bytes, method


def test_readme_method_table_is_the_records():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert adapters.method_table() in readme, "run python tools/readme_flags.py"


def test_lora_equivalents_cost_what_lora_costs():
    spec = _spec()
    lora = estimate(spec, TrainingSetup(method="lora", seq_len=256))
    for alias in ("rslora", "pissa", "olora", "lora-plus"):
        setup = TrainingSetup(method=alias, seq_len=256)
        assert setup.method == "lora"
        assert estimate(spec, setup).peak_allocated_bytes == lora.peak_allocated_bytes


def test_lokr_factorization_is_peft_s():
    from peft.tuners.lokr.layer import factorization

    for n in (576, 896, 1024, 2048, 3072, 4096, 5504, 11008, 127, 14336):
        assert adapters.factorization(n) == factorization(n, -1)


def test_what_peft_refuses_is_refused():
    spec = _spec()
    cases = [dict(method="prefix", grad_ckpt=True), dict(method="ia3", lora_rank=4),
             dict(method="oft", oft_block_size=7), dict(method="dora", recipe="mlx"),
             dict(method="fourierft", n_frequency=10**9), dict(method="lora", lisa_layers=2)]
    for kw in cases:
        with pytest.raises(InvalidSetupError):
            estimate(spec, TrainingSetup(seq_len=256, **kw))
    gpt2 = ModelSpec.from_hf_config(dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=1024),
                                    name="tiny-gpt2", source="test")
    with pytest.raises(InvalidSetupError, match="Conv1D"):
        estimate(gpt2, TrainingSetup(method="loha", seq_len=256))


def test_qdora_is_dora_on_qlora_s_base():
    # --method dora --quant nf4-dq: the base is stored as QLoRA stores it; the 16-bit base is the default.
    spec = _spec()
    qlora = estimate(spec, TrainingSetup(method="qlora", seq_len=256, grad_ckpt=False))
    qdora = estimate(spec, TrainingSetup(method="dora", quant="nf4-dq", seq_len=256))
    dora = estimate(spec, TrainingSetup(method="dora", seq_len=256))
    assert qdora.component("weights") == qlora.component("weights") < dora.component("weights")
    assert qdora.component("quantization constants") == qlora.component("quantization constants") > 0
    assert dora.component("quantization constants") == 0
    with pytest.raises(InvalidSetupError, match="tuners/loha/layer.py"):
        TrainingSetup(method="loha", quant="nf4")           # LoHa's factors take the packed 4-bit shape


@pytest.mark.parametrize("method,quant,why", [
    ("loha", "nf4-dq", "packs to"), ("lokr", "fp4", "packs to"), ("osf", "int8", "tuners/osf/layer.py"),
    ("tinylora", "nf4", "tuners/tinylora/layer.py"), ("lisa", "nf4-dq", "LISA trains whole layers"),
])
def test_quant_refused_where_peft_cannot_train_on_a_quantized_base(method, quant, why):
    with pytest.raises(InvalidSetupError, match=why):
        TrainingSetup(method=method, quant=quant)
    TrainingSetup(method=method)                            # the 16-bit base stays fine


@pytest.mark.parametrize("method,quant", [("vera", "nf4-dq"), ("oft", "nf4"), ("prefix", "int8"),
                                          ("ln-tuning", "nf4-dq"), ("lokr", "int8")])
def test_quant_stores_any_accepted_method_s_base_as_qlora_does(method, quant):
    spec = _spec()
    quantized = estimate(spec, TrainingSetup(method=method, quant=quant, seq_len=256))
    qlora = estimate(spec, TrainingSetup(method="qlora", quant=quant, seq_len=256))
    plain = estimate(spec, TrainingSetup(method=method, seq_len=256))
    assert quantized.component("quantization constants") == qlora.component("quantization constants") > 0
    assert quantized.component("weights") < plain.component("weights")


def test_dora_saves_the_base_and_lora_outputs_more_than_lora():
    # peft tuners/lora/dora.py:165: (m/||W|| - 1) * base_result + m/||W|| * lora_result * scaling keeps both
    # out-wide operands: 2 x (q out + v out) x 2 bytes per token per layer under bf16 autocast.
    spec = _spec()
    kw = dict(seq_len=512, batch_size=2)
    lora = estimate(spec, TrainingSetup(method="lora", **kw)).component("activations")
    dora = estimate(spec, TrainingSetup(method="dora", **kw)).component("activations")
    assert dora - lora == 3 * 1024 * 2 * (256 + 128) * 2


torch = pytest.importorskip("torch")
pytest.importorskip("peft")


def test_litgpt_adapter_trainable_params_are_litgpt_s():
    # The counts lit-gpt@0f021f3a finetune/adapter.py and adapter_v2.py print (tutorials/resource-tables.md):
    # adapter_wte 10 x n_embd and gating_factor n_head from layer 2 on; v2 adds a bias and scale per Linear output
    # (lm_head too) and the norms.
    stablelm = ModelSpec.from_hf_config(dict(model_type="gpt_neox", hidden_size=4096, intermediate_size=16384,
                                             num_hidden_layers=16, num_attention_heads=32, vocab_size=50688,
                                             rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
                                             torch_dtype="bfloat16"), name="stablelm-base-alpha-3b", source="test")
    llama2 = ModelSpec.from_hf_config(dict(LLAMA, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                           num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
                                      name="llama-2-7b", source="test")
    published = {(stablelm, "llama-adapter"): 573_888, (stablelm, "llama-adapter-v2"): 2_125_248,
                 (llama2, "llama-adapter"): 1_229_760, (llama2, "llama-adapter-v2"): 4_279_744}
    for (spec, method), count in published.items():
        setup = TrainingSetup(recipe="litgpt-0.4", method=method, seq_len=512, batch_size=1)
        assert estimate(spec, setup).trainable_params == count, (spec.name, method)


def test_llama_adapter_layers_before_the_prompt_save_nothing():
    # adapter_start_layer 2: a model of two layers has no adapter, no tensor that needs a gradient in its layers;
    # adding layers adds what each adapted layer saves, the first adapted one less than the others (its input
    # needs no gradient).
    def acts(layers, method="llama-adapter"):
        spec = _spec(num_hidden_layers=layers)
        return estimate(spec, TrainingSetup(recipe="litgpt", method=method, seq_len=256)).component("activations")
    base = acts(2)
    first, second = acts(3) - base, acts(4) - acts(3)
    assert 0 < first < second
    assert acts(5) - acts(4) == pytest.approx(second, abs=256)   # (the per-layer average rounds to a byte a token)
    # v2's norms and Linear scales train in every layer: the first layers save too.
    assert acts(3, "llama-adapter-v2") - acts(2, "llama-adapter-v2") > second


def test_litgpt_adapter_v2_needs_litgpt_and_litgpt_s_model_is_not_traced():
    assert LITGPT_METHODS == ("llama-adapter", "llama-adapter-v2")
    with pytest.raises(InvalidSetupError, match="litgpt"):
        TrainingSetup(method="llama-adapter-v2")
    # PEFT's adaption_prompt wraps llama and mistral attention only (tuners/adaption_prompt/config.py).
    neox = ModelSpec.from_hf_config(dict(model_type="gpt_neox", hidden_size=128, intermediate_size=512,
                                         num_hidden_layers=4, num_attention_heads=4, vocab_size=1024),
                                    name="tiny-neox", source="test")
    with pytest.raises(InvalidSetupError, match="adaption_prompt"):
        estimate(neox, TrainingSetup(method="llama-adapter", seq_len=64))
    assert estimate(neox, TrainingSetup(method="llama-adapter", recipe="litgpt", seq_len=64)).trainable_params > 0
    pytest.importorskip("peft")
    from memfit.errors import SourceError
    from memfit.trace import trace

    with pytest.raises(SourceError, match="LitGPT"):
        trace(_spec(), TrainingSetup(recipe="litgpt", method="llama-adapter", seq_len=64))


@pytest.mark.parametrize("kw", [{}, dict(grad_ckpt=True, batch_size=2)])
def test_peft_llama_adapter_past_its_first_layer_matches_the_trace(kw):
    # Six layers: four carry a prompt, three of them past the first adapted one (whose input needs no gradient).
    from memfit.trace import trace

    spec = _spec(num_hidden_layers=6)
    setup = TrainingSetup(method="llama-adapter", seq_len=256, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    est = estimate(spec, setup)
    assert est.trainable_params == 4 * (10 * 256 + 1)          # adaption_prompt (1, 10, hidden) + scalar gate
    assert est.peak_allocated_bytes == pytest.approx(measured.peak_allocated_bytes, rel=0.01)


@pytest.mark.parametrize("method", TRACED)
def test_trainable_params_are_peft_s(method):
    from memfit.physics.stack import resolve_stack
    from memfit.trace.build import build

    spec = _spec()
    setup = TrainingSetup(method=method, seq_len=256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(spec, setup, resolve_stack(spec, setup)).model
    peft_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert estimate(spec, setup).trainable_params == peft_count


@pytest.mark.parametrize("method,kw", [(m, {}) for m in TRACED] + [
    ("osf", dict(lora_rank=32, lora_targets=("q", "k", "v", "o", "gate", "up", "down"))),
    ("osf", dict(adapter_fp32=False)), ("osf", dict(precision="bf16", grad_ckpt=True)),
    ("tinylora", dict(precision="bf16")), ("tinylora", dict(lora_targets=("q", "k", "v", "o", "gate", "up", "down"))),
    ("llama-adapter", dict(grad_ckpt=True)), ("llama-adapter", dict(precision="bf16-mixed", batch_size=2)),
    ("dora", dict(grad_ckpt=True)), ("loha", dict(precision="bf16")), ("boft", dict(precision="bf16")),
    ("prompt", dict(precision="bf16", batch_size=2)), ("lisa", dict(lisa_layers=1, batch_size=2)),
    ("dora", dict(quant="nf4-dq")), ("ia3", dict(quant="nf4")), ("adalora", dict(quant="int8")),
    # --quant on every method PEFT can put on a bitsandbytes base (options.py QUANTIZABLE_METHODS)
    ("vera", dict(quant="nf4-dq")), ("oft", dict(quant="nf4")), ("boft", dict(quant="nf4-dq")),
    ("fourierft", dict(quant="int8")), ("loha", dict(quant="int8")), ("lokr", dict(quant="int8")),
    ("prefix", dict(quant="nf4-dq")), ("prompt", dict(quant="nf4")), ("ptuning", dict(quant="int8")),
    ("ln-tuning", dict(quant="nf4-dq")),
    # int8 keeps each base linear's input (or the rotated / scaled input OFT, BOFT, IA3 feed to it)
    ("dora", dict(quant="int8")), ("ia3", dict(quant="int8")), ("oft", dict(quant="int8")),
    ("boft", dict(quant="int8")), ("vera", dict(quant="int8")), ("prefix", dict(quant="int8")),
    ("ln-tuning", dict(quant="int8")), ("prompt", dict(quant="int8")),
    ("dora", dict(lora_dropout=0.05)), ("dora", dict(lora_dropout=0.05, precision="bf16")),
    ("vera", dict(lora_dropout=0.1, precision="bf16")),
])
def test_estimate_matches_the_trace(method, kw):
    from memfit.trace import trace

    spec = _spec()
    setup = TrainingSetup(method=method, seq_len=256, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    est = estimate(spec, setup)
    assert est.peak_allocated_bytes == pytest.approx(measured.peak_allocated_bytes, rel=0.01)
