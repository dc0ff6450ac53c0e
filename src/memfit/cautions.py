"""The common mistakes a result is checked for: judging by the download, a Mac's whole RAM, system RAM given as
a card's memory, bitsandbytes on a Mac, a fit too thin to grow, lengths that cut the dataset's examples."""

from __future__ import annotations

from dataclasses import dataclass

from .estimator import Estimate
from .hardware import Hardware
from .options import BNB_OPTIMIZERS
from .search import max_int
from .setup import TrainingSetup
from .spec import ModelSpec
from .units import GB, gib

# Below this share of usable memory to spare, a run that fits is warned about growing its length or batch.
THIN_MARGIN_SHARE = 0.10


@dataclass(frozen=True)
class Caution:
    code: str
    message: str


def length_cautions(stats) -> list[Caution]:
    """The dataset check's warnings (dataset.length_warnings) as Cautions."""
    from .dataset import length_warnings

    return [Caution(w["code"], w["message"]) for w in length_warnings(stats)]


def warnings_for(spec: ModelSpec, setup: TrainingSetup, est: Estimate, hardware: Hardware | None,
                 ver=None) -> list[Caution]:
    out = []
    if est.download_bytes:
        ratio = est.device_bytes / est.download_bytes
        out.append(Caution("download-vs-training",
                           f"the download is {est.download_bytes / GB:.1f} GB of 16-bit weights; this training run "
                           f"needs {est.device_bytes / GB:.1f} GB, {ratio:.1f}x the download"))
    if hardware is None:
        return out
    if hardware.kind == "mac" and hardware.usable_bytes >= 0.95 * hardware.capacity_bytes:
        out.append(Caution("mac-whole-ram",
                           "the GPU limit given is the Mac's whole RAM; macOS and open apps need their share: plan "
                           "on about three quarters (Metal's recommendedMaxWorkingSetSize)"))
    if hardware.kind == "mac" and setup.optimizer in BNB_OPTIMIZERS:
        out.append(Caution("bitsandbytes-on-mac",
                           f"optimizer {setup.optimizer} is a bitsandbytes CUDA kernel; on a Mac use a torch or "
                           f"MLX optimizer"))
    if hardware.kind == "memory" and _looks_like_system_ram(hardware.capacity_bytes):
        out.append(Caution("memory-looks-like-system-ram",
                           f"{hardware.capacity_bytes / GB:.0f} GB matches no single GPU but is a common system-RAM "
                           f"size: only the card's own memory counts (see `memfit gpus`)"))
    # "Fits" means the range's high end fits (verdict.py), so the margin that matters is the high end's.
    if ver is not None and ver.status == "fits" and ver.high_margin_bytes < THIN_MARGIN_SHARE * ver.usable_bytes \
            and not spec.is_rule_of_thumb:
        grow_len = max_int(spec, setup, hardware, "seq_len", step=64).value
        grow_batch = max_int(spec, setup, hardware, "batch_size").value
        out.append(Caution("thin-margin",
                           f"only {gib(ver.high_margin_bytes)} to spare at the high end of the range: raising "
                           f"length or batch will not fit (longest "
                           f"length at this batch: {grow_len}; largest batch at this length: {grow_batch})"))
    return out


def _looks_like_system_ram(nbytes: int) -> bool:
    from .hardware import gpu_catalog

    if nbytes < 60 * GB:
        return False
    return not any(abs(nbytes - g["memory_bytes"]) <= 0.06 * g["memory_bytes"] for g in gpu_catalog())
