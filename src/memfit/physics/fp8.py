"""`--precision fp8`: float8 matmuls in training (torchao convert_to_float8_training, as torchtitan and
torchtune's full_finetune_distributed use it; Transformer Engine's fp8_autocast keeps the same copies).

What does not shrink (torchao 0.18.0 torchao/float8/float8_linear.py):
- the weights: Float8Linear keeps its high-precision `weight` and casts it per matmul (forward :255-268);
  gradients and optimizer state follow the weights (pytorch/ao#1102: "FP8 training keeps high-precision weight
  copy, thus there will be no memory saving");
- the saved activations: matmul_with_hp_or_float8_args saves `input_hp` and `weight_hp_t` (:45), the
  high-precision input a bf16 nn.Linear saves too (pytorch/ao#2262: "the weights and activations stay in bf16").
What shrinks: with FSDP2 and `enable_fsdp_float8_all_gather` (config.py:225) the linear weights are all-gathered
as float8, 1 B per element instead of 2 (torchao/float8/fsdp_utils.py): the gathered-parameter buffer.
What grows: each matmul's transient float8 copies (1 B per element) of its input and weight in forward, and of
the output gradient, weight and input in backward (:94-200): one linear's worth at a time.
Measured: torchtune PR #2546 "no change in memory usage"; torchtitan PR #808 47.65 GiB bf16 vs 47.77 rowwise /
47.32 tensorwise with fp8 all-gather.
The lm_head stays in bf16 (torchtitan and torchtune filter the output layer out of the conversion).
"""

from __future__ import annotations

from ..params import layer_linears
from ..setup import TrainingSetup
from ..spec import ModelSpec

FP8_BYTES = 1
# FSDP layouts whose all-gather torchao can run in float8 (FSDP2 fully_shard via the Float8 weight subclass).
FP8_ALL_GATHER_SHARDS = ("fsdp", "fsdp-shard-grad-op", "hsdp")


def active(setup: TrainingSetup) -> bool:
    return setup.precision == "fp8"


def matmul_temp_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The largest layer linear's float8 copies in its backward: grad_output [T, out], weight [out, in] and input
    [T, in], 1 B each (scales are one fp32 each per tensor or row: negligible)."""
    if not active(setup):
        return 0
    tokens = setup.batch_size * setup.seq_len
    return max((FP8_BYTES * (tokens * (lin.d_in + lin.d_out) + lin.d_in * lin.d_out)
                for lin in layer_linears(spec) if lin.parts != ("router",)), default=0)


def apply(parts: dict, spec: ModelSpec, setup: TrainingSetup) -> dict:
    """The sharded parts with the layers' linear weights all-gathered in float8 under FSDP."""
    if not active(setup) or setup.shard not in FP8_ALL_GATHER_SHARDS or not parts.get("gathered"):
        return parts
    linear = sum(lin.weight_params for lin in layer_linears(spec) if lin.parts != ("router",))
    saving = linear * (2 - FP8_BYTES)              # per gathered layer: bf16 -> float8
    layers_gathered = spec.num_layers if setup.shard == "fsdp-shard-grad-op" else 1
    out = dict(parts, gathered=max(parts["gathered"] - layers_gathered * saving, 0))
    busy = spec.num_layers if setup.shard == "fsdp-shard-grad-op" else 2
    out["gathered_busy"] = max(parts.get("gathered_busy", parts["gathered"]) - busy * saving, 0)
    return out


def assumption(setup: TrainingSetup) -> str | None:
    if not active(setup):
        return None
    out = ("fp8 (torchao float8 training): bf16 weights, gradients and optimizer state as in pure bf16, "
           "activations saved in bf16; each linear adds transient float8 copies")
    if setup.shard in FP8_ALL_GATHER_SHARDS:
        out += "; FSDP all-gathers the linear weights in float8 (enable_fsdp_float8_all_gather=True assumed)"
    return out
