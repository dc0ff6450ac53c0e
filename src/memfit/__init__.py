"""memfit: how much memory fine-tuning a model needs, whether it fits, and what to change if not.

Public API (the analytic path never imports torch):

    spec = memfit.load_model("meta-llama/Llama-3.1-8B")          # catalog, config.json, model dir, HF cache, "7B"
    setup = memfit.TrainingSetup(method="lora", batch_size=1, seq_len=2048)
    est = memfit.estimate(spec, setup)                             # named components and three counters
    hw = memfit.load_hardware(gpu="rtx-4090")                      # or memory="24GiB", mac="36GB"
    memfit.verdict(est, hw)                                        # fits / tight / does-not-fit
"""

from .errors import MemfitError
from .estimator import Component, Estimate, estimate
from .hardware import Hardware, load_hardware
from .setup import TrainingSetup
from .sources import load_model
from .spec import ModelSpec
from .verdict import Verdict, verdict

__version__ = "0.1.0"
__all__ = ["Component", "Estimate", "Hardware", "MemfitError", "ModelSpec", "TrainingSetup", "Verdict",
           "estimate", "load_hardware", "load_model", "verdict", "__version__"]
