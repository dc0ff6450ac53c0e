"""Multi-GPU layouts: per-GPU memory falls as GPUs are added; ZeRO's model states equal DeepSpeed's estimators."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit import TrainingSetup, estimate, load_model
from memfit.estimator import _static_parts
from memfit.physics.sharding import DS_SUB_GROUP_SIZE, largest_layer_params, model_state_bytes

SHARDS = ["ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-shard-grad-op"]
MODELS = ["llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "mixtral-8x7b", "phi-3-mini-4k", "llama-3.2-1b"]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(MODELS), st.sampled_from(["full", "lora", "qlora"]), st.sampled_from(SHARDS),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from(["none", "optimizer"]))
def test_per_gpu_memory_never_rises_with_more_gpus(model, method, shard, gpus, offload):
    if offload != "none" and shard in ("ddp", "fsdp-shard-grad-op"):
        offload = "none"
    spec = load_model(model)

    def per_gpu(n):
        return estimate(spec, TrainingSetup(method=method, gpus=n, shard=shard, offload=offload)).device_bytes

    assert per_gpu(gpus * 2) <= per_gpu(gpus)


def test_sharding_saves_against_one_gpu():
    spec = load_model("llama-3.1-8b")
    one = estimate(spec, TrainingSetup(method="full")).device_bytes
    for shard in ("zero2", "zero3", "fsdp"):
        assert estimate(spec, TrainingSetup(method="full", gpus=8, shard=shard)).device_bytes < one
    ddp = estimate(spec, TrainingSetup(method="full", gpus=8, shard="ddp"))
    assert ddp.device_bytes > one          # DDP replicates and adds gradient buckets
    assert ddp.component("communication buffers") == 2 * spec.params


def _states(spec, optimizer="adamw-fused", **kw):
    # DeepSpeed's estimators assume its FusedAdam: no step temporaries besides the fp32 gradient.
    setup = TrainingSetup(method="full", precision="bf16", optimizer=optimizer, **kw)
    return model_state_bytes(_static_parts(spec, setup)["sharded"])


deepspeed = None


def _ds():
    global deepspeed
    if deepspeed is None:
        deepspeed = pytest.importorskip("deepspeed")
    return deepspeed


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus,nodes", [(1, 1), (2, 1), (8, 1), (8, 2)])
def test_zero2_equals_deepspeed(model, gpus, nodes):
    _ds()
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    spec = load_model(model)
    for offload in (False, True):
        cpu, gpu = estimate_zero2_model_states_mem_needs(spec.params, gpus, nodes, cpu_offload=offload)
        ours = _states(spec, gpus=gpus, nodes=nodes, shard="zero2", offload="optimizer" if offload else "none")
        assert ours == pytest.approx(gpu, rel=0.01)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus,nodes", [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)])
def test_zero3_within_deepspeed(model, gpus, nodes):
    """Within 10% of DeepSpeed's estimator wherever its formula applies: the estimator counts the fp32 gradient of
    the whole partition, while stage3.py steps sub-groups of at most sub_group_size (1e9) elements, so beyond that
    memfit is lower by design; with offload both are exact."""
    _ds()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    spec = load_model(model)
    for offload, offload_params, ours_offload in ((False, False, "none"), (True, False, "optimizer"),
                                                  (True, True, "optimizer+params")):
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(spec.params, largest_layer_params(spec), gpus, nodes,
                                                            cpu_offload=offload, cpu_offload_params=offload_params)
        ours = _states(spec, gpus=gpus, nodes=nodes, shard="zero3", offload=ours_offload)
        partition = spec.params / (gpus * nodes)
        if offload or partition <= DS_SUB_GROUP_SIZE:
            assert ours == pytest.approx(gpu, rel=0.01 if offload else 0.10)
        else:
            # the 16 B per partition element that persist (16-bit param and grad, fp32 master, Adam moments) plus
            # at most one sub-group's fp32 gradient
            assert 16 * partition < ours <= 16 * partition + 4 * max(DS_SUB_GROUP_SIZE, largest_layer_params(spec))
            assert ours < gpu * 1.10
        host = estimate(spec, TrainingSetup(method="full", gpus=gpus, nodes=nodes, shard="zero3",
                                            offload=ours_offload)).host_bytes
        if offload:
            assert host == pytest.approx(cpu, rel=0.01)


def _deepspeed_table_gib(printer, *args, **kw):
    """Per-GPU GiB of the no-offload, zero_init=1 row of DeepSpeed's printed estimate table."""
    import contextlib
    import io
    import re

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        printer(*args, **kw)
    for line in out.getvalue().splitlines():
        if "offload_param=none" in line and "offload_optimizer=none" in line and "zero_init=1" in line:
            return float(re.findall(r"([\d.]+)GB", line)[1])
    raise AssertionError(out.getvalue())


def test_zero3_llama_3_1_8b_on_8_gpus_matches_deepspeeds_cold_estimate():
    _ds()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

    spec = load_model("llama-3.1-8b")
    theirs = _deepspeed_table_gib(estimate_zero3_model_states_mem_needs_all_cold, spec.params,
                                  largest_layer_params(spec), num_gpus_per_node=8)
    assert theirs == pytest.approx(18.78, abs=0.01)          # the figure DeepSpeed prints
    ours = _states(spec, gpus=8, shard="zero3") / 2**30
    assert ours == pytest.approx(theirs, rel=0.10)
    # and the estimate's own optimizer-step phase carries the same model states (no autocast copies, no fp32 weights)
    est = estimate(spec, TrainingSetup(method="full", precision="bf16", optimizer="adamw-fused", gpus=8,
                                       shard="zero3"))
    assert est.component("autocast weight copies") == 0
    assert dict(est.phases)["optimizer step"] / 2**30 < theirs * 1.10


def test_zero3_matches_deepspeeds_live_estimate_on_a_real_model():
    _ds()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live

    from memfit.spec import ModelSpec

    config = dict(model_type="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, vocab_size=8192, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                          dtype=torch.bfloat16)
    theirs = _deepspeed_table_gib(estimate_zero3_model_states_mem_needs_all_live, model, num_gpus_per_node=4)
    spec = ModelSpec.from_hf_config(config, name="tiny", source="test")
    assert spec.params == sum(p.numel() for p in model.parameters())
    assert _states(spec, gpus=4, shard="zero3") / 2**30 == pytest.approx(theirs, rel=0.10)


def test_zero_keeps_the_users_optimizer_on_the_fp32_partition():
    """DeepSpeed wraps the client optimizer around its fp32 master partition: SGD keeps 4 B of momentum per
    element there, AdamW 8 B; 8-bit AdamW 2 B + an fp32 absmax per 256; a flat partition is never factored, so
    Adafactor keeps a full fp32 second moment."""
    spec = load_model("llama-3.2-1b")

    def opt_state(optimizer, gpus=2):
        setup = TrainingSetup(method="full", optimizer=optimizer, gpus=gpus, shard="zero3")
        return _static_parts(spec, setup)["sharded"]["opt"]

    part = -(-spec.params // 2)
    assert opt_state("sgd") == 4 * part
    assert opt_state("adamw-fused") == 8 * part
    assert opt_state("adamw-8bit") == 2 * part + 8 * -(-part // 256)
    assert opt_state("adafactor") == 4 * part
    est = estimate(spec, TrainingSetup(method="full", optimizer="sgd", gpus=2, shard="zero3"))
    assert any("keeps the sgd optimizer" in a for a in est.assumptions)
    assert not any("Adam" in a for a in est.assumptions if "zero3" in a)


def test_zero3_sgd_per_gpu_falls_from_one_to_two_gpus():
    spec = load_model("llama-3.2-1b")
    per_gpu = {n: estimate(spec, TrainingSetup(method="full", optimizer="sgd", gpus=n, shard="zero3")).device_bytes
               for n in (1, 2)}
    assert per_gpu[2] < per_gpu[1]
    adam2 = estimate(spec, TrainingSetup(method="full", optimizer="adamw-fused", gpus=2, shard="zero3"))
    # SGD's momentum is half of AdamW's two moments on the same fp32 partition.
    assert adam2.component("optimizer state") == 2 * estimate(
        spec, TrainingSetup(method="full", optimizer="sgd", gpus=2, shard="zero3")).component("optimizer state")


def test_zero_runs_16_bit_without_autocast():
    """bf16-mixed (fp32 weights + autocast on one GPU) under ZeRO is DeepSpeed's bf16 engine: 16-bit weights, no
    autocast weight copies, an fp32 master partition instead."""
    spec = load_model("llama-2-70b")
    setup = TrainingSetup(method="lora", precision="bf16-mixed", lora_targets=("q", "k", "v", "o", "gate", "up", "down"),
                          gpus=8, shard="zero3", grad_ckpt=True)
    est = estimate(spec, setup)
    assert est.component("autocast weight copies") == 0
    assert est.component("weights") == pytest.approx(2 * spec.params / 8, rel=0.01)
    lora = _static_parts(spec, setup)["trainable_params"]
    assert est.component("master weights") == 4 * -(-lora // 8)
    assert est.component("adapter weights") == 2 * -(-lora // 8)


def test_zero3_qlora_keeps_quant_constants_and_gathers_packed_data():
    spec = load_model("llama-3.1-8b")
    one = _static_parts(spec, TrainingSetup(method="qlora", gpus=1))
    z3 = _static_parts(spec, TrainingSetup(method="qlora", gpus=4, shard="zero3"))["sharded"]
    assert z3["quant"] == one["quant"] > 0          # quant_state is not a parameter: ZeRO-3 leaves it whole
    assert z3["weights"] == -(-one["weights"] // 4)
    # the largest module is the bf16 lm_head, not a 4-bit linear counted as if it were 16-bit
    assert z3["gathered"] == 2 * spec.vocab_size * spec.hidden_size


@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen2.5-0.5b", "gemma-2-2b", "phi-2"])
def test_largest_layer_matches_deepspeeds_definition(model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from memfit.sources.catalog import find_entry

    config = transformers.AutoConfig.for_model(**find_entry(model)["config"])
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    # deepspeed stage3.model_to_params: params owned directly (recurse=False) by the largest module
    expected = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in built.modules())
    assert largest_layer_params(load_model(model)) == expected


CONFIG_CASES = [
    ("llama-3.1-8b", dict(method="full", gpus=8, shard="zero3", offload="optimizer", batch_size=2, grad_accum=4)),
    ("qwen2.5-7b", dict(method="full", gpus=4, shard="zero2")),
    ("qwen2.5-7b", dict(method="lora", gpus=2, nodes=2, shard="zero1")),
    ("gemma-2-9b", dict(method="full", gpus=8, shard="zero3", offload="optimizer+params")),
]


@pytest.mark.parametrize("model,kw", CONFIG_CASES)
def test_deepspeed_config_loads_in_deepspeed(model, kw):
    _ds()
    from deepspeed.runtime.config import DeepSpeedConfig

    from memfit.engine_config import deepspeed_config

    setup = TrainingSetup(**kw)
    cfg = DeepSpeedConfig(deepspeed_config(load_model(model), setup))
    assert cfg.zero_optimization_stage == int(setup.shard[-1])
    assert cfg.train_micro_batch_size_per_gpu == setup.batch_size
    assert cfg.gradient_accumulation_steps == setup.grad_accum
    assert cfg.zero_config.offload_optimizer is not None if setup.offload != "none" else True
    # offload needs DeepSpeed's CPU Adam; otherwise HF Trainer's optimizer (the user's) is kept
    assert (cfg.optimizer_name == "adamw") == (setup.offload != "none")


@pytest.mark.parametrize("model,shard,nodes", [("llama-3.1-8b", "fsdp", 1), ("qwen3-8b", "fsdp-shard-grad-op", 1),
                                               ("mistral-7b-v0.1", "hsdp", 2), ("phi-3-mini-4k", "fsdp", 1),
                                               ("gpt2", "fsdp", 1), ("gemma-2-9b", "fsdp", 1)])
def test_accelerate_fsdp_config_loads_in_accelerate(tmp_path, model, shard, nodes):
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    from memfit.engine_config import accelerate_fsdp_config
    from memfit.sources.catalog import find_entry

    spec = load_model(model)
    setup = TrainingSetup(method="full", gpus=4, nodes=nodes, shard=shard, grad_ckpt=True)
    data = accelerate_fsdp_config(spec, setup)
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(data))
    loaded = ClusterConfig.from_yaml_file(str(path))
    assert str(loaded.distributed_type).endswith("FSDP") and loaded.num_processes == 4 * nodes
    fsdp = {k.removeprefix("fsdp_"): v for k, v in loaded.fsdp_config.items()}
    layer = fsdp.pop("transformer_layer_cls_to_wrap")
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp["version"], auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[layer], cpu_offload=fsdp["offload_params"],
        state_dict_type=fsdp["state_dict_type"], activation_checkpointing=fsdp["activation_checkpointing"],
        **({"reshard_after_forward": fsdp["reshard_after_forward"]} if "reshard_after_forward" in fsdp else
           {"sharding_strategy": fsdp["sharding_strategy"]}))
    assert plugin.fsdp_version == fsdp["version"]
    # The wrap class is the decoder layer transformers really builds for this model.
    config = transformers.AutoConfig.for_model(**find_entry(model)["config"])
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    assert layer in {type(m).__name__ for m in built.modules()}


def test_config_command_writes_a_file(tmp_path):
    from memfit.cli import main

    out = tmp_path / "ds.json"
    assert main(["config", "llama-3.1-8b", "--engine", "deepspeed", "--method", "full", "--gpus", "8", "--shard",
                 "zero2", "-o", str(out)]) == 0
    import json

    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 2
    assert main(["config", "llama-3.1-8b", "--engine", "accelerate-fsdp", "--gpus", "8", "--shard", "zero2"]) == 1


# With checkpointing the tracker's peak moves into optimizer.step, where foreach AdamW on DTensor shards shows
# about 13x a shard of temporaries under the fake process group (docs/accuracy.md); left out until understood.
@pytest.mark.parametrize("world,ckpt", [(2, False), (4, False)])
def test_fsdp2_per_gpu_peak_matches_pytorchs_fsdp_tracker(world, ckpt):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json
    import subprocess
    import sys
    from pathlib import Path

    helper = Path(__file__).with_name("fsdp_trace_helper.py")
    proc = subprocess.run([sys.executable, str(helper), str(world), "1" if ckpt else "0"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["estimate"] == pytest.approx(result["tracker"], rel=0.03)


def test_fsdp2_qlora_gathers_nf4_as_stored():
    """torchao's NF4Tensor all-gathers its packed NF4 data and scalers (fsdp_pre_all_gather), so the two decoder
    layers in flight in a 405B QLoRA cost NF4 bytes, not bf16: 0.5 B per linear weight plus the block
    constants, next to the bf16 root (embeddings, final norm, lm_head) that stays gathered."""
    from memfit.spec import ModelSpec

    # meta-llama/Llama-3.1-405B config.json
    spec = ModelSpec.from_hf_config(dict(model_type="llama", hidden_size=16384, intermediate_size=53248,
                                         num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                                         vocab_size=128256, tie_word_embeddings=False, torch_dtype="bfloat16"),
                                    name="llama-3.1-405b", source="test")
    setup = TrainingSetup.from_recipe("torchtune", method="qlora", gpus=8, shard="fsdp", batch_size=1)
    parts = _static_parts(spec, setup)["sharded"]
    h, i, kv = spec.hidden_size, spec.intermediate_size, spec.kv_dim
    linear = 2 * h * h + 2 * h * kv + 3 * h * i                 # q, o, k, v, gate, up, down of one layer
    root = 2 * spec.vocab_size * h + h                            # untied embedding and lm_head, final norm
    layer_nf4 = linear / 2 * (1 + 2 / 64)                         # 4-bit data + absmax constants (< 1/32 of it)
    assert parts["gathered_busy"] == pytest.approx(2 * root + 2 * layer_nf4, rel=0.01)
    assert parts["gathered_busy"] - 2 * root < 2 * linear         # two NF4 layers: less than one bf16 layer


def test_litgpt_fsdp1_accumulation_keeps_unsharded_block_gradients():
    """lit-gpt's FSDP runs accumulate under fabric.no_backward_sync = FSDP1 no_sync(): every unit's unsharded
    gradient stays; with use_orig_params=True a block holding LoRA adapters gets gradients for all its weights.
    lit-gpt@0cc02afa's resource table: Llama-2-7B LoRA on 2 GPUs peaks at 22.18 GB, about its 16-bit model
    (13.5 GB) plus the blocks' gradients (13.0 GB) over two GPUs for the weights only."""
    spec = load_model("llama-2-7b")
    kw = dict(method="lora", gpus=2, shard="fsdp", grad_ckpt=True, seq_len=1304)
    accum = _static_parts(spec, TrainingSetup.from_recipe("litgpt", grad_accum=128, **kw))["sharded"]
    from memfit.params import count_params

    blocks = spec.num_layers * count_params(spec).per_layer
    assert accum["grads"] == pytest.approx(2 * blocks, rel=0.01)
    once = _static_parts(spec, TrainingSetup.from_recipe("litgpt", grad_accum=1, **kw))["sharded"]
    assert once["grads"] < 2 * blocks / 1000                      # no accumulation: LoRA gradients, sharded
    est = estimate(spec, TrainingSetup.from_recipe("litgpt", grad_accum=128, **kw))
    assert est.peak_allocated_bytes == pytest.approx(22.18e9, rel=0.05)
    assert any("no_sync()" in a for a in est.assumptions)


def test_fsdp1_unshard_pool_facts_in_torch_and_accelerate():
    """The facts physics/sharding.fsdp1_idle_unshard_bytes rests on, read from the installed frameworks: the
    all-gather output is allocated under the unshard stream, freed under record_stream on the compute stream, and
    the rate limiter lets two frees run ahead; FSDP1 and accelerate's plugin limit all-gathers by default."""
    import dataclasses
    import inspect

    pytest.importorskip("torch")
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp import _runtime_utils
    from torch.distributed.fsdp._flat_param import FlatParamHandle
    from torch.distributed.fsdp._limiter_utils import _FreeEventQueue

    assert _FreeEventQueue()._max_num_inflight_all_gathers == 2
    assert "_no_dispatch_record_stream" in inspect.getsource(FlatParamHandle._free_unsharded_flat_param)
    unshard = inspect.getsource(_runtime_utils._unshard)
    assert unshard.index("dequeue_if_needed") < unshard.index("stream(unshard_stream)") < unshard.index(
        "handle.unshard()")
    assert inspect.signature(FullyShardedDataParallel.__init__).parameters["limit_all_gathers"].default is True
    accelerate = pytest.importorskip("accelerate")
    fields = {f.name: f for f in dataclasses.fields(accelerate.FullyShardedDataParallelPlugin)}
    assert fields["limit_all_gathers"].default is True


def test_fsdp1_reserved_holds_one_more_layer_than_its_backward_gathers():
    """Answer.AI's fsdp_qlora loop (FSDP1): the unshard pool grows to the root, two layers live in backward and
    one freed layer pending, so reserved - allocated exceeds the generic slack by that pool less what is live at
    the peak: one layer at a layer-backward peak, two at the loss. FSDP2 (torchtune; the HF Trainer under the
    fsdp_version 2 config memfit writes for --shard fsdp) frees without record_stream and adds nothing; the
    HF Trainer's HSDP is FSDP1."""
    from memfit.params import count_params

    spec = load_model("llama-2-7b")
    counts = count_params(spec)
    layer_bf16, root_bf16 = counts.per_layer * 2, (counts.embedding + counts.final_norm + counts.lm_head) * 2
    for seq, phase, idle_layers in ((512, "layer backward (top)", 1), (2048, "cross-entropy backward", 2)):
        setup = TrainingSetup.from_recipe("fsdp-qlora", method="lora", gpus=2, shard="fsdp", batch_size=1,
                                          seq_len=seq, grad_ckpt=False)
        est = estimate(spec, setup)
        assert est.peak_phase == phase
        assert _static_parts(spec, setup)["sharded"]["unshard_pool"] == root_bf16 + 3 * layer_bf16
        assert est.component("FSDP1 unshard pool") == idle_layers * layer_bf16
        assert est.peak_reserved_bytes - est.peak_allocated_bytes == est.component("allocator slack") \
            + idle_layers * layer_bf16
    for recipe, shard, fsdp1 in (("torchtune", "fsdp", False), ("hf", "fsdp", False), ("hf", "hsdp", True)):
        est = estimate(spec, TrainingSetup.from_recipe(recipe, method="lora", gpus=4, shard=shard, batch_size=1,
                                                       seq_len=512, nodes=2 if shard == "hsdp" else 1))
        assert bool(est.component("FSDP1 unshard pool")) is fsdp1
        if not fsdp1:
            assert est.peak_reserved_bytes - est.peak_allocated_bytes == est.component("allocator slack")


def test_split_views_hold_the_first_gradient_until_the_last_arrives():
    """FSDP1's modules see torch.split views of the flat parameter (_flat_param.py _get_unflat_views_unaligned):
    on real CPU tensors, the gradient of the view used last in forward (the lm_head's) is still alive when the
    view used first (the embedding's) gets its gradient, the flat parameter has no gradient yet, and it then
    receives one whole-size gradient: the view gradients and their concatenation coexist."""
    import weakref

    torch = pytest.importorskip("torch")
    flat = torch.zeros(10, requires_grad=True)
    embedding, head = torch.split(flat, [4, 6])
    hidden = embedding * torch.randn(4)                    # used first in forward, so its gradient comes last
    loss = hidden.sum() * (head * torch.randn(6)).sum()
    head_grads, seen, whole = [], [], []
    head.register_hook(lambda g: head_grads.append(weakref.ref(g)))
    embedding.register_hook(lambda g: seen.append((head_grads[0]() is not None, flat.grad is None)))
    flat.register_hook(lambda g: whole.append(g.numel()))
    loss.backward()
    assert seen == [(True, True)]
    assert whole == [10]
    assert head_grads[0]() is None                          # released once concatenated


def test_fsdp1_full_finetune_holds_the_root_view_gradients(monkeypatch):
    """LitGPT full fine-tuning under FSDP1: the lm_head's unsharded gradient is held through the layers'
    backward, and the embedding's backward has the root's view gradients and their concatenation (2x the root
    unit's parameters in bf16); the other phases are unchanged, and LoRA (frozen root) has none."""
    from memfit.params import count_params
    from memfit.physics import sharding

    spec = load_model("llama-2-7b")
    counts = count_params(spec)
    root, head = counts.embedding + counts.final_norm + counts.lm_head, counts.lm_head + counts.final_norm
    setup = TrainingSetup.from_recipe("litgpt", method="full", gpus=4, shard="fsdp", batch_size=1, seq_len=512,
                                      grad_ckpt=True)
    with_views = dict(estimate(spec, setup).phases)
    from memfit import estimator

    monkeypatch.setattr(sharding, "FSDP1_RECIPES", ())
    monkeypatch.setattr(estimator, "_STATIC_CACHE", {})          # the static parts are cached per setup
    without = dict(estimate(spec, setup).phases)
    added = {phase: with_views[phase] - without[phase] for phase in with_views}
    assert added == {"forward (end)": 0, "cross-entropy backward": 0, "layer backward (top)": head * 2,
                     "layer backward (bottom)": head * 2, "embedding backward": 2 * root * 2,
                     "optimizer step": 0, "model load": 0}
    monkeypatch.undo()
    lora = TrainingSetup.from_recipe("litgpt", method="lora", gpus=4, shard="fsdp", batch_size=1, seq_len=512)
    assert _static_parts(spec, lora)["sharded"]["root_view_grad"] == 0
