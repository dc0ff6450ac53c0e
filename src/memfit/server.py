"""`memfit serve`: a local web page over the same estimate code as the CLI, through a small JSON API.

    GET  /                      the page (assets shipped in the package: no CDN, works offline)
    GET  /assets/<file>         app.js, style.css (a fixed list; nothing else is ever served)
    GET  /api/models?q=TEXT     catalog search: [{slug, id, family, params}]
    GET  /api/gpus              the GPU catalog
    POST /api/estimate          body: the CLI's options as JSON ({"model", "method", "batch_size", ...});
                                answer: exactly what `memfit estimate --format json` prints for them.
                                An uploaded config.json goes in "config" (an object) instead of "model".
    POST /api/curve             body: as /api/estimate; answer: device bytes against max length for full,
                                LoRA and QLoRA, and the length where each stops fitting.

Errors are JSON {"error": "..."} with 400 (malformed request), 404, 413 (body over 1 MiB) or 422 (a valid
request memfit cannot estimate: unknown model, impossible number). The server binds 127.0.0.1 by default.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from .data import DATA_DIR
from .errors import MemfitError, UsageError

MAX_BODY_BYTES = 1 << 20
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
# JSON option -> CLI flag, and the JSON type each must have.
OPTIONS = {
    "method": ("--method", str), "batch_size": ("--batch-size", int), "seq_len": ("--seq-len", int),
    "precision": ("--precision", str), "optimizer": ("--optimizer", str), "grad_ckpt": ("--grad-ckpt", bool),
    "attn": ("--attn", str), "lora_rank": ("--lora-rank", int), "lora_targets": ("--lora-targets", str),
    "lora_dropout": ("--lora-dropout", float), "quant": ("--quant", str), "grad_accum": ("--grad-accum", int),
    "chunked_ce": ("--chunked-ce", bool), "recipe": ("--recipe", str), "gpus": ("--gpus", int),
    "nodes": ("--nodes", int), "shard": ("--shard", str), "offload": ("--offload", str), "gpu": ("--gpu", str),
    "memory": ("--memory", str), "mac": ("--mac", str), "mac_wired_limit": ("--mac-wired-limit", str),
    "padding": ("--padding", bool), "kbit_upcast": ("--kbit-upcast", bool),
}
CURVE_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def argv_for(options: dict, model_ref: str) -> list[str]:
    """The `memfit estimate` command line that a JSON request stands for."""
    argv = ["estimate", model_ref, "--format", "json"]
    for key, value in options.items():
        if key in ("model", "config"):
            continue
        if key not in OPTIONS:
            raise RequestError(400, f"unknown option {key!r} (known: model, config, {', '.join(OPTIONS)})")
        flag, kind = OPTIONS[key]
        if value is None:
            continue
        if kind is bool:
            if not isinstance(value, bool):
                raise RequestError(400, f"{key} must be true or false")
            if flag in ("--padding", "--kbit-upcast"):
                argv += [flag] if value else []
            else:
                argv.append(flag if value else "--no-" + flag[2:])
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise RequestError(400, f"{key} must be an integer")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RequestError(400, f"{key} must be a number")
        if kind is str and not isinstance(value, str):
            raise RequestError(400, f"{key} must be a string")
        if kind is int and abs(value) > 10**12:
            raise RequestError(422, f"{key} {value} is absurdly large")
        argv += [flag, str(value)]
    return argv


def run_estimate(options: dict) -> dict:
    """Exactly the CLI's JSON for these options (the same parser and command run in-process)."""
    from .cli import build_parser
    from .commands import cmd_estimate

    with _model_ref(options) as ref:
        argv = argv_for(options, ref)
        try:
            args = build_parser().parse_args(argv)
            return json.loads(cmd_estimate(args))
        except UsageError as exc:
            raise RequestError(400, str(exc).removeprefix("memfit estimate: ")) from None
        except MemfitError as exc:
            raise RequestError(422, str(exc)) from None


@contextlib.contextmanager
def _model_ref(options: dict):
    if "config" in options:
        if not isinstance(options["config"], dict):
            raise RequestError(400, "config must be a JSON object (the contents of a config.json)")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "config.json"
            path.write_text(json.dumps(options["config"]))
            yield str(path)
        return
    model = options.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestError(400, "give a model (catalog name or HF id) or an uploaded config")
    if model.startswith((".", "/", "~")) or "\\" in model:
        raise RequestError(400, "the page takes catalog names and Hub ids, not paths on the server")
    yield model


def run_curve(options: dict) -> dict:
    out = {"lengths": list(CURVE_LENGTHS), "methods": {}}
    for method in ("full", "lora", "qlora"):
        points, last_fit = [], None
        for length in CURVE_LENGTHS:
            data = run_estimate({**{k: v for k, v in options.items() if k not in ("method", "seq_len",
                                                                                 "lora_rank", "lora_targets")},
                                 "method": method, "seq_len": length})
            points.append(data["device_bytes"])
            verdict = data.get("verdict")
            if verdict and verdict["status"] != "does-not-fit":
                last_fit = length
        out["methods"][method] = {"device_bytes": points, "longest_fitting_length": last_fit}
    return out


class Handler(BaseHTTPRequestHandler):
    server_version = "memfit"

    def log_message(self, fmt, *args):   # quiet: a local tool
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        if status == 413:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def do_GET(self):  # noqa: N802 (http.server's naming)
        url = urlparse(self.path)
        try:
            if url.path in ("/", "/index.html"):
                return self._send(200, (DATA_DIR / "web" / "index.html").read_bytes(), "text/html; charset=utf-8")
            if url.path.startswith("/assets/"):
                name = url.path.removeprefix("/assets/")
                if name not in ASSETS:
                    raise RequestError(404, "no such asset")
                return self._send(200, (DATA_DIR / "web" / name).read_bytes(), ASSETS[name])
            if url.path == "/api/models":
                return self._json(200, _search_models(parse_qs(url.query).get("q", [""])[0]))
            if url.path == "/api/gpus":
                from .hardware import gpu_catalog

                return self._json(200, [{"slug": g["slug"], "name": g["name"], "memory_bytes": g["memory_bytes"]}
                                        for g in gpu_catalog()])
            raise RequestError(404, "not found")
        except RequestError as exc:
            self._json(exc.status, {"error": str(exc)})

    def do_POST(self):  # noqa: N802
        url = urlparse(self.path)
        try:
            options = self._read_json()
            if url.path == "/api/estimate":
                return self._json(200, run_estimate(options))
            if url.path == "/api/curve":
                return self._json(200, run_curve(options))
            raise RequestError(404, "not found")
        except RequestError as exc:
            self._json(exc.status, {"error": str(exc)})
        except Exception as exc:  # a bug, not bad input: still an answer, never a dropped connection
            self._json(500, {"error": f"internal error: {type(exc).__name__}"})

    def _read_json(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise RequestError(400, "bad Content-Length") from None
        if length > MAX_BODY_BYTES:
            raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RequestError(400, "the body is not valid JSON") from None
        if not isinstance(data, dict):
            raise RequestError(400, "the body must be a JSON object of options")
        return data


def _search_models(query: str) -> list[dict]:
    from .sources.catalog import catalog_entries

    q = query.strip().lower()[:100]
    rows = [{"slug": e["slug"], "id": e["id"], "family": e["family"], "params": e["params"]}
            for e in catalog_entries() if not q or q in e["slug"] or q in e["id"].lower()]
    return sorted(rows, key=lambda r: (r["family"], r["params"]))


def make_server(host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(host: str, port: int) -> None:
    server = make_server(host, port)
    print(f"memfit: http://{host}:{server.server_address[1]}/  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
