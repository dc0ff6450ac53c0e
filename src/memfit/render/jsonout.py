"""JSON output (schema_version 2). Documented in README "JSON output"; every size is an int of bytes."""

from __future__ import annotations

import json

from ..estimator import SCHEMA_VERSION, Estimate
from ..options import SETUP_FIELDS
from ..verdict import Verdict


def setup_dict(setup) -> dict:
    """Every setup option as resolved, and which of them the user set (the rest are the recipe's)."""
    out = {name: getattr(setup, name) for name in SETUP_FIELDS}
    out["lora_targets"] = list(setup.lora_targets)
    out["explicit"] = sorted(setup.explicit)
    return out


def report_dict(report) -> dict:
    """The whole answer to a request: what `memfit estimate --format json`, POST /api/estimate and
    memfit.to_json(report) all print, byte for byte."""
    r = report
    out = estimate_dict(r.estimate, r.verdict)
    out["warnings"] = [{"code": w.code, "message": w.message} for w in r.warnings]
    if r.verdict is not None:
        out["suggestions"] = [suggestion_dict(s) for s in r.suggestions]
    if r.dataset is not None:
        out["dataset"] = r.dataset.as_dict()
    if r.host_verdict is not None:
        h = r.host_verdict
        out["host_verdict"] = {"status": h.status, "needed_bytes": h.needed_bytes, "ram_bytes": h.ram_bytes,
                               "usable_bytes": h.usable_bytes, "margin_bytes": h.margin_bytes}
    return out


def suggestion_dict(s) -> dict:
    changes = {k: list(v) if isinstance(v, tuple) else v for k, v in s.changes.items()}
    return {"change": s.change, "changes": changes, "command": s.command, "device_bytes": s.device_bytes,
            "saving_bytes": s.saving_bytes, "cost": s.cost, "status": s.status, "fits": s.fits}


def estimate_dict(est: Estimate, verdict: Verdict | None = None, extra: dict | None = None) -> dict:
    setup = setup_dict(est.setup)
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
    if est.kind == "mlx":
        # One counter on Apple silicon: mx.get_peak_memory(). No CUDA counters are claimed.
        del out["peak_allocated_bytes"], out["peak_reserved_bytes"]
        out["mlx_peak_bytes"] = est.extra["mlx_peak_bytes"]
    if est.kind == "mps":
        # PyTorch on MPS: torch.mps.current_allocated_memory() and driver_allocated_memory(), no CUDA counters.
        del out["peak_allocated_bytes"], out["peak_reserved_bytes"]
        out["mps_current_allocated_bytes"] = est.extra["mps_current_allocated_bytes"]
        out["mps_driver_allocated_bytes"] = est.extra["mps_driver_allocated_bytes"]
    if "expected_error" in est.extra:
        out["expected_error"] = est.extra["expected_error"]
    if "load" in est.extra:
        from .load import load_dict

        out["load"] = load_dict(est)
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


def check_dict(result, written_path=None, written=None) -> dict:
    m = result.mapped
    return {"schema_version": SCHEMA_VERSION, "tool": result.tool, "model": m.model,
            "setup": setup_dict(result.setup), "used_keys": m.used, "defaults_assumed": m.defaults,
            "ignored_keys": m.ignored, "estimate": estimate_dict(result.estimate, result.verdict),
            "verdict": verdict_dict(result.verdict) if result.verdict else None,
            "suggestions": [s.as_dict() for s in result.suggestions],
            "warnings": [{"code": w.code, "message": w.message} for w in result.warnings],
            "dataset": result.dataset.as_dict() if result.dataset else None,
            "written": {"path": written_path, "change": written.change} if written else None}
