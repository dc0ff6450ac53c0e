"""Preference and RL trainers: TRL 1.16's defaults, the bad combinations, the reference-model, concatenated-batch
and generation terms, the config readers and the levers. The trace of TRL's own DPO/KTO loss on fake tensors is
the oracle for the estimate."""

import warnings

import pytest

from memfit import TrainingSetup, estimate, load_hardware
from memfit.advisor import suggest
from memfit.cli import main
from memfit.errors import InvalidSetupError
from memfit.physics import trainers as physics
from memfit.preflight.check import check_config

from conftest import small_llama

GiB = 2**30


# ---- defaults are TRL's own ----------------------------------------------------------------------------------
def test_defaults_are_trls_config_defaults():
    trl = pytest.importorskip("trl")
    grpo = {n: f.default for n, f in trl.GRPOConfig.__dataclass_fields__.items()}
    rloo = {n: f.default for n, f in trl.RLOOConfig.__dataclass_fields__.items()}
    dpo = {n: f.default for n, f in trl.DPOConfig.__dataclass_fields__.items()}
    kto = {n: f.default for n, f in trl.KTOConfig.__dataclass_fields__.items()}
    s = TrainingSetup(trainer="grpo", batch_size=8)
    assert s.num_generations == grpo["num_generations"]
    assert s.completion_len == grpo["max_completion_length"]
    assert s.generation == ("hf" if not grpo["use_vllm"] else "vllm-colocate")
    assert s.vllm_gpu_util == grpo["vllm_gpu_memory_utilization"]
    assert s.vllm_sleep == grpo["vllm_enable_sleep_mode"]
    assert s.ref_model == ("none" if grpo["beta"] == 0 else "adapter-off")
    r = TrainingSetup(trainer="rloo", batch_size=2)
    assert (r.num_generations, r.completion_len) == (rloo["num_generations"], rloo["max_completion_length"])
    assert r.ref_model == ("adapter-off" if rloo["beta"] > 0 else "none")
    assert TrainingSetup(trainer="dpo").seq_len == dpo["max_length"]
    assert TrainingSetup(trainer="kto", batch_size=2).seq_len == kto["max_length"]
    assert not dpo["precompute_ref_log_probs"]
    assert TrainingSetup(trainer="dpo").grad_ckpt == dpo["gradient_checkpointing"]


def test_reference_follows_trl_and_the_method():
    assert TrainingSetup(trainer="dpo").ref_model == "adapter-off"         # PEFT: ref_model None, adapter off
    assert TrainingSetup(trainer="dpo", method="full").ref_model == "copy"  # create_model_from_path
    assert TrainingSetup(trainer="orpo").ref_model == "none"
    assert TrainingSetup(trainer="dpo").loss == "trl-fused-head"
    assert TrainingSetup(trainer="orpo").loss == "plain"
    assert TrainingSetup(trainer="sft").ref_model is None


# ---- bad combinations: one clear error ------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    (dict(trainer="grpo", seq_len=512, completion_len=512), "leaves no prompt"),
    (dict(trainer="orpo", ref_model="copy"), "orpo has no reference model"),
    (dict(trainer="dpo", method="full", ref_model="adapter-off"), "needs an adapter"),
    (dict(trainer="gkd"), "give teacher"),
    (dict(trainer="kto", batch_size=1), "2 or more"),
    (dict(num_generations=4), "does not apply to trainer sft"),
    (dict(trainer="grpo", batch_size=3, num_generations=8), "multiple of num_generations"),
    (dict(trainer="grpo", ref_model="precomputed"), "precomputed is a DPO/KTO option"),
    (dict(trainer="grpo", vllm_sleep=True), "apply to generation vllm-colocate"),
    (dict(trainer="dpo", seq_len=512, prompt_len=256, completion_len=128), "must equal seq_len"),
    (dict(trainer="dpo", seq_len=512, completion_len=600), "leaves no prompt"),
    (dict(trainer="dpo", seq_len=512, prompt_len=600), "leaves no completion"),
    (dict(trainer="dpo", recipe="mlx"), "mlx-lm's SFT step only"),
])
def test_bad_combinations_are_refused(kw, words):
    with pytest.raises(InvalidSetupError) as exc:
        TrainingSetup(**kw)
    assert words in exc.value.render(lambda n: n)


def test_one_problem_per_mistake():
    """A derived length never adds a second, confusing range error to the real one."""
    with pytest.raises(InvalidSetupError) as exc:
        TrainingSetup(trainer="grpo", batch_size=8, seq_len=512, completion_len=512)
    assert len(exc.value.problems) == 1


def test_bad_combination_on_the_command_line_is_one_line(capsys):
    code = main(["estimate", "llama-3.2-1b", "--trainer", "orpo", "--ref-model", "copy"])
    err = capsys.readouterr().err
    assert code != 0 and "--ref-model" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---- the physics terms ----------------------------------------------------------------------------------------
def test_concatenated_pair_is_an_sft_step_on_twice_the_rows():
    spec = small_llama()
    dpo = TrainingSetup(trainer="dpo", ref_model="precomputed", batch_size=2, seq_len=256, completion_len=255,
                        loss="hf", grad_ckpt=False)
    sft = TrainingSetup(batch_size=4, seq_len=256, loss="hf", grad_ckpt=False)
    a, b = estimate(spec, dpo), estimate(spec, sft)
    for name in ("activations", "logits and loss", "weights"):
        assert a.component(name) == b.component(name)


def test_reference_copy_adds_exactly_the_weights_and_precompute_removes_the_pass():
    spec = small_llama()
    base = dict(trainer="dpo", method="full", batch_size=1, seq_len=256, prompt_len=128)
    copy = estimate(spec, TrainingSetup(**base, ref_model="copy"))
    pre = estimate(spec, TrainingSetup(**base, ref_model="precomputed"))
    assert copy.component("reference model") == copy.component("weights")
    assert pre.component("reference model") == 0 and "reference forward" not in dict(pre.phases)
    assert copy.peak_allocated_bytes - pre.peak_allocated_bytes >= copy.component("weights")


def test_fused_head_scores_only_the_completion():
    spec = small_llama()
    short = estimate(spec, TrainingSetup(trainer="dpo", ref_model="precomputed", batch_size=1, seq_len=1024,
                                         prompt_len=1000))
    long = estimate(spec, TrainingSetup(trainer="dpo", ref_model="precomputed", batch_size=1, seq_len=1024,
                                        prompt_len=24))
    assert short.component("logits and loss") < long.component("logits and loss")


def test_kv_cache_formula_is_transformers_dynamic_cache():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    spec = small_llama(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=256)
    with torch.no_grad():
        out = model(torch.randint(0, 256, (3, 20)), use_cache=True)
    cache = out.past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == physics.kv_cache_bytes(spec, sequences=3, tokens=20, element_bytes=2)


def test_vllm_colocate_sleep_is_the_larger_not_the_sum():
    spec = small_llama()
    card = 80 * GiB
    kw = dict(trainer="grpo", batch_size=8, seq_len=1024, completion_len=256, generation="vllm-colocate",
              card_bytes=card)
    awake = estimate(spec, TrainingSetup(**kw))
    asleep = estimate(spec, TrainingSetup(**kw, vllm_sleep=True))
    server = estimate(spec, TrainingSetup(**{**kw, "generation": "vllm-server"}))
    reserve = int(0.3 * card)
    assert awake.component("vLLM reservation") == reserve
    assert awake.peak_allocated_bytes == server.peak_allocated_bytes + reserve
    train_peak = max(b for n, b in server.phases if n != "generation")
    assert asleep.peak_allocated_bytes == max(train_peak, dict(asleep.phases)["generation"])
    assert server.component("vLLM reservation") == 0 and "generation" not in dict(server.phases)


def test_hf_generation_holds_the_kv_cache_of_the_generation_batch():
    spec = small_llama()
    s = TrainingSetup(trainer="grpo", batch_size=4, grad_accum=2, num_generations=4, seq_len=1024,
                      completion_len=256)
    phases = dict(estimate(spec, s).phases)
    kv = physics.kv_cache_bytes(spec, 4 * 2, 1024, 2)      # batch x steps_per_generation sequences
    assert phases["generation"] >= kv


# ---- the trace: TRL's own DPO/KTO loss on fake tensors is the oracle ------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(trainer="dpo", batch_size=1, seq_len=256, prompt_len=128),
    dict(trainer="dpo", method="full", ref_model="copy", batch_size=1, seq_len=256, prompt_len=64, grad_ckpt=False),
    dict(trainer="kto", batch_size=2, seq_len=256, prompt_len=128, grad_ckpt=False),
])
def test_estimate_matches_trls_own_loss_traced(kw):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec = small_llama()
    setup = TrainingSetup(recipe="trl", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    est = estimate(spec, setup)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.02
    if kw.get("ref_model") == "copy":
        assert measured.component("reference model") == pytest.approx(est.component("reference model"), rel=0.01)


def test_kto_full_checkpointed_gpt2_matches_the_trace():
    """Issue #17: GPT-2 (tied embedding), KTO, full, checkpointed, was +6.5% over a trace that ran the no-grad KL
    pass and the policy forward in one autocast region. Under accelerate each forward is its own region (the
    trace now does the same), so every layer's gradient exists before the tied embedding's gradients are summed."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from memfit import load_model
    from memfit.trace import trace

    spec = load_model("gpt2", allow_network=False)
    setup = TrainingSetup(recipe="trl", trainer="kto", method="full", ref_model="auto", grad_ckpt=True,
                          batch_size=2, seq_len=512, prompt_len=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = trace(spec, setup)
    est = estimate(spec, setup)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.02
    # At the peak (the embedding's backward) every gradient but the tied matrix's is in .grad already.
    tied_bytes = spec.vocab_size * spec.hidden_size * 4
    assert measured.component("gradients") >= est.component("gradients") - tied_bytes - 2**20


def test_reference_and_pair_terms_against_the_trace():
    """The reference copy's bytes and the concatenated pair's growth, each as TRL's trainer allocates them."""
    pytest.importorskip("trl")
    from memfit.trace import trace

    spec = small_llama()
    base = dict(recipe="trl", trainer="dpo", method="full", seq_len=256, prompt_len=128, grad_ckpt=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre1 = trace(spec, TrainingSetup(**base, ref_model="precomputed", batch_size=1))
        pre2 = trace(spec, TrainingSetup(**base, ref_model="precomputed", batch_size=2))
    e1 = estimate(spec, TrainingSetup(**base, ref_model="precomputed", batch_size=1))
    e2 = estimate(spec, TrainingSetup(**base, ref_model="precomputed", batch_size=2))
    traced_growth = pre2.peak_allocated_bytes - pre1.peak_allocated_bytes
    assert (e2.peak_allocated_bytes - e1.peak_allocated_bytes) == pytest.approx(traced_growth, rel=0.05)


def test_trainers_the_trace_cannot_run_are_refused_in_one_line():
    pytest.importorskip("trl")
    from memfit.trace import trace

    with pytest.raises(InvalidSetupError, match="rloo is not traced"):
        trace(small_llama(), TrainingSetup(trainer="rloo", batch_size=2, prompt_len=128, completion_len=128))
    with pytest.raises(InvalidSetupError, match="vLLM"):
        trace(small_llama(), TrainingSetup(trainer="grpo", batch_size=8, seq_len=1024, prompt_len=512,
                                           generation="vllm-colocate"))


# ---- config readers --------------------------------------------------------------------------------------------
def _check(tmp_path, text, gpu="a100-80gb"):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return check_config(str(path), hardware=load_hardware(gpu=gpu))


def test_trl_grpo_config(tmp_path):
    r = _check(tmp_path, "model_name_or_path: llama-3.2-1b\nper_device_train_batch_size: 8\nmax_length: 1024\n"
                         "num_generations: 4\nmax_completion_length: 256\nuse_vllm: true\nvllm_mode: colocate\n"
                         "vllm_gpu_memory_utilization: 0.4\nvllm_enable_sleep_mode: true\nbeta: 0.04\nuse_peft: true\n")
    s = r.setup
    assert (s.trainer, s.num_generations, s.completion_len, s.generation) == ("grpo", 4, 256, "vllm-colocate")
    assert (s.vllm_gpu_util, s.vllm_sleep, s.ref_model) == (0.4, True, "adapter-off")
    assert r.estimate.component("vLLM reservation") == int(0.4 * load_hardware(gpu="a100-80gb").capacity_bytes)


def test_trl_dpo_and_kto_configs(tmp_path):
    r = _check(tmp_path, "model_name_or_path: llama-3.2-1b\nprecompute_ref_log_probs: true\nloss_type: ipo\n")
    assert (r.setup.trainer, r.setup.ref_model) == ("ipo", "precomputed")
    r = _check(tmp_path, "model_name_or_path: llama-3.2-1b\nper_device_train_batch_size: 4\n"
                         "desirable_weight: 1.0\nuse_peft: true\n")
    assert (r.setup.trainer, r.setup.ref_model) == ("kto", "adapter-off")


def test_llamafactory_stage_and_axolotl_rl(tmp_path):
    r = _check(tmp_path, "model_name_or_path: llama-3.2-1b\nstage: dpo\npref_loss: simpo\nfinetuning_type: lora\n"
                         "cutoff_len: 1024\nper_device_train_batch_size: 1\n")
    assert (r.setup.trainer, r.setup.ref_model) == ("simpo", "none")
    r = _check(tmp_path, "model_name_or_path: llama-3.2-1b\nstage: kto\nfinetuning_type: full\n"
                         "per_device_train_batch_size: 2\n")
    assert (r.setup.trainer, r.setup.ref_model, r.setup.loss) == ("kto", "copy", "hf")
    r = _check(tmp_path, "base_model: llama-3.2-1b\nrl: grpo\nadapter: lora\nmicro_batch_size: 4\n"
                         "sequence_len: 1024\ntrl:\n  num_generations: 4\n  max_completion_length: 128\n"
                         "  use_vllm: true\n  vllm_mode: server\n")
    assert (r.setup.trainer, r.setup.num_generations, r.setup.completion_len, r.setup.generation) == \
        ("grpo", 4, 128, "vllm-server")


# ---- levers ----------------------------------------------------------------------------------------------------
def test_levers_precompute_and_vllm_are_offered_and_fit():
    from memfit import load_model

    spec = load_model("llama-3.1-8b")
    hw = load_hardware(gpu="a100-80gb")
    setup = TrainingSetup(trainer="dpo", method="full", batch_size=1, seq_len=1024, grad_ckpt=True,
                          optimizer="adamw-8bit")
    out = suggest(spec, setup, hw, lambda ref, s, hw=None: "")
    assert any(dict(s.changes).get("ref_model") == "precomputed" and s.fits for s in out)
    grpo = TrainingSetup(trainer="grpo", batch_size=8, seq_len=2048, completion_len=1024, method="full",
                         generation="vllm-colocate", vllm_gpu_util=0.6, card_bytes=hw.capacity_bytes,
                         grad_ckpt=True)
    keys = {k for s in suggest(spec, grpo, hw, lambda ref, s, hw=None: "") for k in dict(s.changes)}
    assert keys & {"vllm_sleep", "vllm_gpu_util", "generation"}


def test_check_words_trainer_problems_in_the_configs_keys(tmp_path):
    with pytest.raises(InvalidSetupError) as exc:
        _check(tmp_path, "model_name_or_path: llama-3.2-1b\nper_device_train_batch_size: 8\nmax_length: 512\n"
                         "num_generations: 8\nmax_completion_length: 512\n")
    assert "max_completion_length 512 leaves no prompt" in str(exc.value) and "(max_length)" in str(exc.value)
