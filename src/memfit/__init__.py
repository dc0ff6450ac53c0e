"""memfit: how much memory fine-tuning a model needs, whether it fits, and what to change if not.

Public API (the analytic path never imports torch):

    spec = memfit.load_model("meta-llama/Llama-3.1-8B")          # catalog, config.json, model dir, HF cache, "7B"
    setup = memfit.TrainingSetup(method="lora", batch_size=1, seq_len=2048)  # unset: the hf recipe's
    est = memfit.estimate(spec, setup)                             # named components and three counters
    hw = memfit.load_hardware(gpu="rtx-4090")                      # or memory="24GiB", mac="36GB"
    memfit.verdict(est, hw)                                        # fits / tight / does-not-fit

    # The whole answer the CLI and the web page give (estimate, verdict, warnings, changes that fit):
    r = memfit.report(memfit.Request(model="meta-llama/Llama-3.1-8B", setup={"method": "qlora"}, gpu="rtx-4090"))
    memfit.to_json(r)                                              # byte for byte `memfit estimate --format json`
"""

from .errors import MemfitError
from .estimator import Component, Estimate, estimate
from .hardware import Hardware, load_hardware
from .report import Report, Request, report
from .setup import TrainingSetup
from .sources import load_model
from .spec import ModelSpec
from .verdict import Verdict, verdict

__version__ = "0.1.0"
__all__ = ["Component", "Estimate", "Hardware", "MemfitError", "ModelSpec", "Report", "Request", "TrainingSetup",
           "Verdict", "estimate", "load_hardware", "load_model", "report", "to_json", "verdict", "__version__"]


def to_json(result: Report) -> str:
    """The JSON text of a report: what `memfit estimate --format json` and POST /api/estimate print."""
    from .render.jsonout import dumps, report_dict

    return dumps(report_dict(result))
