"""The levers of preference and RL trainers (advisor.py applies them like every other lever: each is a re-estimate).

- Precompute the reference log-probs (DPO/IPO/KTO ``precompute_ref_log_probs``): no reference during training.
- Train an adapter so the reference is the same weights with the adapter disabled (full fine-tuning with a copy).
- Shorter completions (GRPO/RLOO/PPO/GKD ``max_completion_length``): a smaller KV cache and fewer scored tokens.
- vLLM co-located: sleep mode (the peak becomes the larger of training and generation), a lower
  ``vllm_gpu_memory_utilization`` (down to what its weights and KV cache need), or a vLLM server on another GPU.
- A fused loss is advisor.py's chunked-ce lever (ORPO/CPO/SimPO/GKD compute full logits).
Fewer generations per prompt is no lever: TRL's per-device batch counts completions (trl PR #2776), so at the same
batch num_generations changes how many prompts share it, not the memory.
"""

from __future__ import annotations

import math

from .hardware import Hardware
from .physics import trainers as physics
from .setup import TrainingSetup
from .spec import ModelSpec

COSTS = {
    "precompute-ref": (1, "a forward-only pass over the dataset before training (precompute_ref_log_probs): the "
                          "reference is fixed, no quality cost"),
    "vllm-sleep": (1, "vLLM sleeps while the trainer runs (vllm_enable_sleep_mode): its weights and KV cache are "
                      "re-created every generation round, a slower step"),
    "vllm-util": (2, "vLLM keeps a smaller KV cache (vllm_gpu_memory_utilization): fewer sequences at once, slower "
                     "generation"),
    "shorter-completions": (3, "completions are cut at the new max_completion_length: long answers are never "
                               "finished or rewarded"),
    "peft-reference": (4, "trains a LoRA adapter instead of every weight; the reference is the base with the "
                          "adapter disabled (free)"),
    "vllm-server": (5, "generation on another GPU (trl vllm-serve): more hardware, weights synced every step"),
}
# vllm_gpu_memory_utilization is offered in steps of this fraction.
VLLM_UTIL_STEP = 0.05


def trainer_levers(spec: ModelSpec, setup: TrainingSetup, hardware: Hardware) -> list[tuple]:
    """(key, words, apply) for each lever of this setup's trainer."""
    t = setup.trainer
    out = []
    if t in ("dpo", "ipo", "kto") and setup.ref_model in ("copy", "adapter-off"):
        out.append(("precompute-ref", "precomputed reference log-probs",
                    lambda s: s.replace(ref_model="precomputed")))
    if setup.ref_model == "copy" and setup.method == "full" and t in ("dpo", "ipo", "kto", "rloo", "ppo"):
        out.append(("peft-reference", "LoRA with the adapter-off reference",
                    lambda s: s.with_method("lora").replace(ref_model="adapter-off")))
    if t in physics.ONLINE and setup.completion_len and setup.completion_len >= 128:
        out.append(("shorter-completions", "half the completion length",
                    lambda s: s.replace(completion_len=s.completion_len // 2,
                                        seq_len=s.seq_len - s.completion_len + s.completion_len // 2,
                                        prompt_len=None)))
    if t in physics.ONLINE and setup.generation == "vllm-colocate":
        if not setup.vllm_sleep:
            out.append(("vllm-sleep", "vLLM sleep mode", lambda s: s.replace(vllm_sleep=True)))
        least = vllm_least_util(spec, setup, hardware.capacity_bytes)
        if least is not None and least < setup.vllm_gpu_util:
            out.append(("vllm-util", f"vllm_gpu_memory_utilization {least:g}",
                        lambda s: s.replace(vllm_gpu_util=least)))
        out.append(("vllm-server", "a vLLM server on another GPU",
                    lambda s: s.replace(generation="vllm-server", vllm_gpu_util=None, vllm_sleep=None)))
    return out


def vllm_least_util(spec: ModelSpec, setup: TrainingSetup, card_bytes: int) -> float | None:
    """The smallest vllm_gpu_memory_utilization (in 0.05 steps) that holds vLLM's 16-bit weights and the KV cache
    of every sequence TRL generates at once at full length (prompt + completion)."""
    if not card_bytes:
        return None
    sh = physics.shape(setup)
    need = spec.params * 2 + physics.kv_cache_bytes(spec, sh.generated_rows, sh.row_tokens, 2)
    steps = math.ceil(need / card_bytes / VLLM_UTIL_STEP)
    least = round(steps * VLLM_UTIL_STEP, 2)
    return least if least < 1.0 else None
