"""--gpu auto from recorded command outputs, and `memfit plan`."""

import json

import pytest

from memfit.verdict import verdict

from memfit import TrainingSetup, estimate, load_hardware, load_model
from memfit.cli import main
from memfit.detect import detect_hardware
from memfit.errors import InvalidSetupError
from memfit.plan import plan

MiB, GiB = 2**20, 2**30


def recorded(outputs):
    return lambda argv: outputs.get(" ".join(argv[:3]))


def test_nvidia_smi_output():
    run = recorded({"nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits":
                    "NVIDIA GeForce RTX 4090, 24564\nNVIDIA GeForce RTX 4090, 24564\n"})
    hw = detect_hardware(run=run, platform="linux", torch_probe=False)
    assert hw.usable_bytes == 24564 * MiB and hw.slug == "rtx-4090"
    assert "2 GPUs" in hw.notes[0]


def test_mixed_cards_take_the_smallest():
    run = recorded({"nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits":
                    "NVIDIA A100-SXM4-80GB, 81920\nNVIDIA GeForce RTX 3090, 24576\n"})
    assert detect_hardware(run=run, platform="linux", torch_probe=False).usable_bytes == 24576 * MiB


def test_torch_cuda_when_no_nvidia_smi():
    hw = detect_hardware(run=lambda argv: None, platform="linux", torch_probe=("NVIDIA H100 80GB HBM3",
                                                                             85_520_809_984))
    assert hw.usable_bytes == 85_520_809_984 and hw.slug == "h100-80gb"


def test_mac_sysctl_default_and_wired_limit():
    base = {"sysctl -n hw.memsize": "38654705664\n", "sysctl -n machdep.cpu.brand_string": "Apple M3 Pro\n"}
    hw = detect_hardware(run=recorded({**base, "sysctl -n iogpu.wired_limit_mb": "0\n"}), platform="darwin",
                         torch_probe=False)
    assert hw.capacity_bytes == 36 * GiB and hw.usable_bytes == 27 * GiB and "M3 Pro" in hw.name
    hw = detect_hardware(run=recorded({**base, "sysctl -n iogpu.wired_limit_mb": "30720\n"}), platform="darwin",
                         torch_probe=False)
    assert hw.usable_bytes == 30 * GiB


def test_nothing_found_is_a_clear_error():
    with pytest.raises(InvalidSetupError, match="found no GPU"):
        detect_hardware(run=lambda argv: None, platform="linux", torch_probe=False)


def test_plan_recommends_the_best_method_that_fits():
    spec, hw = load_model("Qwen/Qwen2.5-7B"), load_hardware(gpu="rtx-4090")
    recommended, alternatives = plan(spec, TrainingSetup(seq_len=2048), hw, lambda s: "cmd")
    assert recommended.method == "lora"                 # full needs far more than 24 GB
    est = estimate(spec, recommended.setup)
    assert est.device_bytes == recommended.device_bytes and verdict(est, hw).status == "fits"
    assert recommended.setup.batch_size * recommended.setup.grad_accum >= 16
    full = next(o for o in alternatives if o.method == "full")
    assert full.setup is None and full.device_bytes > hw.usable_bytes


def test_plan_recommendation_rechecks_as_fits(capsys):
    """Issue #13 / D2: plan's recommended command, re-run, says FITS (the one meaning of fits)."""
    import shlex

    for argv in (["plan", "meta-llama/Llama-3.1-8B", "--memory", "16GiB"], ["plan", "Qwen/Qwen2.5-7B", "--mac", "36GB"]):
        assert main(argv + ["--format", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
        command = data["recommended"]["command"]
        assert main(shlex.split(command)[1:] + ["--format", "json"]) == 0
        again = json.loads(capsys.readouterr().out)
        assert again["verdict"]["status"] == "fits" and again["device_bytes"] == data["recommended"]["device_bytes"]


def test_plan_cli_json(capsys):
    assert main(["plan", "meta-llama/Llama-3.2-1B", "--gpu", "a100-80gb", "--seq-len", "4096",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommended"]["method"] == "full" and data["recommended"]["fits"]
    assert {a["method"] for a in data["alternatives"]} == {"lora", "qlora"}
