"""`memfit plot`: the breakdown against the usable-memory line, memory against max length and batch size for
full, LoRA and QLoRA with the point where each stops fitting, and estimate vs trace. PNG or SVG (matplotlib,
the [plot] extra)."""

from __future__ import annotations

from ..errors import MissingExtraError
from ..estimator import Estimate, estimate
from ..hardware import Hardware
from ..setup import TrainingSetup
from ..spec import ModelSpec

from ..report import CURVE_LENGTHS as LENGTHS  # noqa: E402
from ..units import GiB  # noqa: E402
BATCHES = (1, 2, 4, 8, 16, 32)


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError('memfit plot needs matplotlib: pip install "memfit[plot]"') from None
    return plt


def _methods(setup: TrainingSetup) -> dict[str, TrainingSetup]:
    from ..report import method_setups

    return method_setups(setup)


def plot(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware | None, path: str,
         traced: Estimate | None = None) -> None:
    plt = _plt()
    est = estimate(spec, setup)
    panels = 4 if traced is not None else 3
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6))
    usable = hardware.usable_bytes / GiB if hardware else None

    ax = axes[0]
    bottom = 0.0
    for comp in est.components:
        ax.bar([0], [comp.bytes / GiB], bottom=bottom, label=f"{comp.name} ({comp.bytes / GiB:.2f})")
        bottom += comp.bytes / GiB
    if usable:
        ax.axhline(usable, color="#b3261e", linestyle="--", label=f"usable {usable:.1f} GiB")
    ax.set_xticks([0], [f"{setup.method}, b{setup.batch_size}, s{setup.seq_len}"])
    ax.set_xlim(-0.5, 2.2)          # room on the right for the legend
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(f"{spec.name}: breakdown")
    ax.legend(fontsize=7, loc="upper right")

    for ax, field, values, label in ((axes[1], "seq_len", LENGTHS, "max length (tokens)"),
                                     (axes[2], "batch_size", BATCHES, "micro-batch size")):
        for method, base in _methods(setup).items():
            ys = [estimate(spec, base.replace(**{field: v})).device_bytes / GiB for v in values]
            line, = ax.plot(values, ys, marker="o", label=method)
            if usable:
                fitting = [v for v, y in zip(values, ys) if y <= usable]
                if fitting and fitting[-1] != values[-1]:
                    ax.axvline(fitting[-1], color=line.get_color(), linestyle=":", alpha=0.8)
        if usable:
            ax.axhline(usable, color="#b3261e", linestyle="--", label="usable")
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values], fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("device memory (GiB)")
        ax.set_title(f"memory vs {label.split(' (')[0]}")
        ax.legend(fontsize=8)

    if traced is not None:
        from ..trace.measure import COUNTER_ROWS, compare

        rows = [r for r in compare(est, traced) if r["component"] not in COUNTER_ROWS]
        ax = axes[3]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["estimate_bytes"] / GiB for r in rows], width=0.4, label="estimate")
        ax.bar([x + 0.2 for x in xs], [r["trace_bytes"] / GiB for r in rows], width=0.4, label="trace")
        ax.set_xticks(list(xs), [r["component"] for r in rows], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("GiB at the peak")
        ax.set_title("estimate vs trace")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
