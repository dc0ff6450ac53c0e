"""Hugging Face ids outside the catalog: the local HF cache first (offline), then the Hub (config.json and the
safetensors headers only, never weights).

The Hub is asked with one plain HTTP request per file (urllib, explicit timeouts, no retries) rather than
huggingface_hub's download functions: those retry five times with exponential backoff (about 24 s and eleven
log lines before an offline user sees an error), and their exception types change between the huggingface_hub
releases memfit admits (requests in 0.x, httpx in 1.x, httpx2 in 2.x). Before the first request one TCP connect
to the endpoint (or its proxy) with a short timeout tells offline from online, so an unknown id fails in well
under two seconds offline. HTTP errors are classified the way huggingface_hub itself does: by status code and
the Hub's X-Error-Code header (RepoNotFound, GatedRepo, EntryNotFound).

huggingface_hub is still used, imported lazily, for the cache lookup and the saved token.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import SourceError, UnknownModelError, printable
from ..spec import ModelSpec
from .local import (MAX_CONFIG_BYTES, MAX_HEADER_BYTES, changes_from_summary, load_model_dir, parse_json,
                    parse_safetensors_header, shard_names, summarize_headers)

CONNECT_TIMEOUT_S = 1.5    # the offline check: a reachable Hub answers a TCP connect in well under this
READ_TIMEOUT_S = 15.0      # each request once connected (a socket timeout: per blocking read, not in total)
FIRST_READ_BYTES = 100_000  # one Range request covers most safetensors headers (huggingface_hub reads the same)
DEFAULT_ENDPOINT = "https://huggingface.co"
# Hub repo ids: "org/name", letters, digits, "-", "_", "." , at most 96 characters a part (huggingface_hub's
# validate_repo_id).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def _hub():
    import huggingface_hub  # imported here: the catalog path must not pay for it

    return huggingface_hub


def is_repo_id(ref: str) -> bool:
    return bool(_REPO_ID.match(ref)) and "--" not in ref and ".." not in ref


def load_from_cache(repo_id: str) -> ModelSpec | None:
    """The snapshot of `repo_id` in the local HF cache (HF_HOME / HF_HUB_CACHE), or None."""
    hub = _hub()
    from huggingface_hub.errors import HFValidationError

    try:
        path = hub.try_to_load_from_cache(repo_id, "config.json")
    except HFValidationError as exc:
        raise UnknownModelError(f"{repo_id!r} is not a valid Hugging Face id ({str(exc).splitlines()[0]})",
                                name=repo_id) from None
    if not isinstance(path, str):
        return None
    snapshot = Path(path).parent
    return load_model_dir(snapshot, name=repo_id, source=f"hf-cache:{snapshot}")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline_reason() -> str | None:
    """Why the Hub cannot be asked right now (HF_HUB_OFFLINE, or no TCP connection), or None when it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return _unreachable(endpoint())


def _unreachable(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxied = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        host, port = proxied.hostname or host, proxied.port or 80
    outcome: list = []

    def connect():
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    # A thread bounds the DNS lookup too: getaddrinfo has no timeout of its own.
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT_S + 0.2)
    if not outcome:
        return f"no answer from {host} within {CONNECT_TIMEOUT_S:g} s"
    if outcome[0] is not None:
        return f"cannot connect to {host}:{port}: {getattr(outcome[0], 'strerror', None) or outcome[0]}"
    return None


class _HubHTTPError(Exception):
    def __init__(self, status: int, code: str | None):
        self.status, self.code = status, code or ""
        super().__init__(f"HTTP {status}{' ' + code if code else ''}")


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never send the token to another host (the Hub redirects weights to a CDN)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).hostname != urllib.parse.urlsplit(req.full_url).hostname:
            new.remove_header("Authorization")
        return new


def _token() -> str | None:
    try:
        return _hub().get_token()
    except Exception:   # no saved token, an unreadable token file, an old huggingface_hub: ask anonymously
        return os.environ.get("HF_TOKEN") or None


def _get(url: str, token: str | None, limit: int, byte_range: tuple[int, int] | None = None) -> bytes:
    """One GET, no retries. Raises _HubHTTPError for HTTP errors, OSError (URLError, timeouts) for the network."""
    request = urllib.request.Request(url, headers={"User-Agent": "memfit"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if byte_range:
        request.add_header("Range", f"bytes={byte_range[0]}-{byte_range[1]}")
    opener = urllib.request.build_opener(_SameHostAuth)
    try:
        with opener.open(request, timeout=READ_TIMEOUT_S) as response:
            body = response.read(limit + 1)
    except urllib.error.HTTPError as exc:
        raise _HubHTTPError(exc.code, exc.headers.get("X-Error-Code") if exc.headers else None) from None
    if byte_range:
        return body[:limit]     # a server that ignores Range sends the whole file: its first bytes are the same
    if len(body) > limit:
        raise SourceError(f"{url}: the answer is larger than {limit:,} bytes; not what the Hub serves for this file")
    return body


def load_from_hub(repo_id: str, suggestion: str = "") -> ModelSpec:
    """config.json (a few KB) and the safetensors headers of `repo_id` from the Hub. `suggestion` (a
    did-you-mean) is added to the not-found and offline errors."""
    reason = hub_offline_reason()
    if reason:
        raise UnknownModelError(f"{repo_id!r} is not in the catalog or the local HF cache, and the Hugging Face Hub "
                                f"cannot be asked ({reason}){suggestion or ''}; pass a local config.json or model "
                                f"directory", name=repo_id)
    base, token = f"{endpoint()}/{repo_id}/resolve/main", _token()
    with _progress(f"memfit: reading {repo_id} config.json and safetensors headers from {endpoint()} ..."):
        try:
            raw = _get(f"{base}/config.json", token, MAX_CONFIG_BYTES)
        except _HubHTTPError as exc:
            raise UnknownModelError(_http_message(repo_id, exc, suggestion), name=repo_id) from None
        except OSError as exc:
            raise UnknownModelError(f"could not read {repo_id}/config.json from {endpoint()} ({_net(exc)}); pass a "
                                    f"local config.json or model directory", name=repo_id) from None
        where = f"hub:{repo_id}/config.json"
        config = parse_json(raw, where)
        if not isinstance(config, dict):
            raise SourceError(f"{where}: expected a JSON object")
        spec = ModelSpec.from_hf_config(config, name=repo_id, source=where)
        try:
            headers = _remote_headers(base, token, repo_id)
        except (_HubHTTPError, OSError) as exc:
            detail = _net(exc) if isinstance(exc, OSError) else str(exc)
            return spec.replace(notes=spec.notes + (f"safetensors headers unavailable ({detail}): parameter count "
                                                    f"from config.json",))
    if not headers:
        return spec.replace(notes=spec.notes + ("no safetensors files on the Hub: parameter count from "
                                                "config.json",))
    summary = summarize_headers(headers, spec.tied_embeddings, f"hub:{repo_id}")
    return spec.replace(**changes_from_summary(spec, summary))


def _remote_headers(base: str, token: str | None, repo_id: str) -> list[dict]:
    """Every shard's safetensors header, read with Range requests; [] when the repo has no safetensors."""
    try:
        index = parse_json(_get(f"{base}/model.safetensors.index.json", token, MAX_CONFIG_BYTES * 4),
                           f"hub:{repo_id}/model.safetensors.index.json")
        names = shard_names(index.get("weight_map") if isinstance(index, dict) else None,
                            f"hub:{repo_id}/model.safetensors.index.json")
    except _HubHTTPError as exc:
        if exc.status != 404:
            raise
        names = ["model.safetensors"]
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            return list(pool.map(lambda name: _remote_header(base, token, name, repo_id), names))
    except _HubHTTPError as exc:
        if exc.status == 404 and names == ["model.safetensors"]:
            return []
        raise


def _remote_header(base: str, token: str | None, name: str, repo_id: str) -> dict:
    url, where = f"{base}/{urllib.parse.quote(name)}", f"hub:{repo_id}/{name}"
    first = _get(url, token, FIRST_READ_BYTES, (0, FIRST_READ_BYTES - 1))
    if len(first) < 8:
        raise SourceError(f"{where}: too short to be a safetensors file")
    (length,) = struct.unpack("<Q", first[:8])
    if length > MAX_HEADER_BYTES:
        raise SourceError(f"{where}: safetensors header claims {length} bytes; not a safetensors file")
    header = first[8:8 + length]
    if len(header) < length:
        header = _get(url, token, length, (8, 8 + length - 1))
    if len(header) < length:
        raise SourceError(f"{where}: truncated safetensors header ({len(header):,} of {length:,} bytes)")
    return parse_safetensors_header(header, where)


def _http_message(repo_id: str, exc: _HubHTTPError, suggestion: str) -> str:
    if exc.code == "GatedRepo" or exc.status == 403:
        return f"{repo_id!r} is gated on the Hub: accept its licence and `hf auth login`, or pass a local path"
    if exc.code == "EntryNotFound":
        return f"{repo_id!r} has no config.json on the Hub (not a transformers model?)"
    if exc.code == "RepoNotFound" or exc.status in (401, 404):
        return f"{repo_id!r} is not on the Hugging Face Hub (or is private: `hf auth login`){suggestion}"
    return f"the Hugging Face Hub answered {exc} for {repo_id}/config.json; try again later or pass a local path"


def _net(exc: OSError) -> str:
    reason = getattr(exc, "reason", None) or exc        # URLError wraps the socket error in .reason
    return printable(str(getattr(reason, "strerror", None) or reason))[:200]


class _progress:
    """One line on stderr while the Hub is asked, erased afterwards; only on a terminal, so scripts and pipes
    see nothing but the result or the one error line."""

    def __init__(self, text: str):
        self.text, self.shown = text, False

    def __enter__(self):
        stream = sys.stderr
        if getattr(stream, "isatty", lambda: False)():
            stream.write(self.text[:200])
            stream.flush()
            self.shown = True
        return self

    def __exit__(self, *exc):
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        return False
