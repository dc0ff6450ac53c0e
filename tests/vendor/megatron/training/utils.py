"""Not Megatron's: the two helpers theoretical_memory_usage.py imports from `.utils`, so that the vendored file
runs unchanged without megatron-core, torch.distributed or Megatron's argument parser. Same behaviour as
NVIDIA/Megatron-LM@d98e8a64 megatron/training/utils/common_utils.py:462 print_rank_0 (one process: print) and
:502 is_hybrid_model."""


def is_hybrid_model(args):
    return args.hybrid_layer_pattern is not None


def print_rank_0(message, rank=None):
    print(message, flush=True)
