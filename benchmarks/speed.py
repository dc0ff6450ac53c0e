"""Speed of the analytic path: in-process estimates per second and the CLI's cold start.

    python benchmarks/speed.py            # prints a table and writes benchmarks/results/speed.json

Targets (issue #2): >= 20,000 estimates per second in-process; a CLI start a few times a bare Python start.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from memfit import TrainingSetup, estimate, load_model

RESULTS = Path(__file__).parent / "results" / "speed.json"


def estimates_per_second(seconds: float = 3.0) -> float:
    """Distinct setups each time (lengths vary), so no cache can answer for the estimator."""
    specs = [load_model(m) for m in ("llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "mixtral-8x7b", "phi-3-mini-4k")]
    methods = ("full", "lora", "qlora")
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for spec in specs:
            for method in methods:
                estimate(spec, TrainingSetup(method=method, seq_len=512 + (n % 4096), batch_size=1 + n % 8))
                n += 1
    return n / (time.perf_counter() - start)


def cold_start(argv: list[str], repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    rate = estimates_per_second()
    bare = cold_start([sys.executable, "-c", "pass"])
    cli = cold_start([sys.executable, "-m", "memfit", "estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora",
                      "--gpu", "rtx-4090"])
    result = {"estimates_per_second": round(rate), "python_start_s": round(bare, 4), "cli_estimate_s": round(cli, 4),
              "cli_over_python": round(cli / bare, 2), "python": platform.python_version(),
              "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}"}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"in-process estimates:  {rate:,.0f} per second (target >= 20,000)")
    print(f"bare python start:     {bare * 1000:.0f} ms")
    print(f"memfit estimate (CLI): {cli * 1000:.0f} ms = {cli / bare:.1f}x a bare start")


if __name__ == "__main__":
    main()
