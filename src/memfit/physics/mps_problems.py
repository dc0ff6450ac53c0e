"""What the mps recipe (transformers + PEFT on PyTorch's MPS backend) cannot run, one Problem each."""

from __future__ import annotations

from ..errors import Problem
from ..options import BNB_OPTIMIZERS, MLX_QUANTS

# bitsandbytes optimizers outside BNB_OPTIMIZERS (physics/optimizers.py: GaLore's AdamW8bit and Lion8bit are
# bitsandbytes Optimizer2State / Optimizer1State).
_BNB_BACKED = BNB_OPTIMIZERS + ("galore-8bit", "q-galore", "lion-8bit")


def mps_problems(setup) -> list[Problem]:
    p = []
    if setup.quantized_base and setup.quant not in MLX_QUANTS:
        # bitsandbytes-foundation/bitsandbytes#1983 (merged 2026-07-01): 4-bit and LLM.int8() on MPS run through
        # Hub kernels or slower PyTorch fallbacks, torch >= 2.9; GPTQ/AWQ kernels are CUDA's. None is modelled.
        p.append(Problem("method", f"{{method}} {setup.method} with {{quant}} {setup.quant} is not modelled on MPS "
                                   "(bitsandbytes' MPS path, bitsandbytes#1983, is recent and runs fallback ops); "
                                   "use {method} lora, or {recipe} mlx for 4-bit QLoRA on a Mac"))
    if setup.optimizer in _BNB_BACKED:
        p.append(Problem("optimizer", f"{{optimizer}} {setup.optimizer} is a bitsandbytes optimizer: bitsandbytes "
                                      "has no MPS optimizer kernels (bitsandbytes#1983 left them to a later PR); use "
                                      "adamw-fused, adamw or adafactor"))
    if setup.world_size > 1 or setup.shard != "none":
        p.append(Problem("gpus", "a Mac has one MPS device: {gpus}, {nodes} and {shard} do not apply to {recipe} mps"))
    if setup.attn == "flash":
        p.append(Problem("attn", "{attn} flash (flash-attn) is CUDA only: use sdpa or eager on MPS"))
    if setup.precision == "fp8" and setup.method == "full":   # other methods: setup.py's fp8 line
        p.append(Problem("precision", "{precision} fp8 training (torchao float8) needs CUDA float8 matmuls: MPS has "
                                      "none; use bf16 or fp16"))
    if setup.chunked_ce and setup.loss in ("liger", "unsloth"):
        p.append(Problem("chunked_ce", f"{{chunked_ce}} picks {setup.loss}'s fused loss, a Triton kernel (CUDA "
                                       "only): use {loss} chunked on MPS"))
    return p
