"""Long-context keys in trainer configs: the context-parallel degree and activation offload.

The key names are the options table's (options.py tool_keys): axolotl `context_parallel_size` (ring-flash-attn;
`sequence_parallel_degree` is its earlier name, axolotl PR #2412) and `activation_offloading`; TRL
`SFTConfig.activation_offloading`; torchtune `enable_activation_offloading`. What they mean for memory is
physics/context_parallel.py's.
"""

from __future__ import annotations

from ..options import tool_key
from .reader import Reader

_OLD_CP_KEYS = {"axolotl": ("sequence_parallel_degree",)}


def read_long_context(r: Reader, setup: dict, keys: dict) -> None:
    """Sets `cp` and `activation_offload` in `setup` (and their keys in `keys`) when the config names them."""
    cp_key = tool_key("cp", r.tool)
    for key in ((cp_key,) if cp_key else ()) + _OLD_CP_KEYS.get(r.tool, ()):
        if r.has(key):
            setup["cp"] = r.option(key, "cp", 1)
            keys["cp"] = key
            break
    offload_key = tool_key("activation_offload", r.tool)
    if offload_key and r.has(offload_key):
        setup["activation_offload"] = r.flag(offload_key)
        keys["activation_offload"] = offload_key
