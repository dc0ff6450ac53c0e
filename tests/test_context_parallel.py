"""--cp and --activation-offload on the existing stacks (physics/context_parallel.py)."""

from __future__ import annotations

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.physics import context_parallel as cp

LLAMA = "llama-3.1-8b"       # 32 layers, 32 heads, 8 KV heads, head dim 128, hidden 4096
TOKEN_PARTS = ("activations", "checkpoints", "recomputed layer", "embedding and head activations",
               "backward temporaries", "logits and loss")
STATE_PARTS = ("weights", "optimizer state", "gradients", "master weights", "gathered parameters")



def test_context_parallel_holds_a_cp_th_of_the_tokens_and_the_same_state():
    """Per GPU, a sequence split N ways is the run at S/N tokens (activations, checkpoints, loss) with the model
    state of the full run: the layout shards state over all GPUs either way."""
    spec = load_model(LLAMA)
    common = dict(recipe="trl", method="full", gpus=8, shard="fsdp")
    split = estimate(spec, TrainingSetup(seq_len=65536, cp=4, **common))
    short = estimate(spec, TrainingSetup(seq_len=16384, **common))
    assert split.peak_phase == short.peak_phase
    for name in TOKEN_PARTS + STATE_PARTS:
        assert split.component(name) == short.component(name), name
    # torch context_parallel's all-gather of K/V (accelerate's default under FSDP): the whole sequence's K and V,
    # and their gradients in backward: 2 x 2 x 65536 tokens x 1024 kv dims x 2 B.
    assert split.component("context-parallel buffers") == 2 * 2 * 65536 * 1024 * 2
    assert split.device_bytes < estimate(spec, TrainingSetup(seq_len=65536, **common)).device_bytes


def test_engine_decides_the_attention_split():
    assert cp.style(TrainingSetup(recipe="trl", gpus=4, shard="zero3", cp=2)) == "ulysses"
    assert cp.style(TrainingSetup(recipe="trl", gpus=4, shard="fsdp", cp=2)) == "ring-allgather"
    assert cp.style(TrainingSetup(recipe="axolotl", gpus=4, shard="fsdp", cp=2)) == "ring-allgather"
    assert cp.style(TrainingSetup(recipe="ms-swift", gpus=4, shard="zero3", cp=2)) == "ulysses"


def test_ulysses_keeps_a_whole_kv_head_when_gpus_outnumber_kv_heads():
    spec = load_model(LLAMA)          # 8 KV heads
    at8 = TrainingSetup(recipe="trl", method="full", gpus=8, nodes=2, shard="zero3", cp=8, seq_len=65536)
    at16 = at8.replace(cp=16)
    assert cp.ulysses_kv_extra_bytes(spec, at8, 2) == 0
    # 16 GPUs, 8 KV heads: each GPU keeps one KV head of all 65536 tokens, not half of one:
    # K and V x 65536 x 128 x (1 - 8/16) x 2 B per layer.
    assert cp.ulysses_kv_extra_bytes(spec, at16, 2) == 2 * 65536 * 128 * 2 // 2
    # The all-to-all output: q heads / 16 and one K and one V head of the whole sequence.
    assert cp.buffer_bytes(spec, at16, 2) == (65536 * 128 * (2 + 2) * 2,) * 2


@pytest.mark.parametrize("setup,words", [
    (dict(recipe="torchtune", gpus=2, cp=2), "torchtune recipe has no context or sequence parallelism"),
    (dict(recipe="trl", gpus=4, shard="fsdp", cp=3, seq_len=6144), "--cp 3 must divide the 4 GPUs"),
    (dict(recipe="trl", gpus=4, cp=2, shard="fsdp", attn="eager"), "needs a flash or SDPA attention kernel"),
    (dict(recipe="trl", gpus=4, cp=2), "through accelerate needs FSDP2"),
    (dict(recipe="litgpt", activation_offload=True), "litgpt recipe has no activation offload"),
])
def test_bad_context_parallel_setups_are_one_clear_error(setup, words):
    with pytest.raises(InvalidSetupError) as err:
        TrainingSetup(**setup)
    assert words in err.value.render(lambda n: "--" + n.replace("_", "-"))


def test_ulysses_needs_heads_divisible_by_cp():
    spec = load_model(LLAMA)
    setup = TrainingSetup(recipe="trl", gpus=6, shard="zero3", cp=3, seq_len=6144)
    with pytest.raises(InvalidSetupError, match="Ulysses splits attention heads"):
        estimate(spec, setup)


def test_activation_offload_with_checkpointing_is_checkpoint_offload():
    spec = load_model(LLAMA)
    setup = TrainingSetup(recipe="torchtune", method="lora", seq_len=32768, activation_offload=True)
    assert setup.grad_ckpt and setup.ckpt_offload
    plain = estimate(spec, TrainingSetup(recipe="torchtune", method="lora", seq_len=32768))
    off = estimate(spec, setup)
    assert off.component("checkpoints") == 0 and plain.component("checkpoints") == 32 * 32768 * 4096 * 2
    assert off.host_bytes == 32 * 32768 * 4096 * 2
    assert off.device_bytes < plain.device_bytes
    with pytest.raises(InvalidSetupError):
        TrainingSetup(recipe="torchtune", activation_offload=True, ckpt_offload=False)


def test_activation_offload_without_checkpointing_keeps_two_layers_on_the_gpu():
    spec = load_model(LLAMA)
    base = dict(recipe="torchtune", method="lora", seq_len=8192, grad_ckpt=False)
    plain = estimate(spec, TrainingSetup(**base))
    off = estimate(spec, TrainingSetup(activation_offload=True, **base))
    one_layer = plain.component("activations") // 32
    assert off.component("activations") == 2 * one_layer
    assert off.host_bytes == 30 * one_layer


def test_a_length_cp_does_not_divide_is_padded_to_equal_chunks():
    spec = load_model(LLAMA)
    common = dict(recipe="trl", method="full", gpus=4, shard="fsdp")
    odd = estimate(spec, TrainingSetup(seq_len=10001, cp=4, **common))
    assert odd.component("checkpoints") == estimate(spec, TrainingSetup(seq_len=2501, **common)).component(
        "checkpoints")


def test_readme_long_context_table_is_the_estimate():
    """The README's Llama-3.1-8B at 128k table is what memfit says today."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Long context:")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d.]+) GiB \| ([\d.]+ GiB|0) \| ([\d.]+) GiB", section, re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    spec = load_model(LLAMA)
    for n, tokens, ckpt, gather, device in rows:
        est = estimate(spec, TrainingSetup(recipe="trl", method="full", gpus=8, shard="fsdp", cp=int(n),
                                           seq_len=131072))
        assert int(tokens) == 131072 // int(n)
        assert f"{est.component('checkpoints') / 2**30:.2f}" == ckpt
        assert f"{est.component('context-parallel buffers') / 2**30:.2f} GiB" == gather or gather == "0"
        assert f"{est.device_bytes / 2**30:.2f}" == device
    megatron = estimate(spec, TrainingSetup(recipe="megatron", gpus=8, tp=2, cp=4, sequence_parallel=True,
                                            recompute="full", distributed_optimizer=True, seq_len=131072))
    assert f"{megatron.device_bytes / 2**30:.2f} GiB per GPU" in section


def test_accelerate_config_carries_the_context_parallel_layout(tmp_path):
    """The accelerate YAML loads in accelerate, and its parallelism config spans exactly the GPUs."""
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.parallelism_config import ParallelismConfig

    from memfit.engine_config import accelerate_fsdp_config

    setup = TrainingSetup(recipe="trl", method="full", gpus=8, shard="fsdp", cp=4, seq_len=131072)
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(accelerate_fsdp_config(load_model(LLAMA), setup)))
    loaded = ClusterConfig.from_yaml_file(str(path)).parallelism_config
    sizes = {k.removeprefix("parallelism_config_"): v for k, v in loaded.items() if k.endswith("_size")}
    pc = ParallelismConfig(**sizes)
    assert pc.cp_size == 4 and pc.total_size == 8
    assert loaded["parallelism_config_cp_comm_strategy"] == "allgather"


def test_offloaded_activations_on_the_host_are_counted_per_node():
    spec = load_model(LLAMA)
    base = dict(recipe="trl", method="full", shard="fsdp", seq_len=131072, activation_offload=True)
    one = estimate(spec, TrainingSetup(gpus=2, **base))
    eight = estimate(spec, TrainingSetup(gpus=8, **base))
    # FSDP's own host state is nil here (no --offload): the host holds each GPU's 32 layers x 131072 x 4096 x 2 B.
    assert one.host_bytes == 2 * 32 * 131072 * 4096 * 2 and eight.host_bytes == 4 * one.host_bytes
