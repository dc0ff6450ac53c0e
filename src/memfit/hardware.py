"""Hardware: how much memory a run may really use. GPUs from the catalog, a card's memory, or a Mac's RAM.

On a PC only the card's own memory counts (never system RAM). On Apple silicon the GPU shares RAM with the OS
and apps; its cap is Metal's recommendedMaxWorkingSetSize, which macOS sets to a share of RAM that grows with
RAM size (observed values below) and which `sysctl iogpu.wired_limit_mb` overrides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from .data import DATA_DIR
from .errors import InvalidSetupError, UnknownHardwareError, did_you_mean, printable, shorten
from .physics.overhead import CUDA_CONTEXT_BYTES
from .units import MAX_DEVICE_BYTES, GiB, parse_size

# A card smaller than the CUDA context (426 MiB, physics/overhead.py) cannot hold even an empty training run.
MIN_DEVICE_BYTES = CUDA_CONTEXT_BYTES
# The smallest Apple-silicon Mac has 8 GB (M1, 2020); Apple's GB are GiB.
MIN_MAC_BYTES = 8 * GiB

# recommendedMaxWorkingSetSize / RAM, observed (research/memory-physics.md §7):
#   16 GB M4: 10.67 GB (exo-explore/exo#1672), 16 GB M3: 11.84 GB (AlexsJones/llmfit#754)   -> about 2/3
#   24 GB: 17.76 GiB (sgl-project/sglang#29949); 64 GB M2 Max: 47-49 GB (ggml-org/llama.cpp#1870) -> about 3/4
#   128 GiB: 107.52 GiB (antirez/ds4#893)                                                        -> 0.84
# recommendedMaxWorkingSetSize by RAM (research/frontier.md 3.2): 2/3 measured on 16 GB and 32 GB machines, 3/4 on
# 36, 64 and 96 GB, 84% on 128 GB. The boundary lies between 32 and 36 GB.
MAC_WORKING_SET_SHARE = ((32 * GiB, 2 / 3), (96 * GiB, 3 / 4), (None, 0.84))
MAC_SOURCES = ("exo-explore/exo#1672, AlexsJones/llmfit#754, sgl-project/sglang#29949, ggml-org/llama.cpp#1870, "
               "antirez/ds4#893")



def mac_share_words() -> str:
    """MAC_WORKING_SET_SHARE in words, for listings and help: '2/3 of RAM up to 32 GiB, ...'."""
    from fractions import Fraction

    def share(x: float) -> str:
        f = Fraction(x).limit_denominator(4)
        return f"{f.numerator}/{f.denominator}" if abs(float(f) - x) < 1e-9 else f"{x:.0%}"
    words = [f"{share(s)} of RAM up to {limit // GiB} GiB" if limit else f"{share(s)} above"
             for limit, s in MAC_WORKING_SET_SHARE]
    return ", ".join(words)

@dataclass(frozen=True)
class Hardware:
    name: str
    kind: str                 # "gpu" | "memory" | "mac"
    capacity_bytes: int       # the card's memory, or the Mac's RAM
    usable_bytes: int         # what a training run may use (a card: all it exposes; a Mac: the Metal limit)
    source: str
    notes: tuple[str, ...] = ()
    slug: str | None = None


@lru_cache(maxsize=1)
def gpu_catalog() -> tuple[dict, ...]:
    path = DATA_DIR / "hardware" / "gpus.json"
    return tuple(json.loads(path.read_text(encoding="utf-8"))["gpus"])


def _gpu_index() -> dict[str, dict]:
    index = {}
    for entry in gpu_catalog():
        for name in (entry["slug"], *entry["aliases"]):
            index[name.lower()] = entry
    return index


def find_gpu(name: str) -> dict:
    if not isinstance(name, str) or not name.strip():
        raise UnknownHardwareError("no GPU name given (`memfit gpus` lists them)")
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    for candidate in (key, key.removeprefix("nvidia-").removeprefix("geforce-"), "rtx-" + key):
        entry = _gpu_index().get(candidate)
        if entry:
            return entry
    raise UnknownHardwareError(f"unknown GPU {shorten(name, 60)}" +
                               did_you_mean(key, [g["slug"] for g in gpu_catalog()], "memfit gpus"))


def mac_usable_bytes(ram_bytes: int) -> int:
    for limit, share in MAC_WORKING_SET_SHARE:
        if limit is None or ram_bytes <= limit:
            return int(ram_bytes * share)
    raise AssertionError("unreachable: the table ends with an open bucket")


def _catalog_mac(text):
    """A Mac named by its catalog slug ("m3-max-36gb", `memfit macs`), or None when `text` is a RAM size."""
    import re

    if not isinstance(text, str) or not re.match(r"^\s*m\d", text.strip().lower()):
        return None
    from .macs import find_mac

    return find_mac(text)


def _mac_ram_bytes(text: str | int, what: str = "--mac") -> int:
    """Mac RAM is sold in binary units: Apple's "36GB" is 36 GiB. An explicit GiB or a byte count is kept.
    --mac and --mac-wired-limit both go through here, so "--mac 36GB --mac-wired-limit 36GB" are equal."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    nbytes = parse_size(text, what)
    upper = str(text).strip().upper()
    if upper.endswith(("GB", "G")) and not upper.endswith("IB"):
        nbytes = round(nbytes / 1e9 * GiB)
    return nbytes


def _check_bytes(value, what: str, low: int, low_why: str, high: int = MAX_DEVICE_BYTES) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSetupError(f"{what} must be a size like 24GiB or a whole number of bytes, got {shorten(value)}")
    if value < low:
        raise InvalidSetupError(f"{what} of {value / GiB:.3g} GiB is smaller than {low_why}; check the unit")
    if value > high:
        raise InvalidSetupError(f"{what} of {value / GiB:,.0f} GiB is larger than any single device (2 TiB); "
                                f"check the unit")
    return value


def load_hardware(gpu: str | None = None, memory: str | int | None = None, mac: str | int | None = None,
                  mac_wired_limit: str | int | None = None) -> Hardware:
    """Exactly one of gpu (a catalog slug), memory (a card's own memory) or mac (the Mac's RAM)."""
    given = [name for name, value in (("--gpu", gpu), ("--memory", memory), ("--mac", mac)) if value is not None]
    if len(given) != 1:
        raise InvalidSetupError(f"give exactly one of --gpu, --memory or --mac (got {', '.join(given) or 'none'})")
    if mac_wired_limit is not None and mac is None:
        raise InvalidSetupError("--mac-wired-limit only applies with --mac")
    if gpu is not None:
        entry = find_gpu(gpu)
        return Hardware(name=entry["name"], kind="gpu", capacity_bytes=entry["memory_bytes"],
                        usable_bytes=entry["memory_bytes"], slug=entry["slug"],
                        source=f"{entry['memory_source']}; {entry['source']}")
    if memory is not None:
        nbytes = memory if isinstance(memory, int) else parse_size(memory, "--memory")
        _check_bytes(nbytes, "--memory", MIN_DEVICE_BYTES,
                     f"the CUDA context alone ({MIN_DEVICE_BYTES / GiB:.2f} GiB), so nothing could train on it")
        notes = []
        if isinstance(memory, str) and memory.strip().upper().endswith(("GB", "G")) and "I" not in memory.upper():
            notes.append(f"{memory} read as {nbytes / 1e9:g}e9 bytes; a card sold as '{memory}' usually has "
                         f"{nbytes / 1e9:g} GiB: pass {memory.upper().replace('GB', 'GiB')} for that")
        return Hardware(name=f"GPU with {printable(str(memory))}", kind="memory", capacity_bytes=nbytes,
                        usable_bytes=nbytes, source="--memory (the card's own memory)", notes=tuple(notes))
    model = _catalog_mac(mac)
    if model is not None:
        ram = model.ram_bytes
    else:
        ram = _check_bytes(_mac_ram_bytes(mac), "--mac", MIN_MAC_BYTES,
                           "any Apple-silicon Mac (8 GB); Apple's GB are GiB, so 16GB means 16 GiB")
    if mac_wired_limit is not None:
        usable = _check_bytes(_mac_ram_bytes(mac_wired_limit, "--mac-wired-limit"), "--mac-wired-limit",
                              GiB, "1 GiB, below anything macOS lets the GPU wire")
        if usable > ram:
            raise InvalidSetupError(f"--mac-wired-limit ({usable / GiB:g} GiB) is larger than the Mac's RAM "
                                    f"({ram / GiB:g} GiB)")
        how = "the GPU wired limit you gave (sysctl iogpu.wired_limit_mb)"
    elif model is not None:
        usable = model.working_set_bytes
        how = (f"Metal's recommendedMaxWorkingSetSize for the {model.chip} with {ram // GiB} GB "
               f"({model.working_set_kind}: {model.working_set_source})")
    else:
        usable = mac_usable_bytes(ram)
        how = f"Metal's recommendedMaxWorkingSetSize, {usable / ram:.0%} of RAM at this size ({MAC_SOURCES})"
    label = f"{model.chip} Mac with {ram // GiB} GB" if model else f"Apple silicon Mac with {printable(str(mac))}"
    return Hardware(name=f"{label} unified memory", kind="mac",
                    capacity_bytes=ram, usable_bytes=usable, source=how,
                    notes=("the OS and open apps share this RAM; MLX lets allocations pass the working-set limit "
                           "but the system then pages and slows down",))
