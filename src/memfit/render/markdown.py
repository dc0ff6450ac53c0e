"""Markdown output of a report (`memfit estimate --format markdown`): for issues, notebooks and PR comments."""

from __future__ import annotations

from ..units import count, gib

_WORDS = {"fits": "FITS", "tight": "TIGHT", "does-not-fit": "DOES NOT FIT"}


def render_report_markdown(report) -> str:
    r, est = report, report.estimate
    lines = [f"### {est.model_name}: {count(est.params)} params, {count(est.trainable_params)} trainable", ""]
    if r.verdict is not None:
        v = r.verdict
        lines += [f"**{_WORDS[v.status]}** on {v.hardware.name}: needs {gib(v.needed_bytes)} of "
                  f"{gib(v.usable_bytes)} usable", ""]
    lines += [f"Peak at **{est.peak_phase}**.", "", "| component | GiB | counter |", "|---|---:|---|"]
    lines += [f"| {c.name} | {c.bytes / 2**30:.2f} | {c.counter} |" for c in est.components]
    if est.kind == "mlx":
        lines += ["", f"- peak: {gib(est.device_bytes)} (`mx.get_peak_memory()`)"]
    else:
        lines += ["", f"- peak allocated: {gib(est.peak_allocated_bytes)} (`torch.cuda.max_memory_allocated`)",
                  f"- peak reserved: {gib(est.peak_reserved_bytes)} (`torch.cuda.max_memory_reserved`)",
                  f"- device: {gib(est.device_bytes)} (nvidia-smi)"]
    lines.append(f"- range: {gib(est.range_low_bytes)} to {gib(est.range_high_bytes)}")
    fitting = [s for s in r.suggestions if s.fits]
    if fitting:
        lines += ["", "#### Changes that fit", ""]
        lines += [f"1. **{s.change}**: {gib(s.device_bytes)} ({s.cost})  \n   `{s.command}`" for s in fitting]
    if r.warnings:
        lines += ["", "#### Warnings", ""] + [f"- `{w.code}`: {w.message}" for w in r.warnings]
    lines += ["", "#### Assumptions", ""] + [f"- {a}" for a in est.assumptions]
    return "\n".join(lines)
