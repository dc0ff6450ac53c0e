"""`memfit serve`: a local web page and JSON API over the same report as the CLI (Starlette on uvicorn).

    GET  /                      the page (assets shipped in the package: no CDN, works offline)
    GET  /assets/<file>         app.js, style.css (a fixed list; nothing else is ever served)
    GET  /api/models?q=TEXT     catalog search: [{slug, id, family, params}]
    GET  /api/gpus              the GPU catalog
    GET  /api/schema            JSON Schema of the request body, from the options table (defaults, units, values)
    POST /api/estimate          body: {"model" | "config", and any option of the schema}; answer: exactly what
                                `memfit estimate --format json` prints for the same options
    POST /api/curve             body: as /api/estimate; device bytes against max length for full, LoRA and
                                QLoRA, and the longest length where each fits

Errors are JSON {"error": "..."}: 400 (malformed: not JSON, not an object, an unknown option, a wrong type),
404, 405 (another method), 408 (the body did not arrive in time), 413 (body over 1 MiB), 415 (not
application/json) or 422 (a valid request memfit cannot estimate: unknown model, impossible number). Models come
from the catalog, the local Hugging Face cache, the Hub or an uploaded config, never from a path on the server.
Bound to 127.0.0.1 by default, where only localhost Host headers are answered (no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import json

from .data import DATA_DIR
from .errors import InvalidSetupError, MemfitError, MissingExtraError, SourceError, UsageError

MAX_BODY_BYTES = 1 << 20
BODY_TIMEOUT_S = 10        # a request whose body has not arrived by then is dropped (408)
HEADER_TIMEOUT_S = 10      # a connection whose request headers have not arrived by then is closed
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff",
                     "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'"}


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def request_from_body(body: dict):
    """The Request a JSON body stands for; malformed bodies raise RequestError(400)."""
    from .options import values_from_json
    from .report import Request

    rest = {k: v for k, v in body.items() if k not in ("model", "config")}
    try:
        values = values_from_json(rest)
    except UsageError as exc:
        raise RequestError(400, str(exc)) from None
    model, config = body.get("model"), body.get("config")
    if config is not None and not isinstance(config, dict):
        raise RequestError(400, "config must be a JSON object (the contents of a config.json)")
    if config is None and (not isinstance(model, str) or not model.strip()):
        raise RequestError(400, "give a model (catalog name or HF id) or an uploaded config")
    if model is not None and config is not None:
        raise RequestError(400, "give a model or a config, not both")
    return Request.from_values(values, model=model if config is None else None, config=config, local_paths=False)


def estimate_json(body: dict) -> str:
    """What POST /api/estimate answers: the CLI's JSON text for the same options."""
    from .render.jsonout import dumps, report_dict
    from .report import report

    request = request_from_body(body)
    try:
        return dumps(report_dict(report(request)))
    except MemfitError as exc:
        raise _unprocessable(exc) from None


def curve_json(body: dict) -> str:
    from .render.jsonout import dumps
    from .report import load_request_hardware, load_request_model, method_curves, resolve_setup

    request = request_from_body(body)
    try:
        hardware, _ = load_request_hardware(request)
        spec, _ = load_request_model(request)
        if spec.is_rule_of_thumb:
            raise InvalidSetupError("a bare size has no architecture: length does not enter the rule of thumb")
        return dumps(method_curves(spec, resolve_setup(request, hardware=hardware), hardware))
    except MemfitError as exc:
        raise _unprocessable(exc) from None


def _unprocessable(exc: MemfitError) -> RequestError:
    text = exc.render(lambda name: name) if isinstance(exc, InvalidSetupError) else str(exc)
    return RequestError(422, text)


def _search_models(query: str) -> list[dict]:
    from .sources.catalog import catalog_entries

    q = query.strip().lower()[:100]
    rows = [{"slug": e["slug"], "id": e["id"], "family": e["family"], "params": e["params"]}
            for e in catalog_entries() if not q or q in e["slug"] or q in e["id"].lower()]
    return sorted(rows, key=lambda r: (r["family"], r["params"]))


def create_app(host: str = "127.0.0.1"):
    """The Starlette application (tests drive it with httpx; `serve` runs it on uvicorn)."""
    try:
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware
        from starlette.responses import Response
        from starlette.routing import Route
    except ImportError:
        raise MissingExtraError('memfit serve needs Starlette and uvicorn: pip install "memfit[serve]"') from None

    def json_response(status: int, text: str) -> Response:
        return Response(text, status_code=status, media_type="application/json", headers=_SECURITY_HEADERS)

    def error(status: int, message: str) -> Response:
        return json_response(status, json.dumps({"error": message}))

    async def read_json(request) -> dict:
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise RequestError(415, "send the body as application/json")
        try:
            declared = int(request.headers.get("content-length", "0"))
        except ValueError:
            raise RequestError(400, "bad Content-Length") from None
        if declared > MAX_BODY_BYTES:
            raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {BODY_TIMEOUT_S} s") from None
        from .sources.local import parse_json

        try:   # strict JSON: no NaN or Infinity, bounded nesting (the same reader as config.json files)
            data = parse_json(b"".join(chunks), "request body")
        except SourceError as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RequestError(400, "the body must be a JSON object of options")
        return data

    async def index(request):
        return Response((DATA_DIR / "web" / "index.html").read_bytes(), media_type="text/html; charset=utf-8",
                        headers=_SECURITY_HEADERS)

    async def asset(request):
        name = request.path_params["name"]
        if name not in ASSETS:
            raise RequestError(404, "no such asset")
        return Response((DATA_DIR / "web" / name).read_bytes(), media_type=ASSETS[name], headers=_SECURITY_HEADERS)

    async def models(request):
        return json_response(200, json.dumps(_search_models(request.query_params.get("q", ""))))

    async def gpus(request):
        from .hardware import gpu_catalog

        return json_response(200, json.dumps([{"slug": g["slug"], "name": g["name"],
                                               "memory_bytes": g["memory_bytes"]} for g in gpu_catalog()]))

    async def schema(request):
        from .options import json_schema

        return json_response(200, json.dumps(json_schema()))

    async def answer(request, compute):
        try:
            return json_response(200, await run_in_threadpool(compute, await read_json(request)))
        except RequestError:
            raise
        except Exception as exc:   # a bug, not bad input: still a JSON answer, never a dropped connection
            return error(500, f"internal error: {type(exc).__name__}")

    async def estimate(request):
        return await answer(request, estimate_json)

    async def curve(request):
        return await answer(request, curve_json)

    async def on_request_error(request, exc: RequestError):
        return error(exc.status, str(exc))

    async def on_http_error(request, exc: HTTPException):
        words = {404: "not found", 405: "method not allowed"}
        return error(exc.status_code, words.get(exc.status_code, exc.detail or "bad request"))

    routes = [Route("/", index), Route("/index.html", index), Route("/assets/{name}", asset),
              Route("/api/models", models), Route("/api/gpus", gpus), Route("/api/schema", schema),
              Route("/api/estimate", estimate, methods=["POST"]), Route("/api/curve", curve, methods=["POST"])]
    middleware = []
    if host in LOOPBACK:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]",
                                                                           "testserver"]))
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={RequestError: on_request_error, HTTPException: on_http_error})


def _deadline_protocol():
    """uvicorn's h11 protocol with a deadline for a request's headers. uvicorn (0.3x, protocols/http/h11_impl.py)
    times out idle keep-alive connections but waits forever for the headers of a request that was only begun; a
    client trickling or abandoning them would hold its connection open. Here it is closed after
    HEADER_TIMEOUT_S."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class DeadlineH11Protocol(H11Protocol):
        header_deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def _arm(self):
            self._disarm()
            self.header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._expire)

        def _disarm(self):
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

        def _expire(self):
            self.header_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self):
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:      # a request's headers arrived: its body has its own deadline
                self._disarm()

        def on_response_complete(self):
            self._arm()                      # the next request on this connection gets the same deadline
            super().on_response_complete()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return DeadlineH11Protocol


def make_config(app, **kw):
    """uvicorn's configuration for the page: quiet, a deep listen queue and deadlines on every read."""
    import uvicorn

    # The listen queue holds 2048 connections: bursts of clients wait instead of being reset.
    return uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=5, backlog=2048,
                          http=_deadline_protocol(), h11_max_incomplete_event_size=64 * 1024, **kw)


def serve(host: str, port: int) -> None:
    """Run the page on host:port until Ctrl-C. A busy port or an address that cannot be bound is one error."""
    import socket

    app = create_app(host)
    try:
        import uvicorn
    except ImportError:
        raise MissingExtraError('memfit serve needs Starlette and uvicorn: pip install "memfit[serve]"') from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SourceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    config = make_config(app)
    print(f"memfit: http://{host}:{sock.getsockname()[1]}/  (Ctrl-C to stop)", flush=True)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
