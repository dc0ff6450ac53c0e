"""Vision-language models: image tokens against the real processor, tower/projector/LM counts against the real
classes on the meta device, the estimate's response to image settings, and the estimate against the trace."""

import json
import subprocess
import sys

import pytest

from memfit import TrainingSetup, estimate, load_model
from memfit.errors import InvalidSetupError
from memfit.params import count_params
from memfit.sources.catalog import catalog_entries, spec_from_entry
from memfit.spec import ModelSpec
from memfit.vision import plan_images, smart_resize

VLM_ENTRIES = [e for e in catalog_entries() if "vision_config" in e["config"]]
SIZES = [(1280, 720), (448, 448), (3000, 4000), (57, 91), (10, 1900), (7000, 7000), (28, 28), (800, 500)]


def test_catalog_has_vlms():
    assert {e["slug"] for e in VLM_ENTRIES} >= {"qwen2.5-vl-3b", "qwen2.5-vl-7b", "gemma-3-4b", "smolvlm2-500m",
                                                "llama-3.2-11b-vision"}


@pytest.mark.parametrize("max_pixels", [12845056, 602112, 1003520, 3136 * 4])
@pytest.mark.parametrize("width,height", SIZES)
def test_smart_resize_equals_transformers(width, height, max_pixels):
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    assert smart_resize(height, width, 28, 3136, max_pixels) == hf_smart_resize(height, width, 28, 3136, max_pixels)


@pytest.mark.parametrize("width,height", [(1280, 720), (448, 448), (333, 1000)])
@pytest.mark.parametrize("max_pixels", [12845056, 602112])
def test_plan_equals_the_real_processor(width, height, max_pixels):
    """The processor's own image_grid_thw and pixel_values (PIL backend) are the oracle for the tower's input."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vision = load_model("qwen2.5-vl-7b").vision
    out = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=max_pixels)(
        images=[Image.new("RGB", (width, height))], return_tensors="pt")
    plan = plan_images(vision, f"{width}x{height}", 1, None, max_pixels, None)
    assert out["image_grid_thw"].tolist() == [[1, *plan.grid]]
    assert tuple(out["pixel_values"].shape) == (plan.patches, vision.patch_values)
    assert plan.tokens == plan.patches // 4


def test_default_max_pixels_is_16384_tokens():
    """Qwen2.5-VL's preprocessor_config max_pixels 12,845,056 lets one image become 16,384 tokens, 65,536 patches."""
    plan = plan_images(load_model("qwen2.5-vl-7b").vision, None, 1, None, None, None)
    assert (plan.tokens, plan.patches) == (16384, 65536)
    assert plan_images(load_model("qwen2.5-vl-7b").vision, None, 3, None, 602112, None).tokens == 3 * 27 * 27
    assert plan_images(load_model("qwen2.5-vl-7b").vision, None, 2, None, None, 300).tokens == 600


@pytest.mark.parametrize("entry", VLM_ENTRIES, ids=lambda e: e["slug"])
def test_vlm_counts_equal_meta_numel(entry):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = spec_from_entry(entry)
    config = transformers.AutoConfig.for_model(**entry["config"])
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    # Qwen2.5-VL: model.visual (its merger is the projector); Gemma 3: model.vision_tower, model.multi_modal_projector.
    projector = sum(p.numel() for n, p in model.named_parameters()
                    if ".merger." in n or "multi_modal_projector" in n or ".connector." in n)
    tower = sum(p.numel() for n, p in model.named_parameters()
                if not n.startswith(("model.language_model.", "model.text_model.", "lm_head."))) - projector
    total = sum(p.numel() for p in model.parameters())
    assert (spec.vision.tower_params, spec.vision.projector_params) == (tower, projector)
    # The language model and its head (Mllama: a Llama of all its layers + the cross layers' norms and gates and
    # the 8 extra embedding rows, vision.mllama_extra_params).
    assert count_params(spec).total + spec.vision.lm_extra_params == total - tower - projector
    assert entry["params"] == total


def test_more_pixels_more_memory_and_image_tokens_reach_the_lm():
    spec = load_model("qwen2.5-vl-7b")
    small = estimate(spec, TrainingSetup(seq_len=512, max_pixels=602112))
    big = estimate(spec, TrainingSetup(seq_len=512))
    assert big.device_bytes > small.device_bytes
    # The language model runs 512 + 16,384 tokens: its activations equal a text model's at that length.
    text = spec.replace(vision=None, hf_config_json=None)
    as_text = estimate(text, TrainingSetup(seq_len=512 + 16384))
    assert big.component("activations") == as_text.component("activations")
    assert big.component("vision tower weights") == spec.vision.params * 2
    assert big.component("pixel values") == 65536 * 1176 * 4
    assert big.params == count_params(spec).total + spec.vision.params
    assert any("16,384 image tokens" in a for a in big.assumptions)


def test_image_options_on_a_text_model_are_refused():
    with pytest.raises(InvalidSetupError, match="vision-language"):
        estimate(load_model("qwen2.5-0.5b"), TrainingSetup(image_size="640x480"))
    with pytest.raises(InvalidSetupError, match="vision-language"):
        estimate(load_model("qwen2.5-0.5b"), TrainingSetup(recipe="mlx", max_pixels=602112))
    with pytest.raises(InvalidSetupError, match="mlx-vlm"):
        estimate(load_model("qwen2.5-vl-3b"), TrainingSetup(recipe="mlx"))


@pytest.mark.parametrize("bad", ["640", "0x480", "axb", "640x480x3"])
def test_bad_image_size(bad):
    with pytest.raises(InvalidSetupError, match="image_size"):
        estimate(load_model("qwen2.5-vl-3b"), TrainingSetup(image_size=bad))


def test_cli_bad_image_size_one_line():
    run = subprocess.run([sys.executable, "-m", "memfit", "estimate", "qwen2.5-vl-3b", "--image-size", "big"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "--image-size" in run.stderr


def _tiny_vlm() -> ModelSpec:
    config = json.loads(json.dumps(next(e for e in VLM_ENTRIES if e["slug"] == "qwen2.5-vl-3b")["config"]))
    config.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]})   # head_dim 32
    config["vision_config"].update(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128,
                                   fullatt_block_indexes=[3])
    return ModelSpec.from_hf_config(config, name="tiny-qwen2.5-vl", source="test")


@pytest.mark.parametrize("kw", [dict(method="lora", image_size="448x336"),
                                dict(method="full", image_size="1000x700", grad_ckpt=True),
                                dict(method="lora", images_per_sample=2, max_pixels=200704, batch_size=2)])
def test_estimate_matches_trace(kw):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec, setup = _tiny_vlm(), TrainingSetup(seq_len=128, **kw)
    measured = trace(spec, setup)
    predicted = estimate(spec, setup)
    assert abs(predicted.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.02


def test_gemma3_fixed_tokens_and_crops():
    vision = load_model("gemma-3-4b").vision
    one = plan_images(vision, "1920x1080", 2, None, None, None)
    assert (one.tokens_per_image, one.patches_per_image, one.tokens) == (256, 4096, 512)
    assert plan_images(vision, None, 1, None, None, 768).patches == 3 * 4096
    with pytest.raises(InvalidSetupError, match="max_pixels"):
        plan_images(vision, None, 1, None, 602112, None)
    with pytest.raises(InvalidSetupError, match="multiple"):
        plan_images(vision, None, 1, None, None, 300)


def test_levers_are_re_estimates():
    from memfit.advisor import suggest
    from memfit.hardware import load_hardware

    spec = load_model("qwen2.5-vl-7b")
    setup = TrainingSetup(seq_len=1024)            # one image at the default max_pixels: 16,384 tokens
    out = suggest(spec, setup, load_hardware(gpu="a100-80gb"), lambda ref, s: "memfit estimate")
    by_change = {frozenset(s.changes): s for s in out}
    pixels = by_change.get(frozenset({"max_pixels"}))
    assert pixels is not None and pixels.changes["max_pixels"] == 12845056 // 4
    assert pixels.device_bytes == estimate(spec, setup.replace(max_pixels=12845056 // 4)).device_bytes


def test_readme_example_is_the_estimate():
    """The README's two max_pixels settings print what the estimate says."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    spec = load_model("qwen2.5-vl-7b")
    for max_pixels in (None, 602112):
        est = estimate(spec, TrainingSetup(seq_len=1024, image_size="1920x1080", grad_ckpt=True, max_pixels=max_pixels))
        assert f"{est.device_bytes / 2**30:.2f} GiB" in readme


def test_llamafactory_image_keys(tmp_path):
    from memfit.preflight.check import check_config

    base = "model_name_or_path: {}\nstage: sft\nfinetuning_type: lora\ncutoff_len: 1024\n"
    vlm = tmp_path / "vlm.yaml"
    vlm.write_text(base.format("Qwen/Qwen2.5-VL-7B-Instruct"))
    result = check_config(str(vlm))
    assert (result.setup.max_pixels, result.setup.min_pixels) == (768 * 768, 32 * 32)   # LLaMA-Factory's defaults
    vlm.write_text(base.format("Qwen/Qwen2.5-VL-7B-Instruct") + "image_max_pixels: 262144\n")
    assert check_config(str(vlm)).setup.max_pixels == 262144
    text = tmp_path / "text.yaml"
    text.write_text(base.format("Qwen/Qwen2.5-0.5B") + "image_max_pixels: 262144\n")
    result = check_config(str(text))
    assert result.setup.max_pixels is None and "image_max_pixels" in result.mapped.ignored
    # Fixed-tile VLMs resize whatever LLaMA-Factory hands them: its pixel bounds are set aside, not refused.
    for model in ("meta-llama/Llama-3.2-11B-Vision-Instruct", "google/gemma-3-4b-it"):
        vlm.write_text(base.format(model) + "image_max_pixels: 262144\n")
        result = check_config(str(vlm))
        assert result.setup.max_pixels is None
        assert any(kind == "pixel-bounds-not-tokens" and "image_max_pixels" in text
                   for kind, text in result.mapped.notes)


@pytest.mark.parametrize("width,height", [(1280, 720), (400, 300), (512, 512), (3000, 200), (200, 3000), (1000, 1001)])
def test_smolvlm_tiles_equal_the_real_processor(width, height):
    """SmolVLM's image processor (PIL backend) is the oracle for the tiles the tower sees."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    vision = load_model("smolvlm2-500m").vision
    out = SmolVLMImageProcessorPil(size={"longest_edge": 2048}, max_image_size={"longest_edge": 512})(
        images=[Image.new("RGB", (width, height))], return_tensors="pt")
    plan = plan_images(vision, f"{width}x{height}", 1, None, None, None)
    frames = out["pixel_values"].shape[1]
    assert plan.tokens_per_image == 64 * frames                      # image_seq_len 64 per tile
    assert plan.patches_per_image == frames * (512 // 16) ** 2
    assert plan.patches * vision.patch_values == out["pixel_values"][0].numel()


def _tiny(slug: str, text: dict, vision: dict, **top) -> ModelSpec:
    entry = next(e for e in VLM_ENTRIES if e["slug"] == slug)
    config = json.loads(json.dumps(entry["config"]))
    config["text_config"].update(text)
    config["vision_config"].update(vision)
    config.update(top)
    return ModelSpec.from_hf_config(config, name=f"tiny-{slug}", source="test",
                                    processor={"longest_edge": 512} if slug.startswith("smolvlm") else None)


@pytest.mark.parametrize("spec,kw", [
    (lambda: _tiny("gemma-3-4b", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=32, sliding_window=64),
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        image_size=224, patch_size=14), mm_tokens_per_image=16),
     dict(method="lora", images_per_sample=2)),
    (lambda: _tiny("smolvlm2-500m", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32),
                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        image_size=128, patch_size=16), scale_factor=2),
     dict(method="full", image_size="300x200")),
], ids=["gemma3", "smolvlm"])
def test_other_families_match_trace(spec, kw):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec, setup = spec(), TrainingSetup(seq_len=128, **kw)
    measured = trace(spec, setup)
    assert abs(estimate(spec, setup).peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01


# ---- Llama 3.2 Vision (mllama) ---------------------------------------------------------------------------------
def test_mllama_11b_counts_and_layout():
    """10,670,220,835 parameters (MllamaForConditionalGeneration on the meta device, checked above); the language
    model is read as a Llama of all 40 layers, 8 of them cross-attention layers."""
    spec = load_model("llama-3.2-11b-vision")
    assert (spec.model_type, spec.num_layers, spec.vision.cross_layers) == ("llama", 40, (3, 8, 13, 18, 23, 28, 33, 38))
    assert (spec.vision.tower_params, spec.vision.projector_params) == (863_567_379, 31_461_376)
    assert spec.vision.lm_extra_params == 8 * 4096 + 8 * (2 * 128 + 2)
    assert count_params(spec).total + spec.vision.params == 10_670_220_835


@pytest.mark.parametrize("width,height", [(1280, 720), (560, 560), (300, 2000), (4000, 500)])
def test_mllama_tiles_equal_the_real_processor(width, height):
    """MllamaImageProcessor pads every image to max_image_tiles (4) tiles of 560 px: the tower's input, and so the
    vision tokens the cross-attention layers see (4 x 1601 with the class token), do not depend on the size."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    spec = load_model("llama-3.2-11b-vision")
    vision = spec.vision
    out = MllamaImageProcessorPil(size={"height": 560, "width": 560}, max_image_tiles=4)(
        images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    plan = plan_images(vision, f"{width}x{height}", 1, None, None, None)
    assert tuple(out["pixel_values"].shape) == (1, 1, 4, 3, 560, 560)
    assert plan.patches * vision.patch_values == out["pixel_values"].numel()
    assert (plan.tokens, plan.cross_tokens) == (0, 4 * 1601)
    config = transformers.AutoConfig.for_model(**next(e for e in VLM_ENTRIES
                                                       if e["slug"] == "llama-3.2-11b-vision")["config"])
    with torch.device("meta"):
        tower = transformers.MllamaVisionModel(config.vision_config)
    assert tower.num_patches == vision.patches_per_tile == 1601
    assert vision.padded_patches_per_tile == 1608          # padded to a multiple of 8 before the encoders


def test_mllama_image_tokens_and_text_length():
    spec = load_model("llama-3.2-11b-vision")
    assert plan_images(spec.vision, None, 2, None, None, 6404).cross_tokens == 2 * 6404
    with pytest.raises(InvalidSetupError, match="6,404 vision tokens"):
        estimate(spec, TrainingSetup(image_tokens=1601))
    with pytest.raises(InvalidSetupError, match="max_pixels"):
        estimate(spec, TrainingSetup(max_pixels=602112))
    one, three = (estimate(spec, TrainingSetup(seq_len=512, images_per_sample=n)) for n in (1, 3))
    # Images do not lengthen the text: the Llama walk's activations are the same; the cross-attention terms grow.
    assert one.component("activations") == three.component("activations")
    assert three.component("cross-attention activations") > 2.9 * one.component("cross-attention activations") > 0


def test_mllama_bad_image_tokens_cli_one_line():
    run = subprocess.run([sys.executable, "-m", "memfit", "estimate", "llama-3.2-11b-vision", "--image-tokens", "300"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "--image-tokens" in run.stderr and "4 tiles" in run.stderr


def _tiny_mllama() -> ModelSpec:
    config = json.loads(json.dumps(next(e for e in VLM_ENTRIES if e["slug"] == "llama-3.2-11b-vision")["config"]))
    config["image_token_index"] = 2048
    config["text_config"].update(hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=8,
                                 num_key_value_heads=2, vocab_size=2048, pad_token_id=2000, bos_token_id=1,
                                 eos_token_id=2, cross_attention_layers=[1, 4])
    config["vision_config"].update(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_global_layers=2,
                                   attention_heads=4, image_size=224, vision_output_dim=640,
                                   intermediate_layers_indices=[0, 1, 2, 3])
    return ModelSpec.from_hf_config(config, name="tiny-mllama", source="test")


@pytest.mark.parametrize("kw", [dict(method="lora", images_per_sample=2), dict(method="full", batch_size=2),
                                dict(method="qlora")], ids=["lora-2-images", "full", "qlora-checkpointed"])
def test_mllama_matches_trace(kw):
    """The real Mllama classes on fake tensors. Mllama's own terms (cross-attention saves, the vision output, the
    checkpointed run's tower activations) are over 4% of these peaks: without them (or with image tokens added to
    the text) the estimate misses by more than the 1% allowed."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec, setup = _tiny_mllama(), TrainingSetup.from_recipe(recipe="hf", seq_len=128, **kw)
    measured, predicted = trace(spec, setup), estimate(spec, setup)
    own = sum(predicted.component(name) for name in ("cross-attention activations", "vision outputs",
                                                     "vision tower checkpoints"))
    assert own > 0.04 * predicted.peak_allocated_bytes
    assert abs(predicted.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01


def test_mllama_text_only_batch_skips_cross_layers():
    """Without images MllamaTextModel skips its cross-attention layers: only the self-attention layers save."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from memfit.trace import trace

    spec, setup = _tiny_mllama(), TrainingSetup.from_recipe(recipe="hf", seq_len=256, method="lora",
                                                            images_per_sample=0)
    measured, predicted = trace(spec, setup), estimate(spec, setup)
    assert abs(predicted.peak_allocated_bytes / measured.peak_allocated_bytes - 1) < 0.01
