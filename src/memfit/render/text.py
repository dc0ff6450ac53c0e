"""Text output for people: the breakdown with a bar, the three counters, the verdict, the assumptions."""

from __future__ import annotations

from ..estimator import Estimate
from ..options import LINEAR_ADAPTER_METHODS, RANKED_METHODS
from ..units import count, gib, human
from ..verdict import Verdict

BAR_WIDTH = 30
_VERDICT_WORDS = {"fits": "FITS", "tight": "TIGHT", "does-not-fit": "DOES NOT FIT"}


def _bar(nbytes: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = round(width * nbytes / total) if total else 0
    return "█" * filled + "·" * (width - filled)


def setup_line(est: Estimate) -> str:
    s = est.setup
    explicit = s.explicit | ({"recipe"} if s.recipe != "hf" else set())

    def mark(field: str, text: str) -> str:
        return text if field in explicit else f"{text}*"
    parts = [mark("method", s.method), mark("batch_size", f"batch {s.batch_size}"),
             mark("seq_len", f"length {s.seq_len}"), mark("precision", est.precision),
             mark("optimizer", s.optimizer), mark("grad_ckpt", "grad-ckpt" if s.grad_ckpt else "no grad-ckpt"),
             mark("attn", f"attn {s.attn}")]
    if s.method in RANKED_METHODS:
        label = "LoRA r" if s.method in ("lora", "qlora") else "r"
        parts.append(mark("lora_rank", f"{label}{s.lora_rank} {','.join(s.lora_targets)}"))
    elif s.method in LINEAR_ADAPTER_METHODS:
        parts.append(mark("lora_targets", ",".join(s.lora_targets)))
    if s.quantized_base:
        parts.append(mark("quant", s.quant))
    if s.grad_accum > 1:
        parts.append(mark("grad_accum", f"grad-accum {s.grad_accum}"))
    if s.train_layers:
        parts.append(mark("train_layers", f"last {s.train_layers} layers"))
    if s.world_size > 1 and s.recipe != "megatron":
        parts.append(mark("shard", f"{s.shard} over {s.world_size} GPUs"))
    if s.recipe == "megatron" or s.cp > 1:       # the model-parallel layout (physics/megatron.py)
        parts.append(f"tp {s.tp} x pp {s.pp} x cp {s.cp} over {s.world_size} GPUs" if s.recipe == "megatron"
                     else f"context parallel {s.cp}")
    if s.activation_offload:
        parts.append("activation offload")
    if getattr(s, "trainer", "sft") != "sft":
        parts.append(f"trainer {s.trainer} (reference {s.ref_model}"
                     + (f", generation {s.generation}" if s.generation else "") + ")")
    parts.append(mark("recipe", f"recipe {s.recipe}"))
    return ", ".join(parts)


def render_estimate(est: Estimate, verdict: Verdict | None = None) -> str:
    lines = []
    lines.append(f"{est.model_name}: {count(est.params)} params, {count(est.trainable_params)} trainable "
                 f"({est.model_source})")
    lines.append(f"setup: {setup_line(est)}")
    lines.append("       (* = the recipe's default; set it with its flag, --no-FLAG turns a switch off)")
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
    elif est.kind == "mlx":
        lines.append(f"  peak            {gib(est.device_bytes):>11}   mx.get_peak_memory() (mlx-lm prints "
                     f"'Peak mem {est.extra.get('mlx_peak_mem_printed', est.device_bytes / 1e9):.3f} GB')")
        lines.append(f"  range           {gib(est.range_low_bytes)} - {gib(est.range_high_bytes)}")
    elif est.kind == "mps":
        lines.append(f"  tensors         {gib(est.peak_allocated_bytes):>11}   torch.mps.current_allocated_memory() "
                     f"at the peak")
        lines.append(f"  driver          {gib(est.device_bytes):>11}   torch.mps.driver_allocated_memory() (Metal heaps "
                     f"+ cache)")
        lines.append(f"  range           {gib(est.range_low_bytes)} - {gib(est.range_high_bytes)}")
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


def render_advice(suggestions, warnings) -> str:
    lines = []
    fitting = [x for x in suggestions if x.fits]
    partial = [x for x in suggestions if not x.fits]
    if suggestions:
        lines += ["", "Changes that fit, best first:" if fitting else "No change found that fits."]
    for sug in fitting:
        lines.append(f"  {sug.change:<52} {gib(sug.device_bytes):>11}  saves {gib(sug.saving_bytes)}")
        lines.append(f"      cost: {sug.cost}")
        lines.append(f"      run:  {sug.command}")
    if partial:
        lines += ["", "Not enough alone (what each saves):"]
        for sug in partial:
            lines.append(f"  {sug.change:<52} {gib(sug.device_bytes):>11}  saves {gib(sug.saving_bytes)}  "
                         f"({_VERDICT_WORDS[sug.status]})")
    if warnings:
        lines += ["", "warnings:"] + [f"  - [{w.code}] {w.message}" for w in warnings]
    return "\n".join(lines)


def render_report(report) -> str:
    """`memfit estimate`'s text: dataset lengths, the estimate, the verdicts and the advice."""
    from ..dataset import render_stats

    r = report
    head = render_stats(r.dataset) + "\n\n" if r.dataset is not None else ""
    tail = ""
    if r.host_verdict is not None:
        h = r.host_verdict
        tail = (f"\nhost RAM: {_VERDICT_WORDS[h.status]}: offload needs {gib(h.needed_bytes)} of "
                f"{gib(h.usable_bytes)} usable (3/4 of {gib(h.ram_bytes)}: the OS, data loading and the framework "
                f"keep the rest)")
    advice = render_advice(r.suggestions, r.warnings)
    return head + render_estimate(r.estimate, r.verdict) + tail + ("\n" + advice if advice else "")


def render_max(result, hardware) -> str:
    what = result.what.replace("_", " ")
    if result.value is None:
        return (f"nothing fits on {hardware.name}: even the smallest step needs "
                f"{gib(result.next_device_bytes or 0)} of {gib(result.usable_bytes)} (its range must fit whole)")
    above = f"; one step up does not fit ({gib(result.next_device_bytes)})" if result.next_device_bytes else ""
    return (f"{what}: {result.value} ({gib(result.device_bytes)} of {gib(result.usable_bytes)} usable on "
            f"{hardware.name}, its whole range within{above})")


def render_plan(spec, hardware, base, recommended, alternatives, stats=None) -> str:
    from ..dataset import render_stats

    lines = [render_stats(stats), ""] if stats else []
    lines.append(f"{spec.name} on {hardware.name} ({gib(hardware.usable_bytes)} usable), length {base.seq_len}")
    if recommended is None:
        lines.append("nothing fits at this length: try a shorter --seq-len or a smaller model (`memfit max`)")
    else:
        lines += [f"recommended: {recommended.method}, {_plan_setup(recommended.setup)}: "
                  f"{gib(recommended.device_bytes)}", f"  {recommended.trade_off}", f"  run: {recommended.command}"]
    for option in alternatives:
        if option.setup is None:
            lines.append(f"alternative {option.method}: {'; '.join(option.notes)}")
        else:
            lines.append(f"alternative {option.method}: {_plan_setup(option.setup)}, {gib(option.device_bytes)} "
                         f"({option.trade_off})")
    return "\n".join(lines)


def _plan_setup(s) -> str:
    return (f"batch {s.batch_size} x accumulation {s.grad_accum}, "
            f"{'gradient checkpointing' if s.grad_ckpt else 'no checkpointing'}, {s.optimizer}")


def render_check(result, written_path=None, written=None) -> str:
    m, s = result.mapped, result.setup
    lines = [f"{result.path}: {result.tool} config for {m.model}",
             f"  read as: {s.method}, batch {s.batch_size} x accumulation {s.grad_accum}, length {s.seq_len}, "
             f"{'gradient checkpointing' if s.grad_ckpt else 'no checkpointing'}, {s.optimizer}, attn {s.attn}"
             + (f", {s.quant} base" if s.method == "qlora" else "")
             + (f", LoRA r{s.lora_rank} {','.join(s.lora_targets)}" if s.method in ("lora", "qlora") else "")
             + (f", {s.shard} over {s.world_size} GPUs" if s.shard != "none" else ""),
             f"  keys used: {', '.join(m.used)}"]
    lines += [f"  assumed: {d}" for d in m.defaults]
    if m.ignored:
        lines.append(f"  ignored (no effect on memory): {', '.join(m.ignored)}")
    est = result.estimate
    counted = "mx.get_peak_memory()" if est.kind == "mlx" else f"{gib(est.peak_allocated_bytes)} allocated"
    if est.kind == "mps":
        counted = f"{gib(est.peak_allocated_bytes)} in torch.mps.current_allocated_memory()"
    lines.append(f"  needs {gib(est.device_bytes)} per GPU (peak at {est.peak_phase}; {counted})")
    if result.verdict:
        lines.append(render_verdict(result.verdict))
    shown = [x for x in result.suggestions if x.unavailable is None and x.edits]
    if shown:
        lines.append("edits, best first:")
    for sug in shown:
        edits = "; ".join(f"`{k}: {_yaml(sug.old.get(k))}` -> `{_yaml(v)}`" for k, v in sug.edits.items())
        mark = "" if sug.fits else f" ({_VERDICT_WORDS[sug.status]})"
        lines.append(f"  {edits}: {gib(sug.device_bytes)}{mark} ({sug.cost})")
    if written:
        lines.append(f"wrote {written_path} with: {written.change}")
    lines += [f"warning [{w.code}]: {w.message}" for w in result.warnings]
    return "\n".join(lines)


def _yaml(value) -> str:
    """A value as the config file spells it (YAML: true/false/null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)
