"""Preference and RL keys of the trainer configs `memfit check` reads: which trainer a file runs and its reference,
generation and length settings, in each tool's own key names.

- TRL: a config file does not name its trainer (the command does: `trl dpo --config ...`), so the trainer is read
  from the keys only one of them has (trl 1.16.0 dpo_config.py, kto_config.py, grpo_config.py,
  experimental/gkd/gkd_config.py); RLOO shares GRPO's keys and is read as GRPO (said in the defaults).
- LLaMA-Factory 0.9.6.dev0 `stage: dpo|kto|ppo` with `pref_loss` (hparams/finetuning_args.py: pref_loss default
  sigmoid; orpo and simpo need no reference); its own DPO/KTO trainers (src/llamafactory/train/dpo/trainer.py
  concatenated_forward) take `model(...).logits.to(torch.float32)`: the full fp32 logits, priced as the hf loss.
- axolotl 0.18.0 `rl: dpo|ipo|orpo|kto|simpo|grpo` (utils/schemas/enums.py RLType) with the TRL keys under `trl:`.
"""

from __future__ import annotations

from .reader import Reader

_DPO_KEYS = ("precompute_ref_log_probs", "precompute_ref_batch_size", "ref_model_init_kwargs", "ld_alpha",
             "f_divergence_type", "rpo_alpha", "sync_ref_model", "use_weighting")
_KTO_KEYS = ("desirable_weight", "undesirable_weight")
_ONLINE_KEYS = ("num_generations", "max_completion_length", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
                "vllm_enable_sleep_mode", "generation_batch_size", "steps_per_generation")
_GKD_KEYS = ("teacher_model_name_or_path", "lmbda", "max_new_tokens", "seq_kd")
# LLaMA-Factory pref_loss values (finetuning_args.py) -> memfit's trainer
_LF_PREF = {"sigmoid": "dpo", "hinge": "dpo", "ipo": "ipo", "kto_pair": "dpo", "orpo": "orpo", "simpo": "simpo"}
_AXOLOTL_RL = ("dpo", "ipo", "orpo", "kto", "simpo", "grpo")


def read_trainer_keys(tool: str, r: Reader, setup: dict, defaults: list, keys: dict) -> None:
    """Add the trainer and its options to `setup` (in place), with the keys that set them."""
    if tool == "trl":
        _trl(r, setup, defaults, keys, prefix="")
    elif tool == "llamafactory":
        _llamafactory(r, setup, defaults, keys)
    elif tool == "axolotl":
        rl = r.get("rl")
        if rl is None:
            return
        if not isinstance(rl, str) or rl.strip().lower() not in _AXOLOTL_RL:
            r.problem("rl", f"{rl!r} is not modelled (memfit models {', '.join(_AXOLOTL_RL)})")
            return
        setup["trainer"] = rl.strip().lower()
        keys["trainer"] = "rl"
        r.mapping("trl")
        _trl(r, setup, defaults, keys, prefix="trl.", trainer=setup["trainer"])


def _trl(r: Reader, setup: dict, defaults: list, keys: dict, prefix: str, trainer: str | None = None) -> None:
    has = lambda names: [k for k in names if r.has(prefix + k)]  # noqa: E731
    if trainer is None:
        if has(_GKD_KEYS):
            trainer = "gkd"
        elif has(_ONLINE_KEYS):
            trainer = "grpo"
            defaults.append(f"{', '.join(has(_ONLINE_KEYS))} read as a GRPO config (RLOO has the same keys: "
                            "`memfit estimate --trainer rloo` for RLOO's reference model)")
        elif has(_KTO_KEYS):
            trainer = "kto"
        elif has(_DPO_KEYS) or r.has(prefix + "loss_type") and _dpo_loss(r.get(prefix + "loss_type")):
            trainer = "dpo"
        else:
            return
        setup["trainer"] = trainer
    if trainer in ("dpo", "ipo") and r.has(prefix + "loss_type"):
        loss = _dpo_loss(r.get(prefix + "loss_type"))
        if loss == "ipo":
            setup["trainer"] = trainer = "ipo"
    if trainer in ("dpo", "ipo", "kto") and r.flag(prefix + "precompute_ref_log_probs"):
        setup["ref_model"] = "precomputed"
    keys["ref_model"] = prefix + "precompute_ref_log_probs"
    if trainer in ("grpo", "rloo", "gkd"):
        length = {"gkd": "max_new_tokens"}.get(trainer, "max_completion_length")
        completion = r.option(prefix + length, "completion_len")
        if completion is not None:
            setup["completion_len"] = completion
        keys["completion_len"] = prefix + length
    if trainer in ("grpo", "rloo"):
        generations = r.option(prefix + "num_generations", "num_generations")
        if generations is not None:
            setup["num_generations"] = generations
        keys["num_generations"] = prefix + "num_generations"
        beta = r.get(prefix + "beta")
        if isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta > 0:
            setup["ref_model"] = "adapter-off" if setup.get("method") != "full" else "copy"
        if r.flag(prefix + "use_vllm"):
            mode = r.choice(prefix + "vllm_mode", ("colocate", "server"), "colocate", "TRL's vLLM modes")
            setup["generation"] = "vllm-colocate" if mode == "colocate" else "vllm-server"
            if mode == "colocate":
                util = r.option(prefix + "vllm_gpu_memory_utilization", "vllm_gpu_util")
                if util is not None:
                    setup["vllm_gpu_util"] = util
                if r.has(prefix + "vllm_enable_sleep_mode"):
                    setup["vllm_sleep"] = r.flag(prefix + "vllm_enable_sleep_mode")
            keys.update(vllm_gpu_util=prefix + "vllm_gpu_memory_utilization",
                        vllm_sleep=prefix + "vllm_enable_sleep_mode", generation=prefix + "vllm_mode")
        for key in ("generation_batch_size", "steps_per_generation"):
            if r.has(prefix + key):
                r.note("key-not-honoured", prefix + key, "memfit generates per-device batch x "
                       "gradient_accumulation_steps sequences at once (TRL's default); this value is not read")
    if trainer == "gkd":
        teacher = r.text(prefix + "teacher_model_name_or_path", what="a model name or path")
        if teacher:
            setup["teacher"] = teacher
        keys["teacher"] = prefix + "teacher_model_name_or_path"


def _dpo_loss(value) -> str | None:
    """The DPO loss a loss_type names (a name or a list of them; trl 1.16.0 dpo_config.py:245)."""
    names = value if isinstance(value, list) else [value]
    names = [str(n).strip().lower() for n in names]
    return "ipo" if names == ["ipo"] else ("dpo" if names else None)


def _llamafactory(r: Reader, setup: dict, defaults: list, keys: dict) -> None:
    stage = r.choice("stage", ("pt", "sft", "rm", "ppo", "dpo", "kto"), "sft", "LLaMA-Factory's stages")
    if stage in ("pt", "sft"):
        return
    if stage == "rm":
        r.problem("stage", "rm (reward-model training) is not modelled (memfit models sft, dpo, kto and ppo)")
        return
    keys["trainer"] = "stage"
    if stage == "dpo":
        pref = r.choice("pref_loss", tuple(_LF_PREF), "sigmoid", "LLaMA-Factory's preference losses")
        setup["trainer"] = _LF_PREF.get(pref, "dpo")
        if not r.has("pref_loss"):
            defaults.append("pref_loss not set: LLaMA-Factory's default sigmoid (DPO)")
    else:
        setup["trainer"] = stage
    if stage == "ppo":
        completion = r.option("max_new_tokens", "completion_len")
        if completion is not None:
            setup["completion_len"] = completion
        keys["completion_len"] = "max_new_tokens"
    if r.has("ref_model"):
        setup["ref_model"] = "copy"
        keys["ref_model"] = "ref_model"
    if stage in ("dpo", "kto") and "chunked_ce" not in setup:
        # LLaMA-Factory's own DPO/KTO trainers take the full logits in fp32 (train/dpo/trainer.py
        # concatenated_forward: .logits.to(torch.float32)), not TRL's fused head.
        setup["loss"] = "hf"
