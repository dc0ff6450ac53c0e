"""LoRA on an int8 / GPTQ / AWQ base (physics/quantized_base.py): storage against the buffers each kernel
registers, saved tensors and transients against what its forward/backward keeps."""

import subprocess
import sys

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.estimator import _static_parts, _token_parts
from memfit.params import count_params, layer_linears
from memfit.physics.quantized_base import INT4_GROUP, int4_storage_bytes

torch = pytest.importorskip("torch")


def _awq_buffers(d_in, d_out, g=INT4_GROUP):
    # casper-hansen/AutoAWQ@d9dc8e56 awq/modules/linear/gemm.py WQLinear_GEMM.__init__ register_buffer shapes
    return [torch.empty(d_in, d_out // 8, dtype=torch.int32, device="meta"),
            torch.empty(d_in // g, d_out // 8, dtype=torch.int32, device="meta"),
            torch.empty(d_in // g, d_out, dtype=torch.float16, device="meta")]


def _gptq_buffers(d_in, d_out, g=INT4_GROUP):
    # GPTQModel nn_modules/qlinear/__init__.py BaseQuantLinear: qweight, qzeros, scales, g_idx (4 bits, int32 pack)
    return [torch.empty(d_in // 8, d_out, dtype=torch.int32, device="meta"),
            torch.empty(d_in // g, d_out // 8, dtype=torch.int32, device="meta"),
            torch.empty(d_in // g, d_out, dtype=torch.float16, device="meta"),
            torch.empty(d_in, dtype=torch.int32, device="meta")]


@pytest.mark.parametrize("d_in,d_out", [(4096, 4096), (4096, 11008), (11008, 4096), (2048, 6144)])
def test_int4_storage_matches_kernel_buffers(d_in, d_out):
    for quant, buffers in (("awq-int4", _awq_buffers), ("gptq-int4", _gptq_buffers)):
        data, consts = int4_storage_bytes(d_in, d_out, quant)
        tensors = buffers(d_in, d_out)
        assert data == tensors[0].numel() * tensors[0].element_size()
        assert consts == sum(t.numel() * t.element_size() for t in tensors[1:])


def _est(spec, **kw):
    base = dict(method="qlora", batch_size=2, seq_len=1024, precision="fp16", grad_ckpt=False,
                lora_targets=("q", "k", "v", "o", "gate", "up", "down"), lora_dropout=0.0)
    base.update(kw)
    return estimate(spec, TrainingSetup(**base))


def _parts(spec, **kw):
    est = _est(spec, **kw)
    return _token_parts(spec, est.setup, _static_parts(spec, est.setup))


def test_gptq_keeps_dequantized_weights_of_every_layer():
    """TorchQuantLinear's matmul saves its 16-bit dequantized weight: with no checkpointing, every layer's linears
    in 16 bits beyond what NF4 LoRA saves; with checkpointing, one layer's."""
    spec = load_model("llama-2-7b")
    dequant_layer = 2 * count_params(spec).layer_linear_weights
    nf4, gptq = _est(spec, quant="nf4"), _est(spec, quant="gptq-int4")
    assert gptq.component("activations") - nf4.component("activations") == spec.num_layers * dequant_layer
    # with checkpointing, the recomputed layer (the one being recomputed) holds one layer's dequantized weights
    nf4c, gptqc = _parts(spec, quant="nf4", grad_ckpt=True), _parts(spec, quant="gptq-int4", grad_ckpt=True)
    assert gptqc["layer_act"] - nf4c["layer_act"] == dequant_layer
    # int4 + fp16 scales + int4 zeros per 128 + int32 g_idx: 4.0 + 0.125 + 0.03125 bits and the index
    linears = [lin for lin in layer_linears(spec)]
    expected = spec.num_layers * sum(int4_storage_bytes(lin.d_in, lin.d_out, "gptq-int4")[1] for lin in linears)
    assert gptq.component("quantization constants") == expected


def test_int8_keeps_each_linear_input_unless_another_op_saves_it():
    """bitsandbytes 0.50.2 autograd/_functions.py:186-187: MatMul8bitLt keeps its input A whenever it needs a grad."""
    spec = load_model("llama-2-7b")
    T, h, i, L = 2 * 1024, spec.hidden_size, spec.intermediate_size, spec.num_layers

    def saved(quant, **kw):
        est = _est(spec, quant=quant, **kw)
        return est.component("activations") + est.component("embedding and head activations")

    def extra(**kw):
        return saved("int8", **kw) - saved("nf4", **kw)

    # fp32 adapters: lora_A saves its own fp32 cast, so the attention, MLP and down inputs (fp16) are new; o_proj
    # reads SDPA's saved output (nothing new). The first layer's attention input needs no grad (frozen
    # embedding): its q/k/v keep nothing.
    for dropout in (0.0, 0.1):
        assert extra(lora_dropout=dropout) == L * T * 2 * (2 * h + i) - T * 2 * h
    # fp16 adapters, dropout 0: lora_A saves the input itself, the very tensor int8 keeps
    assert extra(adapter_fp32=False) == 0
    # ... LoRA on q and v only: the MLP and down inputs are new
    assert extra(adapter_fp32=False, lora_targets=("q", "v")) == L * T * 2 * (h + i)


@pytest.mark.parametrize("model,kw", [
    ("tiny", dict(batch_size=2, seq_len=512)),                      # q, v: o, MLP and down inputs kept
    ("tiny", dict(batch_size=2, seq_len=512, lora_dropout=0.1)),    # lora_A keeps the dropout output instead
    ("tiny", dict(batch_size=2, seq_len=512, lora_targets=("q", "k", "v", "o", "gate", "up", "down"))),
    ("smollm2-135m", dict(batch_size=4, seq_len=512)),
])
def test_int8_estimate_matches_the_trace(model, kw):
    """The CPU trace's fake MatMul8bitLt keeps its input as bitsandbytes does (trace/build.py); without the saved
    inputs the estimate was 7.5-11% below it on these cells."""
    import warnings

    from memfit.trace import trace
    from test_adapters import _spec

    spec = _spec() if model == "tiny" else load_model(model)
    setup = TrainingSetup(method="qlora", quant="int8", grad_ckpt=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup).peak_allocated_bytes
    assert estimate(spec, setup).peak_allocated_bytes == pytest.approx(measured, rel=0.01)


def test_awq_backward_dequantizes_and_repeats_per_sequence():
    spec = load_model("llama-2-7b")
    largest = max(lin.d_in * lin.d_out for lin in layer_linears(spec))
    for batch in (1, 4):
        nf4 = _parts(spec, quant="nf4", batch_size=batch, grad_ckpt=True)
        awq = _parts(spec, quant="awq-int4", batch_size=batch, grad_ckpt=True)
        assert awq["temps"] - nf4["temps"] == \
            2 * largest * (1 + batch)
    # a bf16 run saves x.half(): an fp16 copy of every linear's input
    bf = _est(spec, quant="awq-int4", precision="bf16")
    bf_nf4 = _est(spec, quant="nf4", precision="bf16")
    per_token = 2 * sum(lin.d_in for lin in layer_linears(spec))
    assert bf.component("activations") - bf_nf4.component("activations") == spec.num_layers * 2 * 1024 * per_token


def test_quant_on_full_fine_tuning_is_one_clear_error():
    out = subprocess.run([sys.executable, "-m", "memfit", "estimate", "llama-2-7b", "--method", "full", "--quant",
                          "gptq-int4"], capture_output=True, text=True)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--quant" in lines[0] and "qlora" in lines[0]
    assert "Traceback" not in out.stderr
