"""`memfit serve`: the JSON API answers exactly what the CLI prints, refuses bad input with a clear 4xx, stays
up under concurrent requests and serves nothing outside its assets; the page is driven in headless Chromium."""

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.server import make_server


@pytest.fixture(scope="module")
def server():
    srv = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def request(url, body=None, method=None, raw=None, headers=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def cli_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_api_estimate_equals_the_cli(server, capsys):
    body = {"model": "meta-llama/Llama-3.1-8B", "method": "lora", "batch_size": 2, "seq_len": 4096,
            "grad_ckpt": False, "gpu": "rtx-4080"}
    status, raw = request(server + "/api/estimate", body)
    assert status == 200
    expected = cli_json(capsys, ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--batch-size", "2",
                                 "--seq-len", "4096", "--no-grad-ckpt", "--gpu", "rtx-4080", "--format", "json"])
    assert json.loads(raw) == expected


def test_uploaded_config(server):
    from memfit.sources.catalog import find_entry

    body = {"config": find_entry("llama-3.2-1b")["config"], "method": "full", "memory": "80GiB"}
    status, raw = request(server + "/api/estimate", body)
    data = json.loads(raw)
    assert status == 200 and data["model"]["params"] == 1_235_814_400 and data["verdict"]["status"] == "fits"


def test_curve(server):
    status, raw = request(server + "/api/curve", {"model": "llama-3.2-1b", "gpu": "rtx-4090"})
    data = json.loads(raw)
    assert status == 200 and len(data["methods"]["full"]["device_bytes"]) == len(data["lengths"])
    lora = data["methods"]["lora"]
    assert lora["device_bytes"] == sorted(lora["device_bytes"])


BAD = [
    ("/api/estimate", None, b"{not json", 400, "not valid JSON"),
    ("/api/estimate", None, b"[1, 2]", 400, "JSON object"),
    ("/api/estimate", {"model": "llama-3.2-1b", "batch_size": "four"}, None, 400, "batch_size must be an integer"),
    ("/api/estimate", {"model": "llama-3.2-1b", "grad_ckpt": "yes"}, None, 400, "true or false"),
    ("/api/estimate", {"model": "llama-3.2-1b", "seq_len": 10**15}, None, 422, "absurdly large"),
    ("/api/estimate", {"model": "llama-3.2-1b", "seq_len": -5}, None, 422, "at least 1"),
    ("/api/estimate", {"model": "llama-3.2-1b", "frobnicate": 1}, None, 400, "unknown option"),
    ("/api/estimate", {"model": "no-such-model-zzz"}, None, 422, "unknown model"),
    ("/api/estimate", {"model": "/etc/passwd"}, None, 400, "not paths"),
    ("/api/estimate", {"model": "llama-3.2-1b", "method": "sideways"}, None, 400, "invalid choice"),
    ("/api/estimate", {"model": "llama-3.2-1b", "gpu": "rtx-9999"}, None, 422, "unknown GPU"),
    ("/api/estimate", {"config": "nope"}, None, 400, "JSON object"),
    ("/api/estimate", {"config": {"model_type": "llama"}}, None, 422, "missing"),
    ("/api/nothing", {}, None, 404, "not found"),
]


@pytest.mark.parametrize("path,body,raw,status,message", BAD, ids=[b[4] for b in BAD])
def test_bad_input_gets_a_clear_4xx(server, path, body, raw, status, message):
    got, data = request(server + path, body, raw=raw)
    assert got == status
    assert message in json.loads(data)["error"]


def test_oversized_body_is_refused(server):
    import http.client
    from urllib.parse import urlparse

    url = urlparse(server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/api/estimate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(3 << 20))    # announced, never sent: refused before reading
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and "over" in json.loads(resp.read())["error"]
    conn.close()


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


def test_stays_up_under_concurrent_requests(server):
    bodies = [{"model": m, "method": meth, "seq_len": 512 + i, "gpu": "rtx-4090"}
              for i, (m, meth) in enumerate([("llama-3.2-1b", "lora"), ("qwen2.5-7b", "qlora"),
                                            ("gemma-2-2b", "full")] * 20)]
    bodies += [{"model": "llama-3.2-1b", "seq_len": "x"}] * 10
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda b: request(server + "/api/estimate", b)[0], bodies))
    assert results.count(200) == 60 and results.count(400) == 10
    assert request(server + "/api/models?q=qwen")[0] == 200


def test_page_in_headless_chromium(server, capsys, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    shots = Path(__file__).resolve().parent.parent / "test-artifacts"
    shots.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        # The page's CSP forbids eval; Playwright's waiting helpers need it, so the test context bypasses CSP.
        page = browser.new_context(viewport={"width": 1100, "height": 1400}, bypass_csp=True).new_page()
        page.goto(server + "/")
        page.wait_for_function("document.body.dataset.ready === '1'")
        page.fill("#model", "meta-llama/Llama-3.1-8B")
        page.select_option("#method", "lora")
        page.fill("#seq_len", "4096")
        page.select_option("#gpu", "rtx-4080")
        page.evaluate("document.body.dataset.ready = ''")
        page.click("#go")
        page.wait_for_function("document.body.dataset.ready === '1'")
        expected = cli_json(capsys, ["estimate", "meta-llama/Llama-3.1-8B", "--method", "lora", "--seq-len", "4096",
                                     "--precision", "auto", "--attn", "sdpa", "--no-grad-ckpt", "--gpu", "rtx-4080",
                                     "--format", "json"])
        assert page.get_attribute("#verdict", "data-status") == expected["verdict"]["status"] == "does-not-fit"
        assert int(page.get_attribute("#device", "data-bytes")) == expected["device_bytes"]
        shown = page.inner_text("#suggestions")
        assert expected["suggestions"][0]["command"] in shown
        assert page.locator("#curve svg polyline").count() == 3
        page.screenshot(path=str(shots / "page.png"), full_page=True)
        browser.close()
