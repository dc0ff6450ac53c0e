"""The advisor: suggestions are re-estimates whose commands reproduce them with the promised verdict; combinations
are searched; `memfit max` is exact under the one rule of "fits"."""

import json
import shlex

import pytest

from memfit import Request, TrainingSetup, estimate, load_hardware, load_model, report
from memfit.advisor import MIN_SAVING_SHARE
from memfit.cautions import warnings_for
from memfit.cli import main
from memfit.search import biggest_model, max_int
from memfit.verdict import fits, verdict


def _json(capsys, argv):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


CASES = [
    ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--seq-len", "4096", "--gpu", "rtx-4080"],
    ["estimate", "meta-llama/Llama-3.1-8B", "--method", "full", "--batch-size", "4", "--gpu", "a100-80gb"],
    ["estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--batch-size", "8", "--seq-len", "2048", "--gpu",
     "rtx-4090"],
    ["estimate", "google/gemma-2-9b", "--method", "qlora", "--seq-len", "8192", "--memory", "16GiB"],
    ["estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--mac", "36GB"],
    # torchtune 0.7's 8B full recipe (paged 8-bit AdamW in backward, LinearCrossEntropyLoss) fits a 4090 at its
    # default length; at 8192 tokens it does not.
    ["estimate", "meta-llama/Llama-3.1-8B", "--recipe", "torchtune", "--method", "full", "--seq-len", "8192", "--gpu",
     "rtx-4090"],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a[1:4]))
def test_every_suggested_command_gives_the_promised_verdict(capsys, argv):
    data = _json(capsys, argv + ["--format", "json"])
    assert data["verdict"]["status"] != "fits"
    suggestions = data["suggestions"]
    assert any(s["fits"] for s in suggestions), "a run that does not fit gets a change that fits"
    flags = [s["fits"] for s in suggestions]
    assert flags == sorted(flags, reverse=True), "changes that fit come first"
    for s in suggestions:
        rerun = _json(capsys, shlex.split(s["command"])[1:] + ["--format", "json"])
        assert rerun["device_bytes"] == s["device_bytes"], s["command"]
        assert rerun["verdict"]["status"] == s["status"], s["command"]
        assert s["saving_bytes"] == data["device_bytes"] - s["device_bytes"]
        assert s["saving_bytes"] >= MIN_SAVING_SHARE * data["device_bytes"], "no change that saves under 2%"
        for name, value in s["changes"].items():
            if name != "model":
                assert rerun["setup"][name] == value, (name, s["command"])


def test_the_obvious_fix_comes_first():
    """Issue #13: LoRA at batch 8, length 4096 on a 24 GB card: micro-batch 1 x accumulation 8 with checkpointing
    fits at the user's length, and comes before any length cut. Under hf, chunked cross-entropy is Liger's fused
    linear cross-entropy (no full logits), a gentler lever than QLoRA, so it comes first; QLoRA comes next."""
    r = report(Request(model="meta-llama/Llama-3.1-8B", setup={"method": "lora", "batch_size": 8, "seq_len": 4096},
                       gpu="rtx-4090"))
    first, second = r.suggestions[:2]
    assert first.fits and first.changes == {"batch_size": 1, "grad_accum": 8, "grad_ckpt": True, "chunked_ce": True,
                                            "loss": "liger"}
    expected = TrainingSetup(method="lora", batch_size=1, grad_accum=8, seq_len=4096, grad_ckpt=True, loss="liger")
    assert first.device_bytes == estimate(r.spec, expected).device_bytes
    assert second.fits and second.changes == {"method": "qlora", "batch_size": 1, "grad_accum": 8, "grad_ckpt": True}
    expected = TrainingSetup(method="qlora", batch_size=1, grad_accum=8, seq_len=4096)
    assert round(second.device_bytes / 2**30, 2) == 13.96 == round(estimate(r.spec, expected).device_bytes / 2**30, 2)
    for s in r.suggestions:
        setup = TrainingSetup(**{k: v for k, v in s.changes.items()})
        assert setup.seq_len >= 512 or "seq_len" not in s.changes, s.change


def test_levers_are_estimates_of_their_setups():
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="a100-40gb")
    setup = TrainingSetup(method="full", batch_size=2, seq_len=2048)
    r = report(Request(model="meta-llama/Llama-3.1-8B", setup={"method": "full", "batch_size": 2},
                       gpu="a100-40gb"))
    assert r.suggestions
    for s in r.suggestions:
        changes = {k: v for k, v in s.changes.items() if k != "model"}
        new = setup.with_method(changes.pop("method")) if "method" in changes else setup
        new = new.replace(**changes)
        model = load_model(s.changes["model"]) if "model" in s.changes else spec
        est = estimate(model, new)
        assert est.device_bytes == s.device_bytes, s.change
        assert verdict(est, hw).status == s.status


def test_smaller_model_and_more_gpus_are_offered():
    r = report(Request(model="Qwen/Qwen2.5-7B", setup={"method": "full", "batch_size": 2}, gpu="a100-40gb"))
    by_kind = {("model" in s.changes, "gpus" in s.changes): s for s in r.suggestions if s.fits}
    smaller = by_kind[(True, False)]
    best = biggest_model(r.setup, load_hardware(gpu="a100-40gb"), "qwen2.5").value
    assert smaller.changes["model"] == best and best != "Qwen/Qwen2.5-7B"
    gpus = by_kind[(False, True)]
    assert gpus.changes["gpus"] in (2, 4, 8) and gpus.changes["shard"] in ("zero2", "fsdp", "zero3")


def test_mac_advice_never_offers_cuda_only_levers():
    """bitsandbytes, Liger/Triton kernels and several GPUs do not exist on a Mac (issue #13)."""
    for model, method in (("Qwen/Qwen2.5-3B", "full"), ("Qwen/Qwen2.5-7B", "lora"), ("Qwen/Qwen3-32B", "qlora")):
        r = report(Request(model=model, setup={"method": method}, mac="36GB"))
        assert r.verdict.status != "fits"
        for s in r.suggestions:
            assert "gpus" not in s.changes and "shard" not in s.changes, s.change
            assert s.changes.get("optimizer") not in ("adamw-8bit", "paged-adamw-8bit"), s.change
            assert not s.changes.get("chunked_ce"), s.change
            # A 4-bit base on a Mac is an MLX conversion, never bitsandbytes.
            assert s.changes.get("method") != "qlora" or r.setup.recipe == "mlx", s.change


def test_a_tight_run_gets_no_negligible_change():
    """A change saving under 2% is never listed (the 8-bit optimizer of a rank-8 adapter saves ~0.02 GiB)."""
    est = report(Request(model="meta-llama/Llama-3.1-8B", setup={"method": "qlora"})).estimate
    # A card between the point estimate and the range's high end: TIGHT, whatever the error band is.
    card_bytes = (est.device_bytes + est.range_high_bytes) // 2
    r = report(Request(model="meta-llama/Llama-3.1-8B", setup={"method": "qlora"}, memory=f"{card_bytes}B"))
    assert r.verdict.status == "tight"
    assert all(s.saving_bytes >= MIN_SAVING_SHARE * r.estimate.device_bytes for s in r.suggestions)
    assert not any(s.changes.get("optimizer") == "adamw-8bit" for s in r.suggestions)


def test_smaller_batch_keeps_the_effective_batch():
    r = report(Request(model="Qwen/Qwen2.5-7B", setup={"method": "lora", "batch_size": 16, "seq_len": 4096,
                                                      "grad_accum": 2}, gpu="a100-80gb"))
    lever = next(s for s in r.suggestions if "batch_size" in s.changes and s.fits)
    assert lever.changes["batch_size"] * lever.changes["grad_accum"] == 16 * 2
    assert lever.changes["batch_size"] < 16


def test_the_dataset_decides_which_length_is_typical():
    from memfit.advisor import suggest
    from memfit.dataset import length_stats

    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4090")
    setup = TrainingSetup(method="lora", seq_len=8192)
    stats = length_stats([100] * 98 + [3000, 9000], "text", 8192)
    found = suggest(spec, setup, hw, lambda ref, s: "", dataset=stats)
    cut = [s for s in found if "seq_len" in s.changes]
    assert cut and all(f"p99 of your dataset is {stats.p99} tokens" in s.cost for s in cut)


@pytest.mark.parametrize("field,step", [("seq_len", 1), ("seq_len", 64), ("batch_size", 1)])
def test_max_is_exact(field, step):
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4090")
    setup = TrainingSetup(method="qlora", seq_len=1024)
    result = max_int(spec, setup, hw, field, step)
    at = estimate(spec, setup.replace(**{field: result.value}))
    above = estimate(spec, setup.replace(**{field: result.value + step}))
    assert verdict(at, hw).status == "fits" and verdict(above, hw).status != "fits"
    assert result.device_bytes == at.device_bytes and result.next_device_bytes == above.device_bytes


def test_max_answer_rechecks_as_fits_through_the_cli(capsys):
    data = _json(capsys, ["max", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx-4090", "--what",
                          "seq-len", "--format", "json"])
    length = data["seq_len"]
    at = _json(capsys, ["estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx-4090",
                        "--seq-len", str(length), "--format", "json"])
    up = _json(capsys, ["estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--gpu", "rtx-4090",
                        "--seq-len", str(length + 1), "--format", "json"])
    assert at["verdict"]["status"] == "fits" and up["verdict"]["status"] != "fits"
    assert at["device_bytes"] == data["device_bytes"] and up["device_bytes"] == data["next_step_device_bytes"]


def test_biggest_model_of_a_family():
    hw = load_hardware(mac="36GB")
    setup = TrainingSetup(method="lora")
    result = biggest_model(setup, hw, "qwen2.5")
    assert result.value == "Qwen/Qwen2.5-3B"
    assert fits(estimate(load_model("Qwen/Qwen2.5-3B"), setup), hw)
    assert not fits(estimate(load_model("Qwen/Qwen2.5-7B"), setup), hw)


def test_warnings_with_numbers():
    spec = load_model("meta-llama/Llama-3.1-8B")
    setup = TrainingSetup(method="full")
    est = estimate(spec, setup)
    hw = load_hardware(memory="128GB")
    codes = {w.code: w.message for w in warnings_for(spec, setup, est, hw, verdict(est, hw))}
    ratio = est.device_bytes / (spec.params * 2)
    assert f"{ratio:.1f}x the download" in codes["download-vs-training"]
    assert "system-RAM" in codes["memory-looks-like-system-ram"]
    assert "memory-looks-like-system-ram" not in {w.code for w in warnings_for(
        spec, setup, est, load_hardware(memory="80GiB"))}
    mac = load_hardware(mac="64GB", mac_wired_limit="64GiB")
    assert "mac-whole-ram" in {w.code for w in warnings_for(spec, setup, est, mac)}


def test_thin_margin_warning_says_how_far_it_can_grow():
    spec, hw = load_model("meta-llama/Llama-3.1-8B"), load_hardware(gpu="rtx-4090")
    setup = TrainingSetup(method="qlora", seq_len=2048)
    longest = max_int(spec, setup, hw, "seq_len", 64).value
    tight = setup.replace(seq_len=longest)
    est = estimate(spec, tight)
    messages = {w.code: w.message for w in warnings_for(spec, tight, est, hw, verdict(est, hw))}
    assert f"longest length at this batch: {longest}" in messages["thin-margin"]


def test_text_advice_lists_fitting_changes_with_their_commands(capsys):
    assert main(["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--batch-size", "8", "--seq-len",
                 "4096", "--gpu", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("Changes that fit, best first:")
    assert rest, out
    first = rest.strip().splitlines()[:3]
    # Under hf, --chunked-ce is Liger's fused linear cross-entropy: the gentlest change that fits keeps LoRA.
    assert first[0].startswith("micro-batch 1 x accumulation 8 + gradient checkpointing + Liger fused cross-entropy") \
        and "19.23 GiB" in first[0]
    assert first[2].strip() == ("run:  memfit estimate meta-llama/Llama-3.1-8B --method lora --batch-size 1 "
                                "--seq-len 4096 --grad-accum 8 --grad-ckpt --chunked-ce --gpu rtx-4090")
    assert "DOES NOT FIT on NVIDIA GeForce RTX 4090" in head


def test_smaller_model_is_smaller_for_a_moe_model():
    """Qwen3-30B-A3B QLoRA keeps its fused experts in 16 bits (physics/moe.py), so the dense Qwen3-32B needs far
    less memory while having more parameters: it is no "smaller model". The lever offers a member with fewer
    parameters whose run needs less memory than this one."""
    from memfit.sources.catalog import find_entry

    r = report(Request(model="Qwen/Qwen3-30B-A3B", setup={"method": "qlora"}, gpu="a100-40gb"))
    base = estimate(load_model("Qwen/Qwen3-30B-A3B"), r.setup)
    offered = [s for s in r.suggestions if "model" in s.changes]
    assert offered, "a smaller qwen3 fits a 40 GB card"
    for s in offered:
        name = s.changes["model"]
        assert name != "Qwen/Qwen3-32B"
        assert find_entry(name)["params"] < find_entry("Qwen/Qwen3-30B-A3B")["params"]
        assert estimate(load_model(name), r.setup).device_bytes < base.device_bytes
    assert offered[0].changes["model"] == "Qwen/Qwen3-14B"      # the biggest that is smaller in both senses
