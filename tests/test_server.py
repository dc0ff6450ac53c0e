"""`memfit serve`: the JSON API answers byte for byte what the CLI prints, refuses bad input with a clear JSON 4xx,
answers 200 concurrent clients, times out partial requests, serves nothing outside its assets and never reads a
path on the server; the page is driven in headless Chromium."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")

import memfit.server as server_module  # noqa: E402
from memfit.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def server():
    server_module.HEADER_TIMEOUT_S, server_module.BODY_TIMEOUT_S = 2, 2
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(server_module.make_config(server_module.create_app("127.0.0.1")))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    srv.should_exit = True
    thread.join(10)
    server_module.HEADER_TIMEOUT_S, server_module.BODY_TIMEOUT_S = 10, 10


def request(url, body=None, method=None, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def cli_text(capsys, argv):
    assert main(argv) == 0
    return capsys.readouterr().out


def test_api_estimate_is_the_cli_byte_for_byte(server, capsys):
    body = {"model": "meta-llama/Llama-3.1-8B", "method": "lora", "batch_size": 2, "seq_len": 4096,
            "grad_ckpt": False, "optimizer_in_backward": False, "ckpt_reentrant": False, "host_ram": "64GB",
            "gpu": "rtx-4080"}
    status, raw = request(server + "/api/estimate", body)
    assert status == 200
    expected = cli_text(capsys, ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--batch-size", "2",
                                 "--seq-len", "4096", "--no-grad-ckpt", "--no-optimizer-in-backward",
                                 "--no-reentrant", "--host-ram", "64GB", "--gpu", "rtx-4080", "--format", "json"])
    assert raw.decode() + "\n" == expected
    assert json.loads(raw)["host_verdict"]["ram_bytes"] == 64 * 10**9


def test_uploaded_config(server):
    from memfit.sources.catalog import find_entry

    body = {"config": find_entry("llama-3.2-1b")["config"], "method": "full", "memory": "80GiB"}
    status, raw = request(server + "/api/estimate", body)
    data = json.loads(raw)
    assert status == 200 and data["model"]["params"] == 1_235_814_400 and data["verdict"]["status"] == "fits"


def test_curve_uses_the_same_rule_as_the_verdict(server, capsys):
    status, raw = request(server + "/api/curve", {"model": "llama-3.2-1b", "gpu": "rtx-4090"})
    data = json.loads(raw)
    assert status == 200 and len(data["methods"]["full"]["device_bytes"]) == len(data["lengths"])
    for method, points in data["methods"].items():
        assert points["device_bytes"] == sorted(points["device_bytes"])
        longest = points["longest_fitting_length"]
        if longest:
            verdict = json.loads(cli_text(capsys, ["estimate", "llama-3.2-1b", "--method", method, "--seq-len",
                                                   str(longest), "--gpu", "rtx-4090", "--format", "json"]))
            assert verdict["verdict"]["status"] == "fits"
            i = data["lengths"].index(longest)
            assert verdict["device_bytes"] == points["device_bytes"][i]


def test_schema_comes_from_the_options_table(server):
    from memfit.options import SETUP_OPTIONS

    status, raw = request(server + "/api/schema")
    props = json.loads(raw)["properties"]
    assert status == 200
    for option in SETUP_OPTIONS:
        assert option.name in props
    assert props["method"]["enum"][:3] == ["full", "lora", "qlora"] and "dora" in props["method"]["enum"]
    assert props["seq_len"]["default"] == 2048
    assert props["lora_rank"]["x-methods"][:2] == ["lora", "qlora"] and "ia3" not in props["lora_rank"]["x-methods"]
    assert "dataset" not in props


BAD = [
    ("/api/estimate", None, b"{not json", 400, "not valid JSON"),
    ("/api/estimate", None, b"[1, 2]", 400, "JSON object"),
    ("/api/estimate", None, b"[" * 100000 + b"]" * 100000, 400, "not valid JSON"),
    ("/api/estimate", {"model": "llama-3.2-1b", "batch_size": "four"}, None, 400, "batch_size: must be a whole"),
    ("/api/estimate", {"model": "llama-3.2-1b", "grad_ckpt": "yes"}, None, 400, "true or false"),
    ("/api/estimate", {"model": "llama-3.2-1b", "seq_len": 10**15}, None, 422, "seq_len 1000000000000000 is absurd"),
    ("/api/estimate", {"model": "llama-3.2-1b", "seq_len": -5}, None, 422, "seq_len must be at least 1"),
    ("/api/estimate", {"model": "llama-3.2-1b", "frobnicate": 1}, None, 400, "unknown option 'frobnicate'"),
    ("/api/estimate", {"model": "llama-3.2-1b", "dataset": "/etc/passwd"}, None, 400, "unknown option 'dataset'"),
    ("/api/estimate", {"model": "no-such-model-zzz"}, None, 422, "unknown model"),
    ("/api/estimate", {"model": "/etc/passwd"}, None, 422, "not paths"),
    ("/api/estimate", {"model": "mymodel/config.json"}, None, 422, "not paths"),
    ("/api/estimate", {"model": "../../etc"}, None, 422, "not paths"),
    ("/api/estimate", {"model": "llama-3.2-1b", "method": "sideways"}, None, 400, "is not one of full, lora, qlora"),
    ("/api/estimate", {"model": "llama-3.2-1b", "method": "full", "lora_rank": 8}, None, 422,
     "lora_rank only applies to method lora or qlora"),
    ("/api/estimate", {"model": "llama-3.2-1b", "gpu": "rtx-9999"}, None, 422, "unknown GPU"),
    ("/api/estimate", {"config": "nope"}, None, 400, "JSON object"),
    ("/api/estimate", {"config": {"model_type": "llama"}}, None, 422, "missing"),
    ("/api/estimate", {}, None, 400, "give a model"),
    ("/api/nothing", {}, None, 404, "not found"),
]


@pytest.mark.parametrize("path,body,raw,status,message", BAD, ids=[b[4] for b in BAD])
def test_bad_input_gets_a_clear_json_4xx(server, path, body, raw, status, message):
    got, data = request(server + path, body, raw=raw)
    assert got == status
    assert message in json.loads(data)["error"]


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_other_methods_get_json_405(server, method):
    got, data = request(server + "/api/estimate", raw=b"{}", method=method)
    assert got == 405 and json.loads(data) == {"error": "method not allowed"}


def test_only_json_bodies_and_local_hosts(server):
    got, data = request(server + "/api/estimate", raw=b'{"model": "llama-3.2-1b"}',
                        headers={"Content-Type": "text/plain"})
    assert got == 415 and "application/json" in json.loads(data)["error"]
    got, _ = request(server + "/api/models", headers={"Host": "evil.example"})
    assert got == 400


def _raw_exchange(server, payload: bytes, wait_s: float) -> tuple[bytes, float]:
    from urllib.parse import urlparse

    url = urlparse(server)
    conn = socket.create_connection((url.hostname, url.port))
    conn.sendall(payload)
    conn.settimeout(wait_s)
    start, received = time.monotonic(), b""
    try:
        while chunk := conn.recv(4096):
            received += chunk
    except TimeoutError:
        pass
    conn.close()
    return received, time.monotonic() - start


def test_oversized_body_is_refused_before_it_is_read(server):
    head = (b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(3 << 20).encode() + b"\r\n\r\n")
    received, _ = _raw_exchange(server, head, 10)
    assert received.startswith(b"HTTP/1.1 413") and b"over 1048576 bytes" in received


def test_partial_requests_time_out(server):
    """A request whose headers or body never finish is answered (408) or closed within the deadline."""
    received, waited = _raw_exchange(server, b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\n", 15)
    assert received == b"" and waited < 10
    head = (b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\":")
    received, waited = _raw_exchange(server, head, 15)
    assert received.startswith(b"HTTP/1.1 408") and waited < 10


@pytest.mark.parametrize("path", ["/assets/../../pyproject.toml", "/assets/%2e%2e/server.py", "/../etc/passwd",
                                  "/assets/index.html", "/assets/", "/assets/app.js/../../x"])
def test_nothing_outside_the_assets(server, path):
    got, _ = request(server + path)
    assert got == 404


def test_assets_and_page(server):
    assert request(server + "/")[0] == 200
    status, body = request(server + "/assets/app.js")
    assert status == 200 and b"/api/estimate" in body
    assert b"http://" not in request(server + "/")[1] and b"https://" not in body   # no CDN


def test_two_hundred_concurrent_clients_all_answered(server, capsys):
    """Issue #14: with 50 and 200 concurrent clients the old server reset connections (listen queue of 5)."""
    cases = [("llama-3.2-1b", "lora"), ("qwen2.5-7b", "qlora"), ("gemma-2-2b", "full"), ("qwen2.5-0.5b", "lora")]
    bodies = [{"model": m, "method": meth, "seq_len": 512 + 64 * (i % 8), "gpu": "rtx-4090"}
              for i, (m, meth) in enumerate(cases * 45)]
    bodies += [{"model": "llama-3.2-1b", "seq_len": "x"}] * 20
    expected = {}
    for b in bodies[:32]:
        key = (b["model"], b["method"], b["seq_len"])
        expected[key] = json.loads(cli_text(capsys, ["estimate", b["model"], "--method", b["method"], "--seq-len",
                                                     str(b["seq_len"]), "--gpu", "rtx-4090", "--format",
                                                     "json"]))["device_bytes"]
    with ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(lambda b: request(server + "/api/estimate", b), bodies))
    assert [s for s, _ in results].count(200) == 180 and [s for s, _ in results].count(400) == 20
    for body, (status, raw) in zip(bodies, results):
        if status == 200:
            assert json.loads(raw)["device_bytes"] == expected[(body["model"], body["method"], body["seq_len"])]
    assert request(server + "/api/models?q=qwen")[0] == 200


def test_serve_on_a_busy_port_is_one_error(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        code = main(["serve", "--port", str(busy.getsockname()[1])])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: cannot listen on 127.0.0.1:") and err.count("\n") == 1


def _browser(p, chromium):
    return p.chromium.launch(executable_path=str(chromium), args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])


PAGE_CASES = [
    # (form fields set, the same request on the command line)
    ({"model": "meta-llama/Llama-3.1-8B", "opt-method": "lora", "opt-seq_len": "4096", "gpu": "rtx-4080"},
     ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--seq-len", "4096", "--gpu", "rtx-4080"]),
    ({"model": "Qwen/Qwen3-32B", "opt-method": "qlora", "mac": "36GB"},
     ["estimate", "Qwen/Qwen3-32B", "--method", "qlora", "--mac", "36GB"]),
    ({"model": "Qwen/Qwen2.5-7B", "opt-method": "full", "opt-grad_ckpt": "true", "opt-recipe": "torchtune",
      "gpu": "a100-80gb"},
     ["estimate", "Qwen/Qwen2.5-7B", "--method", "full", "--grad-ckpt", "--recipe", "torchtune", "--gpu",
      "a100-80gb"]),
]


def test_page_in_headless_chromium(server, capsys):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    shots = Path(__file__).resolve().parent.parent / "test-artifacts"
    shots.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = _browser(p, chromium)
        # The page's CSP forbids eval; Playwright's waiting helpers need it, so the test context bypasses CSP.
        page = browser.new_context(viewport={"width": 1100, "height": 1400}, bypass_csp=True).new_page()
        page.goto(server + "/")
        page.wait_for_function("document.body.dataset.ready === '1'")
        for n, (fields, argv) in enumerate(PAGE_CASES):
            page.goto(server + "/")
            page.wait_for_function("document.body.dataset.ready === '1'")
            page.select_option("#gpu", "")
            for field, value in fields.items():
                if field in ("gpu",) or field.startswith("opt-") and page.locator(f"#{field}").evaluate(
                        "e => e.tagName") == "SELECT":
                    page.select_option(f"#{field}", value)
                else:
                    page.fill(f"#{field}", value)
            page.evaluate("document.body.dataset.ready = ''")
            page.click("#go")
            page.wait_for_function("document.body.dataset.ready === '1'")
            expected = json.loads(cli_text(capsys, argv + ["--format", "json"]))
            assert page.get_attribute("#verdict", "data-status") == expected["verdict"]["status"], (
                argv, page.inner_text("#error"))
            assert int(page.get_attribute("#device", "data-bytes")) == expected["device_bytes"], argv
            shown = page.inner_text("#suggestions")
            for s in expected["suggestions"]:
                assert (s["command"] in shown) == s["fits"], s["command"]
            assert page.locator("#curve svg polyline").count() == 3
            page.screenshot(path=str(shots / f"page-{n}.png"), full_page=True)
        # After an error the old answer is gone, and the error says why.
        page.fill("#model", "no-such-model-xyz")
        page.evaluate("document.body.dataset.ready = ''")
        page.click("#go")
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert page.is_hidden("#result") and "unknown model" in page.inner_text("#error")
        browser.close()
