"""Turn a traced run into an Estimate (kind "trace"), and compare one with the analytic estimate."""

from __future__ import annotations

import contextlib
import resource
import time
import warnings

from ..components import TRACE_GROUPS
from ..errors import InvalidSetupError, SourceError
from ..estimator import Component, Estimate
from ..params import count_params
from ..physics import states
from ..physics.overhead import CUBLAS_WORKSPACE_BYTES, overheads
from ..physics.stack import resolve_stack
from ..setup import TrainingSetup
from ..spec import ModelSpec

# How the estimate's components group into what a trace can tell apart (components.py).
GROUPS = TRACE_GROUPS
DEVIATIONS = (
    "traced on fake CPU tensors: optimizer implementation passed explicitly (foreach/fused) as CUDA picks it",
    "dropout keeps a bool mask as CUDA's native_dropout does (the CPU kernel would keep fp32 noise)",
    "allocations rounded up to 512 B as the CUDA caching allocator does",
    "cuBLAS workspace, allocator slack and CUDA context are not traceable on a CPU: added as the estimate adds them",
)


def trace_fake(spec: ModelSpec, setup: TrainingSetup, steps: int = 2, progress: bool = False) -> Estimate:
    from .build import build
    from .step import run_steps
    from .tracker import PeakTracker

    if spec.is_rule_of_thumb:
        raise InvalidSetupError("a bare size has no architecture to trace; name a model or a config.json")
    if setup.shard != "none":
        raise InvalidSetupError("memfit trace runs one GPU's step without sharding; the multi-GPU layouts are "
                                "estimated (FSDP2 is cross-checked against PyTorch's FSDPMemTracker in the tests)")
    if setup.compile:
        raise InvalidSetupError("memfit trace runs the eager step; a torch.compile step is estimated only "
                                "(physics/compile.py): drop --compile to trace")
    if steps < 2:
        raise InvalidSetupError("a trace needs at least 2 steps (the first allocates the optimizer state)")
    stack = resolve_stack(spec, setup)
    start = time.perf_counter()
    tracker = PeakTracker()
    try:
        with _quiet():
            built = build(spec, setup, stack)
            info = run_steps(spec, setup, stack, built, tracker, steps=steps, progress=progress)
    except (SourceError, InvalidSetupError):
        raise
    except Exception as exc:  # data-dependent ops, unsupported kernels: say what and what to use instead
        raise SourceError(f"cannot trace {spec.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}; "
                          f"`memfit estimate` gives the analytic estimate") from None
    wall = time.perf_counter() - start
    components, allocated, over = traced_components(tracker)
    reserved = allocated + over.reserved_slack
    _, paged, _ = states.optimizer_state_bytes(spec, setup, stack)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=states.trainable_params(spec, stack),
        model_source=spec.source, setup=setup, precision=stack.precision, components=tuple(components),
        peak_phase=tracker.peak_where, phases=((tracker.peak_where, allocated),), peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved, device_bytes=reserved + over.cuda_context, range_low_bytes=allocated,
        range_high_bytes=over.range_high, paged_bytes=paged, download_bytes=count_params(spec).total * 2,
        assumptions=tuple(built.notes) + DEVIATIONS, kind="trace",
        extra={"traced": "model forward, loss, backward and optimizer steps (transformers"
                         + (" + peft" if setup.method != "full" else "") + f"), {steps} steps",
               "accounted": info["accounted"], "wall_s": round(wall, 2), "peak_rss_bytes": peak_rss},
    )


def traced_components(tracker) -> tuple[list[Component], int, object]:
    """The tracker's peak as components (the batch's inputs count with the weights), plus what a CPU cannot run
    and the estimate adds the same way (cuBLAS workspace, allocator slack, CUDA context)."""
    totals = {k: v for k, v in tracker.peak_totals.items() if k != "inputs"}
    totals["weights"] += tracker.peak_totals.get("inputs", 0)
    components = [Component(name, nbytes, "allocated", "traced") for name, nbytes in totals.items() if nbytes]
    components.append(Component("cuBLAS workspace", CUBLAS_WORKSPACE_BYTES, "allocated", "accounted"))
    allocated = sum(c.bytes for c in components)
    over = overheads(allocated)
    components += [Component("allocator slack", over.reserved_slack, "reserved", "accounted"),
                   Component("CUDA context", over.cuda_context, "device", "accounted")]
    return components, allocated, over


@contextlib.contextmanager
def _quiet():
    """transformers' and torch's advice about hooks and deprecations is noise for a user of the trace."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)


COUNTER_ROWS = ("peak allocated", "peak reserved", "device")


def compare(estimate: Estimate, measured: Estimate) -> list[dict]:
    """Per group and in total: estimate, trace, ratio (estimate / trace)."""
    rows = []
    for group, names in GROUPS.items():
        est = sum(c.bytes for c in estimate.components if c.name in names)
        got = sum(c.bytes for c in measured.components if c.name in (group,) + names)
        if est or got:
            rows.append({"component": group, "estimate_bytes": est, "trace_bytes": got,
                         "ratio": round(est / got, 4) if got else None})
    for counter, attr in (("peak allocated", "peak_allocated_bytes"), ("peak reserved", "peak_reserved_bytes"),
                          ("device", "device_bytes")):
        est, got = getattr(estimate, attr), getattr(measured, attr)
        rows.append({"component": counter, "estimate_bytes": est, "trace_bytes": got,
                     "ratio": round(est / got, 4) if got else None})
    return rows
