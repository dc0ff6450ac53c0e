import pytest

from memfit import load_hardware
from memfit.errors import InvalidSetupError, UnknownHardwareError
from memfit.hardware import gpu_catalog, mac_usable_bytes
from memfit.units import parse_size

GiB, MiB = 2**30, 2**20


def test_catalog_has_25_gpus_with_sources():
    gpus = gpu_catalog()
    assert len(gpus) >= 25
    assert {g["vendor"] for g in gpus} >= {"nvidia", "amd"}
    assert all(g["source"].startswith("https://") and g["memory_bytes"] > 8 * GiB for g in gpus)


@pytest.mark.parametrize("name,expected", [("rtx-4090", 24564 * MiB), ("RTX 4090", 24564 * MiB),
                                           ("4090", 24564 * MiB), ("a100", 81920 * MiB),
                                           ("a100-40gb", 40 * GiB), ("h100", 81559 * MiB), ("mi300x", 192 * GiB)])
def test_gpu_lookup(name, expected):
    assert load_hardware(gpu=name).usable_bytes == expected


def test_unknown_gpu_suggests():
    with pytest.raises(UnknownHardwareError, match="did you mean"):
        load_hardware(gpu="rtx-4900")


@pytest.mark.parametrize("ram_gib,usable_gib", [(16, 16 * 2 / 3), (24, 18), (36, 27), (64, 48), (128, 128 * 0.84)])
def test_mac_working_set(ram_gib, usable_gib):
    # observed: 16 GB -> 10.7-11.8 GB, 24 GB -> 17.76 GiB, 64 GB -> 47-49 GB, 128 GiB -> 107.52 GiB
    assert mac_usable_bytes(ram_gib * GiB) == pytest.approx(usable_gib * GiB, rel=1e-6)
    assert load_hardware(mac=f"{ram_gib}GB").capacity_bytes == ram_gib * GiB   # Apple's GB are GiB


def test_mac_wired_limit_override():
    hw = load_hardware(mac="36GB", mac_wired_limit="32GiB")
    assert hw.usable_bytes == 32 * GiB
    with pytest.raises(InvalidSetupError):
        load_hardware(mac="16GB", mac_wired_limit="32GiB")


@pytest.mark.parametrize("text,nbytes", [("24GB", 24 * 10**9), ("24GiB", 24 * GiB), ("24 GiB", 24 * GiB),
                                         ("24G", 24 * 10**9), ("1.5TB", 1.5e12), ("512MiB", 512 * MiB)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "abc", "24XB", "0GB", "24", "-1GB", "3000TB"])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidSetupError):
        parse_size(text)
