"""`memfit config`: a ready DeepSpeed JSON or accelerate FSDP config for the chosen plan.

The DeepSpeed file is what HF Trainer's `deepspeed=` argument or `accelerate launch --deepspeed_config_file`
takes; bucket sizes use the values HF's integration derives from the hidden size for "auto"
(transformers integrations/deepspeed.py: reduce_bucket_size = h*h, stage3_prefetch_bucket_size = 0.9*h*h,
stage3_param_persistence_threshold = 10*h). The accelerate file is the YAML `accelerate launch --config_file`
reads. Both are validated by the engines' own parsers in the tests.
"""

from __future__ import annotations

import json

from .errors import InvalidSetupError
from .setup import TrainingSetup
from .spec import ModelSpec

ENGINES = ("deepspeed", "accelerate-fsdp")


def _precision_flags(setup: TrainingSetup) -> tuple[bool, bool]:
    fp16 = setup.precision.startswith("fp16")
    return (not fp16 and setup.precision != "fp32"), fp16


def deepspeed_config(spec: ModelSpec, setup: TrainingSetup) -> dict:
    if not setup.shard.startswith("zero"):
        raise InvalidSetupError(f"--engine deepspeed needs --shard zero1|zero2|zero3 (got {setup.shard})")
    h = spec.hidden_size
    bf16, fp16 = _precision_flags(setup)
    zero = {"stage": int(setup.shard[-1]), "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": h * h}
    if setup.shard == "zero3":
        zero.update(stage3_prefetch_bucket_size=int(0.9 * h * h), stage3_param_persistence_threshold=10 * h,
                    stage3_gather_16bit_weights_on_model_save=True)
    if setup.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setup.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # train_batch_size is left for DeepSpeed to derive (micro batch x accumulation x world size at launch).
    config = {
        "train_micro_batch_size_per_gpu": setup.batch_size,
        "gradient_accumulation_steps": setup.grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16},
        "zero_optimization": zero,
    }
    if setup.offload != "none":
        # ZeRO-Offload rejects a client (torch) optimizer unless zero_force_ds_cpu_optimizer is false (deepspeed
        # 0.19.8 runtime/engine.py _configure_optimizer): name AdamW so DeepSpeed builds its CPU Adam. Without
        # offload there is no "optimizer" section and HF Trainer's own optimizer (the --optimizer) is kept.
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto"}}
    return config


def accelerate_fsdp_config(spec: ModelSpec, setup: TrainingSetup) -> dict:
    if setup.shard not in ("fsdp", "fsdp-shard-grad-op", "hsdp"):
        raise InvalidSetupError(f"--engine accelerate-fsdp needs --shard fsdp|fsdp-shard-grad-op|hsdp "
                                f"(got {setup.shard})")
    layer = spec.traits.get("layer")
    if layer is None:
        raise InvalidSetupError(f"no FSDP wrap class known for model_type {spec.model_type!r}")
    bf16, fp16 = _precision_flags(setup)
    fsdp = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": layer,
            "fsdp_offload_params": setup.offload != "none", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_activation_checkpointing": setup.grad_ckpt}
    if setup.shard == "hsdp":
        # Hybrid sharding is FSDP1's HYBRID_SHARD in accelerate's config file.
        fsdp.update(fsdp_version=1, fsdp_sharding_strategy="HYBRID_SHARD", fsdp_use_orig_params=True,
                    fsdp_sync_module_states=True)
    else:
        fsdp.update(fsdp_version=2, fsdp_reshard_after_forward=setup.shard == "fsdp")
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": "bf16" if bf16 else ("fp16" if fp16 else "no"),
        "num_machines": setup.nodes,
        "num_processes": setup.world_size,
        "machine_rank": 0,
        "main_training_function": "main",
        "use_cpu": False,
        "fsdp_config": fsdp,
    }


def render_config(spec: ModelSpec, setup: TrainingSetup, engine: str) -> str:
    if engine == "deepspeed":
        return json.dumps(deepspeed_config(spec, setup), indent=2)
    import yaml

    return yaml.safe_dump(accelerate_fsdp_config(spec, setup), sort_keys=False)
