"""LoRA on the embedding and lm_head (`--lora-targets ...,embed,head`; physics/lora_outer.py): the trainable
count against PEFT's own model, the estimate against the trace of the real PEFT step, and target parsing."""

import warnings

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.options import ALL_TARGETS
from memfit.setup import parse_targets
from memfit.sources.catalog import catalog_entries


def test_targets_parse_with_aliases():
    assert parse_targets("all-linear,head") == ALL_TARGETS + ("head",)
    assert parse_targets("q_proj,v_proj,lm_head,embed_tokens") == ("q", "v", "head", "embed")
    assert parse_targets("all-linear") == ALL_TARGETS
    with pytest.raises(InvalidSetupError, match="unknown LoRA target"):
        parse_targets("q,wings")


@pytest.mark.parametrize("slug", ["smollm2-135m", "pythia-160m"])
def test_trainable_params_equal_peft(slug):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    spec = load_model(slug)
    setup = TrainingSetup(method="lora", lora_rank=8, lora_targets=("q", "v", "head", "embed"))
    entry = next(e for e in catalog_entries() if e["slug"] == slug)
    config = transformers.AutoConfig.for_model(**entry["config"])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
             if m is model.get_input_embeddings() or m is model.get_output_embeddings()}
    q_v = {"llama": ["q_proj", "v_proj"], "gpt_neox": ["query_key_value"]}[spec.model_type]
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=q_v + sorted(names)))
    peft_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert estimate(spec, setup).trainable_params == peft_trainable


@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_estimate_matches_trace_with_head_and_embed(grad_ckpt):
    pytest.importorskip("torch")
    from memfit.trace import trace

    spec = load_model("smollm2-135m")         # tied embeddings: PEFT wraps both ends of one matrix
    setup = TrainingSetup.from_recipe("hf", method="lora", batch_size=1, seq_len=256, grad_ckpt=grad_ckpt,
                                      lora_targets=("q", "v", "head", "embed"))
    plain = TrainingSetup.from_recipe("hf", method="lora", batch_size=1, seq_len=256, grad_ckpt=grad_ckpt,
                                      lora_targets=("q", "v"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured, measured_plain = trace(spec, setup), trace(spec, plain)
    est, est_plain = estimate(spec, setup), estimate(spec, plain)
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.002
    # what the two adapters add, estimated vs traced, within 2%
    added = est.peak_allocated_bytes - est_plain.peak_allocated_bytes
    traced = measured.peak_allocated_bytes - measured_plain.peak_allocated_bytes
    assert traced > 0 and abs(added / traced - 1) < 0.02
