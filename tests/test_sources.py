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
    # A model's config.json on the Hub, or (Llama 3.2 Vision, gated on the Hub) the builder that states its sizes.
    assert all(e["source"].startswith(("https://huggingface.co/", "https://github.com/")) for e in entries)


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


# ---- hardening: every bad model input is one clean SourceError / UnknownModelError -----------------------------
def _config_error(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises((SourceError, UnknownModelError)) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message
    return message


def test_binary_file_as_model(tmp_path):
    message = _config_error(tmp_path, bytes(range(256)) * 4)
    assert "config.json" in message and "not a text file" in message


def test_weights_file_as_model(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a": (2, 2)})
    with pytest.raises(SourceError, match="weights file.*model directory"):
        load_model(str(path))


@pytest.mark.parametrize("key,literal", [("hidden_size", "NaN"), ("rope_theta", "Infinity"),
                                         ("attention_dropout", "-Infinity")])
def test_non_finite_json_constants_are_refused_with_the_key(tmp_path, key, literal):
    text = json.dumps(dict(LLAMA_CFG, **{key: 0})).replace(f'"{key}": 0', f'"{key}": {literal}')
    message = _config_error(tmp_path, text)
    assert f"{key} is {literal}" in message and "config.json" in message


def test_overflowing_number_literal_is_refused(tmp_path):
    text = json.dumps(LLAMA_CFG).replace('"hidden_size": 2048', '"hidden_size": 1e400')
    assert "hidden_size is 1e400" in _config_error(tmp_path, text)


def test_nested_non_finite_names_the_path(tmp_path):
    text = json.dumps(dict(LLAMA_CFG, rope_scaling={"factors": [1.0, 0]})).replace("0]", "NaN]")
    assert "rope_scaling.factors[1] is NaN" in _config_error(tmp_path, text)


def test_deeply_nested_json(tmp_path):
    assert "nested too deeply" in _config_error(tmp_path, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")


@pytest.mark.parametrize("changes,match", [
    ({"hidden_size": "4096"}, "hidden_size must be an integer, got '4096'"),
    ({"num_hidden_layers": [16]}, "num_hidden_layers must be an integer"),
    ({"vocab_size": None, "num_hidden_layers": None}, "missing num_hidden_layers"),
    ({"num_attention_heads": True}, "num_attention_heads must be an integer, got True"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"hidden_act": ["silu"]}, "hidden_act must be a short string"),
    ({"model_type": ["llama"]}, "model_type must be a string"),
    ({"hidden_size": 4096.5}, "hidden_size must be an integer"),
    ({"hidden_size": -2048}, "hidden_size must be a positive integer up to 262,144, got -2048"),
    ({"hidden_size": 10**9}, "hidden_size must be a positive integer up to 262,144"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers must be a positive integer up to 10,000"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
    ({"num_attention_heads": -32}, "num_attention_heads must be a positive integer"),
    ({"vocab_size": 10**12}, "vocab_size must be a positive integer up to 10,000,000"),
    ({"intermediate_size": 10**9}, "intermediate_size must be a positive integer up to 2,097,152"),
    ({"partial_rotary_factor": -3}, r"partial_rotary_factor must be a number in \(0, 1\], got -3"),
    ({"attention_dropout": 5.0}, r"attention_dropout must be a number in \[0, 0.99\], got 5.0"),
    ({"sliding_window": -100}, "sliding_window must be a positive number of tokens"),
    ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping must be a number"),
    ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype 'float8_e4m3fn' is not supported"),
    ({"torch_dtype": 16}, "torch_dtype 16 is not supported"),
    ({"quantization_config": "4bit"}, "quantization_config must be a JSON object"),
    ({"hidden_size": 262144, "intermediate_size": 2**21, "num_hidden_layers": 10000, "head_dim": 8192},
     "more than any model that exists"),
])
def test_wrong_types_and_absurd_values(tmp_path, changes, match):
    config = {k: v for k, v in dict(LLAMA_CFG, **changes).items() if v is not None}
    with pytest.raises(SourceError, match=match):
        load_model(str(_write_config(tmp_path, config)))


def _write_config(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_moe_experts_out_of_range(tmp_path):
    moe = dict(LLAMA_CFG, model_type="mixtral", num_local_experts=10**9, num_experts_per_tok=2)
    with pytest.raises(SourceError, match="num_experts must be an integer from 0 to 65,536"):
        load_model(str(_write_config(tmp_path, moe)))


@pytest.mark.parametrize("text_config", ["x", [1, 2], 5])
def test_text_config_must_be_an_object(tmp_path, text_config):
    config = {"model_type": "gemma3", "text_config": text_config}
    with pytest.raises(SourceError, match="text_config must be a JSON object"):
        load_model(str(_write_config(tmp_path, config)))


@pytest.mark.parametrize("model_type,changes", [("gpt2", {"n_head": 0}), ("gpt_neox", {"num_attention_heads": 0}),
                                                ("falcon", {"num_attention_heads": 0}),
                                                ("gemma3_text", {"sliding_window_pattern": 0})])
def test_zero_divisors_are_errors_not_crashes(tmp_path, model_type, changes):
    config = dict(dict(LLAMA_CFG, model_type=model_type, n_embd=2048, n_head=32, n_layer=4), **changes)
    with pytest.raises(SourceError, match="must be a positive integer"):
        load_model(str(_write_config(tmp_path, config)))


def test_dtype_auto_and_torch_prefix_still_read(tmp_path):
    assert load_model(str(_write_config(tmp_path, dict(LLAMA_CFG, torch_dtype="auto")))).checkpoint_dtype == "bf16"
    assert load_model(str(_write_config(tmp_path, dict(LLAMA_CFG, torch_dtype="torch.float16")))
                      ).checkpoint_dtype == "fp16"
    fp8 = dict(LLAMA_CFG, torch_dtype="float8_e4m3fn", quantization_config={"quant_method": "fp8"})
    assert load_model(str(_write_config(tmp_path, fp8))).prequantized == "fp8"


@pytest.mark.parametrize("shape,match", [([10**12, 10**12], "claims 1e\\+24 elements"),
                                         ([1e12, 1e12], "malformed shape"), ([True, 2], "malformed shape"),
                                         ([-1, 2], "malformed shape"), ("4x4", "malformed shape"),
                                         ([1] * 9, "malformed shape")])
def test_absurd_safetensors_shapes(tmp_path, shape, match):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    raw = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(SourceError, match=match):
        load_model(str(tmp_path))


@pytest.mark.parametrize("content,match", [
    (struct.pack("<Q", 500) + b'{"w": {"dtype": "BF16"', "truncated safetensors file"),
    (struct.pack("<Q", 11) + b"\xff\xfe garbage!", "not UTF-8"),
    (struct.pack("<Q", 9) + b"[1, 2, 3]", "not a JSON object"),
    (struct.pack("<Q", 4) + b"{\"w\"", "not valid JSON"),
    (b"\x01\x02", "too short"),
    (struct.pack("<Q", 41) + b'{"w": {"dtype": "BF99", "shape": [2, 2]}}', "unknown dtype 'BF99'"),
    (struct.pack("<Q", 8) + b'{"w": 5}', "no dtype/shape entry"),
])
def test_garbage_safetensors_headers(tmp_path, content, match):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(SourceError, match=match):
        load_model(str(tmp_path))


def test_index_cannot_point_outside_the_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CFG))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(SourceError, match="not a .safetensors file inside the model directory"):
        load_model(str(tmp_path))


def test_long_and_control_character_model_names():
    with pytest.raises(UnknownModelError, match="too long") as info:
        load_model("x" * 5000)
    assert len(str(info.value)) < 300
    for name in ("llama\x1b[31m-evil", "meta\u202e/llama", "a\x00b", "two\nlines"):
        with pytest.raises(UnknownModelError, match="control or invisible characters") as info:
            load_model(name)
        message = str(info.value)
        assert "\x1b" not in message and "\u202e" not in message and "\n" not in message and "\x00" not in message


def test_name_from_config_is_escaped(tmp_path):
    config = dict(LLAMA_CFG, _name_or_path="evil\x1b[2J\u202etxt.exe" + "y" * 500)
    spec = load_model(str(_write_config(tmp_path, config)))
    assert "\x1b" not in spec.name and "\u202e" not in spec.name
    assert spec.name.startswith("evil\\x1b[2J\\u202etxt.exe") and len(spec.name) <= 201


def test_error_messages_escape_text_from_files(tmp_path):
    message = _config_error(tmp_path, json.dumps(dict(LLAMA_CFG, model_type="bad\x1b[31m\u202e")))
    assert "not supported" in message and "\\x1b" in message and "\\u202e" in message


def test_every_catalog_model_still_loads_from_its_config_json(tmp_path):
    for entry in catalog_entries():
        spec = load_model(str(_write_config(tmp_path, entry["config"])))
        assert spec.params == load_model(entry["id"]).params, entry["id"]
