"""The mps recipe (issue #16): transformers + PEFT on PyTorch's MPS backend, with MPS's own counters."""

import json

import pytest

import memfit
from memfit.cli import main
from memfit.estimator import estimate
from memfit.physics import mps_allocator as mps
from memfit.physics.overhead import CUBLAS_WORKSPACE_BYTES
from memfit.setup import TrainingSetup
from memfit.sources import load_model
from memfit.units import MiB

MODEL = "meta-llama/Llama-3.2-1B"
CUDA_WORDS = ("cuBLAS", "CUDA context", "torch.cuda", "nvidia-smi", "allocator slack", "max_memory_allocated",
              "max_memory_reserved", "peak_allocated_bytes", "peak_reserved_bytes")


def _run(capsys, *args):
    code = main(["estimate", MODEL, "--recipe", "mps", "--mac", "36GB", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [(), ("--method", "full", "--grad-ckpt"), ("--load-peak",)])
def test_no_cuda_component_or_counter_in_text_or_json(capsys, args):
    code, text, _ = _run(capsys, *args)
    assert code == 0
    code, raw, _ = _run(capsys, *args, "--format", "json")
    assert code == 0
    for word in CUDA_WORDS:
        assert word not in text, word
        assert word not in raw, word
    data = json.loads(raw)
    assert data["kind"] == "mps"
    assert {c["counter"] for c in data["components"]} == {"mps-current", "mps-driver"}
    current = sum(c["bytes"] for c in data["components"] if c["counter"] == "mps-current")
    assert current == data["mps_current_allocated_bytes"]
    assert sum(c["bytes"] for c in data["components"]) == data["mps_driver_allocated_bytes"] == data["device_bytes"]
    assert data["verdict"]["usable_bytes"] == memfit.report(memfit.Request(model=MODEL, mac="36GB")).verdict.usable_bytes
    assert "torch.mps.current_allocated_memory()" in text and "torch.mps.driver_allocated_memory()" in text


@pytest.mark.parametrize("options", [dict(method="lora", seq_len=2048), dict(method="full", seq_len=1024, batch_size=2),
                                     dict(method="lora", seq_len=4096, grad_ckpt=True)])
def test_tensors_are_the_hf_recipes_without_the_cublas_workspace(options):
    spec = load_model(MODEL)
    mps_est = estimate(spec, TrainingSetup(recipe="mps", **options))
    # The same step under hf with SDPA on the math path (what MPS runs under autograd, attention.cpp).
    twin = estimate(spec.replace(attn_kv_broadcast=True), TrainingSetup(recipe="hf", **options))
    assert twin.component("cuBLAS workspace") == CUBLAS_WORKSPACE_BYTES
    assert mps_est.extra["mps_current_allocated_bytes"] == twin.peak_allocated_bytes - CUBLAS_WORKSPACE_BYTES
    # With eager attention both stacks run the same attention: only the workspace differs.
    eager = estimate(spec, TrainingSetup(recipe="mps", attn="eager", **options))
    hf_eager = estimate(spec, TrainingSetup(recipe="hf", attn="eager", **options))
    assert eager.peak_allocated_bytes == hf_eager.peak_allocated_bytes - CUBLAS_WORKSPACE_BYTES
    # The math path keeps the s x s softmax that CUDA's fused SDPA kernels never hold (with checkpointing the
    # peak is the loss, where attention keeps nothing).
    hf_sdpa = estimate(spec, TrainingSetup(recipe="hf", **options)).peak_allocated_bytes - CUBLAS_WORKSPACE_BYTES
    assert mps_est.peak_allocated_bytes > hf_sdpa if not options.get("grad_ckpt") else \
        mps_est.peak_allocated_bytes == hf_sdpa


def test_the_recipes_defaults_are_the_trainers_on_mps():
    setup = TrainingSetup(recipe="mps")
    assert (setup.optimizer, setup.attn, setup.grad_ckpt) == ("adamw-fused", "sdpa", False)
    # torch 2.13: fused optimizer kernels exist for mps (what the default adamw_torch_fused needs)
    pytest.importorskip("torch")
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    assert "mps" in _get_fused_kernels_supported_devices()


def test_allocator_rounding_worked_examples():
    # get_allocation_size: page alignment (16 KiB on Apple silicon)
    assert mps.buffer_bytes(100) == 16 * 1024
    assert mps.buffer_bytes(3 * 16 * 1024 + 1) == 4 * 16 * 1024
    # createHeapBlock: small buffers (<= 1 MiB) -> 8 MiB heaps, < 10 MiB -> 32 MiB, < 512 MiB -> 1 GiB
    assert mps.new_heap_bytes(mps.buffer_bytes(100)) == 8 * MiB
    assert mps.new_heap_bytes(MiB) == 8 * MiB
    assert mps.new_heap_bytes(MiB + 16 * 1024) == 32 * MiB
    assert mps.new_heap_bytes(10 * MiB) == 1024 * MiB
    # under memory pressure, or from 512 MiB up, a heap of its own rounded to kRoundLarge (2 MiB)
    assert mps.new_heap_bytes(100 * MiB, memory_pressure=True) == 100 * MiB
    assert mps.new_heap_bytes(mps.buffer_bytes(600 * MiB + 1)) == 602 * MiB
    # the newer bucketing: 1.5 MiB + 1 byte -> 1.5 MiB + 16 KiB aligned -> 32 KiB granule (1 MiB >> 5)
    assert mps.bucketed_bytes(1536 * 1024 + 1) == 1536 * 1024 + 32 * 1024
    assert mps.bucketed_bytes(100) == 16 * 1024      # small buffers are not bucketed
    assert mps.heap_span_bytes(1) == mps.heap_span_bytes(1024 * MiB) == 1024 * MiB
    assert mps.heap_span_bytes(1024 * MiB + 1) == 2048 * MiB


def test_driver_counter_is_whole_heaps_above_the_tensors():
    est = estimate(load_model(MODEL), TrainingSetup(recipe="mps", seq_len=1024))
    current, driver = est.extra["mps_current_allocated_bytes"], est.extra["mps_driver_allocated_bytes"]
    assert driver % mps.XLARGE_HEAP_BYTES == 0
    assert driver >= current * 1.10
    assert est.range_low_bytes <= driver <= est.range_high_bytes


@pytest.mark.parametrize("args", [("--method", "qlora"), ("--method", "dora", "--quant", "nf4"),
                                  ("--optimizer", "adamw-8bit"), ("--optimizer", "paged-adamw"),
                                  ("--optimizer", "lion-8bit"), ("--gpus", "2"), ("--shard", "fsdp"),
                                  ("--attn", "flash"), ("--method", "full", "--precision", "fp8"),
                                  ("--chunked-ce",)])
def test_each_bad_combination_is_one_error_line(capsys, args):
    code, out, err = _run(capsys, *args)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err


def test_mps_needs_a_mac_and_a_mac_alone_still_means_mlx(capsys):
    assert main(["estimate", MODEL, "--recipe", "mps", "--gpu", "a100-80gb"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mac" in err[0]
    rep = memfit.report(memfit.Request(model=MODEL, mac="36GB"))
    assert rep.setup.recipe == "mlx" and rep.estimate.kind == "mlx"
    rep = memfit.report(memfit.Request(model=MODEL, mac="36GB", setup={"recipe": "mps"}))
    assert rep.estimate.kind == "mps" and rep.verdict.needed_bytes == rep.estimate.extra["mps_driver_allocated_bytes"]
