"""Time and peak RSS of `memfit trace` for 1B, 8B and 70B models on this machine.

    python benchmarks/trace_speed.py        # writes benchmarks/results/trace_speed.json

Targets (issue #3): Llama-3.1-8B LoRA at batch 1, length 2048 in at most 60 s and 2 GiB of RAM; 70B in at most
5 minutes. Each trace runs in its own process so its peak RSS is its own.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "trace_speed.json"
CASES = [
    ("meta-llama/Llama-3.2-1B", ["--method", "full", "--precision", "bf16", "--optimizer", "adamw"]),
    ("meta-llama/Llama-3.1-8B", ["--method", "lora", "--batch-size", "1", "--seq-len", "2048"]),
    ("meta-llama/Llama-3.1-8B", ["--method", "full", "--precision", "bf16", "--optimizer", "adamw"]),
    ("meta-llama/Llama-3.1-70B", ["--method", "lora", "--batch-size", "1", "--seq-len", "2048"]),
]


def run(model: str, flags: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "memfit", "trace", model, *flags, "--format", "json"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"model": model, "flags": flags, "error": proc.stderr.strip()}
    data = json.loads(proc.stdout)
    return {"model": model, "flags": " ".join(flags), "wall_s": round(wall, 1),
            "trace_s": data["trace"]["wall_s"], "peak_rss_mib": round(data["trace"]["peak_rss_bytes"] / 2**20),
            "peak_allocated_gib": round(data["peak_allocated_bytes"] / 2**30, 2), "peak_phase": data["peak_phase"]}


def main() -> None:
    rows = [run(model, flags) for model, flags in CASES]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": f"{os.cpu_count()} cores, {platform.machine()}",
                                   "python": platform.python_version(), "rows": rows}, indent=2) + "\n")
    for r in rows:
        if "error" in r:
            print(f"{r['model']}: ERROR {r['error']}")
        else:
            print(f"{r['model']:<28} {r['flags']:<48} {r['wall_s']:>6} s (trace {r['trace_s']} s)  "
                  f"RSS {r['peak_rss_mib']} MiB  peak {r['peak_allocated_gib']} GiB at {r['peak_phase']}")


if __name__ == "__main__":
    main()
