"""Preference and RL trainers: what a DPO, KTO, ORPO, GRPO, RLOO, PPO or GKD step holds beyond one SFT step.

The physics is read from TRL 1.16.0 (the installed release; research/frontier.md sections 1.1, 2.2, 2.3):

- The policy's training micro-step is an SFT step on other rows (``micro_setup``): DPO, IPO, ORPO, SimPO and CPO
  run chosen and rejected as one concatenated batch (``DataCollatorForPreference``: 2B rows), KTO runs its B
  unpaired rows, GRPO/RLOO/PPO/GKD run B completions of prompt + completion tokens.
- DPO, KTO, GRPO and RLOO patch the model with TRL's fused LM head (trainer/utils.py:1548 add_fused_lm_head,
  dpo_trainer.py:959, kto_trainer.py, grpo_trainer.py:1068): only labelled positions are projected (on CUDA,
  utils.py:1642-1648 compacts ``hidden_states[mask]``), so the loss prices the completion tokens, never B·S·V
  logits.
- The reference model (dpo_trainer.py:908-929): None with PEFT (the same weights, adapter disabled with
  ``use_adapter``, run under ``torch.no_grad``, dpo_trainer.py:1327-1338) or with ``precompute_ref_log_probs``;
  otherwise ``create_model_from_path``: a full second copy in the same dtype and quantization.
- Generation (GRPO, RLOO, PPO, GKD): HF ``generate`` holds a KV cache for prompt + completion of every sequence it
  generates at once; vLLM co-located reserves ``vllm_gpu_memory_utilization`` of the card (sleep mode releases it
  while training: trl/generation/vllm_generation.py:366 ``llm.sleep(level=2)``, :491/:705 ``wake_up``); a vLLM
  server holds nothing on the training GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..spec import ModelSpec

if TYPE_CHECKING:       # setup.py imports this module for its defaults and rules
    from ..setup import TrainingSetup

PAIRED = ("dpo", "ipo", "orpo", "simpo", "cpo")         # chosen + rejected concatenated: 2B rows
REFERENCE_FREE = ("orpo", "simpo", "cpo")               # no reference model at all
PREFERENCE = PAIRED + ("kto",)
ONLINE = ("grpo", "rloo", "ppo", "gkd")                 # they generate their completions
# The trainers that run TRL 1.16's fused LM head (log-probs of the labelled positions only).
FUSED_HEAD = ("dpo", "ipo", "kto", "grpo", "rloo")
# The trainers whose reference log-probs are computed inside the training step (on top of saved activations);
# GRPO/RLOO compute theirs once per generation round (grpo_trainer.py _generate_and_score_completions).
REF_IN_STEP = ("dpo", "ipo", "kto")

# TRL 1.16.0 defaults, each from its config file.
# grpo_config.py:480 num_generations=8, :494 max_completion_length=512, :587 use_vllm=False, :594 vllm_mode
# "colocate", :612 vllm_enable_sleep_mode=False, :656 vllm_gpu_memory_utilization=0.3, :681 beta=0.0;
# rloo_config.py:301 num_generations=2, :315 max_completion_length=512, :502 beta=0.05;
# experimental/gkd/gkd_config.py:74 max_new_tokens=128; dpo_config.py:195, kto_config.py:166,
# experimental/orpo/orpo_config.py:79, experimental/cpo/cpo_config.py:99 max_length=1024.
NUM_GENERATIONS = {"grpo": 8, "rloo": 2, "ppo": 1, "gkd": 1}
COMPLETION_LEN = {"grpo": 512, "rloo": 512, "ppo": 512, "gkd": 128}
PREFERENCE_MAX_LENGTH = 1024
VLLM_GPU_UTIL = 0.3
KL_BETA = {"grpo": 0.0, "rloo": 0.05}     # beta 0: "the reference model is not loaded" (grpo_config.py:681)

# The options only some trainers read (the rest apply to every trainer).
TRAINER_OPTIONS = {
    "ref_model": PREFERENCE + ("grpo", "rloo", "ppo"),
    "prompt_len": PREFERENCE + ONLINE,
    "completion_len": PREFERENCE + ONLINE,
    "num_generations": ("grpo", "rloo"),
    "generation": ONLINE,
    "vllm_gpu_util": ONLINE,
    "vllm_sleep": ONLINE,
    "teacher": ("gkd",),
}
TRAINER_FIELDS = ("trainer",) + tuple(TRAINER_OPTIONS)
TRAINER_OPTIONS_KEYS = tuple(TRAINER_OPTIONS)


def default_ref_model(trainer: str, method: str) -> str:
    """TRL's own choice when no reference is named (dpo_trainer.py:908-929; GRPO's beta=0 loads none)."""
    if trainer in REFERENCE_FREE or trainer in ("sft", "gkd") or KL_BETA.get(trainer, 1.0) == 0.0:
        return "none"
    return "adapter-off" if method in ("lora", "qlora") else "copy"


def resolve(given: dict, values: dict) -> None:
    """Fill the trainer options the caller left out with TRL 1.16's defaults for the trainer (in place)."""
    trainer = values["trainer"]
    if trainer == "sft":
        for name in TRAINER_OPTIONS:
            values[name] = given.get(name)
        return
    if values["recipe"] == "hf" and "grad_ckpt" not in given:
        # These are TRL's trainers: trl 1.16.0 trainer/base_config.py:62-63 gradient_checkpointing=True (every
        # TRL config inherits it, since v0.22.0, huggingface/trl#3510); the hf recipe's False is transformers'.
        values["grad_ckpt"] = True
    if trainer in PREFERENCE and "seq_len" not in given:
        values["seq_len"] = PREFERENCE_MAX_LENGTH if "prompt_len" not in given or "completion_len" not in given \
            else given["prompt_len"] + given["completion_len"]
    if trainer in ONLINE:
        completion = given.get("completion_len", COMPLETION_LEN[trainer])
        values["completion_len"] = completion
        if "seq_len" not in given and "prompt_len" in given:
            values["seq_len"] = given["prompt_len"] + completion
        values["generation"] = given.get("generation", "hf")
        values["vllm_gpu_util"] = given.get("vllm_gpu_util", VLLM_GPU_UTIL)
        values["vllm_sleep"] = given.get("vllm_sleep", False)
    else:
        for name in ("generation", "vllm_gpu_util", "vllm_sleep"):
            values[name] = given.get(name)
    # A derived prompt of no tokens is left unset: problems() says the completion fills the row.
    if "prompt_len" not in given and values.get("completion_len") and trainer in ONLINE:
        rest = values["seq_len"] - values["completion_len"]
        values["prompt_len"] = rest if rest >= 1 else None
    elif trainer in PREFERENCE and "prompt_len" not in given and "completion_len" in given:
        rest = values["seq_len"] - given["completion_len"]
        values["prompt_len"] = rest if rest >= 1 else None
    else:
        values["prompt_len"] = given.get("prompt_len")
    if trainer in PREFERENCE:
        rest = values["seq_len"] - values["prompt_len"] if values["prompt_len"] else 0
        values["completion_len"] = given.get("completion_len", rest if rest >= 1 else None)
    values["num_generations"] = given.get("num_generations", NUM_GENERATIONS.get(trainer)) \
        if trainer in ("grpo", "rloo") else given.get("num_generations")
    values["ref_model"] = given.get("ref_model", "auto")
    if values["ref_model"] == "auto":
        values["ref_model"] = default_ref_model(trainer, values["method"])
    values["teacher"] = given.get("teacher")
    if "loss" not in given and "chunked_ce" not in given and values["recipe"] != "mlx":
        # add_fused_lm_head is unconditional in DPO/KTO/GRPO/RLOO; TRL's experimental ORPO/CPO
        # (orpo_trainer.py:777-800 concatenated_forward) and GKD (gkd_trainer.py:326-349) take the model's full
        # logits and run cross_entropy / log_softmax on them in their dtype.
        values["loss"] = "trl-fused-head" if trainer in FUSED_HEAD else "plain"


def problems(setup: TrainingSetup) -> list:
    """The combinations no trainer can run, each one line naming its options."""
    from ..errors import Problem

    p = []
    t = setup.trainer
    for name, trainers in TRAINER_OPTIONS.items():
        if name in setup.explicit and t not in trainers:
            p.append(Problem(name, f"{{{name}}} does not apply to {{trainer}} {t} (it applies to "
                                   f"{', '.join(trainers)})"))
    if p or t == "sft":
        return p
    if setup.recipe == "mlx":
        p.append(Problem("trainer", f"{{trainer}} {t} is modelled for TRL's PyTorch trainers; the mlx recipe "
                                    "models mlx-lm's SFT step only (give {recipe} trl or hf for a PyTorch run)"))
    if t in REFERENCE_FREE and setup.ref_model != "none":
        p.append(Problem("ref_model", f"{t} has no reference model: {{ref_model}} {setup.ref_model} does not apply "
                                      "(use none, or dpo for a reference)"))
    if setup.ref_model == "adapter-off" and setup.method == "full":
        p.append(Problem("ref_model", "{ref_model} adapter-off needs an adapter: use {method} lora or qlora, or "
                                      "copy or precomputed with full fine-tuning"))
    if setup.ref_model == "precomputed" and t not in ("dpo", "ipo", "kto"):
        p.append(Problem("ref_model", f"{{ref_model}} precomputed is a DPO/KTO option (precompute_ref_log_probs); "
                                      f"{t} scores fresh completions every step"))
    if t in ("grpo", "rloo") and (setup.batch_size * setup.world_size * setup.grad_accum) % setup.num_generations:
        # grpo_config.py __post_init__ refuses a generation batch (per-device batch x processes x
        # steps_per_generation) that is not a multiple of num_generations
        p.append(Problem("num_generations", f"{{batch_size}} x GPUs x {{grad_accum}} must be a multiple of "
                                            f"{{num_generations}} ({setup.num_generations}): each prompt's "
                                            "completions are generated together"))
    if t in ONLINE or setup.prompt_len is not None or setup.completion_len is not None:
        total = setup.seq_len
        if setup.prompt_len is not None and setup.prompt_len >= total:
            p.append(Problem("prompt_len", f"{{prompt_len}} {setup.prompt_len} leaves no completion in a row of {total} "
                                           "tokens ({seq_len})"))
        elif setup.completion_len is not None and setup.completion_len >= total:
            p.append(Problem("completion_len", f"{{completion_len}} {setup.completion_len} leaves no prompt in a "
                                               f"row of {total} tokens ({{seq_len}}): give {{prompt_len}} or a longer "
                                               "{seq_len}"))
        elif setup.prompt_len is not None and setup.completion_len is not None and \
                setup.prompt_len + setup.completion_len != total:
            p.append(Problem("prompt_len", f"{{prompt_len}} {setup.prompt_len} + {{completion_len}} "
                                           f"{setup.completion_len} must equal {{seq_len}} {total} (the row); give two "
                                           "of the three"))
    if t == "kto" and setup.batch_size < 2:
        # kto_trainer.py: the KL term mismatches completions within the batch (collator cycles them by one)
        p.append(Problem("batch_size", "KTO needs {batch_size} 2 or more: its KL term pairs each prompt with "
                                       "another row's completion"))
    if t == "gkd" and not setup.teacher:
        p.append(Problem("teacher", "GKD distils from a teacher: give {teacher} (a catalog name, Hugging Face id or "
                                    "config.json)"))
    if setup.generation != "vllm-colocate" and t in ONLINE and \
            ({"vllm_gpu_util", "vllm_sleep"} & setup.explicit):
        p.append(Problem("vllm_gpu_util", "{vllm_gpu_util} and {vllm_sleep} apply to {generation} vllm-colocate "
                                          f"(generation is {setup.generation})"))
    if setup.vllm_gpu_util is not None and setup.vllm_gpu_util <= 0:
        p.append(Problem("vllm_gpu_util", "{vllm_gpu_util} must be above 0 (a fraction of the card)"))
    return [x for x in p if x is not None]


# ---- shapes ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    rows: int              # rows in the policy's training micro-step
    row_tokens: int        # tokens per row (prompt + completion)
    scored_tokens: int     # labelled positions the loss projects (the fused head's compact path)
    generated_rows: int    # sequences generated at once per GPU (0: no generation)


def shape(setup: TrainingSetup) -> Shape:
    t, b, s = setup.trainer, setup.batch_size, setup.seq_len
    rows = 2 * b if t in PAIRED else b
    completion = setup.completion_len if setup.completion_len is not None else s - 1
    scored = rows * min(completion, s - 1)
    generated = 0
    if t in ("grpo", "rloo"):
        # generation_batch_size = per_device_train_batch_size * steps_per_generation per process, and
        # steps_per_generation defaults to gradient_accumulation_steps (grpo_config.py:521-531)
        generated = b * setup.grad_accum
    elif t in ("ppo", "gkd"):
        generated = b
    return Shape(rows=rows, row_tokens=s, scored_tokens=scored, generated_rows=generated)


def micro_setup(setup: TrainingSetup) -> TrainingSetup:
    """The policy's training micro-step as the SFT step memfit already prices: the same options, the trainer's
    rows. (Only the options that apply to the method are passed, so nothing is refused.)"""
    if setup.trainer == "sft":
        return setup
    from ..options import BY_NAME, SETUP_FIELDS
    from ..setup import TrainingSetup

    values = {}
    for name in SETUP_FIELDS:
        if name in TRAINER_FIELDS:
            continue
        methods = BY_NAME[name].methods
        if methods and setup.method not in methods:
            continue
        if name in ("chunked_ce", "ckpt_offload", "ckpt_reentrant", "autocast", "shard", "galore_rank", "apollo_rank",
                    "muon_params") and name not in setup.explicit:
            continue     # derived from the others exactly as before
        values[name] = getattr(setup, name)
    values["batch_size"] = shape(setup).rows
    values["chunked_ce"] = None
    return TrainingSetup(**values)


# ---- the loss of TRL's experimental ORPO / CPO / SimPO -----------------------------------------------------------
def concatenated_logits_loss(spec: ModelSpec, setup: TrainingSetup, stack):
    """What ORPOTrainer/CPOTrainer.concatenated_forward hold (trl 1.16.0 experimental/orpo/orpo_trainer.py:745-822,
    experimental/cpo/cpo_trainer.py concatenated_forward; cpo_alpha 1.0 by default, so SimPO too), for their
    default plain loss; None for any other trainer or loss.

    The model's full logits over the 2B rows (fp32 under mixed precision: accelerate's convert_outputs_to_fp32 of
    the bf16 output) stay saved by the log-prob kernel (get_batch_logps -> selective_log_softmax, on CUDA TRL's
    Triton kernel, trainer/utils.py:572-574, which saves its logits, kernels/logprob_entropy.py:192); the chosen
    half's NLL (cross_entropy_loss, :779-791) saves its log-softmax and, while it runs, a contiguous copy of the
    shifted half. In backward the kernel's gradient (one logits-sized buffer, logprob_entropy.py:208) is sliced
    back into a zero buffer of the full logits ([:, :-1] SliceBackward), the NLL's gradient is sliced back twice
    ([..., :-1] then [:B]), and the two full-size gradients are summed: three full logits buffers at once on fake
    tensors. (Autograd sums in place when it owns an operand alone, torch input_buffer.cpp can_accumulate_inplace,
    which fake tensors never are: a GPU run's backward likely peaks one full logits buffer lower, at the kernel's
    gradient beside the saved tensors. This is the trace's count, an upper bound.)"""
    from .loss import LossMemory

    if setup.trainer not in REFERENCE_FREE or setup.loss != "plain":
        return None
    sh = shape(setup)
    full = sh.rows * sh.row_tokens * spec.vocab_size
    chosen = (sh.rows // 2) * (sh.row_tokens - 1) * spec.vocab_size
    d = 4 if stack.autocast else stack.logits_bytes        # the logits' dtype at the loss
    saved = d * full + d * chosen
    converting = stack.logits_bytes * full - d * chosen if stack.autocast else 0   # bf16 output + its fp32 copy
    return LossMemory(saved=saved, forward_extra=max(d * chosen, converting), backward_extra=3 * d * full - saved,
                      note=f"{setup.trainer}: the full logits of the concatenated pair (TRL concatenated_forward), "
                           "the chosen half's cross-entropy and the log-prob kernel on all rows")


# ---- components -----------------------------------------------------------------------------------------------
def kv_cache_bytes(spec: ModelSpec, sequences: int, tokens: int, element_bytes: int) -> int:
    """HF generate's DynamicCache: K and V of every layer for every position of every sequence
    (transformers cache_utils.py DynamicLayer.update concatenates [batch, kv_heads, positions, head_dim])."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * tokens * sequences * element_bytes


def hf_generation_parts(spec: ModelSpec, setup: TrainingSetup, element_bytes: int) -> dict:
    """HF generate's memory beyond the model's state: the KV cache of every sequence generated at once and one
    layer's no-grad working set over the prompts at the prefill (the trace accounts generation from this too)."""
    sh = shape(setup)
    prompt = setup.prompt_len or (setup.seq_len - (setup.completion_len or 0))
    return {"generation KV cache": kv_cache_bytes(spec, sh.generated_rows, sh.row_tokens, element_bytes),
            "generation prefill": no_grad_layer_bytes(spec, sh.generated_rows * prompt, element_bytes)}


def no_grad_layer_bytes(spec: ModelSpec, tokens: int, element_bytes: int) -> int:
    """The largest working set of one decoder layer run under torch.no_grad on `tokens` tokens: the layer's input
    (held by the model's loop), the residual and the normed input, and in a gated MLP act(gate), up and their
    product alive at once (transformers LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)))."""
    width = spec.experts_per_token * spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size
    mlp = (3 if spec.mlp_kind == "gated" else 2) * width
    attention = 2 * spec.hidden_size + 2 * spec.num_heads * spec.head_dim + 4 * spec.kv_dim
    return tokens * element_bytes * (3 * spec.hidden_size + max(mlp, attention - spec.hidden_size))


def trainer_phases(spec: ModelSpec, setup: TrainingSetup, micro: TrainingSetup, static: dict, parts: dict,
                   phases: dict, card_bytes: int | None, teacher: ModelSpec | None) -> tuple[dict, dict, list]:
    """The SFT micro-step's phases with the trainer's components added, their notes and the assumptions."""
    from .loss import loss_memory

    stack = static["stack"]
    sh = shape(setup)
    t = setup.trainer
    cb = stack.compute_bytes
    notes: dict[str, str] = {}
    out: list[str] = [f"trainer {t}: {_rows_words(setup, sh)}"]
    phases = {name: dict(parts_) for name, parts_ in phases.items()}
    state_names = ("weights", "quantization constants", "adapter weights", "master weights", "optimizer state",
                   "gathered parameters", "communication buffers", "cuBLAS workspace")
    state = {k: v for k, v in phases["optimizer step"].items() if k in state_names}

    def add_everywhere(name: str, nbytes: int, note: str) -> None:
        notes[name] = note
        for parts_ in phases.values():
            parts_[name] = nbytes

    # The reference model.
    ref = setup.ref_model
    if ref == "copy":
        weights = static["weights"] + static["quant"]
        if setup.shard in ("zero3", "fsdp", "hsdp"):
            # dpo_trainer.py:984-990: the reference goes through prepare_deepspeed / prepare_fsdp: sharded alike
            weights //= setup.shard_degree
        add_everywhere("reference model", weights, "a second copy of the frozen weights in the same dtype and "
                       "quantization (TRL create_model_from_path, dpo_trainer.py:916-927)")
    ref_layer = no_grad_layer_bytes(spec, sh.rows * sh.row_tokens, cb)
    ref_head = loss_memory(spec, micro, stack, tokens=sh.scored_tokens)
    ref_transient = max(ref_layer, ref_head.saved + ref_head.forward_extra)
    if ref in ("copy", "adapter-off"):
        how = "the adapter disabled (peft use_adapter)" if ref == "adapter-off" else "the reference copy"
        notes["reference forward"] = (f"no-grad forward of {how} on {sh.rows} rows: one layer's working set or the "
                                      "fused head's tiles, whichever is larger")
        if t in REF_IN_STEP:
            # dpo_trainer.py:1318-1340: after the policy forward, before backward: its saved tensors are alive.
            # The policy's loss forward transients (its tiles) are gone; what it saved for backward stays.
            fwd = dict(phases["forward (end)"], **{"logits and loss": parts["loss"].saved})
            phases["reference forward"] = {**fwd, "reference forward": ref_transient}
        else:
            # GRPO/RLOO: the reference log-probs are computed with the completions, before the training micro-steps.
            phases["reference forward"] = {**state, "reference forward": ref_transient}
        out.append(f"reference model: {ref}" + (" (weights held all the time)" if ref == "copy" else
                                                " (same weights, no extra copy)"))
    elif ref == "precomputed":
        out.append("reference log-probs precomputed before training (precompute_ref_log_probs): a forward-only pre-pass "
                   "at precompute_ref_batch_size, nothing during training")
    elif t != "sft" and t not in ("gkd",):
        out.append(f"no reference model ({'reference-free loss' if t in REFERENCE_FREE else 'beta 0'})")

    if t == "kto":
        out.append("KTO's KL pass (mismatched completions) runs under no_grad before the policy forward; its "
                   "reference KL pass rides with the reference forward")
    if t in REFERENCE_FREE:
        out.append(f"{t}: the concatenated pair's full logits (TRL's experimental "
                   f"{'ORPOTrainer' if t == 'orpo' else 'CPOTrainer'}.concatenated_forward), traced by memfit trace")

    # PPO: a reward model (frozen) and a value model (trained like the policy: weights, adapter, grads, state).
    if t == "ppo":
        reward = static["weights"] + static["quant"]
        value = reward + static["adapter"] + static["grads"] + static["opt"]
        add_everywhere("reward model", reward, "the frozen reward model: the same architecture, weights as loaded")
        add_everywhere("value model", value, "the value model trained with the policy: weights, adapter, gradients "
                       "and optimizer state of a second model of this architecture")
        out.append("PPO: reward and value models of the policy's architecture, none sharing the policy's weights")

    # GKD: the teacher's weights and logits, and the JSD on full logits.
    if t == "gkd" and teacher is not None and teacher.vocab_size != spec.vocab_size:
        from ..errors import InvalidSetupError

        # trl 1.16.0 experimental/gkd/gkd_trainer.py:176-185 refuses it: the JSD compares full distributions
        raise InvalidSetupError(f"GKD needs a teacher with the student's vocabulary: {teacher.name} has "
                                f"{teacher.vocab_size} tokens, {spec.name} {spec.vocab_size} (TRL refuses it)")
    if t == "gkd" and teacher is not None:
        teacher_weights = teacher.params * _dtype_bytes(teacher.checkpoint_dtype)
        add_everywhere("teacher model", teacher_weights, f"teacher {teacher.name} weights in its checkpoint dtype "
                       f"({teacher.checkpoint_dtype}; gkd_trainer.py:159-175 dtype auto)")
        jsd = gkd_loss_bytes(spec, setup, stack)
        fwd = {k: v for k, v in phases["forward (end)"].items() if k != "logits and loss"}
        phases["teacher forward and JSD loss"] = {**fwd, "teacher logits and JSD": jsd}
        notes["teacher logits and JSD"] = ("student and teacher logits, then generalized_jsd_loss on full B x S x V "
                                           "logits (gkd_trainer.py:238-361)")
        out.append(f"GKD: teacher {teacher.name}; full logits of student and teacher for the JSD")

    # Generation.
    if sh.generated_rows:
        gen = setup.generation
        if gen == "hf":
            hf = hf_generation_parts(spec, setup, cb)
            kv, prefill = hf["generation KV cache"], hf["generation prefill"]
            notes["generation KV cache"] = (f"HF generate: K and V of {spec.num_layers} layers for {sh.generated_rows} "
                                           f"sequences of {sh.row_tokens} tokens (2·L·kv_heads·head_dim·tokens·"
                                           f"sequences·{cb} B)")
            notes["generation prefill"] = "one layer's no-grad working set over the prompts at the prefill"
            phases["generation"] = {**state, "generation KV cache": kv, "generation prefill": prefill}
            out.append(f"generation with HF generate: {sh.generated_rows} sequences at once "
                       "(per-device batch x steps_per_generation), accounted from its formula (not traceable)")
        elif gen == "vllm-colocate":
            util = setup.vllm_gpu_util
            if card_bytes:
                reserve = int(util * card_bytes)
                note = (f"vLLM gpu_memory_utilization {util} x the card's {card_bytes / 2**30:.1f} GiB: its weights, "
                        "activations and KV cache (trl/generation/vllm_generation.py)")
                if setup.vllm_sleep:
                    notes["vLLM reservation"] = note + "; asleep (level 2) while the trainer runs"
                    phases["generation"] = {**state, "vLLM reservation": reserve}
                else:
                    add_everywhere("vLLM reservation", reserve, note)
                need = spec.params * 2 + kv_cache_bytes(spec, sh.generated_rows, sh.row_tokens, 2)
                if need > reserve:
                    out.append(f"vLLM's share ({reserve / 2**30:.2f} GiB) is below its 16-bit weights + the KV cache "
                               f"of {sh.generated_rows} full-length sequences ({need / 2**30:.2f} GiB): vLLM refuses "
                               "to start without room for cache blocks, or generates fewer sequences at once")
                out.append(f"vLLM co-located: {util:g} of the card" + (
                    ", sleep mode: the peak is the larger of training and generation" if setup.vllm_sleep else
                    ", held through training (no sleep mode)"))
            else:
                out.append(f"vLLM co-located reserves {util:g} of the card: give a GPU (--gpu or --memory) to include "
                           "it; not counted here")
        else:
            server = spec.params * 2 + kv_cache_bytes(spec, sh.generated_rows, sh.row_tokens, 2)
            out.append(f"vLLM server on other GPUs: nothing for generation on this GPU; the server GPU needs at least "
                       f"{server / 2**30:.2f} GiB (16-bit weights + KV cache of {sh.generated_rows} sequences) "
                       "within its own gpu_memory_utilization")
    return phases, notes, out


def gkd_loss_bytes(spec: ModelSpec, setup: TrainingSetup, stack) -> int:
    """The logits and generalized JSD of GKDTrainer.compute_loss at their peak, the end of the loss forward
    (trl 1.16.0 experimental/gkd/gkd_trainer.py:324-361 and :238-322, beta 0.5, gkd_config.py:66-67).

    Student and teacher return full logits (fp32 under mixed precision: accelerate wraps both forwards with
    convert_outputs_to_fp32; the teacher is prepared the same way, gkd_trainer.py:194). Over the S-1 shifted
    positions the function keeps, until it returns: both logits divided by the temperature (2), both log-softmaxes
    (2), the stacked pair for the mixture (2, saved by logsumexp) and the mixture (1), kl_div's saved exp(target)
    of each side (2) and the student side's (target - input) (1), the two KL outputs (2), their beta-weighted
    copies (2) and their sum (1): 15 tensors of B x (S-1) x V."""
    sh = shape(setup)
    d = 4 if stack.autocast else stack.logits_bytes
    full = sh.rows * sh.row_tokens * spec.vocab_size
    shifted = sh.rows * (sh.row_tokens - 1) * spec.vocab_size
    return d * (2 * full + 15 * shifted)


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def _rows_words(setup: TrainingSetup, sh: Shape) -> str:
    t = setup.trainer
    words = (f"{sh.rows} rows of {sh.row_tokens} tokens in the training micro-step"
             + (" (chosen + rejected concatenated)" if t in PAIRED else "")
             + (f", {setup.num_generations} completions per prompt" if t in ("grpo", "rloo") else ""))
    if setup.completion_len is None and t in PREFERENCE:
        words += "; no prompt length given: every position after the first is scored (an upper bound)"
    else:
        words += f"; {sh.scored_tokens} completion tokens scored"
    return words
