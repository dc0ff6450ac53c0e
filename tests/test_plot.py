"""`memfit plot` writes PNG and SVG with the breakdown, the curves and the usable-memory line."""

import pytest

from memfit.cli import main

pytest.importorskip("matplotlib")


def test_png_and_svg(tmp_path, capsys):
    png, svg = tmp_path / "m.png", tmp_path / "m.svg"
    for path in (png, svg):
        assert main(["plot", "meta-llama/Llama-3.1-8B", "--method", "lora", "--gpu", "rtx-4090", "-o", str(path)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    text = svg.read_text()
    for label in ("device memory (GiB)", "max length (tokens)", "micro-batch size", "usable"):
        assert label in text


def test_with_trace_adds_the_comparison(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "t.svg"
    assert main(["plot", "llama-3.2-1b", "--method", "lora", "--seq-len", "256", "--with-trace", "-o", str(out)]) == 0
    assert "estimate vs trace" in out.read_text()


def test_bad_output_name(capsys):
    assert main(["plot", "llama-3.2-1b", "-o", "x.jpg"]) == 1
    assert "png or .svg" in capsys.readouterr().err
