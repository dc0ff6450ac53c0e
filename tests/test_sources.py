"""Every model source returns the same ModelSpec: catalog, config.json, model directory (with safetensors
headers, sharded or not, pre-quantized), the local HF cache, and the Hub (mocked: tests never reach it)."""

import json
import struct

import pytest

from memfit import load_model
from memfit.errors import SourceError, UnknownModelError
from memfit.sources.catalog import catalog_entries, find_entry

LLAMA_CFG = dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                 tie_word_embeddings=True, torch_dtype="bfloat16")


def write_safetensors(path, tensors, dtype="BF16"):
    """A header-only safetensors file: 8-byte length + JSON header (the weights are never read)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_catalog_size_and_families():
    entries = catalog_entries()
    assert len(entries) >= 40
    assert len({e["config"]["model_type"] for e in entries}) >= 10
    assert len({e["family"] for e in entries}) >= 10
    assert all(e["source"].startswith("https://huggingface.co/") for e in entries)


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "llama-3.1-8b", "META-LLAMA/llama-3.1-8b",
                                  "Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"])
def test_catalog_lookup_is_case_insensitive_with_aliases(name):
    assert load_model(name).name == "meta-llama/Llama-3.1-8B"
    assert load_model(name).params == 8_030_261_248


def test_unknown_model_suggests_close_matches():
    with pytest.raises(UnknownModelError, match="did you mean qwen2.5-7b"):
        load_model("qwen2.5-7")


def test_config_json_equals_catalog(tmp_path):
    entry = find_entry("llama-3.2-1b")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(entry["config"]))
    from_file = load_model(str(path))
    from_catalog = load_model("llama-3.2-1b")
    assert from_file.params == from_catalog.params == 1_235_814_400
    assert from_file.replace(name="x", source="x", family="x") == from_catalog.replace(name="x", source="x",
                                                                                       family="x")


def test_model_dir_reads_exact_params_from_safetensors_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA_CFG, num_hidden_layers=1)))
    tensors = {"model.embed_tokens.weight": (128256, 2048), "model.norm.weight": (2048,),
               # stored although tied (as Qwen3 and Qwen1.5 ship it): must not be counted
               "lm_head.weight": (128256, 2048),
               "model.layers.0.self_attn.rotary_emb.inv_freq": (32,)}
    write_safetensors(tmp_path / "model.safetensors", tensors, dtype="F32")
    spec = load_model(str(tmp_path))
    assert spec.exact_params == 128256 * 2048 + 2048
    assert spec.checkpoint_dtype == "fp32"


def test_sharded_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    write_safetensors(tmp_path / "a.safetensors", {"x.weight": (10, 10)})
    write_safetensors(tmp_path / "b.safetensors", {"y.weight": (5, 4), "z.bias": (3,)})
    index = {"weight_map": {"x.weight": "a.safetensors", "y.weight": "b.safetensors", "z.bias": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load_model(str(tmp_path)).exact_params == 100 + 20 + 3


def test_prequantized_checkpoint_is_recognized(tmp_path):
    cfg = dict(LLAMA_CFG, quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp_path / "model.safetensors", {"q.weight": (100, 1), "q.weight.absmax": (4,)}, dtype="U8")
    spec = load_model(str(tmp_path))
    assert spec.prequantized == "bnb-4bit"
    assert spec.exact_params is None and spec.params == load_model("llama-3.2-1b").params


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"hidden_size": 10}), "no model_type"),
    (json.dumps({"model_type": "bert"}), "not supported"),
    (json.dumps(dict(LLAMA_CFG, hidden_size="big")), "hidden_size must be an integer"),
    (json.dumps({k: v for k, v in LLAMA_CFG.items() if k != "num_hidden_layers"}), "missing num_hidden_layers"),
    (json.dumps(dict(LLAMA_CFG, num_key_value_heads=7)), "not a multiple"),
    (json.dumps(dict(LLAMA_CFG, vocab_size=-5)), "vocab_size must be a positive integer"),
])
def test_malformed_configs(tmp_path, content, match):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(SourceError, match=match):
        load_model(str(path))


def test_directory_without_config(tmp_path):
    with pytest.raises(SourceError, match="no config.json"):
        load_model(str(tmp_path))


def test_corrupt_safetensors_header(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"xx")
    with pytest.raises(SourceError, match="not a safetensors file"):
        load_model(str(tmp_path))


def test_hf_cache_is_used_offline(tmp_path, monkeypatch):
    # The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/config.json}
    repo = tmp_path / "models--someorg--tiny-llama"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps(LLAMA_CFG))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    spec = load_model("someorg/tiny-llama")
    assert spec.source.startswith("hf-cache:")
    assert spec.params == load_model("llama-3.2-1b").params


class _FakeTensorInfo:
    def __init__(self, dtype, n):
        self.dtype, self.parameter_count = dtype, n


class _FakeFileMeta:
    def __init__(self, tensors):
        self.tensors = tensors


class _FakeMeta:
    def __init__(self, files):
        self.files_metadata = files


def test_hub_fetches_only_config_and_metadata(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fetched = []
    config_path = tmp_path / "downloaded-config.json"
    config_path.write_text(json.dumps(LLAMA_CFG))

    def fake_download(repo_id, filename, **kw):
        fetched.append((repo_id, filename))
        return str(config_path)

    def fake_metadata(self, repo_id, **kw):
        fetched.append((repo_id, "safetensors-metadata"))
        return _FakeMeta({"model.safetensors": _FakeFileMeta({
            "model.embed_tokens.weight": _FakeTensorInfo("BF16", 1000),
            "lm_head.weight": _FakeTensorInfo("BF16", 1000),   # tied: skipped
            "model.norm.weight": _FakeTensorInfo("BF16", 24)})})

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", fake_metadata)
    spec = load_model("newco/brand-new-model")
    assert fetched == [("newco/brand-new-model", "config.json"), ("newco/brand-new-model", "safetensors-metadata")]
    assert spec.source == "hub:newco/brand-new-model/config.json"
    assert spec.exact_params == 1024


def test_hub_offline_gives_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_network(repo_id, filename, **kw):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    with pytest.raises(UnknownModelError, match="are you offline"):
        load_model("newco/brand-new-model")


def test_hf_hub_offline_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModelError, match="HF_HUB_OFFLINE"):
        load_model("newco/brand-new-model")
