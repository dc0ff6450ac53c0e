"""Recipes named after the stacks people run, and the loss kernels: each default against the value its cited
source sets, each loss's bytes from the terms of its source (and, for the plain loss, a torch measurement)."""

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.options import ALL_TARGETS, LOSSES
from memfit.physics.loss import (TRL_TILE_TOKENS, TRL_TILE_VOCAB, liger_chunk_tokens, loss_memory,
                                 unsloth_chunk_tokens)
from memfit.physics.stack import resolve_stack
from memfit.recipes import CHUNKED_LOSSES, RECIPES

# (recipe, method) -> the values its cited source sets (recipes.py `sources`).
CITED = {
    # trl 1.16.0 base_config.py:62-63 gradient_checkpointing=True; sft_trainer.py:1142-1147 fused LM head.
    ("trl", "lora"): dict(grad_ckpt=True, loss="trl-fused-head", lora_rank=8, lora_targets=("q", "v"),
                          lora_dropout=0.0, kbit_upcast=False, optimizer="adamw-fused"),
    # huggingface/trl@f2cd577 sft_config.py:336 chunked_nll default (1.7-1.14).
    ("trl-1.14", "lora"): dict(grad_ckpt=True, loss="trl-chunked-nll"),
    # trl <= 0.21: no checkpointing by default, HF loss; QLoRA through prepare_model_for_kbit_training.
    ("trl-0.21", "lora"): dict(grad_ckpt=False, loss="hf", kbit_upcast=False),
    ("trl-0.21", "qlora"): dict(grad_ckpt=True, loss="hf", kbit_upcast=True),
    # transformers 5.24.0 training_args.py:811 adamw_torch_fused, :926 gradient_checkpointing False.
    ("hf", "lora"): dict(grad_ckpt=False, loss="hf", optimizer="adamw-fused", chunked_ce=False),
    # torchtune 0.7.0 8B_lora_single_device.yaml:24-29,61-71,93; 8B_full_single_device.yaml:59-66.
    ("torchtune", "lora"): dict(grad_ckpt=True, loss="chunked", lora_rank=8, lora_dropout=0.0,
                                lora_targets=("q", "v", "o", "gate", "up", "down"), optimizer="adamw-fused",
                                precision="bf16", optimizer_in_backward=False),
    ("torchtune", "full"): dict(optimizer="paged-adamw-8bit", optimizer_in_backward=True, loss="chunked"),
    # unsloth llama.py:3063-3079 r=16, all 7 projections, dropout 0, use_gradient_checkpointing="unsloth".
    ("unsloth", "lora"): dict(lora_rank=16, lora_targets=ALL_TARGETS, lora_dropout=0.0, grad_ckpt=True,
                              ckpt_offload=True, loss="unsloth", optimizer="adamw-8bit"),
    # axolotl 0.18.0 examples/llama-3/lora-8b.yml:25-52.
    ("axolotl", "lora"): dict(lora_rank=32, lora_dropout=0.05, lora_targets=ALL_TARGETS, optimizer="adamw-8bit",
                              grad_ckpt=True, attn="flash", ckpt_reentrant=False, loss="hf"),
    # LLaMA-Factory 0.9.6.dev0 finetuning_args.py:73-82, model_args.py:137-149.
    ("llamafactory", "lora"): dict(lora_rank=8, lora_targets=ALL_TARGETS, lora_dropout=0.0, grad_ckpt=True,
                                   ckpt_reentrant=True, loss="hf", chunked_ce=False),
    # ms-swift 4.6.0.dev0 trainers/arguments.py:134,153; tuner_args.py:126-135.
    ("ms-swift", "lora"): dict(lora_rank=8, lora_targets=ALL_TARGETS, lora_dropout=0.05, grad_ckpt=True, loss="hf"),
    # LitGPT finetune/lora.py: chunked_cross_entropy with lm_head_chunk_size 128, lora_dropout 0.05.
    ("litgpt", "lora"): dict(loss="chunked", lora_dropout=0.05, optimizer="adamw"),
    # A plain loop: F.cross_entropy on the logits as they are, torch AdamW (foreach).
    ("pytorch", "full"): dict(loss="plain", optimizer="adamw", autocast=False, grad_ckpt=False),
}


@pytest.mark.parametrize("recipe,method", sorted(CITED))
def test_recipe_defaults_are_their_sources_values(recipe, method):
    setup = TrainingSetup(recipe=recipe, method=method)
    for name, value in CITED[(recipe, method)].items():
        assert getattr(setup, name) == value, (recipe, method, name)
    assert RECIPES[recipe].sources, recipe


def test_every_recipe_resolves_and_names_a_version_or_commit():
    spec = load_model("llama-3.2-1b")
    for name, recipe in RECIPES.items():
        for method in recipe.methods:
            est = estimate(spec, TrainingSetup(recipe=name, method=method))
            assert est.device_bytes > 0
        if name not in ("litgpt", "mlx"):
            assert any(any(ch.isdigit() for ch in source) and ("@" in source or "." in source)
                       for source in recipe.sources), name


def test_knobs_given_explicitly_win_over_the_recipe_on_and_off():
    # TT-10's knobs: torchtune full fine-tuning without checkpointing, chunked loss or optimizer-in-backward.
    s = TrainingSetup(recipe="torchtune", method="full", grad_ckpt=False, chunked_ce=False,
                      optimizer_in_backward=False, optimizer="adamw")
    assert (s.grad_ckpt, s.chunked_ce, s.loss, s.optimizer_in_backward, s.optimizer) == \
        (False, False, "hf", False, "adamw")
    assert TrainingSetup(recipe="trl", grad_ckpt=False).grad_ckpt is False
    assert TrainingSetup(recipe="llamafactory", grad_ckpt=False).ckpt_reentrant is False
    assert TrainingSetup(recipe="llamafactory", ckpt_reentrant=False).ckpt_reentrant is False
    assert TrainingSetup(recipe="unsloth", ckpt_offload=False).ckpt_offload is False
    assert TrainingSetup(recipe="trl-0.21", method="qlora", kbit_upcast=False).kbit_upcast is False


def test_loss_and_chunked_ce_are_one_fact():
    for name in LOSSES:
        assert TrainingSetup(loss=name).chunked_ce == (name in CHUNKED_LOSSES)
    # chunked_ce alone picks the recipe's chunked or plain loss.
    assert TrainingSetup(chunked_ce=True).loss == "liger"
    assert TrainingSetup(recipe="litgpt", chunked_ce=False).loss == "plain"
    assert TrainingSetup(recipe="torchtune", chunked_ce=False).loss == "hf"
    assert TrainingSetup(recipe="trl", chunked_ce=False).loss == "hf"
    # An explicit loss wins over the recipe; a contradicting pair is refused.
    assert TrainingSetup(recipe="trl", loss="trl-chunked-nll").loss == "trl-chunked-nll"
    assert TrainingSetup(loss="liger", chunked_ce=True).loss == "liger"
    with pytest.raises(InvalidSetupError, match="contradicts"):
        TrainingSetup(loss="hf", chunked_ce=True)


def _loss(spec, **kw):
    setup = TrainingSetup(**kw)
    return loss_memory(spec, setup, resolve_stack(spec, setup)), setup


def test_liger_chunks_follow_vocab_over_hidden():
    # liger-kernel 0.8.5 fused_linear_cross_entropy.py:84-87 for Llama-3-8B (V=128256, H=4096): inc_factor 32.
    assert liger_chunk_tokens(4096, 128256, 4096) == 128
    assert liger_chunk_tokens(4000, 128256, 4096) == 128          # next power of 2 of ceil(4000 / 32) = 125
    assert liger_chunk_tokens(8, 128256, 4096) == 1
    assert liger_chunk_tokens(100, 32000, 4096) == 16             # inc 8: ceil(100/8)=13 -> 16
    spec = load_model("llama-3.1-8b")
    T, H, V = 2 * 4096, 4096, 128256
    lora, _ = _loss(spec, method="lora", batch_size=2, seq_len=4096, loss="liger")
    # grad_input (bf16) and the fp32 per-token loss are kept; two bf16 logit chunks + one chunk @ weight transient.
    assert lora.saved == T * H * 2 + 4 * T
    chunk = liger_chunk_tokens(T, V, H)
    assert lora.forward_extra == T * H * 2 + 2 * chunk * V * 2 + chunk * H * 2 and lora.backward_extra == 0
    full, _ = _loss(spec, method="full", batch_size=2, seq_len=4096, loss="liger", precision="bf16")
    assert full.saved - lora.saved == V * H * 2                   # grad_weight when the head trains
    # Every term is proportional to tokens x hidden (the chunk is T / ceil(V / H) rows): twice the tokens, twice
    # the bytes; HF's loss at the same size holds over ten times more.
    big, _ = _loss(spec, method="lora", batch_size=4, seq_len=4096, loss="liger")
    assert big.saved + big.forward_extra == 2 * (lora.saved + lora.forward_extra)
    hf, _ = _loss(spec, method="lora", batch_size=2, seq_len=4096, loss="hf")
    assert hf.saved + hf.backward_extra > 10 * (lora.saved + lora.forward_extra)


def test_unsloth_chunks_are_capped_at_two_gib():
    assert unsloth_chunk_tokens(10**6, 128256) == 2 * 2**30 // (128256 * 8) == 2092
    assert unsloth_chunk_tokens(100, 128256) == 100
    spec = load_model("llama-3.1-8b")
    m, _ = _loss(spec, recipe="unsloth", batch_size=4, seq_len=8192)
    assert m.forward_extra == 8 * 2092 * 128256 <= 2 * 2**30
    assert m.saved == 4 * 8192 * 4096 * 2


def test_trl_chunked_nll_has_a_transient_fp32_copy_of_lm_head():
    spec = load_model("llama-3.1-8b")
    V, H = 128256, 4096
    m, _ = _loss(spec, recipe="trl-1.14", batch_size=1, seq_len=2048)
    chunk = 256 * V * 4
    assert m.saved == 2048 * H * 2                                # the reordered hidden states
    assert m.forward_extra == max(V * H * 4 + chunk, 4 * chunk)
    assert m.backward_extra == V * H * 4 + 5 * chunk + 2 * 2048 * H * 2
    # fp32 weights: w.float() is the weight itself, no copy.
    m32, _ = _loss(spec, recipe="trl-1.14", batch_size=1, seq_len=2048, precision="bf16-mixed")
    assert m32.backward_extra < m.backward_extra - V * H * 3
    # Short batches cost more than HF's loss at this vocabulary (frontier.md 2.1: break-even near 2.7k tokens).
    short, _ = _loss(spec, recipe="trl-1.14", batch_size=1, seq_len=256)
    hf_short, _ = _loss(spec, recipe="trl-1.14", batch_size=1, seq_len=256, loss="hf")
    assert short.saved + short.backward_extra > hf_short.saved + hf_short.backward_extra


def test_trl_fused_head_tiles_and_fp32_accumulators():
    spec = load_model("llama-3.1-8b")
    V, H, T = 128256, 4096, 8192
    m, _ = _loss(spec, recipe="trl", batch_size=2, seq_len=4096)
    tile = TRL_TILE_TOKENS * TRL_TILE_VOCAB * 2
    assert m.backward_extra == tile + T * H * (4 + 2) + 8 * T
    full, _ = _loss(spec, recipe="trl", method="full", batch_size=2, seq_len=4096)
    assert full.backward_extra - m.backward_extra == V * H * (4 + 2)
    small, _ = _loss(spec, recipe="trl", batch_size=1, seq_len=512)
    assert small.forward_extra - 4 * 7 * 512 == 512 * TRL_TILE_VOCAB * 2


def test_plain_loss_matches_torch():
    """F.cross_entropy(lm_head(h).flatten(0, 1), y) as a plain loop runs it, measured on real CPU tensors by
    memfit's allocation tracker: the peak over the loss's forward and backward is the saved log-softmax plus the
    backward's two T x V buffers, i.e. LossMemory.saved + backward_extra (the hidden-state grad is tiny here)."""
    torch = pytest.importorskip("torch")
    from memfit.trace.tracker import PeakTracker

    from memfit.spec import ModelSpec

    T, H, V = 256, 8, 4096
    h = torch.randn(1, T, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16)
    y = torch.randint(0, V, (T,))
    tracker = PeakTracker()
    with tracker:
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).flatten(0, 1), y)
        loss.backward()
    spec = ModelSpec.from_hf_config({"model_type": "llama", "hidden_size": H, "intermediate_size": 16,
                                     "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
                                     "vocab_size": V, "torch_dtype": "bfloat16"}, name="tiny", source="test")
    m, _ = _loss(spec, recipe="pytorch", method="full", precision="bf16", batch_size=1, seq_len=T)
    predicted = m.saved + max(m.forward_extra, m.backward_extra)
    assert predicted == 3 * 2 * T * V
    assert abs(tracker.peak - predicted) <= 0.02 * predicted + 4 * T * H + 8192, (tracker.peak, predicted)


def _partitioner_saved(fn, *args):
    """The tensors torch.compile's forward graph saves for backward: AOTAutograd with inductor's decomposition
    table and the min-cut partitioner inductor uses (torch/_functorch/partitioners.py, compiler="inductor"); the
    forward graph's outputs past the first (the loss) are what the backward reads."""
    import functools

    import torch
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    got = {}

    def fw(gm, _):
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        got["saved"] = [o.meta["val"] for o in outs[1:]]
        return make_boxed_func(gm)

    f = aot_function(fn, fw_compiler=fw, bw_compiler=lambda gm, _: make_boxed_func(gm),
                     partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
                     decompositions=select_decomp_table())
    f(*args).backward()
    return [(tuple(t.shape), t.dtype) for t in got["saved"] if isinstance(t, torch.Tensor)]


def test_compiled_torchtune_chunked_loss_saves_bf16_logits_not_the_fp32_log_softmax():
    """torchtune compiles each chunk's cross-entropy (training/_compile.py compile_loss; 0.7.0
    modules/loss/cross_entropy_loss.py:87-115 compute_cross_entropy: linear, logits.float(), F.cross_entropy).
    Run through the partitioner, that chunk saves its logits in bf16 and two fp32 per-row reductions, not the fp32
    log-softmax eager saves: memfit's compiled saved set is exactly the partitioner's, chunk for chunk."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    t, H, V = 64, 32, 1000
    h = torch.randn(t, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, V, (t,))

    def compute_cross_entropy(hidden_chunk, weight, target_chunk):
        return F.cross_entropy(F.linear(hidden_chunk, weight).float(), target_chunk, reduction="sum")

    saved = _partitioner_saved(compute_cross_entropy, h, w, y)
    logits = [s for s in saved if s[0] == (t, V)]
    assert logits == [((t, V), torch.bfloat16)]                  # no fp32 (t, V) tensor
    rows = [s for s in saved if s[0] == (t, 1)]
    assert rows == [((t, 1), torch.float32)] * 2

    spec = load_model("llama-3.2-1b")
    T = 2 * 2048
    eager, _ = _loss(spec, recipe="torchtune", batch_size=2, seq_len=2048, loss="chunked")
    comp, _ = _loss(spec, recipe="torchtune", batch_size=2, seq_len=2048, loss="chunked", compile=True)
    hidden_copy = T * spec.hidden_size * 2                        # the masked hidden states, both ways
    per_token = logits[0][1].itemsize * spec.vocab_size + torch.float32.itemsize * len(rows)   # the partitioner's
    assert comp.saved - hidden_copy == per_token * T
    assert eager.saved - hidden_copy == 4 * T * spec.vocab_size
    assert comp.forward_extra == 0 < eager.forward_extra
    assert comp.backward_extra == 2 * T * spec.vocab_size // 8   # one chunk's bf16 gradient
