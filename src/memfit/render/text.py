"""Text output for people: the breakdown with a bar, the three counters, the verdict, the assumptions."""

from __future__ import annotations

from ..estimator import Estimate
from ..units import count, gib, human
from ..verdict import Verdict

BAR_WIDTH = 30
_VERDICT_WORDS = {"fits": "FITS", "tight": "TIGHT", "does-not-fit": "DOES NOT FIT"}


def _bar(nbytes: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = round(width * nbytes / total) if total else 0
    return "█" * filled + "·" * (width - filled)


def setup_line(est: Estimate, explicit: frozenset[str] = frozenset()) -> str:
    s = est.setup
    def mark(field: str, text: str) -> str:
        return text if field in explicit or not explicit else f"{text}*"
    parts = [mark("method", s.method), mark("batch_size", f"batch {s.batch_size}"),
             mark("seq_len", f"length {s.seq_len}"), mark("precision", est.precision),
             mark("optimizer", s.optimizer), mark("grad_ckpt", "grad-ckpt" if s.grad_ckpt else "no grad-ckpt"),
             mark("attn", f"attn {s.attn}")]
    if s.method != "full":
        parts.append(mark("lora_rank", f"LoRA r{s.lora_rank} {','.join(s.lora_targets)}"))
    if s.method == "qlora":
        parts.append(mark("quant", s.quant))
    if s.grad_accum > 1:
        parts.append(f"grad-accum {s.grad_accum}")
    parts.append(mark("recipe", f"recipe {s.recipe}"))
    return ", ".join(parts)


def render_estimate(est: Estimate, verdict: Verdict | None = None, explicit: frozenset[str] = frozenset()) -> str:
    lines = []
    lines.append(f"{est.model_name}: {count(est.params)} params, {count(est.trainable_params)} trainable "
                 f"({est.model_source})")
    lines.append(f"setup: {setup_line(est, explicit)}")
    if explicit:
        lines.append("       (* = default of the recipe; change it with its flag)")
    if est.kind == "rule-of-thumb":
        lines.append("RULE OF THUMB ONLY: no architecture known; name a model for an architecture-aware estimate")
    if est.kind == "trace":
        lines.append(f"TRACED: {est.extra.get('traced')} in {est.extra.get('wall_s')} s")
        for line in est.extra.get("accounted", []):
            lines.append(f"  accounted, not traced: {line}")
    if est.kind == "cuda":
        lines.append(f"MEASURED on {est.extra.get('gpu')} (torch {est.extra.get('torch')}), random weights")
    lines.append("")
    total = est.device_bytes
    width = max(len(c.name) for c in est.components)
    lines.append(f"memory at the peak ({est.peak_phase}):")
    for c in est.components:
        lines.append(f"  {c.name:<{width}}  {gib(c.bytes):>11}  {_bar(c.bytes, total)}")
    lines.append("")
    if est.kind == "rule-of-thumb":
        lines.append(f"  total                 {gib(est.device_bytes):>11}  ({est.device_bytes / 1e9:.1f} GB)")
    else:
        lines.append(f"  peak allocated  {gib(est.peak_allocated_bytes):>11}   torch.cuda.max_memory_allocated")
        lines.append(f"  peak reserved   {gib(est.peak_reserved_bytes):>11}   torch.cuda.max_memory_reserved")
        lines.append(f"  device          {gib(est.device_bytes):>11}   nvidia-smi (reserved + CUDA context)")
        lines.append(f"  range           {gib(est.range_low_bytes)} - {gib(est.range_high_bytes)}")
    if est.host_bytes:
        lines.append(f"  host RAM        {gib(est.host_bytes):>11}   moved to the CPU by offload (per node)")
    if est.paged_bytes:
        lines.append(f"  paged optimizer state  {human(est.paged_bytes)} in CUDA managed memory (outside these)")
    if verdict is not None:
        lines.append("")
        lines.append(render_verdict(verdict))
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in est.assumptions]
    return "\n".join(lines)


def render_verdict(v: Verdict) -> str:
    hw = v.hardware
    head = f"{_VERDICT_WORDS[v.status]} on {hw.name}: needs {gib(v.needed_bytes)} of {gib(v.usable_bytes)} usable"
    if v.status == "does-not-fit":
        tail = f" (short by {gib(-v.margin_bytes)})"
    elif v.status == "tight":
        tail = (f" ({gib(v.margin_bytes)} spare, but the high end of the range is over by "
                f"{gib(-v.high_margin_bytes)})")
    else:
        tail = f" ({gib(v.margin_bytes)} spare)"
    lines = [head + tail, f"  usable memory: {hw.source}"]
    lines += [f"  note: {n}" for n in hw.notes]
    return "\n".join(lines)


def render_compare(rows: list[dict]) -> str:
    lines = ["estimate vs trace:", f"  {'component':<20} {'estimate':>11} {'trace':>11} {'ratio':>7}"]
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        lines.append(f"  {r['component']:<20} {gib(r['estimate_bytes']):>11} {gib(r['trace_bytes']):>11} {ratio:>7}")
    return "\n".join(lines)


def render_advice(verdict, suggestions, warnings) -> str:
    lines = []
    if suggestions:
        head = "Changes that fit, best first:" if any(x.fits for x in suggestions) else \
            "No change found that fits; closest first:"
        lines += ["", head]
        for sug in suggestions:
            mark = "" if sug.fits else "  (still does not fit)"
            lines.append(f"  {sug.change:<44} {gib(sug.device_bytes):>11}  saves {gib(sug.saving_bytes)}{mark}")
            lines.append(f"      cost: {sug.cost}")
            lines.append(f"      run:  {sug.command}")
    if warnings:
        lines += ["", "warnings:"] + [f"  - [{w['code']}] {w['message']}" for w in warnings]
    return "\n".join(lines)
