"""The command line: every command works, JSON has the documented schema, bad input is one line on stderr."""

import json
import subprocess
import sys

import pytest

from memfit.cli import main

GiB = 2**30


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_schema(capsys):
    code, out, err = run(capsys, "estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--format", "json",
                         "--gpu", "rtx-4090")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["schema_version"] == 2
    assert data["model"]["name"] == "Qwen/Qwen2.5-7B" and data["model"]["params"] == 7_615_616_512
    assert data["model"]["trainable_params"] == 28 * 8 * (3584 + 3584 + 3584 + 512)   # r8 on q,v
    for key in ("setup", "components", "peak_allocated_bytes", "peak_reserved_bytes", "device_bytes", "range",
                "peak_phase", "assumptions", "verdict"):
        assert key in data
    assert data["verdict"]["status"] in ("fits", "tight", "does-not-fit")
    assert data["verdict"]["usable_bytes"] == 24564 * 2**20
    assert data["verdict"]["margin_bytes"] == data["verdict"]["usable_bytes"] - data["device_bytes"]
    assert sum(c["bytes"] for c in data["components"]) == data["device_bytes"]


def test_estimate_text_names_counters_and_defaults(capsys):
    code, out, _ = run(capsys, "estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--seq-len", "2048",
                       "--gpu", "rtx-4090")
    assert code == 0
    assert "torch.cuda.max_memory_allocated" in out and "nvidia-smi" in out
    assert "FITS" in out and "batch 1*" in out and "length 2048," in out


def test_config_file_and_memory_flag(capsys, tmp_path):
    from memfit.sources.catalog import find_entry

    path = tmp_path / "config.json"
    path.write_text(json.dumps(find_entry("llama-3.2-1b")["config"]))
    code, out, _ = run(capsys, "estimate", str(path), "--method", "full", "--batch-size", "4",
                       "--precision", "bf16-mixed", "--memory", "80GB", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["setup"]["precision_resolved"] == "bf16-mixed"
    assert data["verdict"]["usable_bytes"] == 80 * 10**9
    assert any("80GB read as" in n for n in data["verdict"]["hardware"]["notes"])


def test_bare_size_on_a_mac(capsys):
    code, out, _ = run(capsys, "estimate", "7B", "--method", "lora", "--mac", "36GB", "--format", "json")
    data = json.loads(out)
    assert data["kind"] == "rule-of-thumb" and data["device_bytes"] == 17 * 10**9
    assert data["verdict"]["status"] == "fits" and data["verdict"]["usable_bytes"] == 27 * GiB


@pytest.mark.parametrize("command", [["models"], ["models", "--family", "qwen2.5"], ["gpus"], ["macs"], ["rule"],
                                     ["explain", "meta-llama/Llama-3.1-8B", "--method", "full"]])
def test_listing_commands(capsys, command):
    code, out, err = run(capsys, *command)
    assert code == 0 and out.strip() and err == ""
    code, out, _ = run(capsys, *command, "--format", "json")
    assert code == 0 and json.loads(out)["schema_version"] == 2


def test_models_family_filter(capsys):
    _, out, _ = run(capsys, "models", "--family", "qwen2.5", "--format", "json")
    slugs = [m["slug"] for m in json.loads(out)["models"]]
    assert "qwen2.5-7b" in slugs and all(s.startswith("qwen2.5") for s in slugs)


def test_explain_full_bf16_foreach(capsys):
    _, out, _ = run(capsys, "explain", "llama-3-8b", "--method", "full", "--precision", "bf16", "--optimizer",
                    "adamw", "--format", "json")
    data = json.loads(out)
    per = {r["what"]: r["bytes"] for r in data["bytes_per_trained_weight"]}
    # weight 2 + gradient 2 + bf16 Adam moments 2 + 2 + foreach temporary 2 = 10 (memory-physics §0.6)
    assert per == {"weight": 2, "gradient": 2, "optimizer state": 4, "optimizer step temporaries": 2}
    assert data["rule_of_thumb_bytes_per_weight"] == 12
    assert any("parameter dtype" in d for d in data["differences"])


def test_explain_names_the_adapter_dtype_not_the_run_s(capsys):
    # PEFT keeps LoRA A/B in fp32 while the base trains in bf16: the row says fp32 (user trial D24).
    _, out, _ = run(capsys, "explain", "llama-3-8b", "--method", "lora", "--format", "json")
    weight = next(r for r in json.loads(out)["bytes_per_trained_weight"] if r["what"] == "weight")
    assert weight["bytes"] == 4 and weight["note"].startswith("fp32 adapter"), weight


BAD = [
    (["estimate", "no-such-model-xyz"], 1, "unknown model"),
    (["estimate", "./missing/config.json"], 1, "no such file"),
    (["estimate", "llama-3.1-8b", "--batch-size", "0"], 1, "at least 1"),
    (["estimate", "llama-3.1-8b", "--seq-len", "-5"], 1, "at least 1"),
    (["estimate", "llama-3.1-8b", "--seq-len", "ten"], 1, "not a whole number"),
    (["estimate", "llama-3.1-8b", "--batch-size", "99999999"], 1, "absurdly large"),
    (["estimate", "llama-3.1-8b", "--method", "full", "--quant", "nf4"], 1, "--quant only applies to --method qlora"),
    (["estimate", "llama-3.1-8b", "--method", "full", "--lora-rank", "8"], 1,
     "--lora-rank only applies to --method lora or qlora or dora"),
    (["estimate", "llama-3.1-8b", "--gpu", "rtx-4090", "--mac", "36GB"], 1, "exactly one"),
    (["estimate", "llama-3.1-8b", "--gpu", "rtx4090x"], 1, "unknown GPU"),
    (["estimate", "llama-3.1-8b", "--memory", "24"], 1, "no unit"),
    (["estimate", "llama-3.1-8b", "--memory=-24GB"], 1, "not a size"),
    (["estimate", "llama-3.1-8b", "--memory", "5000TB"], 1, "larger than any"),
    (["estimate", "llama-3.1-8b", "--optimizer", "sophia"], 1, "optimizer 'sophia'"),
    (["estimate", "llama-3.1-8b", "--lora-targets", "q,zz"], 1, "--lora-targets unknown LoRA target zz"),
    (["estimate", "llama-3.1-8b", "--recipe", "nemo"], 1, "--recipe 'nemo' is not one of hf, trl, trl-1.14, trl-0.21, torchtune"),
    (["estimate", "llama-3.1-8b", "--gpus", "0"], 1, "--gpus must be at least 1"),
    (["estimate", "llama-3.1-8b", "--recipe", "mlx", "--optimizer", "adamw-8bit"], 1,
     "--optimizer adamw-8bit is not one the mlx recipe can use"),
    (["estimate", "llama-3.1-8b", "--gpus", "2", "--mac", "36GB"], 1, "mlx-lm trains on one Apple-silicon GPU"),
    (["estimate", "llama-3.1-8b", "--gpus", "2", "--mac", "36GB", "--recipe", "hf"], 1, "a Mac has one GPU"),
    (["estimate", "qwen2.5-0.5b", "--lora-rank", "16384"], 1, "above the width of the adapted layers (128)"),
    (["estimate", "llama-3.1-8b", "--recipe", "torchtune", "--method", "full", "--grad-accum", "4"], 1,
     "--optimizer-in-backward cannot accumulate gradients: set --grad-accum 1"),
    (["estimate", "llama-3.1-8b", "--precision", "bf16", "--autocast"], 1, "--autocast contradicts --precision"),
    (["estimate", "llama-3.1-8b", "--ckpt-offload"], 1, "--ckpt-offload moves checkpoints"),
    (["estimate", "llama-3.1-8b", "--shard", "zero2", "--offload", "optimizer+params"], 1, "needs --shard zero3"),
    (["estimate", "llama-3.1-8b", "--gpus", "2", "--shard", "hsdp"], 1, "--nodes 2 or more"),
    (["estimate", "llama-3.1-8b", "--method", "qlora", "--precision", "fp32"], 1, "contradicts"),
    (["estimate", "0.0001B"], 1, "below a million"),
    (["estimate", "~nosuchuser/x"], 1, "cannot be read as a path"),
    (["trace", "gpt2", "--steps", "1000000"], 1, "trace 2 to 20 optimizer steps"),     # refused before torch loads
    (["plot", "gpt2", "-o", "/nonexistent-folder/x.png"], 1, "the folder /nonexistent-folder does not exist"),
    (["estimate", "llama-3.1-8b", "--attn", "magic"], 1, "--attn 'magic' is not one of sdpa, flash, eager"),
    (["estimate"], 2, "required"),
    (["frobnicate"], 2, "invalid choice"),
]


@pytest.mark.parametrize("argv,code,message", BAD, ids=[" ".join(b[0][1:]) or b[0][0] for b in BAD])
def test_bad_input_is_one_line_on_stderr(capsys, argv, code, message):
    got, out, err = run(capsys, *argv)
    assert got == code
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_python_dash_m_and_no_torch_import():
    code = ("import sys, memfit; from memfit.cli import main; "
            "main(['estimate', 'llama-3.2-1b', '--format', 'json']); "
            "assert 'torch' not in sys.modules and 'huggingface_hub' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "memfit", "estimate", "7B"], capture_output=True, text=True)
    assert proc.returncode == 0 and "RULE OF THUMB" in proc.stdout


def test_trace_without_the_extra_names_the_install(capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "transformers", "peft"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    code, out, err = run(capsys, "trace", "llama-3.2-1b")
    assert code == 1 and out == ""
    assert 'pip install "memfit[trace]"' in err and err.count("\n") == 1


def test_reentrant_needs_checkpointing(capsys):
    code, _, err = run(capsys, "estimate", "llama-3.2-1b", "--reentrant")
    assert code == 1 and "needs --grad-ckpt" in err


def test_every_command_has_help_and_is_in_the_readme(capsys):
    from pathlib import Path

    from memfit.cli import COMMANDS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert "usage: memfit " + command in capsys.readouterr().out
        assert f"memfit {command}" in readme, command


def test_every_recipe_switch_has_an_off_form(capsys):
    """Issue #13/#15: a recipe default can be turned off explicitly (TT-10 ran torchtune full without them)."""
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--recipe", "torchtune", "--method", "full",
                       "--no-grad-ckpt", "--no-chunked-ce", "--no-optimizer-in-backward", "--optimizer", "adamw",
                       "--format", "json")
    setup = json.loads(out)["setup"]
    assert code == 0 and setup["grad_ckpt"] is False and setup["chunked_ce"] is False
    assert setup["optimizer_in_backward"] is False and setup["optimizer"] == "adamw"
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--recipe", "unsloth", "--no-ckpt-offload",
                       "--no-autocast", "--format", "json")
    setup = json.loads(out)["setup"]
    assert code == 0 and setup["ckpt_offload"] is False and setup["autocast"] is False and setup["grad_ckpt"]
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--recipe", "unsloth", "--format", "json")
    assert json.loads(out)["setup"]["ckpt_offload"] is True


def test_gpus_without_a_layout_are_replicas(capsys):
    """`--gpus 4` alone, or with --shard none, means DDP replicas, exactly as --shard ddp."""
    outs = []
    for extra in ([], ["--shard", "none"], ["--shard", "ddp"]):
        code, out, _ = run(capsys, "estimate", "llama-3.2-1b", "--method", "full", "--gpus", "4", *extra,
                           "--format", "json")
        data = json.loads(out)
        assert code == 0 and data["setup"]["shard"] == "ddp"
        outs.append(data["device_bytes"])
    assert outs[0] == outs[1] == outs[2]


def test_past_the_context_is_a_warning(capsys, tmp_path):
    from memfit.sources.catalog import find_entry

    config = dict(find_entry("llama-3.2-1b")["config"], max_position_embeddings=1024)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, _ = run(capsys, "estimate", str(path), "--seq-len", "4096", "--format", "json")
    warnings = {w["code"]: w["message"] for w in json.loads(out)["warnings"]}
    assert code == 0 and "past" in warnings["past-context"] and "1024" in warnings["past-context"]


def test_readme_flag_reference_is_the_options_table():
    """No option is spelled out by hand: the README's flag lists are what options.flag_reference() prints."""
    from pathlib import Path

    from memfit.options import flag_reference

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for group in ("setup", "hardware"):
        block = readme.split(f"<!-- flags:{group} -->\n```\n", 1)[1].split("\n```", 1)[0]
        assert block == flag_reference(group), f"{group}: run python tools/readme_flags.py"
    from memfit.components import readme_table

    table = readme.split("<!-- components -->\n", 1)[1].split("\n<!-- /components -->", 1)[0]
    assert table == readme_table(), "What is counted: run python tools/readme_flags.py"


def test_gpt2_past_its_1024_positions_is_a_warning(capsys):
    """Issue #14: GPT-2 at 100,000 tokens was estimated without a word (n_positions is 1024)."""
    code, out, _ = run(capsys, "estimate", "gpt2", "--seq-len", "100000", "--format", "json")
    warnings = {w["code"]: w["message"] for w in json.loads(out)["warnings"]}
    assert code == 0 and "context of 1024 tokens" in warnings["past-context"]
