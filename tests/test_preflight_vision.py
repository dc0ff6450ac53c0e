"""`memfit check` reads the image settings of ms-swift, axolotl and LLaMA-Factory configs (preflight/vision.py),
and ms-swift's config files (preflight/swift.py)."""

import pytest

from memfit.errors import InvalidSetupError
from memfit.preflight.check import check_config
from memfit.preflight.formats import detect_format

QWEN = "Qwen/Qwen2.5-VL-7B-Instruct"


def _check(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return check_config(str(path))


def test_swift_max_pixels_argument_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("MAX_PIXELS", raising=False)
    monkeypatch.delenv("MIN_PIXELS", raising=False)
    base = f"model: {QWEN}\ntuner_type: lora\nmax_length: 2048\n"
    assert _check(tmp_path, base + "max_pixels: 1003520\n").setup.max_pixels == 1003520
    # The argument rescales, then the Qwen processor bounds again at MAX_PIXELS: the smaller wins.
    result = _check(tmp_path, base + "max_pixels: 1003520\nENV:\n  MAX_PIXELS: 602112\n  MIN_PIXELS: 200704\n")
    assert (result.setup.max_pixels, result.setup.min_pixels) == (602112, 200704)
    assert any("ENV.MAX_PIXELS" in d for d in result.mapped.defaults)
    monkeypatch.setenv("MAX_PIXELS", "401408")            # the shell that runs `swift sft` and `memfit check`
    result = _check(tmp_path, base)
    assert result.setup.max_pixels == 401408
    assert any("environment variable MAX_PIXELS" in d for d in result.mapped.defaults)
    with pytest.raises(InvalidSetupError, match="MAX_PIXELS must be a positive whole number"):
        _check(tmp_path, base + "ENV:\n  MAX_PIXELS: lots\n")


def test_swift_config_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("MAX_PIXELS", raising=False)
    data = {"model": QWEN, "train_type": "lora", "quant_bits": 4, "quant_method": "bnb"}
    assert detect_format(data) == "ms-swift"
    result = _check(tmp_path, f"model: {QWEN}\ntrain_type: lora\nquant_bits: 4\nquant_method: bnb\n")
    s = result.setup
    assert (s.method, s.quant, s.batch_size, s.grad_accum, s.grad_ckpt, s.lora_rank) == \
        ("qlora", "nf4-dq", 1, 16, True, 8)
    assert s.seq_len == 128000                            # max_length unset: the model's max_model_len
    assert s.max_pixels is None                           # no bound: the processor's preprocessor_config.json
    full = _check(tmp_path, f"model: {QWEN}\ntuner_type: full\nper_device_train_batch_size: 4\nmax_length: 1024\n"
                            f"freeze_vit: false\n")
    assert (full.setup.method, full.setup.grad_accum) == ("full", 4)
    assert any(code == "key-not-honoured" and "freeze_vit" in text for code, text in full.mapped.notes)
    with pytest.raises(InvalidSetupError, match="bnb takes 4 or 8 bits"):
        _check(tmp_path, f"model: {QWEN}\nquant_bits: 3\nquant_method: bnb\n")


def test_axolotl_processor_kwargs_and_image_size(tmp_path):
    base = f"base_model: {QWEN}\nadapter: lora\nsequence_len: 1024\n"
    result = _check(tmp_path, base + "processor_kwargs:\n  max_pixels: 401408\n  min_pixels: 3136\nimage_size: 512\n")
    assert (result.setup.max_pixels, result.setup.min_pixels, result.setup.image_size) == (401408, 3136, "512x512")
    assert result.mapped.keys["max_pixels"] == "processor_kwargs.max_pixels"
    assert _check(tmp_path, base + "image_size: [640, 480]\n").setup.image_size == "640x480"
    with pytest.raises(InvalidSetupError, match="image_size"):
        _check(tmp_path, base + "image_size: big\n")
    text = _check(tmp_path, "base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nsequence_len: 1024\nimage_size: 512\n")
    assert text.setup.image_size is None and "image_size" in text.mapped.ignored


def test_pixel_bounds_set_aside_for_tiled_families(tmp_path):
    """LLaMA-Factory's image_max_pixels shrinks images before a fixed-tile processor: no change in tokens."""
    result = _check(tmp_path, "model_name_or_path: google/gemma-3-4b-it\nstage: sft\nfinetuning_type: lora\n"
                              "cutoff_len: 1024\nimage_max_pixels: 262144\n")
    assert result.setup.max_pixels is None and result.setup.min_pixels is None
    assert [code for code, _ in result.mapped.notes] == ["pixel-bounds-not-tokens"]
    assert result.estimate.device_bytes > 0


def test_swift_notes_its_hooked_qwen3_vl_tower(tmp_path, monkeypatch):
    monkeypatch.delenv("MAX_PIXELS", raising=False)
    result = _check(tmp_path, "model: Qwen/Qwen3-VL-8B-Instruct\ntuner_type: lora\nmax_length: 1024\n"
                              "max_pixels: 1048576\n")
    notes = [text for code, text in result.mapped.notes if "patch_get_input_embeddings" in text]
    # 1024x1024 at 32 px per token: 32 x 32 tokens, 4096 patches x 27 blocks x 1152 x 2 bytes = 0.24 GiB
    assert len(notes) == 1 and "0.24 GiB" in notes[0]
    plain = _check(tmp_path, "model: Qwen/Qwen3-VL-8B-Instruct\ntuner_type: lora\nmax_length: 1024\n"
                             "gradient_checkpointing: false\n")
    assert not [t for _, t in plain.mapped.notes if "patch_get_input_embeddings" in t]
