"""JSON output (schema_version 1). Documented in README "JSON output"; every size is an int of bytes."""

from __future__ import annotations

import dataclasses
import json

from ..estimator import SCHEMA_VERSION, Estimate
from ..verdict import Verdict


def estimate_dict(est: Estimate, verdict: Verdict | None = None, extra: dict | None = None) -> dict:
    setup = dataclasses.asdict(est.setup)
    setup["lora_targets"] = list(est.setup.lora_targets)
    setup["precision_resolved"] = est.precision
    out = {
        "schema_version": SCHEMA_VERSION,
        "kind": est.kind,
        "model": {"name": est.model_name, "params": est.params, "trainable_params": est.trainable_params,
                  "source": est.model_source},
        "setup": setup,
        "components": [{"name": c.name, "bytes": c.bytes, "counter": c.counter, "note": c.note}
                       for c in est.components],
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "device_bytes": est.device_bytes,
        "range": {"low": est.range_low_bytes, "high": est.range_high_bytes},
        "peak_phase": est.peak_phase,
        "phases": [{"name": name, "allocated_bytes": nbytes} for name, nbytes in est.phases],
        "paged_bytes": est.paged_bytes,
        "host_bytes": est.host_bytes,
        "download_bytes": est.download_bytes,
        "assumptions": list(est.assumptions),
    }
    if "expected_error" in est.extra:
        out["expected_error"] = est.extra["expected_error"]
    if verdict is not None:
        out["verdict"] = verdict_dict(verdict)
    if extra:
        out.update(extra)
    return out


def verdict_dict(v: Verdict) -> dict:
    hw = v.hardware
    return {"status": v.status, "fits": v.fits, "usable_bytes": v.usable_bytes, "margin_bytes": v.margin_bytes,
            "high_margin_bytes": v.high_margin_bytes,
            "hardware": {"name": hw.name, "slug": hw.slug, "kind": hw.kind, "capacity_bytes": hw.capacity_bytes,
                         "source": hw.source, "notes": list(hw.notes)}}


def dumps(data) -> str:
    return json.dumps(data, indent=2)
