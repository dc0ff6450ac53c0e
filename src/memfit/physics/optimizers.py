"""Memory-saving optimizers: one record per optimizer (what it keeps, what its step allocates, whether it frees
each gradient during backward), read from the implementation people install.

Every formula works on the trainable tensors with their shapes and roles (``trainable_shapes``), because these
optimizers treat a decoder matrix, an embedding and a 1-D tensor differently. Byte counts are per tensor and
summed; step temporaries are the largest single tensor's (every implementation below loops over parameters one
at a time, so only one tensor's temporaries are alive at once). ``tests/test_optimizers.py`` runs each package
on real tensors of a small model and checks these numbers against what it allocated.

Sources (PyPI wheels, read 2026-12):
- galore-torch 1.0: galore_torch/adamw.py:91-129 (projected grad, exp_avg/exp_avg_sq of the projection),
  galore_projector.py:12-45 (std projection: right for rows >= cols, left otherwise), :71-105 (SVD of an fp32
  copy), galore_torch/adamw8bit.py:33-75 (bitsandbytes Optimizer2State on the projected gradient).
- transformers 5.24.0 trainer_optimizer.py:351-381 (galore_* defaults rank 128, update_proj_gap 200, scale 0.25,
  proj_type std), :384-410 (apollo_adamw: rank 128, random projection, channel scaling), :101-158 (target
  modules are nn.Linear only; everything else is a plain group of the same optimizer).
- q-galore-torch 1.0: q_galore_adamw8bit.py:11-13 (bitsandbytes Optimizer2State, 8-bit blockwise), :65-119 (the
  step: project, p.saved_data = p.data.clone(), p.data = p.grad = the projected gradient, update, project_back),
  q_galore_projector.py:31-107 (std projection, dequantized for every use), :148-168 (_quantize: uint8 with a
  scale and a zero point per group of quant_group_size, in the projection's dtype). Its weight path
  (`p.float_grad`, INT8 weights) needs the QLinear of VITA-Group/Q-GaLore's training code, not in the package.
- apollo-torch 1.0.3: apollo_torch/apollo.py:113-182, random_projector.py:139-174 (seeded randn projection,
  stored in the param dtype).
- torch 2.13.0 torch/optim/_muon.py:31-70 (Newton-Schulz in bf16), :130-133 (2-D params only), :155-160
  (momentum_buffer), :326-341 (single-tensor step, nesterov lerp).
- adam-mini 1.1.1: adam_mini/adam_mini.py:115-127 (name classes), :229-400 (m full size; v per head, per
  output row, or one per tensor).
- lion-pytorch 0.2.5: lion_pytorch/lion_pytorch.py:14-28 (update = exp_avg.clone()...add(grad)), :83-84.
- bitsandbytes 0.50.2: optim/lion.py Lion8bit = Optimizer1State 8-bit (uint8 state + fp32 absmax per 256).
- came-pytorch 0.1.3: came_pytorch/CAME.py:84-172 (fp32 states: exp_avg full, factored rows/cols of the second
  moment and of the instability).
- lomo-optim 0.1.1: lomo_optim/lomo.py:71-74 (a hook per parameter), :80-131 (fp32 copies of grad and param,
  p.grad = None at once), adalomo.py:79-99 (fp32 factored second moment), :125-207.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import InvalidSetupError, Problem
from ..params import count_params, layer_linears
from ..spec import ModelSpec

if TYPE_CHECKING:                  # setup.py imports this module for its rules; stack.py imports setup.py
    from .stack import Stack

# bitsandbytes blockwise 8-bit state (the same layout physics/states.py prices for AdamW8bit).
BNB_MIN_8BIT = 4096
BNB_BLOCK = 256
BNB_QMAP_BYTES = 256 * 4
# transformers 5.24.0 trainer_optimizer.py:369-374 and :398-405: the Trainer's rank when optim_args gives none.
DEFAULT_LOW_RANK = 128


@dataclass(frozen=True)
class Shape:
    """`count` trainable tensors of rows x cols (cols 1 for a vector). role: matrix (a decoder linear weight or a
    LoRA factor), embedding, head, vector (bias, norm), experts (3-D stacked MoE weights, one matrix each)."""

    rows: int
    cols: int
    count: int
    role: str
    name: str = ""

    @property
    def numel(self) -> int:
        return self.rows * self.cols


def trainable_shapes(spec: ModelSpec, stack: Stack) -> list[Shape]:
    """Every trainable tensor with its shape, as transformers (weight = out x in) and PEFT build them."""
    if not stack.base_trainable:
        out = []
        for m in stack.lora_modules:
            lin = m.linear
            out += [Shape(m.rank, lin.d_in, stack.lora_layers, "matrix", lin.name + ".lora_A"),
                    Shape(lin.d_out, m.rank, stack.lora_layers, "matrix", lin.name + ".lora_B")]
        return out
    counts = count_params(spec)
    h = spec.hidden_size
    out = [Shape(spec.vocab_size, h, 1, "embedding", "embed_tokens")]
    if spec.position_embeddings:
        out.append(Shape(spec.position_embeddings, h, 1, "embedding", "embed_positions"))
    if counts.lm_head >= spec.vocab_size * h:
        out.append(Shape(spec.vocab_size, h, 1, "head", "lm_head"))
    for lin in layer_linears(spec):
        role = "matrix" if lin.copies == 1 else "experts"
        out.append(Shape(lin.d_out, lin.d_in, spec.num_layers * lin.copies, role, lin.name))
        if lin.bias:
            out.append(Shape(lin.d_out * lin.copies, 1, spec.num_layers, "vector", lin.name + ".bias"))
    norm_tensors = spec.norms_per_layer * (2 if spec.norm_bias else 1)
    out.append(Shape(h, 1, spec.num_layers * norm_tensors, "vector", "norm"))
    if spec.qk_norm != "none":
        q, k = (spec.head_dim, spec.head_dim) if spec.qk_norm == "head" else (spec.q_dim, spec.kv_dim)
        out += [Shape(q, 1, spec.num_layers, "vector", "q_norm"), Shape(k, 1, spec.num_layers, "vector", "k_norm")]
    out.append(Shape(counts.final_norm, 1, 1, "vector", "norm"))
    return out


@dataclass(frozen=True)
class Knobs:
    """The settings an optimizer's memory depends on (options --galore-rank, --apollo-rank, --muon-params)."""

    galore_rank: int = DEFAULT_LOW_RANK
    apollo_rank: int = DEFAULT_LOW_RANK
    muon_params: str = "hidden"      # hidden: decoder matrices only (AdamW for embeddings/head); all-2d
    spec: ModelSpec | None = None


@dataclass(frozen=True)
class OptimizerFacts:
    name: str
    package: str                      # the PyPI package and version the numbers were read from
    keeps: str                        # one line for the README: what lives in memory
    state: Callable[[Shape, int, Knobs], int]       # persistent bytes for one tensor (param bytes p)
    # temporaries of one tensor's update, given what the loop's locals still hold of the previous tensor's
    step_temp: Callable[[Shape, int, Knobs, int], int]
    # what the loop's locals keep of a tensor's update while the next tensor is processed (a Python for-loop
    # reassigns `update`, `denom`, ... only when it reaches them again)
    leftover: Callable[[Shape, int, Knobs], int] = lambda s, p, k: 0
    # what a tensor's update releases for the rest of the step (a gradient replaced by a smaller one)
    frees: Callable[[Shape, int, Knobs], int] = lambda s, p, k: 0
    grads_freed_in_backward: bool = False
    full_only: bool = False           # projects or classifies full weight matrices: method full
    targets_last: bool = False        # the Trainer's low-rank groups: the projected matrices after everything else
    bnb: bool = False                 # bitsandbytes kernels: the trace adds its state from the layout
    shared_bytes: int = 0             # once per optimizer (bitsandbytes' quantization maps)


def _adam_loop(s: Shape, p: int) -> tuple[int, int]:
    """The AdamW-style for-loop these packages fall back to: 2 states; denom and exp_avg/denom temporaries."""
    return 2 * p * s.numel, 2 * p * s.numel


def _bnb8(n: int, states: int) -> int:
    """bitsandbytes blockwise 8-bit states of an n-element tensor (fp32 below min_8bit_size)."""
    if n < BNB_MIN_8BIT:
        return 4 * states * n
    return states * (n + 4 * -(-n // BNB_BLOCK))


def _projected(s: Shape, rank: int) -> tuple[int, int, int]:
    """(rank used, larger side, smaller side): std projection keeps rank x the larger side."""
    r = min(rank, s.rows, s.cols)
    return r, max(s.rows, s.cols), min(s.rows, s.cols)


def _low_rank_target(s: Shape) -> bool:
    return s.role == "matrix"     # transformers: nn.Linear weights of the decoder (optim_target_modules)


# -- GaLore ------------------------------------------------------------------------------------------------------

def _galore_state(s: Shape, p: int, k: Knobs) -> int:
    if not _low_rank_target(s):
        return _adam_loop(s, p)[0] * s.count
    r, big, small = _projected(s, k.galore_rank)
    # exp_avg + exp_avg_sq of the r x big projected gradient, and the r x small orthogonal matrix (param dtype)
    return p * (2 * r * big + r * small) * s.count


def _svd_temp(s: Shape, p: int, r: int) -> int:
    """get_orthogonal_matrix on the first step (and every update_proj_gap): an fp32 copy of the gradient, its
    thin SVD U, S, Vh in fp32, and the rank-r factor in fp32."""
    small, big = min(s.rows, s.cols), max(s.rows, s.cols)
    copy = 4 * s.numel if p != 4 else 0
    # + diag(s[:r]) and the fp32 r x big factor, and the other factor cast to the param dtype. LAPACK's (cuSOLVER's)
    # own workspace is not counted.
    return copy + 4 * (s.rows * small + small + small * s.cols) + 4 * r * big + 4 * r * r + p * r * small


def _galore_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    if not _low_rank_target(s):
        return _adam_loop(s, p)[1] + prev
    r, big, _ = _projected(s, k.galore_rank)
    # low-rank grad, denom, exp_avg/denom (r x big each), then project_back and its * scale (full size each): by
    # then the previous tensor's locals are reassigned. The projection refresh runs before that, with them alive.
    update = p * (3 * r * big + 2 * s.numel)
    return max(update, _svd_temp(s, p, r) + prev)


def _low_rank_leftover(rank_of: Callable[[Knobs], int]):
    def leftover(s: Shape, p: int, k: Knobs) -> int:
        if not _low_rank_target(s):
            return 2 * p * s.numel                  # Adam's denom and exp_avg / denom
        r, big, _ = _projected(s, rank_of(k))
        return p * (s.numel + r * big)              # the full-size update and the r x big denom
    return leftover


def _galore8_state(s: Shape, p: int, k: Knobs) -> int:
    if not _low_rank_target(s):
        return _bnb8(s.numel, 2) * s.count
    r, big, small = _projected(s, k.galore_rank)
    return (_bnb8(r * big, 2) + p * r * small) * s.count


def _galore8_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    if not _low_rank_target(s):
        return 0
    r, big, _ = _projected(s, k.galore_rank)
    # adamw8bit.py:47-57: the projection (and its SVD refresh) with the full gradient alive; then p.data.clone()
    # while the weight and the gradient are alive, after which p.grad is the projected one (the full gradient is
    # freed); project_back and * scale are full size. Read from the source only: bitsandbytes' CPU path is not
    # its CUDA kernel, so tests/test_optimizers.py checks this state but not these temporaries.
    return max(p * s.numel + 2 * p * r * big, p * (2 * s.numel + r * big), _svd_temp(s, p, r))


# -- Q-GaLore ----------------------------------------------------------------------------------------------------

# The quantization group of the stored projection: ms-swift galore_proj_group_size, axolotl qgalore_proj_group_size
# and VITA-Group/Q-GaLore run_pretrain.py --proj_group_size all default to 256. The bit width (4 or 8) does not
# change the storage: _quantize returns uint8 either way (q_galore_projector.py:166).
QGALORE_GROUP = 256


def _qgalore_projection(r: int, small: int, p: int) -> int:
    """The stored projection: uint8 codes, a scale and a zero point per group (param dtype), and the first
    singular vector kept for the adaptive refresh (past_ortho_vector, q_galore_projector.py:45/74)."""
    n = r * small
    return n + 2 * p * -(-n // QGALORE_GROUP) + p * small


def _qgalore_state(s: Shape, p: int, k: Knobs) -> int:
    if not _low_rank_target(s):
        return _bnb8(s.numel, 2) * s.count
    r, big, small = _projected(s, k.galore_rank)
    return (_bnb8(r * big, 2) + _qgalore_projection(r, small, p)) * s.count


def _qgalore_frees(s: Shape, p: int, k: Knobs) -> int:
    """p.grad = grad (q_galore_adamw8bit.py:91): each target's full gradient is replaced by its r x big projection
    for the rest of the step."""
    if not _low_rank_target(s):
        return 0
    r, big, _ = _projected(s, k.galore_rank)
    return p * (s.numel - r * big)


def _qgalore_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    if not _low_rank_target(s):
        return 0
    r, big, small = _projected(s, k.galore_rank)
    # q_galore_adamw8bit.py:79-85: the projected gradient (r x big) and the dequantized projection, then the weight's
    # clone and grad.clone() with the full gradient alive. p.data = ... drops the old weight (the clone becomes it)
    # and p.grad = grad the full gradient; project_back (q_galore_projector.py:93-107) then makes the full-size
    # product and its * scale with the dequantized projection alive. The refresh (SVD of an fp32 copy) runs
    # first, with the full gradient alive, as in GaLore.
    project = p * (r * big + 2 * r * small)
    clone = p * (s.numel + 2 * r * big)
    back = p * (s.numel + 2 * r * big + r * small)
    return max(project, clone, back, _svd_temp(s, p, r) + p * 2 * r * small)


# -- APOLLO ------------------------------------------------------------------------------------------------------

def _apollo_state(s: Shape, p: int, k: Knobs) -> int:
    if not _low_rank_target(s):
        return _adam_loop(s, p)[0] * s.count
    r, big, small = _projected(s, k.apollo_rank)
    # as GaLore (random instead of SVD projection, kept in the param dtype) + the 0-dim scaled_grad norm
    return (p * (2 * r * big + r * small) + p) * s.count


def _apollo_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    if not _low_rank_target(s):
        return _adam_loop(s, p)[1] + prev
    r, big, small = _projected(s, k.apollo_rank)
    # projection update: an fp32 copy of the gradient, the fp32 randn and its / sqrt(rank), then the param-dtype
    # cast; update: low-rank grad, denom, norm_grad, then p.grad * scaling and / limiter (full size each)
    refresh = (4 * s.numel if p != 4 else 0) + 2 * 4 * r * small + p * r * small + prev
    return max(refresh, p * (3 * r * big + 2 * s.numel))


# -- Muon --------------------------------------------------------------------------------------------------------

def _muon_handles(s: Shape, k: Knobs) -> bool:
    if s.cols == 1 or s.role == "experts":
        return False                       # torch Muon refuses non-2-D parameters (_muon.py:130-133)
    return s.role == "matrix" or k.muon_params == "all-2d"


def _muon_state(s: Shape, p: int, k: Knobs) -> int:
    if _muon_handles(s, k):
        return p * s.numel * s.count       # momentum_buffer
    # torch AdamW(fused=True) for the rest: exp_avg, exp_avg_sq and the fp32 0-dim step (torch/optim/adam.py)
    return (2 * p * s.numel + 4) * s.count


def _muon_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    if not _muon_handles(s, k):
        return 0
    small = min(s.rows, s.cols)
    # nesterov grad.lerp(buf) (param dtype, held by the caller); each Newton-Schulz iteration makes the gram matrix
    # and its update (small x small, bf16) and the next bf16 iterate while the previous one is alive
    return p * s.numel + 2 * 2 * s.numel + 2 * 2 * small * small


# -- Adam-mini ---------------------------------------------------------------------------------------------------

def _adam_mini_v(s: Shape, k: Knobs) -> int:
    """Elements of v for one tensor (adam_mini.py:115-127 name classes)."""
    name = s.name
    if "bias" in name:
        return s.numel                                  # plain Adam
    if s.role in ("embedding", "head"):
        return s.rows                                   # one per token
    spec = k.spec
    if any(t in name for t in ("k_proj", "q_proj")) and spec is not None:
        # m.view(-1, dim * dim // n_heads) (adam_mini.py:256-257): one per "head" of hidden^2 / heads elements
        head_numel = spec.hidden_size * spec.hidden_size // spec.num_heads
        if s.numel % head_numel:
            raise InvalidSetupError(Problem("optimizer", f"{{optimizer}} adam-mini cannot split {name} "
                                                         f"({s.rows} x {s.cols}) into heads of hidden^2 / heads = "
                                                         f"{head_numel} elements (adam-mini 1.1.1 fails the same way)"))
        return s.numel // head_numel
    if any(t in name for t in ("v_proj", "o_proj", "mlp", "proj", "fc", "dense")) and s.cols > 1:
        return s.rows                                   # one per output neuron
    return 1                                            # norms: one for the tensor


def _adam_mini_state(s: Shape, p: int, k: Knobs) -> int:
    return p * (s.numel + _adam_mini_v(s, k)) * s.count


def _adam_mini_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    # grad * grad before its row mean, then update = m * stepsize and -update (full size each)
    return 2 * p * s.numel


# -- Lion, CAME, LOMO, AdaLomo -----------------------------------------------------------------------------------

def _lion_state(s: Shape, p: int, k: Knobs) -> int:
    return p * s.numel * s.count


def _lion_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    return 2 * p * s.numel      # exp_avg.clone() and .add(grad) (not in place) before sgn_()


def _lion8_state(s: Shape, p: int, k: Knobs) -> int:
    return _bnb8(s.numel, 1) * s.count


def _factored(s: Shape) -> bool:
    return s.cols > 1


def _came_state(s: Shape, p: int, k: Knobs) -> int:
    # fp32: exp_avg full; 2-D: second moment and instability as row + column vectors; 1-D: exp_avg_sq; and the
    # 0-dim RMS of the weight (param dtype)
    second = 2 * (s.rows + s.cols) if _factored(s) else s.numel
    return (4 * (s.numel + second) + p) * s.count


def _came_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    # the fp32 gradient copy, then (update - exp_avg)**2 with update alive: four fp32 tensors at once, on top of
    # the previous tensor's `update` and `res`
    copy = 4 * s.numel if p != 4 else 0
    return copy + 3 * 4 * s.numel + prev


def _came_leftover(s: Shape, p: int, k: Knobs) -> int:
    return 2 * 4 * s.numel                          # `update` and `res` (fp32)


def _zero(s: Shape, p: int, k: Knobs, prev: int = 0) -> int:
    return 0


def _lomo_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    # grad.to(float32) and p.data.to(float32), less the 16-bit gradient it frees at once (p.grad = None); both are
    # aliases when the parameter is already fp32. The hook runs when the next gradient is computed, before it is
    # accumulated: that one is alive too (taken as the same size), except for the embedding, updated last
    # (fused_backward's grad_func(0) after loss.backward(), lomo.py:227-231).
    return ((8 - p) * s.numel if p != 4 else 0) + _next_gradient(s, p)


def _next_gradient(s: Shape, p: int) -> int:
    return 0 if s.role == "embedding" else p * s.numel


def _adalomo_state(s: Shape, p: int, k: Knobs) -> int:
    return 4 * ((s.rows + s.cols) if _factored(s) else s.numel) * s.count


def _adalomo_temp(s: Shape, p: int, k: Knobs, prev: int) -> int:
    # three fp32 tensors at once (the gradient copy, grad**2 and its + eps; or the copy, the update and the fp32
    # param copy), less the 16-bit gradient freed at once; fp32 parameters: the copies are aliases, two remain
    if p == 4:
        return 2 * 4 * s.numel + _next_gradient(s, p)
    return 3 * 4 * s.numel - p * s.numel + _next_gradient(s, p)


OPTIMIZER_FACTS: dict[str, OptimizerFacts] = {f.name: f for f in (
    OptimizerFacts("galore", "galore-torch 1.0 GaLoreAdamW", "Adam moments of the rank-r projected gradient + the "
                   "r x min(m,n) projection per decoder matrix; plain Adam moments for embeddings, head, norms",
                   _galore_state, _galore_temp, _low_rank_leftover(lambda k: k.galore_rank), full_only=True,
                   targets_last=True),
    OptimizerFacts("galore-8bit", "galore-torch 1.0 GaLoreAdamW8bit (bitsandbytes 0.50.2)", "as galore with the "
                   "moments in bitsandbytes blockwise 8 bits (fp32 below 4096 elements)", _galore8_state,
                   _galore8_temp, full_only=True, bnb=True, shared_bytes=2 * BNB_QMAP_BYTES, targets_last=True),
    OptimizerFacts("q-galore", "q-galore-torch 1.0 QGaLoreAdamW8bit (bitsandbytes blockwise state)",
                   "as galore-8bit with the projection stored as uint8 with a scale and zero point per 256 entries "
                   "(weights stay 16-bit: Q-GaLore's INT8 weights need its training code's QLinear)",
                   _qgalore_state, _qgalore_temp, frees=_qgalore_frees, full_only=True, bnb=True,
                   shared_bytes=2 * BNB_QMAP_BYTES, targets_last=True),
    OptimizerFacts("apollo", "apollo-torch 1.0.3 APOLLOAdamW", "Adam moments of a rank-r random projection of "
                   "each decoder matrix's gradient + the projection; plain Adam moments elsewhere",
                   _apollo_state, _apollo_temp, _low_rank_leftover(lambda k: k.apollo_rank), full_only=True,
                   targets_last=True),
    OptimizerFacts("muon", "torch 2.13.0 torch.optim.Muon + AdamW(fused)", "one momentum buffer per decoder "
                   "matrix (Newton-Schulz temporaries in bf16); AdamW moments for embeddings, head and 1-D tensors",
                   _muon_state, _muon_temp),
    OptimizerFacts("adam-mini", "adam-mini 1.1.1 Adam_mini", "first moment in full; second moment one value per "
                   "head (q, k), per output row (v, o, MLP, embeddings, head) or per tensor (norms)",
                   _adam_mini_state, _adam_mini_temp, full_only=True),
    OptimizerFacts("lion", "lion-pytorch 0.2.5 Lion", "one momentum (exp_avg) in the param dtype",
                   _lion_state, _lion_temp),
    OptimizerFacts("lion-8bit", "bitsandbytes 0.50.2 Lion8bit", "one momentum in blockwise 8 bits (fp32 below "
                   "4096 elements)", _lion8_state, _zero, bnb=True, shared_bytes=BNB_QMAP_BYTES),
    OptimizerFacts("came", "came-pytorch 0.1.3 CAME", "fp32 first moment in full + factored (row and column) "
                   "fp32 second moment and instability for matrices", _came_state, _came_temp, _came_leftover),
    OptimizerFacts("lomo", "lomo-optim 0.1.1 Lomo", "no state: each parameter is updated and its gradient freed "
                   "inside backward (fp32 copies of one tensor at a time)", _zero, _lomo_temp,
                   grads_freed_in_backward=True),
    OptimizerFacts("adalomo", "lomo-optim 0.1.1 AdaLomo", "factored fp32 second moment (rows + columns), updated "
                   "inside backward with each gradient freed at once", _adalomo_state, _adalomo_temp,
                   grads_freed_in_backward=True),
)}


def knobs_for(spec: ModelSpec, setup) -> Knobs:
    return Knobs(galore_rank=getattr(setup, "galore_rank", None) or DEFAULT_LOW_RANK,
                 apollo_rank=getattr(setup, "apollo_rank", None) or DEFAULT_LOW_RANK,
                 muon_params=getattr(setup, "muon_params", None) or "hidden", spec=spec)


def state_bytes(spec: ModelSpec, setup, stack: Stack) -> tuple[int, str]:
    facts = OPTIMIZER_FACTS[setup.optimizer]
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    k = knobs_for(spec, setup)
    total = sum(facts.state(s, p, k) for s in trainable_shapes(spec, stack)) + facts.shared_bytes
    return total, f"{facts.keeps} ({facts.package})"


def step_order(spec: ModelSpec, stack: Stack, facts: OptimizerFacts) -> list[Shape]:
    """One tensor after another as the step visits them: model order (embeddings, each layer's linears and
    vectors, final norm, head; two layers stand for all, as they repeat); the low-rank optimizers' Trainer
    groups put every non-target tensor before the targets (trainer_optimizer.py:147-150)."""
    shapes = trainable_shapes(spec, stack)
    per_layer = [s for s in shapes if s.role in ("matrix", "experts") or (s.role == "vector" and s.count > 1)]
    first = [s for s in shapes if s.role == "embedding"]
    last = [s for s in shapes if s not in per_layer and s not in first]
    order = first + per_layer + per_layer + last
    if facts.targets_last:
        order = [s for s in order if not _low_rank_target(s)] + [s for s in order if _low_rank_target(s)]
    return order


def step_temp_bytes(spec: ModelSpec, setup, stack: Stack) -> tuple[int, str]:
    facts = OPTIMIZER_FACTS[setup.optimizer]
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    k = knobs_for(spec, setup)
    largest, prev, freed = 0, 0, 0
    for s in step_order(spec, stack, facts):
        largest = max(largest, facts.step_temp(s, p, k, prev) - freed)
        prev = facts.leftover(s, p, k)
        freed += facts.frees(s, p, k)
    where = "inside backward" if facts.grads_freed_in_backward else "inside optimizer.step()"
    return largest, f"{facts.package}: one tensor at a time {where}; the largest tensor's temporaries"


def layer_step_temp_bytes(spec: ModelSpec, setup, stack: Stack) -> int:
    """For an optimizer that updates inside backward: the temporaries of a decoder layer's tensors, which run while
    the layers below still keep their activations (the embedding's update comes last, when they are freed)."""
    facts = OPTIMIZER_FACTS.get(setup.optimizer)
    if not (facts and facts.grads_freed_in_backward):
        return 0
    p = stack.weight_bytes if stack.base_trainable else stack.adapter_bytes
    k = knobs_for(spec, setup)
    layer = [s for s in step_order(spec, stack, facts) if s.role not in ("embedding", "head") and
             (s.role != "vector" or s.count > 1)]
    return max((facts.step_temp(s, p, k, 0) for s in layer), default=0)


IN_BACKWARD = tuple(name for name, f in OPTIMIZER_FACTS.items() if f.grads_freed_in_backward)
_KNOB_OPTIMIZERS = {"galore_rank": ("galore", "galore-8bit", "q-galore"), "apollo_rank": ("apollo",),
                    "muon_params": ("muon",)}


def optimizer_problems(setup) -> list[Problem]:
    """The combinations these optimizers cannot run (each face words them with its own option names)."""
    out = []
    facts = OPTIMIZER_FACTS.get(setup.optimizer)
    if facts and facts.full_only and setup.method != "full":
        out.append(Problem("optimizer", f"{{optimizer}} {setup.optimizer} works on full weight matrices: it needs "
                                        f"{{method}} full (method is {setup.method})"))
    if facts and facts.grads_freed_in_backward and "optimizer_in_backward" in setup.explicit \
            and not setup.optimizer_in_backward:
        out.append(Problem("optimizer_in_backward", f"{{optimizer}} {setup.optimizer} always updates inside "
                                                    "backward: {optimizer_in_backward} cannot be off"))
    if facts and setup.shard.startswith("zero"):
        # ZeRO steps the optimizer on flat 1-D fp32 partitions (deepspeed runtime/zero/stage_1_and_2.py:577), which
        # these optimizers' per-matrix memory does not describe; FSDP2 keeps each parameter's shape.
        out.append(Problem("shard", f"{{optimizer}} {setup.optimizer} is modelled on whole (or FSDP-sharded) "
                                    f"tensors, not on DeepSpeed ZeRO's flat partitions: use {{shard}} fsdp or none"))
    for knob, users in _KNOB_OPTIMIZERS.items():
        if knob in setup.explicit and setup.optimizer not in users:
            out.append(Problem(knob, f"{{{knob}}} only applies to {{optimizer}} {' or '.join(users)} (optimizer is "
                                     f"{setup.optimizer})"))
    return out


def readme_table() -> str:
    """The README's optimizer table (tools/readme_flags.py writes it; a test checks it)."""
    lines = ["| `--optimizer` | implementation | what it keeps in memory |", "|---|---|---|"]
    for f in OPTIMIZER_FACTS.values():
        needs = " Full fine-tuning only." if f.full_only else ""
        lines.append(f"| {f.name} | {f.package} | {f.keeps}.{needs} |")
    return "\n".join(lines)
