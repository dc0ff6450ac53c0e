"""The memory-saving optimizers as people instantiate them (physics/optimizers.py has their memory).

Parameter groups follow transformers 5.24.0 trainer_optimizer.py:101-158 for GaLore and APOLLO (the nn.Linear
weights of the decoder layers get the projection; every other parameter is a plain group of the same class) and
the defaults of :369-374 / :398-405. Muon steps the decoder matrices (or every 2-D tensor with muon_params
all-2d), torch AdamW(fused=True) the rest, as torch/optim/_muon.py's docstring pairs them. LOMO and AdaLomo
register their update as a gradient hook in the constructor (lomo_optim/lomo.py:71-74); `step()` here runs the
update of the last parameter, as Lomo.fused_backward does after loss.backward().

Each package is imported when asked for; a missing one is a clear error naming its `pip install`.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from ..errors import MissingExtraError

PACKAGES = {"galore": "galore-torch", "galore-8bit": "galore-torch", "q-galore": "q-galore-torch",
            "apollo": "apollo-torch", "adam-mini": "adam-mini", "lion": "lion-pytorch", "lion-8bit": "bitsandbytes", "came": "came-pytorch",
            "lomo": "lomo-optim", "adalomo": "lomo-optim"}
_MODULES = {"galore-torch": "galore_torch", "q-galore-torch": "q_galore_torch", "apollo-torch": "apollo_torch",
            "adam-mini": "adam_mini",
            "lion-pytorch": "lion_pytorch", "came-pytorch": "came_pytorch", "lomo-optim": "lomo_optim",
            "bitsandbytes": "bitsandbytes"}
LR = 1e-5
# transformers' default is 200 (trainer_optimizer.py:371, :402): the projection is refreshed on the first step and
# every 200th. The trace refreshes it on every step, so its second step allocates what step 200 of a real run does
# (a refresh with the whole state alive); memory does not depend on the gap otherwise.
UPDATE_PROJ_GAP = 1


def _import(name: str):
    package = PACKAGES[name]
    try:
        return importlib.import_module(_MODULES[package])
    except ImportError:
        raise MissingExtraError(f"optimizer {name} needs {package}: pip install {package}") from None


def low_rank_groups(model: nn.Module) -> tuple[list, list]:
    """(decoder nn.Linear weights, every other trainable parameter)."""
    layers = model.get_decoder().layers if hasattr(model, "get_decoder") else model
    target = {id(m.weight) for m in layers.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad}
    params = [p for p in model.parameters() if p.requires_grad]
    return [p for p in params if id(p) in target], [p for p in params if id(p) not in target]


class _Several:
    """Two optimizers stepped as one (Muon for matrices, AdamW for the rest)."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers
        self.state = {k: v for o in optimizers for k, v in o.state.items()}

    def step(self):
        for o in self.optimizers:
            o.step()
        self.state = {k: v for o in self.optimizers for k, v in o.state.items()}

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


class _InBackward:
    """LOMO / AdaLomo: the update ran in backward hooks; step() updates the last parameter, as fused_backward."""

    def __init__(self, optimizer):
        self.optimizer, self.state = optimizer, {}

    def step(self):
        self.optimizer.grad_func(0)

    def zero_grad(self, set_to_none: bool = True):
        pass


def make(name: str, model: nn.Module, setup):
    """The optimizer `name` (memfit's) over `model`'s trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "muon":
        matrices, rest = low_rank_groups(model)
        if setup.muon_params == "all-2d":
            matrices += [p for p in rest if p.ndim == 2]
            rest = [p for p in rest if p.ndim != 2]
        return _Several(torch.optim.Muon(matrices, lr=LR), torch.optim.AdamW(rest, lr=LR, fused=True))
    module = _import(name)
    if name in ("galore", "galore-8bit", "apollo"):
        matrices, rest = low_rank_groups(model)
        if name == "apollo":
            extra = dict(rank=setup.apollo_rank, proj="random", scale_type="channel",
                         update_proj_gap=UPDATE_PROJ_GAP, scale=1.0, proj_type="std")
            cls = module.APOLLOAdamW
        else:
            extra = dict(rank=setup.galore_rank, update_proj_gap=UPDATE_PROJ_GAP, scale=0.25, proj_type="std")
            cls = module.GaLoreAdamW8bit if name == "galore-8bit" else module.GaLoreAdamW
        return cls([{"params": rest}, {"params": matrices, **extra}], lr=LR)
    if name == "q-galore":
        # The projection group as ms-swift and axolotl build it (galore_proj_quant on, 4 bits, groups of 256,
        # cos_threshold 0.4, gamma_proj 2, queue_size 5: q_galore_projector.py's own defaults).
        from ..physics.optimizers import QGALORE_GROUP

        matrices, rest = low_rank_groups(model)

        extra = dict(rank=setup.galore_rank, update_proj_gap=UPDATE_PROJ_GAP, scale=0.25, proj_type="std", quant=True,
                     quant_n_bit=4, quant_group_size=QGALORE_GROUP, cos_threshold=0.4, gamma_proj=2, queue_size=5)
        return _qgalore_on_current_bitsandbytes(
            module.QGaLoreAdamW8bit([{"params": rest}, {"params": matrices, **extra}], lr=LR))
    if name == "adam-mini":
        config = model.config
        return module.Adam_mini(model.named_parameters(), lr=LR, dim=config.hidden_size,
                                n_heads=config.num_attention_heads,
                                n_kv_heads=getattr(config, "num_key_value_heads", None), verbose=False)
    if name == "lion":
        return module.Lion(params, lr=LR)
    if name == "lion-8bit":
        return module.optim.Lion8bit(params, lr=LR)
    if name == "came":
        return importlib.import_module("came_pytorch.CAME").CAME(params, lr=LR)
    if name == "lomo":
        return _InBackward(module.Lomo(model, lr=LR))
    if name == "adalomo":
        # AdaLomo puts its states on CUDA with .cuda() (adalomo.py:87-96); the trace's CPU tensors stand in for CUDA's
        original = torch.Tensor.cuda
        torch.Tensor.cuda = lambda self, *args, **kwargs: self
        try:
            return _InBackward(module.AdaLomo(model, lr=LR))
        finally:
            torch.Tensor.cuda = original
    raise KeyError(name)


def _qgalore_on_current_bitsandbytes(optimizer):
    """q-galore-torch 1.0 passes percentile_clipping=100 and block_wise=True positionally to bitsandbytes'
    Optimizer2State (q_galore_adamw8bit.py:12-13) and reads them back from get_config (:143, :172, :199).
    bitsandbytes 0.50.2 dropped both (optim/optimizer.py:404-421: max_unorm and skip_zeros now sit in those
    positions, and get_config has neither key), so the package's first step raises KeyError there. Restore the
    meaning it was written for: no clipping, no max_unorm, blockwise 8-bit state."""
    optimizer.args.max_unorm, optimizer.args.skip_zeros = 0.0, False
    get_config = optimizer.get_config

    def config(gindex, pindex, group):
        return {**get_config(gindex, pindex, group), "percentile_clipping": 100, "block_wise": True}

    optimizer.get_config = config
    return optimizer
