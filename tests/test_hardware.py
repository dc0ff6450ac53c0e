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


@pytest.mark.parametrize("ram_gib,usable_gib", [(16, 16 * 2 / 3), (24, 16), (32, 32 * 2 / 3), (36, 27), (64, 48), (128, 128 * 0.84)])
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


# ---- hardening: nonsense sizes are errors that say what is allowed ---------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(memory="0.0000001GB"), "smaller than the CUDA context alone"),
    (dict(memory=100), "smaller than the CUDA context alone"),
    (dict(memory="400MiB"), "smaller than the CUDA context alone"),
    (dict(memory=True), "must be a size"),
    (dict(memory=3 * 2**40), "larger than any single device"),
    (dict(memory="1e400GB"), "not a size"),
    (dict(memory="9" * 400 + "GB"), "not a size"),
    (dict(memory="9" * 90 + "GB"), "larger than any single device"),
    (dict(mac="1GB"), "smaller than any Apple-silicon Mac"),
    (dict(mac="1000000"), "has no unit"),
    (dict(mac="36"), "has no unit"),
    (dict(mac="36GB", mac_wired_limit="100MB"), "--mac-wired-limit .* smaller than 1 GiB"),
    (dict(mac="36GB", mac_wired_limit="37GB"), r"--mac-wired-limit \(37 GiB\) is larger than the Mac's RAM \(36 GiB\)"),
])
def test_nonsense_hardware_sizes(kwargs, match):
    with pytest.raises(InvalidSetupError, match=match) as info:
        load_hardware(**kwargs)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_smallest_real_sizes_still_work():
    assert load_hardware(memory="512MiB").usable_bytes == 512 * MiB      # just above the CUDA context
    assert load_hardware(mac="8GB").capacity_bytes == 8 * GiB
    assert load_hardware(memory="24GB").usable_bytes == 24 * 10**9       # unchanged: GB is 1e9
    assert load_hardware(memory="24GiB").usable_bytes == 24 * GiB
    assert load_hardware(memory=str(24 * GiB)).usable_bytes == 24 * GiB  # a bare byte count of a real card


def test_mac_and_wired_limit_read_with_the_same_convention():
    hw = load_hardware(mac="36GB", mac_wired_limit="36GB")
    assert hw.capacity_bytes == hw.usable_bytes == 36 * GiB
    assert load_hardware(mac="36GB", mac_wired_limit="30GB").usable_bytes == 30 * GiB


def test_host_ram_has_its_own_larger_bound():
    from memfit.units import parse_host_ram

    assert parse_size("4TB", "--host-ram") == 4 * 10**12          # a 4 TB host is real
    assert parse_host_ram("32TiB") == 32 * 2**40
    with pytest.raises(InvalidSetupError, match="larger than any single device"):
        parse_size("4TB", "--memory")
    with pytest.raises(InvalidSetupError, match="larger than any machine's RAM"):
        parse_size("100TiB", "--host-ram")


def test_cli_host_ram_4tb_is_accepted(capsys):
    from memfit.cli import main

    assert main(["estimate", "llama-3.2-1b", "--method", "full", "--gpus", "2", "--shard", "zero3",
                 "--offload", "optimizer", "--host-ram", "4TB", "--format", "json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["host_verdict"]["ram_bytes"] == 4 * 10**12


def test_long_gpu_names_are_shortened():
    with pytest.raises(UnknownHardwareError) as info:
        load_hardware(gpu="rtx\x1b[31m" + "x" * 5000)
    assert "\x1b" not in str(info.value) and len(str(info.value)) < 300


def test_detected_nonsense_is_ignored():
    from memfit.detect import detect_hardware

    def run(argv):
        return {"nvidia-smi": "Bad GPU, inf\nZero GPU, 0\nOdd GPU, [N/A]\nNVIDIA GeForce RTX 4090, 24564\n",
                "sysctl": None}[argv[0]]

    hw = detect_hardware(run=run, platform="linux", torch_probe=False)
    assert hw.usable_bytes == 24564 * MiB and hw.slug == "rtx-4090"

    def mac(argv):
        return {"hw.memsize": "38654705664", "iogpu.wired_limit_mb": "999999999",
                "machdep.cpu.brand_string": "Apple M3 Pro"}.get(argv[-1]) if argv[0] == "sysctl" else None

    hw = detect_hardware(run=mac, platform="darwin", torch_probe=False)
    assert hw.usable_bytes == mac_usable_bytes(36 * GiB)     # a wired limit above the RAM is not used
