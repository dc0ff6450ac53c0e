"""Speed of `memfit serve` over real HTTP on 127.0.0.1: POST /api/estimate and POST /api/curve.

    python benchmarks/server_speed.py     # prints a table and writes benchmarks/results/server_speed.json

Target (issue #13): /api/curve under 50 ms on this machine. The old server turned JSON into argv, ran argparse and
parsed its own printed JSON (34.5 ms an estimate, about 1 s a curve); now both call the library directly.
Each request is distinct (the length varies), so no estimate cache answers for the server.
"""

from __future__ import annotations

import json
import platform
import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn

from memfit.server import create_app, make_config

RESULTS = Path(__file__).parent / "results" / "server_speed.json"
CASES = {
    "estimate, fits (no advice)": ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B", "method": "qlora",
                                                      "gpu": "rtx-4090"}),
    "estimate, does not fit (advice searched)": ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B",
                                                                    "method": "lora", "batch_size": 8,
                                                                    "gpu": "rtx-4090"}),
    "curve": ("/api/curve", {"model": "meta-llama/Llama-3.1-8B", "method": "lora", "gpu": "rtx-4090"}),
}


def _post(url: str, body: dict) -> float:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
    return time.perf_counter() - start


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(make_config(create_app("127.0.0.1")))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    rows = {}
    for name, (path, body) in CASES.items():
        times = []
        for i in range(30):
            times.append(_post(base + path, dict(body, seq_len=1024 + 64 * i)))
        rows[name] = {"median_ms": round(1000 * statistics.median(times), 1),
                      "p90_ms": round(1000 * sorted(times)[int(0.9 * len(times))], 1)}
        print(f"{name:<45} median {rows[name]['median_ms']:>7.1f} ms   p90 {rows[name]['p90_ms']:>7.1f} ms")
    server.should_exit = True
    RESULTS.write_text(json.dumps({"machine": f"{platform.machine()}, {platform.python_version()}",
                                   "requests": rows, "target_curve_ms": 50}, indent=2) + "\n")


if __name__ == "__main__":
    main()
