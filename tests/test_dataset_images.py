"""The dataset check counts the image tokens of the images each row names (tiny PNG/JPEG files written here),
with the model's processor rule; a missing or unreadable image is one line naming file:line."""

import json
import subprocess
import sys

import pytest

from memfit import load_model
from memfit.dataset import length_stats, token_lengths
from memfit.dataset_images import image_refs
from memfit.errors import SourceError
from memfit.vision import image_token_rule

pytest.importorskip("tokenizers")
Image = pytest.importorskip("PIL.Image")
WORDS = "a b c d e f g h".split()


@pytest.fixture
def tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _images(tmp_path):
    (tmp_path / "img").mkdir()
    Image.new("RGB", (640, 480)).save(tmp_path / "img" / "a.png")
    Image.new("RGB", (1280, 720)).save(tmp_path / "img" / "b.jpg", quality=50)
    Image.new("RGB", (100, 3000)).save(tmp_path / "img" / "c.png")


def _rows(tmp_path, rows):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_image_refs_of_every_layout():
    assert image_refs({"images": ["x.png", {"path": "y.jpg"}], "messages": []}) == ["x.png", {"path": "y.jpg"}]
    assert image_refs({"image": "coco/1.jpg", "conversations": []}) == ["coco/1.jpg"]
    row = {"messages": [{"role": "user", "content": [{"type": "image", "path": "p.png"}, {"type": "text", "text": "hi"},
                                                     {"type": "image_url", "image_url": {"url": "q.png"}}]}]}
    assert image_refs(row) == ["p.png", "q.png"]


def test_qwen_image_tokens_in_the_lengths(tmp_path, tokenizer):
    _images(tmp_path)
    data = _rows(tmp_path, [
        {"messages": [{"role": "user", "content": "a b c"}], "images": ["img/a.png"]},                     # 3 words
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/b.jpg"},
                                                   {"type": "text", "text": "a b"}]}]},
        {"messages": [{"role": "user", "content": "a"}], "images": ["img/a.png", "img/c.png"]},
        {"messages": [{"role": "user", "content": "a b c d"}]},
    ])
    vision = load_model("qwen2.5-vl-7b").vision
    rule = image_token_rule(vision, None, 602112)
    counts = []
    lengths, layout = token_lengths(data, tokenizer, image_tokens=rule, image_counts=counts)
    text, _ = token_lengths(data, tokenizer)
    # smart_resize at max_pixels 602112: 640x480 -> 644x476 = 23 x 17 = 391 tokens, 1280x720 -> 1008x560 =
    # 36 x 20 = 720 tokens (the rule equals the processor: tests/test_vision.py).
    a, b, c = rule(640, 480), rule(1280, 720), rule(100, 3000)
    assert (a, b) == (391, 720)
    assert counts == [a, b, a + c, 0]
    assert lengths == [t + i for t, i in zip(text, counts)]
    stats = length_stats(lengths, layout, 512, counts)
    assert stats.image_tokens == (a, a + c, a + c) and stats.max == max(lengths)


def test_fixed_and_tiled_families(tmp_path, tokenizer):
    _images(tmp_path)
    data = _rows(tmp_path, [{"text": "a b", "images": ["img/b.jpg"]}, {"text": "a", "image": "img/a.png"}])
    counts = []
    token_lengths(data, tokenizer, image_tokens=image_token_rule(load_model("llava-1.5-7b").vision), image_counts=counts)
    assert counts == [576, 576]
    counts = []
    token_lengths(data, tokenizer, image_tokens=image_token_rule(load_model("internvl3-1b").vision), image_counts=counts)
    # 1280x720: 4x2 tiles (ties 2x1 on aspect, more tiles while under twice the area) + thumbnail; 640x480: 4x3 +
    # thumbnail (the tile grids equal the processor's: tests/test_vision_more.py).
    assert counts == [9 * 256, 13 * 256]


def test_missing_and_unreadable_images(tmp_path, tokenizer):
    _images(tmp_path)
    (tmp_path / "img" / "bad.png").write_bytes(b"not an image at all")
    rule = image_token_rule(load_model("qwen2.5-vl-3b").vision)
    data = _rows(tmp_path, [{"text": "a", "images": ["img/a.png"]}, {"text": "b", "images": ["img/missing.png"]}])
    with pytest.raises(SourceError, match=r"data\.jsonl:2: image 'img/missing\.png' not found"):
        token_lengths(data, tokenizer, image_tokens=rule)
    data = _rows(tmp_path, [{"text": "a", "images": ["img/bad.png"]}])
    with pytest.raises(SourceError, match=r"data\.jsonl:1: image 'img/bad\.png' is not a readable image"):
        token_lengths(data, tokenizer, image_tokens=rule)
    data = _rows(tmp_path, [{"text": "a", "images": ["https://example.com/x.png"]}])
    with pytest.raises(SourceError, match="local files only"):
        token_lengths(data, tokenizer, image_tokens=rule)


def test_header_only_no_decode(tmp_path, tokenizer, monkeypatch):
    """Sizes come from the header: decoding pixels (Image.load) is never called."""
    _images(tmp_path)
    from PIL import ImageFile

    def no_load(self, *a, **k):
        raise AssertionError("pixels decoded")
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    data = _rows(tmp_path, [{"text": "a", "images": ["img/a.png", "img/b.jpg"]}])
    counts = []
    token_lengths(data, tokenizer, image_tokens=image_token_rule(load_model("qwen2.5-vl-3b").vision),
                  image_counts=counts)
    assert counts[0] > 0


def test_cli_estimate_counts_images_and_one_line_for_a_missing_one(tmp_path, tokenizer):
    _images(tmp_path)
    data = _rows(tmp_path, [{"text": "a b c", "images": ["img/a.png"]}] * 3)
    run = subprocess.run([sys.executable, "-m", "memfit", "estimate", "qwen2.5-vl-3b", "--dataset", data,
                          "--tokenizer", tokenizer, "--max-pixels", "602112", "--format", "json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["dataset"]["p50"] == 3 + 391 and out["dataset"]["image_tokens"]["max"] == 391
    assert out["setup"]["seq_len"] == 64            # the length is chosen from the text (3 tokens), images on top
    data = _rows(tmp_path, [{"text": "a", "images": ["img/a.png"]}, {"text": "a", "images": ["nope.png"]}])
    run = subprocess.run([sys.executable, "-m", "memfit", "estimate", "qwen2.5-vl-3b", "--dataset", data,
                          "--tokenizer", tokenizer], capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "data.jsonl:2: image 'nope.png' not found" in run.stderr


def test_check_counts_images_under_the_trainers_pixel_bound(tmp_path, tokenizer, monkeypatch):
    """`memfit check` on an ms-swift config: the dataset it names, its images counted at the config's MAX_PIXELS."""
    from memfit.preflight.check import check_config

    monkeypatch.delenv("MAX_PIXELS", raising=False)
    _images(tmp_path)
    _rows(tmp_path, [{"messages": [{"role": "user", "content": "a b"}], "images": ["img/b.jpg"]}] * 2)
    config = tmp_path / "swift.yaml"
    config.write_text("model: Qwen/Qwen2.5-VL-3B-Instruct\ntuner_type: lora\nmax_length: 2048\ndataset: data.jsonl\n"
                      "ENV:\n  MAX_PIXELS: 602112\n")
    stats = check_config(str(config), tokenizer=tokenizer).dataset
    assert stats.image_tokens == (720, 720, 720)           # 1280x720 at 602,112 pixels: 36 x 20 tokens
    config.write_text(config.read_text().replace("602112", "200704"))
    assert check_config(str(config), tokenizer=tokenizer).dataset.image_tokens[0] == \
        image_token_rule(load_model("qwen2.5-vl-3b").vision, None, 200704)(1280, 720)


def test_embedded_images(tmp_path, tokenizer):
    """A data: URL in JSONL, and the datasets Image feature's {"bytes": ...} in Parquet."""
    import base64
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (640, 480)).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rule = image_token_rule(load_model("qwen2.5-vl-3b").vision, None, 602112)
    counts = []
    token_lengths(_rows(tmp_path, [{"text": "a", "images": [url]}]), tokenizer, image_tokens=rule, image_counts=counts)
    assert counts == [391]
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"text": ["a b"], "images": [[{"bytes": buffer.getvalue(), "path": None}]]})
    pq.write_table(table, tmp_path / "d.parquet")
    counts = []
    token_lengths(str(tmp_path / "d.parquet"), tokenizer, image_tokens=rule, image_counts=counts)
    assert counts == [391]
