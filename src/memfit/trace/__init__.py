"""memfit trace: measure a real training step of the real model on fake tensors (needs the [trace] extra).

    from memfit.trace import trace
    measured = trace(spec, setup)      # an Estimate with kind="trace": same components, same counters

No GPU, no weights, no memory: the model is built from its config on the meta device, materialized as fake
CPU tensors, and run for real training steps under a tracker that counts every live storage.
"""

from __future__ import annotations

from ..errors import MissingExtraError

INSTALL_HINT = 'pip install "memfit[trace]"  (torch, transformers, peft)'


def require_trace_extra() -> None:
    missing = []
    for module in ("torch", "transformers", "peft"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MissingExtraError(f"memfit trace needs {', '.join(missing)}: {INSTALL_HINT}")


def trace(spec, setup, steps: int = 2, progress: bool = False):
    """Trace `steps` optimizer steps and return the peak as an Estimate (kind='trace')."""
    require_trace_extra()
    from ..options import LITGPT_METHODS

    if setup.method in LITGPT_METHODS and setup.recipe.startswith("litgpt"):
        from ..errors import SourceError

        raise SourceError(f"method {setup.method} under recipe {setup.recipe} is LitGPT's own model, which the trace "
                          "(transformers + PEFT) does not build; `memfit estimate` gives the analytic estimate")
    if getattr(setup, "trainer", "sft") != "sft":
        from .trainers import trace_trainer     # TRL's own preference losses (needs trl)

        return trace_trainer(spec, setup, steps=steps, progress=progress)
    from .measure import trace_fake

    return trace_fake(spec, setup, steps=steps, progress=progress)


__all__ = ["INSTALL_HINT", "require_trace_extra", "trace"]
