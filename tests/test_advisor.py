"""The advisor: suggestions are re-estimates whose commands reproduce them; `memfit max` is exact."""

import json
import shlex

import pytest

from memfit import TrainingSetup, estimate, load_hardware, load_model
from memfit.advisor import suggest, warnings_for
from memfit.cli import main
from memfit.search import biggest_model, max_int
from memfit.verdict import verdict


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


CASES = [
    ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--seq-len", "4096", "--gpu", "rtx-4080"],
    ["estimate", "meta-llama/Llama-3.1-8B", "--method", "full", "--batch-size", "4", "--gpu", "a100-80gb"],
    ["estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--batch-size", "8", "--seq-len", "2048", "--gpu",
     "rtx-4090"],
    ["estimate", "google/gemma-2-9b", "--method", "qlora", "--seq-len", "8192", "--memory", "16GiB"],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a[1:4]))
def test_every_suggested_command_gives_the_promised_total(capsys, argv):
    data = _json(capsys, argv + ["--format", "json"])
    assert data["verdict"]["status"] != "fits"
    suggestions = data["suggestions"]
    assert suggestions, "a run that does not fit gets suggestions"
    assert any(s["fits"] for s in suggestions)
    fits = [s["fits"] for s in suggestions]
    assert fits == sorted(fits, reverse=True), "changes that fit come first"
    for s in suggestions:
        rerun = _json(capsys, shlex.split(s["command"])[1:] + ["--format", "json"])
        assert rerun["device_bytes"] == s["device_bytes"], s["command"]
        assert s["saving_bytes"] == data["device_bytes"] - s["device_bytes"] > 0
        assert (rerun["verdict"]["status"] != "does-not-fit") == s["fits"]


def test_levers_by_name_with_real_numbers():
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4080")
    setup = TrainingSetup(method="lora", seq_len=4096)
    by_change = {s.change: s for s in suggest(spec, setup, hw, "meta-llama/Llama-3.1-8B", ["--gpu", "rtx-4080"])}
    ckpt = by_change["gradient checkpointing"]
    assert ckpt.device_bytes == estimate(spec, setup.replace(grad_ckpt=True)).device_bytes
    # 8-bit states for a rank-8 adapter save almost nothing, and the advice says so.
    assert "small" in by_change["8-bit optimizer"].cost and by_change["8-bit optimizer"].saving_bytes < 2**27
    combined = by_change["gradient checkpointing + QLoRA"]
    assert combined.fits and combined.args == {"--method": "qlora", "--grad-ckpt": True}
    assert combined.device_bytes == estimate(spec, setup.replace(method="qlora", grad_ckpt=True)).device_bytes


def test_smaller_batch_keeps_the_effective_batch():
    spec, hw = load_model("Qwen/Qwen2.5-7B"), load_hardware(gpu="a100-80gb")
    setup = TrainingSetup(method="lora", batch_size=16, seq_len=4096, grad_accum=2)
    lever = next(s for s in suggest(spec, setup, hw, "Qwen/Qwen2.5-7B", []) if "accumulation" in s.change)
    batch, accum = lever.args["--batch-size"], lever.args["--grad-accum"]
    assert batch * accum == 16 * 2 and batch < 16 and lever.fits
    assert not estimate(spec, setup.replace(batch_size=batch * 2, grad_accum=accum // 2)).device_bytes \
        <= hw.usable_bytes


@pytest.mark.parametrize("field,step", [("seq_len", 1), ("seq_len", 64), ("batch_size", 1)])
def test_max_is_exact(field, step):
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4090")
    setup = TrainingSetup(method="qlora", seq_len=1024)
    result = max_int(spec, setup, hw, field, step)
    at = estimate(spec, setup.replace(**{field: result.value})).device_bytes
    above = estimate(spec, setup.replace(**{field: result.value + step})).device_bytes
    assert at <= hw.usable_bytes < above
    assert result.device_bytes == at and result.next_device_bytes == above


def test_biggest_model_of_a_family():
    hw = load_hardware(mac="36GB")
    setup = TrainingSetup(method="lora")
    result = biggest_model(setup, hw, "qwen2.5")
    assert result.value == "Qwen/Qwen2.5-3B"
    assert estimate(load_model("Qwen/Qwen2.5-3B"), setup).device_bytes <= hw.usable_bytes
    assert estimate(load_model("Qwen/Qwen2.5-7B"), setup).device_bytes > hw.usable_bytes


def test_max_cli_json(capsys):
    data = _json(capsys, ["max", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx-4090", "--what",
                          "seq-len", "--format", "json"])
    assert data["seq_len"] > 2048 and data["device_bytes"] <= data["usable_bytes"] < data["next_step_device_bytes"]


def test_warnings_with_numbers():
    spec = load_model("meta-llama/Llama-3.1-8B")
    setup = TrainingSetup(method="full")
    est = estimate(spec, setup)
    hw = load_hardware(memory="128GB")
    codes = {w["code"]: w["message"] for w in warnings_for(spec, setup, est, hw, verdict(est, hw))}
    ratio = est.device_bytes / (spec.params * 2)
    assert f"{ratio:.1f}x the download" in codes["download-vs-training"]
    assert "system-RAM" in codes["memory-looks-like-system-ram"]
    assert "memory-looks-like-system-ram" not in {w["code"] for w in warnings_for(
        spec, setup, est, load_hardware(memory="80GiB"))}
    mac = load_hardware(mac="64GB", mac_wired_limit="64GiB")
    assert "mac-whole-ram" in {w["code"] for w in warnings_for(spec, setup, est, mac)}


def test_thin_margin_warning_says_how_far_it_can_grow():
    spec = load_model("meta-llama/Llama-3.1-8B")
    setup = TrainingSetup(method="qlora", seq_len=2048)
    longest = max_int(spec, setup, load_hardware(gpu="rtx-4090"), "seq_len", 64).value
    tight = setup.replace(seq_len=longest)
    hw = load_hardware(gpu="rtx-4090")
    est = estimate(spec, tight)
    messages = {w["code"]: w["message"] for w in warnings_for(spec, tight, est, hw, verdict(est, hw))}
    assert f"longest length at this batch: {longest}" in messages["thin-margin"]


def test_each_lever_is_the_estimate_of_its_setup():
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="a100-40gb")
    setup = TrainingSetup(method="full", batch_size=2, seq_len=2048)
    found = {s.change: s for s in suggest(spec, setup, hw, "meta-llama/Llama-3.1-8B", ["--gpu", "a100-40gb"])}
    longest = max_int(spec, setup, hw, "seq_len", 64).value
    expected = {
        "gradient checkpointing": setup.replace(grad_ckpt=True),
        "chunked cross-entropy": setup.replace(chunked_ce=True),
        "8-bit optimizer": setup.replace(optimizer="adamw-8bit"),
        "paged 8-bit optimizer": setup.replace(optimizer="paged-adamw-8bit"),
        "QLoRA": TrainingSetup.from_recipe("hf", method="qlora", batch_size=2, seq_len=2048, grad_ckpt=False),
        "LoRA instead of full fine-tuning": TrainingSetup(method="lora", batch_size=2, seq_len=2048),
    }
    if longest:
        expected[f"max length {longest}"] = setup.replace(seq_len=longest)
    for change, new_setup in expected.items():
        assert found[change].device_bytes == estimate(spec, new_setup).device_bytes, change
    qwen = load_model("Qwen/Qwen2.5-7B")
    smaller = [s for s in suggest(qwen, setup, hw, "Qwen/Qwen2.5-7B", []) if s.change.startswith("smaller model")]
    best = biggest_model(setup, hw, "qwen2.5").value
    assert best == "Qwen/Qwen2.5-1.5B" and smaller[0].args["model"] == best   # 3B full needs 46.8 GiB
    assert smaller[0].device_bytes == estimate(load_model(best), setup).device_bytes


def test_dataset_coverage_in_the_length_advice(tmp_path):
    from memfit.dataset import length_stats

    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4090")
    setup = TrainingSetup(method="lora", seq_len=8192)
    stats = length_stats([100] * 98 + [3000, 9000], "text", 8192)
    lever = next(s for s in suggest(spec, setup, hw, "x", [], dataset=stats) if s.change.startswith("max length"))
    assert f"p99 of your dataset is {stats.p99} tokens" in lever.cost
