"""Megatron-Core layouts against Megatron-LM's own theoretical memory report (the oracle).

tests/vendor/megatron/training/theoretical_memory_usage.py is NVIDIA/Megatron-LM@d98e8a64's file, unchanged
(megatron-core on PyPI does not ship megatron/training). It is called here with an argparse namespace built from
the same model and layout memfit is given; memfit's model state (weights, fp32 main gradients, master weights,
Adam state) and activations must equal its two figures.

Where the report covers a layout:
- model state: every tp/pp/ep/dp layout, with or without the distributed optimizer (it knows no context
  parallelism: memfit shards the distributed optimizer over dp x cp, megatron/core/optimizer/__init__.py:934,
  so a cp > 1 layout is compared with the report's data_parallel_size = dp x cp);
- activations: sequence parallelism with selective recompute (any MLP width), and no sequence parallelism with
  a 4h MLP (that path writes 10 + 24/t); the non-interleaved 1F1B schedule; context parallelism as the report
  at seq_length / cp (the report does not split the sequence itself).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.physics import megatron, megatron_moe
from memfit.spec import ModelSpec

sys.path.insert(0, str(Path(__file__).parent / "vendor"))
from megatron.training import theoretical_memory_usage as oracle  # noqa: E402

MB = 1024 * 1024
STATE = ("weights", "gradients", "master weights", "optimizer state")
NOT_ACTIVATIONS = STATE + ("context-parallel buffers", "cuBLAS workspace", "allocator slack", "CUDA context")


def megatron_args(spec: ModelSpec, setup: TrainingSetup, dp_for_optimizer: int | None = None) -> argparse.Namespace:
    """The namespace Megatron's argument parser would build for this model and layout."""
    lay = megatron.layout(setup)
    return argparse.Namespace(
        kv_channels=spec.head_dim, num_attention_heads=spec.num_heads, hidden_size=spec.hidden_size,
        group_query_attention=spec.num_kv_heads != spec.num_heads, num_query_groups=spec.num_kv_heads,
        num_experts=spec.num_experts if spec.is_moe else None, moe_layer_freq=1, num_layers=spec.num_layers,
        swiglu=spec.mlp_kind == "gated", moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        normalization="RMSNorm", multi_latent_attention=False, padded_vocab_size=megatron.padded_vocab(spec, lay.tp),
        untie_embeddings_and_output_weights=not spec.tied_embeddings, ffn_hidden_size=spec.intermediate_size,
        moe_ffn_hidden_size=spec.moe_intermediate_size if spec.is_moe else None, moe_latent_size=None,
        moe_router_topk=spec.experts_per_token if spec.is_moe else 2, add_bias_linear=False,
        expert_tensor_parallel_size=lay.tp, expert_model_parallel_size=lay.ep,
        pipeline_model_parallel_size=lay.pp, tensor_model_parallel_size=lay.tp, world_size=setup.world_size,
        data_parallel_size=dp_for_optimizer or lay.dp, use_distributed_optimizer=lay.distributed_optimizer,
        seq_length=setup.seq_len // lay.cp, micro_batch_size=setup.batch_size,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        sequence_parallel=lay.sequence_parallel,
        recompute_granularity=setup.recompute if setup.recompute != "none" else None, hybrid_layer_pattern=None)


def report(args, microbatches):
    with contextlib.redirect_stdout(io.StringIO()):
        state_mb, act_mb, _ = oracle.report_theoretical_memory(args, num_microbatches=microbatches)
    return state_mb * MB, act_mb * MB


def memfit_parts(spec, setup):
    est = estimate(spec, setup)
    state = sum(est.component(n) for n in STATE)
    activations = sum(c.bytes for c in est.components if c.name not in NOT_ACTIVATIONS)
    return est, state, activations


def four_h_model() -> ModelSpec:
    """A GQA SwiGLU model whose MLP is 4h wide: the width Megatron's without-sequence-parallel path assumes."""
    return ModelSpec.from_hf_config(dict(model_type="llama", hidden_size=2048, intermediate_size=8192,
                                         num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                                         head_dim=128, vocab_size=50000, tie_word_embeddings=False,
                                         torch_dtype="bfloat16"), name="gpt-4h", source="test")


LAYOUTS = [
    # model, gpus, nodes, tp, pp, cp, sp, dist-opt, micro-batch, length, micro-batches
    ("llama-3.1-8b", 8, 1, 2, 1, 1, True, True, 1, 8192, 4),
    ("llama-3.1-8b", 8, 1, 4, 2, 1, True, False, 1, 4096, 8),
    ("llama-3.1-8b", 8, 2, 2, 4, 1, True, True, 2, 4096, 2),     # fewer micro-batches than stages
    ("llama-3.1-8b", 8, 1, 8, 1, 1, True, True, 1, 16384, 1),    # vocabulary padded to 129024
    ("llama-3.1-70b", 8, 4, 8, 4, 1, True, True, 1, 4096, 16),
    ("gpt-4h", 8, 1, 2, 1, 1, False, True, 1, 4096, 1),          # no sequence parallelism
    ("gpt-4h", 8, 1, 4, 2, 1, False, False, 2, 2048, 4),
]


@pytest.mark.parametrize("model,gpus,nodes,tp,pp,cp,sp,distopt,mbs,seq,m", LAYOUTS)
def test_model_state_and_activations_equal_megatron_report(model, gpus, nodes, tp, pp, cp, sp, distopt, mbs, seq, m,
                                                           vpp=1):
    spec = four_h_model() if model == "gpt-4h" else load_model(model)
    setup = TrainingSetup(recipe="megatron", gpus=gpus, nodes=nodes, tp=tp, pp=pp, cp=cp, sequence_parallel=sp,
                          recompute="selective", distributed_optimizer=distopt, batch_size=mbs, seq_len=seq,
                          grad_accum=m, vpp=vpp, pp_stage="first")
    state_oracle, act_oracle = report(megatron_args(spec, setup), m)
    _, state, activations = memfit_parts(spec, setup)
    assert state == pytest.approx(state_oracle, rel=1e-6)
    assert activations == pytest.approx(act_oracle, rel=1e-6)


@pytest.mark.parametrize("vpp,model,sp", [(2, "llama-3.1-8b", True), (4, "llama-3.1-8b", True), (2, "gpt-4h", False)])
def test_interleaved_schedule_equals_megatron_report(vpp, model, sp):
    test_model_state_and_activations_equal_megatron_report(model, 8, 2, 2, 4, 1, sp, True, 1, 4096, 8, vpp=vpp)


def test_interleaving_holds_more_than_plain_1f1b():
    spec = load_model("llama-3.1-8b")
    act = {v: estimate(spec, TrainingSetup(recipe="megatron", gpus=8, pp=4, tp=2, sequence_parallel=True, vpp=v,
                                           grad_accum=8, seq_len=4096, pp_stage="first")).component("activations")
           for v in (1, 2)}
    assert act[2] == round(act[1] * (1 + 3 / 8))      # 1 + (pp - 1) / (pp x vpp)


def test_context_parallel_is_the_report_at_a_cp_th_of_the_length():
    spec = load_model("llama-3.1-8b")
    setup = TrainingSetup(recipe="megatron", gpus=8, tp=2, cp=4, sequence_parallel=True, recompute="selective",
                          distributed_optimizer=True, seq_len=131072)
    lay = megatron.layout(setup)
    state_oracle, act_oracle = report(megatron_args(spec, setup, dp_for_optimizer=lay.dp * lay.cp), 1)
    est, state, activations = memfit_parts(spec, setup)
    assert state == pytest.approx(state_oracle, rel=1e-6)
    assert activations == pytest.approx(act_oracle, rel=1e-6)
    # The ring's K/V chunks: 2 (K and V) x 2 chunks x 32768 tokens x 1024 kv dims x 2 B, twice in backward, / tp.
    assert est.component("context-parallel buffers") == 2 * 2 * 2 * 32768 * 1024 * 2 // 2


def test_moe_expert_parallel_model_state_equals_megatron_report():
    spec = load_model("mixtral-8x7b")
    setup = TrainingSetup(recipe="megatron", gpus=8, nodes=2, tp=2, pp=2, ep=4, sequence_parallel=True,
                          recompute="selective", distributed_optimizer=True, seq_len=4096, grad_accum=4,
                          pp_stage="first")
    state_oracle, _ = report(megatron_args(spec, setup), 4)
    _, state, _ = memfit_parts(spec, setup)
    assert state == pytest.approx(state_oracle, rel=1e-6)


def test_vocabulary_padding_follows_megatron():
    spec = load_model("llama-3.1-8b")       # 128256 = 1002 x 128 = 501 x 256, not a multiple of 1024
    assert [megatron.padded_vocab(spec, tp) for tp in (1, 2, 8)] == [128256, 128256, 129024]


def test_full_recompute_keeps_layer_inputs_and_one_layer():
    spec = load_model("llama-3.1-8b")
    base = dict(recipe="megatron", gpus=8, tp=2, pp=2, sequence_parallel=True, distributed_optimizer=True,
                seq_len=8192, grad_accum=4, pp_stage="first")
    full = estimate(spec, TrainingSetup(recompute="full", **base))
    selective = estimate(spec, TrainingSetup(recompute="selective", **base))
    tokens_hidden = 8192 * 4096
    # 16 layers on the stage x 2 micro-batches in flight x 2 B x s b h / tp
    assert full.component("checkpoints") == 16 * 2 * 2 * tokens_hidden // 2
    assert full.component("recomputed layer") == selective.component("activations") // (16 * 2)
    assert full.device_bytes < selective.device_bytes


def test_pipeline_first_stage_holds_min_of_microbatches_and_stages():
    spec = load_model("llama-3.1-8b")
    act = {m: estimate(spec, TrainingSetup(recipe="megatron", gpus=8, pp=4, tp=2, sequence_parallel=True,
                                           recompute="selective", grad_accum=m, seq_len=4096,
                                           pp_stage="first")).component("activations")
           for m in (1, 2, 4, 16)}
    assert act[2] == 2 * act[1] and act[4] == 4 * act[1] and act[16] == act[4]


@pytest.mark.parametrize("changes,words", [
    (dict(gpus=6, tp=3), "--tp 3 must divide the 32 attention heads"),
    (dict(gpus=6, pp=3), "--pp 3 must divide the 32 layers"),
    (dict(gpus=8, tp=2, pp=2, cp=4), "--tp x --pp x --cp = 16 must divide the 8 GPUs"),
    (dict(gpus=8, ep=2), "has no experts to split"),
    (dict(gpus=8, method="lora"), "megatron models full training"),
    (dict(gpus=8, shard="zero3"), "not --shard zero3"),
    (dict(gpus=8, pp=2, vpp=2), "--vpp (the interleaved schedule) needs --pp 3 or more"),
    (dict(gpus=8, pp=4, vpp=3), "--pp x --vpp = 12 must divide the 32 layers"),
])
def test_bad_layouts_are_one_clear_error(changes, words):
    spec = load_model("llama-3.1-8b")
    with pytest.raises(InvalidSetupError) as err:
        estimate(spec, TrainingSetup(recipe="megatron", **changes))
    text = err.value.render(lambda n: "--" + n.replace("_", "-")) if hasattr(err.value, "render") else str(err.value)
    assert words in text


def test_megatron_options_need_the_megatron_recipe():
    with pytest.raises(InvalidSetupError, match="Megatron layout option"):
        TrainingSetup(recipe="trl", tp=2, gpus=2)


def parse_megatron_words(words: list[str], world_size: int, vocab_size: int) -> argparse.Namespace:
    """Read the arguments `memfit config --engine megatron` writes the way Megatron's parser reads them (flag
    names are Megatron-LM's), then derive what Megatron derives: the data-parallel size and the padded vocabulary
    (megatron/core/tokenizers/utils/build_tokenizer.py:133-138)."""
    p = argparse.ArgumentParser()
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                 "--expert-model-parallel-size", "--recompute-num-layers", "--num-layers", "--hidden-size",
                 "--ffn-hidden-size", "--num-attention-heads", "--kv-channels", "--num-query-groups",
                 "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--make-vocab-size-divisible-by",
                 "--seq-length", "--max-position-embeddings", "--micro-batch-size", "--global-batch-size"):
        p.add_argument(flag, type=int, default=None)
    for flag in ("--recompute-granularity", "--recompute-method", "--normalization", "--position-embedding-type"):
        p.add_argument(flag)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--group-query-attention", "--swiglu",
                 "--disable-bias-linear", "--add-qkv-bias", "--untie-embeddings-and-output-weights", "--bf16",
                 "--fp16"):
        p.add_argument(flag, action="store_true")
    a = p.parse_args(words)
    multiple = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
    return argparse.Namespace(
        **{k: v for k, v in vars(a).items() if k not in ("expert_model_parallel_size",)},
        expert_model_parallel_size=a.expert_model_parallel_size or 1,
        expert_tensor_parallel_size=a.tensor_model_parallel_size, world_size=world_size,
        data_parallel_size=world_size // (a.tensor_model_parallel_size * a.pipeline_model_parallel_size
                                          * a.context_parallel_size),
        padded_vocab_size=-(-vocab_size // multiple) * multiple, add_bias_linear=not a.disable_bias_linear,
        moe_layer_freq=1, moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        multi_latent_attention=False, moe_latent_size=None, virtual_pipeline_model_parallel_size=None,
        hybrid_layer_pattern=None)


@pytest.mark.parametrize("model,gpus,tp,pp,cp,m", [("llama-3.1-8b", 8, 2, 2, 1, 4), ("llama-3.1-70b", 8, 8, 1, 1, 1)])
def test_config_arguments_describe_the_estimated_layout(model, gpus, tp, pp, cp, m):
    """The written arguments, read back as Megatron reads them, give Megatron's report the estimate's figures."""
    from memfit.megatron_config import megatron_arguments

    spec = load_model(model)
    setup = TrainingSetup(recipe="megatron", gpus=gpus, tp=tp, pp=pp, cp=cp, sequence_parallel=True,
                          recompute="selective", distributed_optimizer=True, seq_len=8192, grad_accum=m,
                          pp_stage="first")
    args = parse_megatron_words(megatron_arguments(spec, setup), setup.world_size, spec.vocab_size)
    assert args.global_batch_size == m * megatron.layout(setup).dp
    state_oracle, act_oracle = report(args, m)
    _, state, activations = memfit_parts(spec, setup)
    assert state == pytest.approx(state_oracle, rel=1e-6)
    assert activations == pytest.approx(act_oracle, rel=1e-6)


def test_config_command_writes_megatron_arguments(capsys):
    from memfit.cli import main

    assert main(["config", "llama-3.1-8b", "--engine", "megatron", "--gpus", "8", "--tp", "4", "--pp", "2",
                 "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "--tensor-model-parallel-size 4" in out and "--pipeline-model-parallel-size 2" in out
    assert "--recompute-granularity full" in out and "--recompute-num-layers 1" in out
    assert main(["config", "llama-3.1-8b", "--engine", "megatron", "--gpus", "6", "--tp", "3"]) == 1
    assert "--tp 3 must divide the 32 attention heads" in capsys.readouterr().err


# --- MoE router and token dispatch (physics/megatron_moe.py; Megatron-LM@d98e8a64 megatron/core/transformer/moe) ---

def mixtral_setup(**changes):
    base = dict(recipe="megatron", gpus=8, tp=2, ep=4, sequence_parallel=True, recompute="selective",
                distributed_optimizer=True, seq_len=4096, grad_accum=1)
    return TrainingSetup(**{**base, **changes})


def test_capacity_is_megatrons_get_capacity():
    spec = load_model("mixtral-8x7b")           # 8 experts, top-2
    for seq, factor, expected in ((4096, 1.0, 512), (4096, 1.25, 640), (4000, 1.1, 550)):
        lay = megatron.layout(mixtral_setup(seq_len=seq, moe_capacity_factor=factor))
        # get_capacity(num_tokens = tokens x topk, num_experts, factor) = ceil(tokens x 2 / 8 x factor),
        # tokens = the sequence-parallel shard seq / tp
        assert megatron_moe.capacity(spec, mixtral_setup(seq_len=seq, moe_capacity_factor=factor), lay) == expected


def test_padded_capacity_factor_prices_the_padded_tokens():
    """Padding to capacity 1.25 routes E x capacity x tp = 8 x 640 x 2 = 10240 tokens to each GPU's experts per
    layer instead of the balanced 2048 x 2 x 2 = 8192: each extra token costs its saved copy (2 B x h), its prob
    (2 B) and the experts' intermediates (4 B x expert width / tp); the capacity mask adds 1 B per token and
    expert; one layer's send buffer grows by 8 x 640 - 4096 tokens and its received one by 2048."""
    spec = load_model("mixtral-8x7b")
    dropless = estimate(spec, mixtral_setup()).component("MoE dispatch buffers")
    padded = estimate(spec, mixtral_setup(moe_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True))
    h, i, tokens_in, extra = 4096, 14336, 2048, 10240 - 8192
    per_layer = extra * (2 * h + 2 + 4 * i // 2) + tokens_in * 8 * 1
    transient = 2 * h * ((8 * 640 - tokens_in * 2) + extra)
    assert padded.component("MoE dispatch buffers") - dropless == 32 * per_layer + transient
    # The factor matters: 1.5 routes more than 1.25, and without padding the capacity caps a step the same way.
    more = estimate(spec, mixtral_setup(moe_capacity_factor=1.5, moe_pad_expert_input_to_capacity=True))
    assert more.component("MoE dispatch buffers") > padded.component("MoE dispatch buffers")
    capped = estimate(spec, mixtral_setup(moe_capacity_factor=1.25))
    assert dropless < capped.component("MoE dispatch buffers") < padded.component("MoE dispatch buffers")


def test_dropless_dispatch_buffers_by_hand():
    """Dropless Mixtral, tp 2 x ep 4, 4096 tokens: per layer 2048 tokens enter on each GPU; router: fp32 aux-loss
    softmax and bool routing map over 8 experts; experts: 8192 routed token copies x (2 B x 4096 + 2 B prob);
    one layer's send buffer (4096 tokens) and received buffer (8192, two local experts: sorted) in flight."""
    spec = load_model("mixtral-8x7b")
    est = estimate(spec, mixtral_setup())
    per_layer = 2048 * 8 * (4 + 1) + 8192 * (2 * 4096 + 2)
    assert est.component("MoE dispatch buffers") == 32 * per_layer + 2 * 4096 * (4096 + 8192)
    # and the dense model has none
    assert estimate(load_model("llama-3.1-8b"), TrainingSetup(recipe="megatron", gpus=8, tp=2,
                                                               sequence_parallel=True)).component(
        "MoE dispatch buffers") == 0


@pytest.mark.parametrize("changes,words", [
    (dict(moe_pad_expert_input_to_capacity=True), "--moe-pad-expert-input-to-capacity needs --moe-capacity-factor"),
    (dict(sequence_parallel=False), "only with --sequence-parallel"),
])
def test_bad_moe_layouts_are_one_clear_error(changes, words):
    with pytest.raises(InvalidSetupError) as err:
        estimate(load_model("mixtral-8x7b"), mixtral_setup(**changes))
    assert words in err.value.render(lambda n: "--" + n.replace("_", "-"))


def test_capacity_factor_on_a_dense_model_is_an_error():
    with pytest.raises(InvalidSetupError, match="has no experts"):
        estimate(load_model("llama-3.1-8b"), TrainingSetup(recipe="megatron", gpus=8, moe_capacity_factor=1.0))


# --- Pipeline stages ---

def stage_estimates(spec, **setup):
    return {stage: estimate(spec, TrainingSetup(recipe="megatron", pp_stage=stage, **setup))
            for stage in ("first", "last", "worst")}


def test_last_stage_params_are_the_reports_other_shards_plus_the_output_layer():
    """Megatron's report prints (verbose) the parameters of the shards other than the first: 1/pp of the layers.
    The last stage adds the output layer, V/tp x h, which it holds even when tied to the embedding
    (gpt_model.py:289-290)."""
    for model in ("llama-3.1-8b", "llama-3.2-1b"):          # untied and tied embeddings
        spec = load_model(model)
        setup = TrainingSetup(recipe="megatron", gpus=8, tp=2, pp=4, sequence_parallel=True, recompute="selective",
                              distributed_optimizer=True, grad_accum=8, pp_stage="last")
        lay = megatron.layout(setup)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            oracle.report_theoretical_memory(megatron_args(spec, setup), num_microbatches=8, verbose=True)
        line = next(x for x in out.getvalue().splitlines() if "other shards" in x)
        other_billions = float(line.split(":")[-1])
        last = megatron.stage_params(spec, lay, "last").total
        output_layer = megatron.padded_vocab(spec, 2) * spec.hidden_size / 2
        assert (last - output_layer) / 1e9 == pytest.approx(other_billions, abs=6e-5)


def test_last_stage_holds_one_microbatch_and_the_logits():
    spec = load_model("llama-3.1-8b")
    est = stage_estimates(spec, gpus=8, tp=2, pp=4, sequence_parallel=True, recompute="selective",
                          distributed_optimizer=True, grad_accum=8, seq_len=4096)
    first, last = est["first"], est["last"]
    assert last.component("activations") * 4 == first.component("activations")      # 1 vs pp=4 in flight
    s, h, v, t = 4096, 4096, 128256, 2
    assert last.component("logits and loss") == 4 * s * h * (1 + v / h) / t             # the report's pp=1 term
    assert first.component("logits and loss") == 0 and last.component("embedding and head activations") == 0
    # The verdict is about the worse stage, and both are listed as phases.
    worst = est["worst"]
    assert worst.device_bytes == max(first.device_bytes, last.device_bytes)
    assert {name for name, _ in worst.phases} == {"1F1B steady state (first stage)",
                                                  "1F1B steady state (last stage)"}


def test_long_sequence_makes_the_last_stage_the_worst():
    """At 32k tokens with few micro-batches the logits (s x V / tp x 4 B) outweigh the first stage's extra
    micro-batch: the worst stage is the last, which a first-stage-only estimate would miss."""
    spec = load_model("llama-3.1-8b")
    est = stage_estimates(spec, gpus=8, tp=4, pp=2, sequence_parallel=True, recompute="full",
                          distributed_optimizer=True, grad_accum=4, seq_len=32768)
    assert est["last"].device_bytes > est["first"].device_bytes
    assert est["worst"].device_bytes == est["last"].device_bytes
    assert est["worst"].extra["megatron"]["stage"] == "last"


def test_interleaved_last_stage_holds_vpp_minus_one_rounds_plus_one_chunk():
    """schedules.py:964-965: warm-up on the last rank is (vpp - 1) x pp chunks, so (vpp - 1) pp + 1 chunks of
    L / (pp vpp) layers are in flight: (2 - 1) x 4 + 1 = 5 chunks = 2.5 stages' worth for vpp 2."""
    spec = load_model("llama-3.1-8b")
    est = stage_estimates(spec, gpus=8, tp=2, pp=4, vpp=2, sequence_parallel=True, recompute="selective",
                          distributed_optimizer=True, grad_accum=8, seq_len=4096)
    plain = stage_estimates(spec, gpus=8, tp=2, pp=4, sequence_parallel=True, recompute="selective",
                            distributed_optimizer=True, grad_accum=8, seq_len=4096)
    assert est["last"].component("activations") == round(plain["last"].component("activations") * 2.5)


def test_dispatch_token_counts_are_megatrons_own_routing():
    """Megatron's own router token dropping and permutation (tests/vendor/megatron/core_moe/moe_utils.py, copied
    from Megatron-LM@d98e8a64) on CPU tensors: the tokens its experts receive are memfit's routed tokens, padded
    (exactly E x capacity) and dropping without padding (the worst step: every rank routes all it can to the
    experts of rank 0, two of four, expert parallel 2)."""
    torch = pytest.importorskip("torch")

    from megatron.core_moe import moe_utils as mcore

    spec = ModelSpec.from_hf_config(dict(model_type="mixtral", hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         num_local_experts=4, num_experts_per_tok=2, vocab_size=256),
                                    name="moe-4x", source="test")
    tokens, topk, experts, factor = 100, 2, 4, 1.0

    def routed(logits, pad):
        scores, top = torch.topk(logits, topk, dim=-1)
        probs = torch.zeros_like(logits).scatter(1, top, torch.softmax(scores, dim=-1))
        routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
        probs, routing_map = mcore.apply_router_token_dropping(probs, routing_map, router_topk=topk,
                                                               capacity_factor=factor, pad_to_capacity=pad)
        return probs, routing_map

    torch.manual_seed(0)
    # Padded, one rank: permute(drop_and_pad) hands the experts E x capacity token copies.
    setup = TrainingSetup(recipe="megatron", gpus=1, seq_len=tokens, moe_capacity_factor=factor,
                          moe_pad_expert_input_to_capacity=True)
    lay = megatron.layout(setup)
    capacity = mcore.get_capacity(num_tokens=tokens * topk, num_experts=experts, capacity_factor=factor)
    assert megatron_moe.capacity(spec, setup, lay) == capacity == 50
    probs, routing_map = routed(torch.randn(tokens, experts), pad=True)
    permuted, *_ = mcore.permute(torch.randn(tokens, 64), routing_map, probs=probs,
                                 num_out_tokens=capacity * experts, drop_and_pad=True)
    assert permuted.shape[0] == megatron_moe.expert_tokens(spec, setup, lay) == 200
    # Dropping without padding, ep 2: both ranks prefer experts 0 and 1, which rank 0 holds.
    setup = TrainingSetup(recipe="megatron", gpus=2, ep=2, seq_len=tokens, moe_capacity_factor=factor)
    lay = megatron.layout(setup)
    skewed = torch.randn(tokens, experts) + torch.tensor([10.0, 10.0, 0.0, 0.0])
    received = sum(int(routed(skewed, pad=False)[1][:, :2].sum()) for _ in range(2))
    assert received == megatron_moe.expert_tokens(spec, setup, lay) == 2 * 2 * capacity
    # and dropless Megatron on one rank routes exactly tokens x top-k, memfit's balanced count
    setup = TrainingSetup(recipe="megatron", gpus=1, seq_len=tokens)
    assert megatron_moe.expert_tokens(spec, setup, megatron.layout(setup)) == tokens * topk
