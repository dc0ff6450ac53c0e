"""The ORPO, CPO/SimPO, GRPO and GKD steps of TRL 1.16.0 on fake tensors: their trainer objects and batches.

`trace/trainers.py` drives the step (build, fake weights, tracker, backward, optimizer); this module gives it, per
trainer, a trainer object whose attributes are the TRL config's defaults and the batch its loss reads, and calls the
trainer's own loss method on it:

- ORPO: ``ORPOTrainer.compute_loss`` (experimental/orpo/orpo_trainer.py:879-901 -> get_batch_loss_metrics :824 ->
  concatenated_forward :745-822: the model's full logits, cross_entropy on the chosen half, get_batch_logps on all).
- CPO and SimPO: ``CPOTrainer.compute_loss`` (experimental/cpo/cpo_trainer.py; SimPO is ``loss_type="simpo"``,
  cpo_config.py:121-136 loss_type sigmoid, cpo_alpha 1.0, simpo_gamma 0.5).
- GRPO: ``GRPOTrainer._compute_loss`` (trainer/grpo_trainer.py:3020-3292) on the prompt + completion ids a
  generation round leaves, through ``_get_per_token_logps_and_entropies`` (:1419-1508) and the fused LM head; with
  beta > 0 the reference log-probs are computed first by the same method under no_grad, as
  ``_generate_and_score_completions`` does (:2634, :2709-2737). Generation itself is not run (its length is data-
  dependent): the trace accounts its KV cache and prefill from the estimate's formula.
- GKD: ``GKDTrainer.compute_loss`` (experimental/gkd/gkd_trainer.py:324-361): the student's and the teacher's full
  logits, then ``generalized_jsd_loss`` (:238-322).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

TRACED = ("orpo", "simpo", "cpo", "grpo", "gkd")


class _CudaLogProbEntropy(torch.autograd.Function):
    """What TRL's Triton ``selective_log_softmax_and_entropy`` allocates on CUDA (trl/kernels/logprob_entropy.py:
    146-246): four fp32 per-row vectors in forward, the logits saved as they are, and in backward one contiguous
    gradient the logits' size and dtype. selective_log_softmax takes it on CUDA for fp16/bf16/fp32 logits
    (trainer/utils.py:510-535, :572-574); the CPU fallback (a gather and a per-row logsumexp) allocates otherwise.
    Triton has no CPU backend, so on fake tensors the kernels' allocations are made and the kernels not run."""

    @staticmethod
    def forward(ctx, logits, index, temperature=1.0, row_mask=None):
        logprobs = torch.empty(logits.shape[:-1], device=logits.device, dtype=torch.float32)
        entropy, log_z, expected_logit = (torch.empty_like(logprobs) for _ in range(3))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, index, log_z, expected_logit)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        logits, _, _, _ = ctx.saved_tensors
        if grad_logprobs is not None:
            grad_logprobs = grad_logprobs.contiguous()
        return torch.empty_like(logits, memory_format=torch.contiguous_format), None, None, None


@contextlib.contextmanager
def cuda_log_softmax():
    """selective_log_softmax takes its CUDA branch (the Triton kernel's allocations), as on a GPU."""
    from trl.trainer import utils

    saved = {name: getattr(utils, name, None) for name in ("is_triton_available", "_supports_trl_loss_kernel",
                                                          "_fused_logprob_entropy")}
    supported = saved["_supports_trl_loss_kernel"]

    def on_cuda(logits, index=None, row_mask=None):
        # trainer/utils.py:510-535 with the device test answered as on a GPU
        return supported(_OnCuda(logits), index if index is None else _OnCuda(index),
                         row_mask if row_mask is None else _OnCuda(row_mask))

    utils.is_triton_available = lambda: True
    utils._supports_trl_loss_kernel = on_cuda
    utils._fused_logprob_entropy = _CudaLogProbEntropy.apply
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(utils, name)
            else:
                setattr(utils, name, value)


class _OnCuda:
    """A tensor's layout facts as _supports_trl_loss_kernel reads them, with the device a GPU's."""

    def __init__(self, t):
        self.device, self.dtype, self.ndim, self.shape = torch.device("cuda"), t.dtype, t.ndim, t.shape
        self._t = t

    def stride(self, dim):
        return self._t.stride(dim)


def _defaults(config) -> dict:
    return {name: f.default for name, f in config.__dataclass_fields__.items() if not callable(f.default_factory)}


class _Accelerator:
    """What the losses ask of accelerate on one process."""
    device = torch.device("cpu")
    num_processes = 1
    process_index = 0
    is_main_process = True
    sync_gradients = False

    def __init__(self, autocast_dtype=None):
        self.autocast_dtype = autocast_dtype

    @staticmethod
    def unwrap_model(m):
        return m

    @staticmethod
    def gather_for_metrics(t):
        return t

    gather = gather_for_metrics

    @staticmethod
    def reduce(t, reduction="sum"):
        return t

    def autocast(self):
        # accelerate 1.16 Accelerator.autocast: an autocast region of the mixed-precision dtype, else nothing
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast_dtype)


def _config_namespace(config, **overrides):
    class _Args:
        pass

    args = _Args()
    for name, value in {**_defaults(config), **overrides}.items():
        setattr(args, name, value)
    args.device = torch.device("cpu")
    return args


def stub(trainer: str, model, ref_model, teacher, autocast_dtype, setup):
    """A TRL trainer object with the attributes its loss reads, set to the TRL config's defaults."""
    acc = _Accelerator(autocast_dtype)
    common = dict(model=model, accelerator=acc, aux_loss_enabled=False,
                  _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0)
    if trainer in ("orpo", "simpo", "cpo"):
        if trainer == "orpo":
            from trl.experimental.orpo import ORPOConfig as config, ORPOTrainer as cls
        else:
            from trl.experimental.cpo import CPOConfig as config, CPOTrainer as cls
        d = _defaults(config)
        attrs = dict(is_encoder_decoder=False, beta=d["beta"], padding_value=0, pad_token_id=0,
                     _peft_has_been_casted_to_bf16=False, args=_config_namespace(config),
                     _stored_metrics=defaultdict(lambda: defaultdict(list)))
        if trainer != "orpo":
            # SimPO is CPO's loss_type "simpo" (cpo_trainer.py:367-368 simpo_gamma); cpo_alpha keeps its default
            attrs.update(loss_type="simpo" if trainer == "simpo" else d["loss_type"], cpo_alpha=d["cpo_alpha"],
                         simpo_gamma=d["simpo_gamma"], label_smoothing=d["label_smoothing"], alpha=d["alpha"])
    elif trainer == "grpo":
        from trl import GRPOConfig as config, GRPOTrainer as cls

        d = _defaults(config)
        # memfit names the reference, not beta: any beta > 0 runs the KL term alike (0.04: ms-swift's default,
        # swift/arguments/rlhf_args.py:355-356); TRL's default 0.0 (grpo_config.py:681) loads no reference
        beta = 0.0 if setup.ref_model == "none" else (d["beta"] or 0.04)
        args = _config_namespace(config, steps_per_generation=setup.grad_accum,
                                 gradient_accumulation_steps=setup.grad_accum, per_device_train_batch_size=setup.batch_size)
        attrs = dict(args=args, ref_model=ref_model, beta=beta, loss_type=d["loss_type"],
                     epsilon_low=d["epsilon"], epsilon_high=d["epsilon_high"] or d["epsilon"],
                     importance_sampling_level=d["importance_sampling_level"],
                     top_entropy_quantile=d["top_entropy_quantile"],
                     off_policy_mask_threshold=d["off_policy_mask_threshold"], use_vllm=False,
                     vllm_importance_sampling_correction=d["vllm_importance_sampling_correction"],
                     current_gradient_accumulation_steps=setup.grad_accum, max_completion_length=setup.completion_len,
                     _entropy_bonus_enabled=False, use_adaptive_entropy=False, temperature=d["temperature"])
    elif trainer == "gkd":
        from trl.experimental.gkd import GKDConfig as config, GKDTrainer as cls

        d = _defaults(config)
        attrs = dict(teacher_model=teacher, beta=d["beta"], temperature=d["temperature"], lmbda=d["lmbda"],
                     args=_config_namespace(config))
    else:
        raise ValueError(trainer)
    obj = cls.__new__(cls)
    for name, value in {**common, **attrs}.items():
        object.__setattr__(obj, name, value)
    return obj


def batch(spec, setup, rows: int, row_tokens: int) -> dict:
    """The collated batch, real tensors (built outside the fake mode)."""
    completion = min(setup.completion_len or row_tokens - 1, row_tokens - 1)
    prompt = row_tokens - completion
    t = setup.trainer
    if t in ("orpo", "simpo", "cpo"):
        pairs = rows // 2
        out = {}
        for side in ("chosen", "rejected"):
            ids = torch.randint(0, spec.vocab_size, (pairs, row_tokens))
            labels = ids.clone()
            labels[:, :prompt] = -100            # tokenize_row: the prompt's labels are label_pad_token_id
            out.update({f"{side}_input_ids": ids, f"{side}_attention_mask": torch.ones(pairs, row_tokens,
                                                                                        dtype=torch.long),
                        f"{side}_labels": labels})
        return out
    if t == "grpo":
        return {"prompt_ids": torch.randint(0, spec.vocab_size, (rows, prompt)),
                "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
                "completion_ids": torch.randint(0, spec.vocab_size, (rows, completion)),
                "completion_mask": torch.ones(rows, completion, dtype=torch.long),
                "advantages": torch.randn(rows),
                "num_items_in_batch": torch.tensor(float(rows * completion * setup.grad_accum))}
    if t == "gkd":
        ids = torch.randint(0, spec.vocab_size, (rows, row_tokens))
        labels = ids.clone()
        labels[:, :prompt] = -100                 # generate_on_policy_outputs / the collator mask the prompt
        return {"input_ids": ids, "attention_mask": torch.ones(rows, row_tokens, dtype=torch.long), "labels": labels}
    raise ValueError(t)


def reference_logps(obj, model, ref_model, inputs: dict) -> torch.Tensor:
    """GRPO's reference log-probs of a generation round, as _generate_and_score_completions computes them
    (grpo_trainer.py:2634 no_grad with checkpointing off, :2709-2737 the ref model or the adapter switched off)."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    with torch.no_grad(), disable_gradient_checkpointing(model, None):
        if ref_model is not None:
            logps, _, _ = type(obj)._get_per_token_logps_and_entropies(obj, ref_model, ids, mask, keep,
                                                                        batch_size=obj.args.per_device_train_batch_size)
        else:
            with use_adapter(model, adapter_name=None):
                logps, _, _ = type(obj)._get_per_token_logps_and_entropies(
                    obj, model, ids, mask, keep, batch_size=obj.args.per_device_train_batch_size)
    return logps


def loss(obj, model, inputs: dict) -> torch.Tensor:
    """The trainer's own loss call, as HF Trainer.training_step makes it."""
    if type(obj).__name__ == "GRPOTrainer":
        return type(obj)._compute_loss(obj, model, inputs)
    return type(obj).compute_loss(obj, model, inputs)
