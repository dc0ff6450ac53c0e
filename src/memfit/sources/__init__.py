"""Model sources. Every way of naming a model returns the same ModelSpec; ``load_model`` picks the source.

Order: a bare size ("7B") -> a local path (config.json or model directory) -> the built-in catalog -> the
local Hugging Face cache -> the Hub (config.json and safetensors metadata only, never weights).
"""

from .resolve import load_model

__all__ = ["load_model"]
