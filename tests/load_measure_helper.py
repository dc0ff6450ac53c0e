"""Run in a fresh process by tests/test_load.py: save a random-weight checkpoint, load it back with transformers'
from_pretrained on the CPU, and print the peak of malloc's live bytes during the load (JSON).

What the GPU would hold is made visible on the CPU this way:
- the checkpoint is saved in another dtype than the one loaded, so every tensor is copied out of the safetensors
  mmap (a same-dtype CPU load would keep the file's pages, which a GPU load copies);
- live bytes are read from glibc's mallinfo2 (not the resident set, which keeps freed pages and Python's own
  objects), sampled by a thread and at the quantize kernel;
- bitsandbytes' CPU reference quantize_4bit computes in fp32 temporaries a GPU never allocates; it is replaced by
  a kernel that allocates what the CUDA kernel allocates (bitsandbytes 0.50 backends/cuda/ops.py:384-420: the
  packed output and fp32 absmax). Values do not matter for memory.
"""

from __future__ import annotations

import ctypes
import json
import sys
import tempfile
import threading
import time


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def live_bytes() -> int:
    """Bytes malloc has handed out and not taken back (glibc mallinfo2: in-use heap + mmapped chunks). torch's
    CPU allocator gets tensors from posix_memalign; Python's small objects live in pymalloc arenas, not here."""
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


class PeakMalloc:
    """High-water mark of malloc's live bytes, sampled by a thread and at `sample()` calls."""

    def __init__(self):
        self.base = self.peak = live_bytes()

    def __enter__(self):
        self.base = live_bytes()
        self.peak, self._stop = self.base, False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def sample(self):
        self.peak = max(self.peak, live_bytes())

    def _loop(self):
        while not self._stop:
            self.sample()
            time.sleep(0.0001)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()
        self.sample()


def cuda_like_quantize_4bit(peak: PeakMalloc) -> None:
    """Register the CUDA-shaped kernel and call it once, so that the lazy imports its first call triggers
    (torch.library's dynamo guard) happen before the measurement."""
    import bitsandbytes
    import torch

    def kernel(A, blocksize, quant_type, quant_storage):
        n = A.numel()
        absmax = torch.empty((-(n // -blocksize),), dtype=torch.float32)
        out = torch.empty(((n + 1) // (quant_storage.itemsize * 2), 1), dtype=quant_storage)
        absmax.fill_(1.0)
        out.zero_()                     # touch the pages, as a kernel writing its output does
        peak.sample()                   # the 16-bit input and both outputs are alive here
        return out, absmax

    torch.library.register_kernel("bitsandbytes::quantize_4bit", "cpu", kernel)
    bitsandbytes.functional.quantize_4bit(torch.ones(128, 64, dtype=torch.bfloat16), quant_type="nf4")


def main() -> None:
    import torch
    import transformers

    job = json.loads(sys.argv[1])
    config = transformers.AutoConfig.for_model(**job["config"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, job["save_dtype"]))
    folder = tempfile.mkdtemp(prefix="memfit-load-")
    model.save_pretrained(folder)
    del model
    kwargs = {"device_map": "cpu", "dtype": getattr(torch, job["load_dtype"])}
    peak = PeakMalloc()
    if job.get("quant"):
        cuda_like_quantize_4bit(peak)
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=job["quant"] == "nf4-dq",
            bnb_4bit_compute_dtype=getattr(torch, job["load_dtype"]))
    with peak:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    held = sum(t.numel() * t.element_size() for t in loaded.state_dict().values())
    quant_state = 0
    for module in loaded.modules():
        qs = getattr(getattr(module, "weight", None), "quant_state", None)
        if qs is not None:
            quant_state += qs.absmax.numel() * qs.absmax.element_size() + qs.code.numel() * qs.code.element_size()
            if qs.state2 is not None:
                quant_state += sum(t.numel() * t.element_size() for t in (qs.state2.absmax, qs.state2.code))
    print(json.dumps({"peak_bytes": peak.peak - peak.base, "param_bytes": sum(
        p.numel() * p.element_size() for p in loaded.parameters()), "quant_state_bytes": quant_state,
        "state_dict_bytes": held}))


if __name__ == "__main__":
    main()
