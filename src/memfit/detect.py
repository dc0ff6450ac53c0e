"""`--gpu auto`: find the local accelerator and its memory, without needing one to test.

Order: nvidia-smi (the driver's view, every NVIDIA GPU), torch.cuda when torch is installed, then macOS sysctl
(RAM and the GPU wired limit). Each probe runs a command through `run`, so tests feed recorded outputs.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

from .errors import InvalidSetupError, printable
from .hardware import MIN_DEVICE_BYTES, Hardware, mac_usable_bytes
from .units import MAX_DEVICE_BYTES, GiB, MiB


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def detect_hardware(run=_run, platform: str = sys.platform, torch_probe=None) -> Hardware:
    found = _nvidia_smi(run) or _torch_cuda(torch_probe) or (_mac(run) if platform == "darwin" else None)
    if found is None:
        raise InvalidSetupError("--gpu auto found no GPU (no nvidia-smi, no CUDA torch, not a Mac): pass --gpu, "
                                "--memory or --mac")
    return found


def _nvidia_smi(run) -> Hardware | None:
    out = run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    if not out or not out.strip():
        return None
    gpus = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        try:
            nbytes = float(mib.strip()) * MiB
        except ValueError:      # "[N/A]", "[Not Supported]" on some vGPUs and MIG slices
            continue
        # A probe can print nonsense ("inf", "0" on a wedged driver): only a size a card can have counts.
        if math.isfinite(nbytes) and MIN_DEVICE_BYTES <= nbytes <= MAX_DEVICE_BYTES:
            gpus.append((printable(name.strip())[:100], int(nbytes)))
    if not gpus:
        return None
    name, nbytes = min(gpus, key=lambda g: g[1])     # with mixed cards, the smallest one limits a run
    notes = (f"{len(gpus)} GPUs found; memfit estimates one (the smallest, {name})",) if len(gpus) > 1 else ()
    slug = _catalog_slug(name)
    return Hardware(name=name, kind="gpu", capacity_bytes=nbytes, usable_bytes=nbytes, slug=slug,
                    source="detected: nvidia-smi memory.total", notes=notes)


def _torch_cuda(probe) -> Hardware | None:
    if probe is None:
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        probe = (props.name, props.total_memory)
    if not probe:
        return None
    name, nbytes = probe
    if not isinstance(nbytes, int) or not MIN_DEVICE_BYTES <= nbytes <= MAX_DEVICE_BYTES:
        return None
    return Hardware(name=name, kind="gpu", capacity_bytes=nbytes, usable_bytes=nbytes, slug=_catalog_slug(name),
                    source="detected: torch.cuda.get_device_properties(0).total_memory")


def _mac(run) -> Hardware | None:
    ram = run(["sysctl", "-n", "hw.memsize"])
    if not ram or not ram.strip().isdigit():
        return None
    ram_bytes = int(ram.strip())
    if not GiB <= ram_bytes <= MAX_DEVICE_BYTES:
        return None
    wired = run(["sysctl", "-n", "iogpu.wired_limit_mb"])
    chip = printable((run(["sysctl", "-n", "machdep.cpu.brand_string"]) or "Apple silicon").strip())[:100]
    # 0 means "macOS default"; a limit above the RAM cannot be wired, so the default applies then too.
    if wired and wired.strip().isdigit() and 0 < int(wired.strip()) * MiB <= ram_bytes:
        usable, how = int(wired.strip()) * MiB, "detected: sysctl iogpu.wired_limit_mb"
    else:
        usable = mac_usable_bytes(ram_bytes)
        how = f"detected: sysctl hw.memsize; Metal working-set limit {usable / ram_bytes:.0%} of RAM"
    return Hardware(name=f"{chip} Mac with {ram_bytes / 2**30:.0f} GiB unified memory", kind="mac",
                    capacity_bytes=ram_bytes, usable_bytes=usable, source=how)


def _catalog_slug(name: str) -> str | None:
    """The catalog GPU whose slug words all appear in the device name ("NVIDIA H100 80GB HBM3" -> h100-80gb);
    the most specific match wins."""
    import re

    from .hardware import gpu_catalog

    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    best = None
    for entry in gpu_catalog():
        for candidate in (entry["slug"], *entry["aliases"]):
            parts = set(candidate.split("-"))
            if parts <= words and (best is None or len(parts) > best[0]):
                best = (len(parts), entry["slug"])
    return best[1] if best else None
