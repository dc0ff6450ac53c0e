"""The Mac as its users run it (issue #16): mlx-lm's defaults, MLX's one counter, Mac-only advice, the catalog."""

import json

import pytest

from memfit import Request, TrainingSetup, estimate, load_hardware, load_model, report
from memfit.cli import main

CUDA_WORDS = ("CUDA", "cuBLAS", "nvidia-smi", "torch.cuda", "allocator slack", "max_memory_allocated")


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mac_estimate_has_no_cuda_term_and_reports_the_mlx_peak(capsys):
    code, out, _ = _run(capsys, "estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--mac", "36GB")
    assert code == 0 and "recipe mlx" in out and "mx.get_peak_memory()" in out
    for word in CUDA_WORDS:
        assert word not in out, word
    code, out, _ = _run(capsys, "estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--mac", "36GB",
                        "--format", "json")
    data = json.loads(out)
    assert "peak_allocated_bytes" not in data and "peak_reserved_bytes" not in data
    assert data["mlx_peak_bytes"] == data["device_bytes"] == sum(c["bytes"] for c in data["components"])
    assert {c["counter"] for c in data["components"]} == {"mlx"}
    assert not any(w in json.dumps(data) for w in ("CUDA", "cuBLAS", "nvidia-smi"))


def test_recipe_hf_on_a_mac_keeps_the_pytorch_model(capsys):
    code, out, _ = _run(capsys, "estimate", "Qwen/Qwen2.5-7B", "--mac", "36GB", "--recipe", "hf", "--format", "json")
    assert code == 0 and json.loads(out)["setup"]["recipe"] == "hf"


def test_mlx_recipe_is_mlx_lm_s_own_defaults():
    """The oracle is mlx-lm's CONFIG_DEFAULTS (mlx_lm/lora.py) when mlx-lm is installed."""
    lora = pytest.importorskip("mlx_lm.lora")
    d = lora.CONFIG_DEFAULTS
    s = TrainingSetup(recipe="mlx")
    assert s.batch_size == d["batch_size"] and s.train_layers == d["num_layers"]
    assert s.seq_len == d["max_seq_length"] and s.grad_ckpt == d["grad_checkpoint"]
    assert s.grad_accum == d["grad_accumulation_steps"]
    assert s.lora_rank == d["lora_parameters"]["rank"] and s.lora_dropout == d["lora_parameters"]["dropout"]
    assert d["optimizer"] in ("adam", "adamw") and s.optimizer == "adamw"     # same two moments
    assert s.lora_targets == ("q", "k", "v", "o", "gate", "up", "down")     # every Linear (keys=None)


def test_the_mlx_estimate_is_the_step_model():
    from memfit.physics.mlx import mlx_estimate

    spec = load_model("Qwen/Qwen2.5-1.5B")
    est = estimate(spec, TrainingSetup(recipe="mlx", seq_len=1024, grad_ckpt=True))
    m = mlx_estimate(spec, method="lora", batch_size=4, seq_len=1023, train_layers=16, grad_ckpt=True,
                     dtype="bf16", backend="metal")
    assert est.device_bytes == m.mlx_peak_bytes and est.kind == "mlx"
    qlora = estimate(spec, TrainingSetup(recipe="mlx", method="qlora", quant="mlx-8bit"))
    four = estimate(spec, TrainingSetup(recipe="mlx", method="qlora"))
    assert four.component("weights") < qlora.component("weights") < estimate(
        spec, TrainingSetup(recipe="mlx")).component("weights")


@pytest.mark.parametrize("argv,message", [
    (["--recipe", "mlx", "--method", "qlora", "--quant", "nf4"], "the mlx recipe quantizes with MLX"),
    (["--method", "qlora", "--quant", "mlx-4bit"], "is an MLX conversion: it needs --recipe mlx"),
    (["--recipe", "mlx", "--precision", "bf16-mixed"], "MLX has no autocast"),
    (["--method", "full", "--train-layers", "4"], "modelled for --recipe mlx only"),
    (["--recipe", "mlx", "--optimizer", "paged-adamw-8bit"], "not one the mlx recipe can use"),
])
def test_bad_mlx_combinations_are_one_error(capsys, argv, message):
    code, out, err = _run(capsys, "estimate", "qwen2.5-0.5b", *argv)
    assert code == 1 and out == "" and err.count("\n") == 1 and message in err


def test_mac_advice_uses_mac_levers_only():
    r = report(Request(model="Qwen/Qwen2.5-7B", setup={"method": "lora"}, mac="36GB"))
    assert r.verdict.status == "does-not-fit"
    changed = set().union(*(s.changes for s in r.suggestions))
    assert "train_layers" in changed and "grad_ckpt" in changed
    assert not changed & {"gpus", "shard", "chunked_ce", "optimizer"}
    qlora = [s for s in r.suggestions if s.changes.get("method") == "qlora"]
    assert qlora and all("mlx_lm.convert" in s.cost for s in qlora)


def test_wired_limit_is_the_last_resort(tmp_path):
    """When no setup change fits, raising iogpu.wired_limit_mb is offered, with its risk, and re-checks as FITS."""
    from memfit.sources.catalog import find_entry

    path = tmp_path / "config.json"           # not a catalog model: no smaller sibling to offer
    path.write_text(json.dumps(find_entry("llama-3.1-70b")["config"]))
    r = report(Request(model=str(path), setup={"method": "qlora", "batch_size": 1, "seq_len": 512}, mac="48GB"))
    assert r.verdict.status == "does-not-fit"
    wired = r.suggestions[0]
    assert "mac_wired_limit" in wired.changes and "may page or freeze" in wired.cost
    limit = wired.changes["mac_wired_limit"]
    setup = {"method": "qlora", "batch_size": 1, "seq_len": 512}
    setup.update({k: v for k, v in wired.changes.items() if k != "mac_wired_limit"})
    again = report(Request(model=str(path), setup=setup,
                           mac="48GB", mac_wired_limit=limit))
    assert again.verdict.status == "fits" and again.estimate.device_bytes == wired.device_bytes


def test_mac_catalog_by_slug_and_listing(capsys):
    hw = load_hardware(mac="m3-max-36gb")
    assert hw.capacity_bytes == 36 * 2**30 and hw.usable_bytes == 28_991_030_000 - 28_991_030_000 % 1 or \
        abs(hw.usable_bytes - 28_991_030_000) < 2**20
    assert load_hardware(mac="32GB").usable_bytes == 32 * 2**30 * 2 // 3     # 2/3 up to 32 GB (measured)
    assert load_hardware(mac="36GB").usable_bytes == 27 * 2**30              # 3/4 from 36 GB
    code, out, _ = _run(capsys, "macs", "--format", "json")
    slugs = {m["slug"] for m in json.loads(out)["macs"]}
    assert code == 0 and {"m1-8gb", "m3-max-36gb", "m2-ultra-192gb"} <= slugs


def test_check_reads_an_mlx_lm_config_the_mac_way(tmp_path, capsys):
    """num_layers is --train-layers, lora_parameters.keys the targets; the advice edits mlx-lm's own keys."""
    path = tmp_path / "lora.yaml"
    path.write_text("model: Qwen/Qwen2.5-7B\nfine_tune_type: lora\nnum_layers: 8\nbatch_size: 4\n"
                    "lora_parameters:\n  keys: [self_attn.q_proj, self_attn.v_proj]\n  rank: 8\n  scale: 20.0\n")
    code, out, _ = _run(capsys, "check", str(path), "--mac", "36GB", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["setup"]["train_layers"] == 8 and data["setup"]["lora_targets"] == ["q", "v"]
    expected = estimate(load_model("Qwen/Qwen2.5-7B"), TrainingSetup(recipe="mlx", train_layers=8,
                                                                    lora_targets=("q", "v")))
    assert data["estimate"]["device_bytes"] == expected.device_bytes and "mlx_peak_bytes" in data["estimate"]
    keys = {k for s in data["suggestions"] for k in s["edits"]}
    assert keys <= {"batch_size", "grad_accumulation_steps", "grad_checkpoint", "num_layers", "model",
                    "max_seq_length", "fine_tune_type"}
    code, out, _ = _run(capsys, "check", str(path), "--mac", "36GB")
    assert not any(w in out for w in CUDA_WORDS)


def test_a_catalog_mac_without_a_measurement_gets_the_same_limit_as_its_ram():
    # One rule: `--mac m4-max-128gb` and `--mac 128GB` must not disagree about what the GPU may use.
    from memfit.macs import mac_catalog

    for mac in mac_catalog():
        by_slug = load_hardware(mac=mac.slug)
        by_ram = load_hardware(mac=f"{mac.ram_bytes // 2**30}GB")
        if mac.working_set_kind == "rule":
            assert by_slug.usable_bytes == by_ram.usable_bytes, mac.slug
        else:   # a published reading wins over the rule for that machine
            assert by_slug.usable_bytes == mac.working_set_bytes, mac.slug
