"""Every model source returns the same ModelSpec: catalog, config.json, model directory (with safetensors
headers, sharded or not, pre-quantized), the local HF cache, and the Hub (a local HTTP server on 127.0.0.1: tests never reach the real one)."""

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


def _safetensors_bytes(tensors, dtype="BF16"):
    header = {name: {"dtype": dtype, "shape": list(shape), "data_offsets": [0, 0]} for name, shape in tensors.items()}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 64     # a few weight bytes that must never be needed


class _Hub:
    """A stand-in for the Hub's /{repo}/resolve/main/{file} endpoint: files, error codes and Range requests."""

    def __init__(self):
        import http.server
        import threading

        self.files, self.requests, self.auth = {}, [], []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Range")))
                hub.auth.append(self.headers.get("Authorization"))
                entry = hub.files.get(self.path)
                if entry is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound" if self.path.count("/") < 5 or
                                     not any(k.startswith(self.path.rsplit("/", 1)[0]) for k in hub.files)
                                     else "EntryNotFound")
                    self.end_headers()
                    return
                status, body = entry
                rng = self.headers.get("Range")
                if rng and status == 200:
                    start, end = map(int, rng.removeprefix("bytes=").split("-"))
                    body, status = body[start:end + 1], 206
                self.send_response(status)
                if status == 403:
                    self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo, name, body, status=200):
        self.files[f"/{repo}/resolve/main/{name}"] = (status, body if isinstance(body, bytes) else body.encode())

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    server = _Hub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    yield server
    server.close()


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """HF_ENDPOINT at a port nothing listens on: connection refused, as with no network."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def test_hub_reads_only_config_and_safetensors_headers(hub):
    hub.add("newco/brand-new-model", "config.json", json.dumps(LLAMA_CFG))
    hub.add("newco/brand-new-model", "model.safetensors", _safetensors_bytes({
        "model.embed_tokens.weight": (1000,), "lm_head.weight": (1000,),    # tied: skipped
        "model.norm.weight": (24,)}))
    spec = load_model("newco/brand-new-model")
    assert spec.source == "hub:newco/brand-new-model/config.json"
    assert spec.exact_params == 1024
    paths = [p.rsplit("/", 1)[1] for p, _ in hub.requests]
    assert paths == ["config.json", "model.safetensors.index.json", "model.safetensors"]
    assert hub.requests[-1][1] == "bytes=0-99999"     # only the header's bytes, never the weights


def test_hub_sharded_checkpoint(hub):
    repo = "newco/sharded"
    hub.add(repo, "config.json", json.dumps(dict(LLAMA_CFG, tie_word_embeddings=False)))
    hub.add(repo, "model.safetensors.index.json", json.dumps({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}))
    hub.add(repo, "model-00001-of-00002.safetensors", _safetensors_bytes({"a.weight": (10, 10)}))
    hub.add(repo, "model-00002-of-00002.safetensors", _safetensors_bytes({"b.weight": (5,)}, dtype="F32"))
    spec = load_model(repo)
    assert spec.exact_params == 105 and spec.checkpoint_dtype == "bf16"


def test_hub_without_safetensors_uses_config_count(hub):
    hub.add("newco/bin-only", "config.json", json.dumps(LLAMA_CFG))
    spec = load_model("newco/bin-only")
    assert spec.exact_params is None and spec.params == load_model("llama-3.2-1b").params
    assert any("no safetensors" in note for note in spec.notes)


@pytest.mark.parametrize("setup,match", [
    (lambda hub: None, "not on the Hugging Face Hub"),
    (lambda hub: hub.add("newco/m", "config.json", "", status=403), "gated"),
    (lambda hub: hub.add("newco/m", "config.json", "{}", status=500), "answered HTTP 500"),
    (lambda hub: hub.add("newco/m", "config.json", '{"model_type": "llama", "hidden_size": NaN}'),
     "hidden_size is NaN"),
    (lambda hub: hub.add("newco/m", "config.json", b"\x89PNG\r\n\x1a\n\0\0"), "not UTF-8"),
])
def test_hub_errors_are_one_clean_message(hub, setup, match):
    setup(hub)
    with pytest.raises((UnknownModelError, SourceError), match=match) as info:
        load_model("newco/m")
    assert "\n" not in str(info.value)


def test_hub_gets_the_token_and_a_cdn_never_does(hub):
    import urllib.request

    from memfit.sources.hub import _SameHostAuth

    hub.add("newco/brand-new-model", "config.json", json.dumps(LLAMA_CFG))
    load_model("newco/brand-new-model")
    assert hub.auth == ["Bearer hf_test_token"] * 3
    # redirects keep Authorization on the same host and drop it for another (the Hub sends weights to a CDN)
    req = urllib.request.Request("http://127.0.0.1:1/x", headers={"Authorization": "Bearer secret"})
    other = _SameHostAuth().redirect_request(req, None, 302, "Found", {}, "http://cdn.example/x")
    same = _SameHostAuth().redirect_request(req, None, 302, "Found", {}, "http://127.0.0.1:1/y")
    assert not other.has_header("Authorization") and same.has_header("Authorization")


def test_unknown_hub_id_offline_returns_one_line_with_a_suggestion(offline, capsys):
    with pytest.raises(UnknownModelError) as info:
        load_model("meta-lama/Llama-3.1-8B")
    message = str(info.value)
    assert "cannot connect" in message and "did you mean meta-llama/Llama-3.1-8B " in message
    assert info.value.candidates[0] == "meta-llama/Llama-3.1-8B" and info.value.name == "meta-lama/Llama-3.1-8B"
    assert "\n" not in message
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""      # no retry chatter from huggingface_hub


def test_hf_hub_offline_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModelError, match="HF_HUB_OFFLINE"):
        load_model("newco/brand-new-model")


def test_cli_offline_hub_id_is_one_error_line(offline, capsys):
    from memfit.cli import main

    assert main(["estimate", "meta-lama/Llama-3.1-8B"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ")
    assert "meta-llama/Llama-3.1-8B" in captured.err
