"""The Apple-silicon Mac catalog: chips, RAM options and Metal's recommendedMaxWorkingSetSize.

Data in ``data/hardware/macs.json``; each entry says whether its working set is a published measurement or the
rule of hardware.py (the same one `--mac 36GB` uses), and where it comes from. Loaded on first use, nothing at import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from .data import DATA_DIR
from .errors import UnknownHardwareError, did_you_mean


@dataclass(frozen=True)
class Mac:
    slug: str                   # "m3-max-36gb"
    chip: str                   # "M3 Max"
    ram_bytes: int              # Apple's "36 GB" is 36 GiB
    working_set_bytes: int      # recommendedMaxWorkingSetSize: what MLX may wire (mx.set_wired_limit)
    working_set_kind: str       # "measured" | "rule"
    working_set_source: str
    ram_source: str
    machines: str

    @property
    def working_set_share(self) -> float:
        return self.working_set_bytes / self.ram_bytes


@lru_cache(maxsize=1)
def mac_catalog() -> tuple[Mac, ...]:
    raw = json.loads((DATA_DIR / "hardware" / "macs.json").read_text(encoding="utf-8"))
    return tuple(_mac(e) for e in raw["macs"])


def _mac(e: dict) -> Mac:
    if e["working_set_kind"] == "measured":
        working_set, source = e["working_set_bytes"], e["working_set_source"]
    else:   # one rule for a catalog Mac and for `--mac 36GB`
        from .hardware import mac_share_words, mac_usable_bytes

        working_set = mac_usable_bytes(e["ram_bytes"])
        source = "; ".join(filter(None, [f"rule: {mac_share_words()}", e.get("working_set_source")]))
    return Mac(slug=e["slug"], chip=e["chip"], ram_bytes=e["ram_bytes"], working_set_bytes=working_set,
               working_set_kind=e["working_set_kind"], working_set_source=source, ram_source=e["ram_source"],
               machines=e["machines"])


def find_mac(name: str) -> Mac:
    """'m3-max-36gb', 'M3 Max 36GB', 'm3_max_36' all name the same entry."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if not key.endswith("gb"):
        key += "gb"
    key = key.replace("-gb", "gb")
    for mac in mac_catalog():
        if mac.slug == key:
            return mac
    raise UnknownHardwareError(f"unknown Mac {name!r}" + did_you_mean(key, [m.slug for m in mac_catalog()],
                                                                       "memfit macs"))
