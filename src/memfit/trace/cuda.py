"""`memfit trace --device cuda`: the same training steps on a real GPU with random weights (nothing downloaded).

Reports torch.cuda.max_memory_allocated, max_memory_reserved and the device memory in use (mem_get_info), over
the measured steps after a warm-up step, so lazily created state (optimizer, cuBLAS handles) is included the
way a long run sees it. QLoRA uses real bitsandbytes Linear4bit layers (bitsandbytes must be installed).
"""

from __future__ import annotations

import time

from ..errors import InvalidSetupError, MissingExtraError
from ..estimator import Component, Estimate
from ..params import count_params
from ..physics import states
from ..physics.stack import resolve_stack
from ..setup import TrainingSetup
from ..spec import ModelSpec


def trace_cuda(spec: ModelSpec, setup: TrainingSetup, steps: int = 2) -> Estimate:
    import torch

    if not torch.cuda.is_available():
        raise InvalidSetupError("--device cuda needs a CUDA GPU and a CUDA build of torch; none is available here "
                                "(use the default fake-tensor trace, which needs no GPU)")
    from .build import build, storage_on
    from .step import make_inputs, train_step
    from .tracker import PeakTracker

    stack = resolve_stack(spec, setup)
    built = build(spec, setup, stack)
    model = built.model
    storage_on(model, "cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    if setup.quantized_base:
        _quantize_4bit(model, built, setup)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = _cuda_optimizer(trainable, setup, model)
    inputs = {k: v.cuda() for k, v in make_inputs(spec, setup).items()}
    names = PeakTracker()                       # only names phases here; CUDA counts the bytes
    start = time.perf_counter()
    micro = min(setup.grad_accum, 2)
    train_step(model, optimizer, inputs, stack, micro, names)          # warm-up: state, handles, workspaces
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        train_step(model, optimizer, inputs, stack, micro, names)
    torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    free, total = torch.cuda.mem_get_info()
    device = total - free
    components = (Component("measured allocated", allocated, "allocated", "torch.cuda.max_memory_allocated"),
                  Component("allocator slack", reserved - allocated, "reserved", "max_memory_reserved - allocated"),
                  Component("CUDA context and other", max(device - reserved, 0), "device",
                            "mem_get_info in use - reserved (context, kernels, other processes)"))
    return Estimate(
        model_name=spec.name, params=spec.params, trainable_params=states.trainable_params(spec, stack),
        model_source=spec.source, setup=setup, precision=stack.precision, components=components,
        peak_phase="measured over the steps after a warm-up step", phases=(("measured", allocated),),
        peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, device_bytes=max(device, reserved),
        range_low_bytes=allocated, range_high_bytes=max(device, reserved), paged_bytes=0,
        download_bytes=count_params(spec).total * 2, assumptions=tuple(built.notes), kind="cuda",
        extra={"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "wall_s": round(time.perf_counter() - start, 2)},
    )


def _cuda_optimizer(params, setup: TrainingSetup, model=None):
    from .step import make_optimizer

    from ..options import BNB_OPTIMIZERS
    from ..physics.optimizers import OPTIMIZER_FACTS
    from .optimizers import make

    if setup.optimizer in OPTIMIZER_FACTS:       # the real package on the GPU, bitsandbytes' 8-bit ones included
        return make(setup.optimizer, model, setup)
    if setup.optimizer not in BNB_OPTIMIZERS:
        return make_optimizer(params, setup)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise MissingExtraError(f"--optimizer {setup.optimizer} on a GPU needs bitsandbytes: pip install bitsandbytes")
    cls = {"adamw-bnb": bnb.optim.AdamW, "adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw": bnb.optim.PagedAdamW,
           "paged-adamw-8bit": bnb.optim.PagedAdamW8bit}[setup.optimizer]
    return cls(params, lr=1e-5)


def _quantize_4bit(model, built, setup: TrainingSetup) -> None:
    """Swap each decoder linear for a bitsandbytes Linear4bit holding the same (random) weights."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise MissingExtraError("QLoRA on a GPU needs bitsandbytes: pip install bitsandbytes") from None
    import torch

    targets = {id(m) for m in built.quantized}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) not in targets:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=torch.bfloat16, compress_statistics=setup.quant == "nf4-dq",
                                  quant_type="fp4" if setup.quant == "fp4" else "nf4")
            q.weight = bnb.nn.Params4bit(child.weight.data.to("cpu"), requires_grad=False,
                                         quant_type=q.weight.quant_type, compress_statistics=setup.quant == "nf4-dq")
            if child.bias is not None:
                q.bias = child.bias
            setattr(parent, name, q.cuda())
    torch.cuda.empty_cache()
