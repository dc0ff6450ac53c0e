"""The seed's rule of thumb: its table and its worked verdicts."""

import pytest

from memfit import TrainingSetup, estimate, load_hardware, load_model, verdict
from memfit.cli import main

GB = 10**9
TABLE = {  # size: (LoRA GB, full GB), from the seed
    0.5: (4, 10), 1.5: (6, 22), 3: (9, 40), 7: (17, 88), 14: (31, 172),
}


@pytest.mark.parametrize("size", sorted(TABLE))
def test_rule_table(size):
    spec = load_model(f"{size:g}B")
    lora = estimate(spec, TrainingSetup(method="lora"))
    full = estimate(spec, TrainingSetup(method="full"))
    assert lora.kind == "rule-of-thumb"
    assert lora.device_bytes == TABLE[size][0] * GB
    assert full.device_bytes == TABLE[size][1] * GB


def test_master_copy_and_qlora():
    spec = load_model("7B")
    assert estimate(spec, TrainingSetup(method="full", precision="bf16-mixed")).device_bytes == 116 * GB
    assert estimate(load_model("8B"), TrainingSetup(method="qlora")).device_bytes == pytest.approx(8.6 * GB)
    # the seed's "27-32B about 22-26 GB"
    assert estimate(load_model("27B"), TrainingSetup(method="qlora")).device_bytes == pytest.approx(21.9 * GB)
    assert estimate(load_model("32B"), TrainingSetup(method="qlora")).device_bytes == pytest.approx(25.4 * GB)


def _status(size, method, **hw):
    return verdict(estimate(load_model(size), TrainingSetup(method=method)), load_hardware(**hw)).status


def test_worked_verdicts_36gb_mac():
    mac = load_hardware(mac="36GB")
    assert mac.usable_bytes == 27 * 2**30          # about 27 GB usable (3/4 of 36 GiB)
    assert _status("1.5B", "lora", mac="36GB") == "fits"
    assert _status("1.5B", "full", mac="36GB") == "fits"
    assert _status("7B", "lora", mac="36GB") == "fits"
    assert _status("14B", "lora", mac="36GB") == "does-not-fit"
    assert _status("3B", "full", mac="36GB") == "does-not-fit"
    assert _status("27B", "qlora", mac="36GB") == "fits"


def test_worked_verdicts_16gb_card():
    assert _status("8B", "lora", memory="16GB") == "does-not-fit"
    assert _status("8B", "qlora", memory="16GB") == "fits"


def test_rule_command_prints_the_table(capsys):
    assert main(["rule", "--format", "json"]) == 0
    import json

    rows = {r["params_b"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert [rows[s]["lora_gb"] for s in (0.5, 1.5, 3, 7, 14)] == [4, 6, 9, 17, 31]
    assert [rows[s]["full_gb"] for s in (0.5, 1.5, 3, 7, 14)] == [10, 22, 40, 88, 172]
