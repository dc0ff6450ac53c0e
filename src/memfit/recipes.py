"""Recipe presets: the defaults each training stack really uses, with where each default comes from.

A recipe decides what the user did not: the dtype the model is loaded in, whether the trainer wraps the forward
in autocast, the optimizer implementation, checkpointing, the LoRA defaults, how the loss is computed. What the
user sets always wins (TrainingSetup resolves the rest through ``Recipe.default``). Sources are cited per field
in ``sources``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import InvalidSetupError
from .options import ALL_TARGETS, OPTIMIZERS

# The setup options a recipe gives a default for (the rest come from the options table).
RECIPE_FIELDS = ("precision", "optimizer", "grad_ckpt", "attn", "lora_rank", "lora_targets", "lora_dropout", "quant",
                 "loss", "adapter_fp32")
# Every option whose default depends on the recipe or the method (setup.py resolves some of them from others).
RECIPE_DECIDED = RECIPE_FIELDS + ("chunked_ce", "optimizer_in_backward", "autocast", "ckpt_offload", "ckpt_reentrant",
                                  "kbit_upcast", "shard", "train_layers")
# The loss kernels that never hold the full B x S x V logits: `chunked_ce` is true exactly for these.
CHUNKED_LOSSES = ("chunked", "liger", "unsloth", "trl-chunked-nll", "trl-fused-head")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    precision: str                 # "auto" = the checkpoint's dtype (transformers v5 dtype="auto")
    autocast: bool                 # trainer wraps forward in torch.autocast when weights are 16-bit
    optimizer: str
    grad_ckpt: bool
    attn: str
    lora_rank: int
    lora_targets: tuple[str, ...]
    lora_dropout: float
    adapter_fp32: bool             # LoRA weights upcast to fp32 (PEFT autocast_adapter_dtype=True)
    loss: str                      # the loss kernel this stack runs by default (options.LOSSES)
    fp32_logits_copy: bool         # accelerate's convert_outputs_to_fp32 under autocast
    chunked_loss: str = "liger"    # what `--chunked-ce` picks here (the stack's own chunked or fused loss)
    plain_loss: str = "hf"         # what `--no-chunked-ce` picks here
    chunked_kind: str = "chunked-fp32"   # how `--loss chunked` runs here (physics/loss.py)
    keeps_logits: bool = False     # the training loop holds the logits through backward (plain loss)
    quant: str = "nf4-dq"
    ckpt_offload: bool = False     # checkpoints kept in host memory (unsloth's offloaded checkpointing)
    ckpt_reentrant: bool = False   # torch.utils.checkpoint use_reentrant=True (when checkpointing)
    fused_norm: bool = False       # norms are fused kernels that save only their input (MLX, Liger, Unsloth)
    bnb4_saves_input: bool = False  # bitsandbytes < 0.43.2: MatMul4Bit keeps each 4-bit linear's input (quantized_base)
    # LitGPT (physics/litgpt.py): Fabric hands the loop fp32 logits; the loop's `logits` outlives the step into
    # the next forward; Lightning's bitsandbytes plugin quantizes lm_head too, from fp16; k and v are repeated to
    # every head before SDPA; LoRA on part of the fused qkv pads its output with an index_copy that saves it; GELU
    # MLPs call F.gelu (one saved tensor).
    fabric_fp32_output: bool = False
    keeps_previous_logits: bool = False
    quantizes_head: bool = False
    repeats_kv: str = ""             # "grouped" (GQA only) or "grouped+mqa"
    lora_qkv_zero_pad: bool = False
    fused_gelu: bool = False
    defaults: dict = field(default_factory=dict)         # other setup options this stack sets (mlx: batch 4)
    full_overrides: dict = field(default_factory=dict)   # defaults that differ for full fine-tuning
    qlora_overrides: dict = field(default_factory=dict)  # defaults that differ for QLoRA
    # Stacks that build their own model code (LitGPT) change the architecture facts that matter for memory.
    arch_overrides: dict = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    optimizers: tuple[str, ...] = tuple(OPTIMIZERS)   # what the stack can instantiate
    methods: tuple[str, ...] = ("full", "lora", "qlora")   # what the stack can train (megatron: full only)

    def default(self, name: str, method: str):
        """This stack's default for setup option `name` with `method`, or None where it has none."""
        if method == "qlora" and name in self.qlora_overrides:
            return self.qlora_overrides[name]
        if method == "full" and name in self.full_overrides:
            return self.full_overrides[name]
        if name in self.defaults:
            return self.defaults[name]
        if name in RECIPE_FIELDS or name == "ckpt_reentrant":
            return getattr(self, name)
        if name == "chunked_ce":
            return self.default("loss", method) in CHUNKED_LOSSES
        return None

    def loss_for(self, chunked: bool) -> str:
        """The loss `--chunked-ce` (True) or `--no-chunked-ce` (False) means in this stack."""
        return self.chunked_loss if chunked else self.plain_loss


_PEFT_LORA = ("LoraConfig defaults r=8, lora_dropout=0.0, q_proj/v_proj for Llama-style models: peft 0.21.2 "
              "src/peft/tuners/lora/config.py and utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING")
_PEFT_FP32 = "fp32 adapters: PEFT autocast_adapter_dtype=True (huggingface/peft#1706)"
_HF_TRAINER = ("transformers 5.24.0 training_args.py:806-811 default optim adamw_torch_fused for torch >= 2.8; "
               ":926 gradient_checkpointing default False; bf16=True (set by the user) is autocast with no master "
               "copy: accelerate 1.16 accelerator.py prepare_model")
_HF_LOSS = "transformers 5.24.0 loss/loss_utils.py:61 ForCausalLMLoss upcasts the logits: logits = logits.float()"
_TRL_BASE = ("trl 1.16.0 trainer/base_config.py:62-63 gradient_checkpointing default True (since v0.22.0, "
             "huggingface/trl#3510); :108 bf16 = not fp16 when unset")

RECIPES: dict[str, Recipe] = {
    "hf": Recipe(
        name="hf", description="transformers v5 Trainer with PEFT, bf16=True",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        qlora_overrides={"grad_ckpt": True},
        sources=("dtype='auto' default: huggingface/transformers#42805 (modeling_utils.py)", _HF_TRAINER, _PEFT_LORA,
                 _PEFT_FP32, _HF_LOSS,
                 "QLoRA enables gradient checkpointing: peft prepare_model_for_kbit_training "
                 "(use_gradient_checkpointing=True) and TRL >= 0.22's own k-bit preparation",
                 "--chunked-ce means Liger's fused linear cross-entropy (Trainer use_liger_kernel=True)")),
    "trl": Recipe(
        name="trl", description="TRL 1.16 SFTTrainer (fused LM head loss, gradient checkpointing on) with PEFT",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="trl-fused-head",
        fp32_logits_copy=True, chunked_loss="trl-fused-head",
        sources=(_TRL_BASE,
                 "trl 1.16.0 trainer/sft_config.py:283-289 loss_type default 'nll', :314-321 'chunked_nll' a deprecated "
                 "alias of it; trainer/sft_trainer.py:1142-1147 add_fused_lm_head on every SFTTrainer (since 1.15.0; "
                 "1.14.0 still has chunked_nll)",
                 "trl 1.16.0 trainer/utils.py:1506 _CHUNKED_LOGPROB_CHUNK_SIZE = 32768 (vocab tile), "
                 "kernels/chunked_logprob.py:31 TOKEN_CHUNK_SIZE = 4096, :347 and :413 one tile buffer, :406-412 fp32 grad accumulators, :456 cast back",
                 "trl >= 0.22 no longer calls prepare_model_for_kbit_training (no fp32 upcast)", _HF_TRAINER,
                 _PEFT_LORA, _PEFT_FP32)),
    "trl-1.14": Recipe(
        name="trl-1.14", description="TRL 1.7-1.14 SFTTrainer (loss_type chunked_nll, gradient checkpointing on)",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="trl-chunked-nll",
        fp32_logits_copy=True, chunked_loss="trl-chunked-nll",
        sources=("huggingface/trl@f2cd577 (1.10.0.dev0) trainer/sft_config.py:107-114,283,334-336 loss_type defaults to "
                 "chunked_nll (default since v1.7.0, huggingface/trl#5846; the same code through 1.14.0)",
                 "huggingface/trl@f2cd577 trainer/sft_trainer.py:86 _CHUNKED_LM_HEAD_CHUNK_SIZE = 256; :99-114 "
                 "_chunk: logits = h.float() @ w.float().t(), log_softmax, nll_loss, entropy, under "
                 "torch.utils.checkpoint; :202-203 valid tokens reordered to the front (hidden[order])",
                 "trl 0.22+ base_config.py gradient_checkpointing default True (huggingface/trl#3510)", _PEFT_LORA,
                 _PEFT_FP32)),
    "trl-0.21": Recipe(
        name="trl-0.21", description="TRL <= 0.21 SFTTrainer (HF loss, no checkpointing by default; QLoRA through "
                                     "peft prepare_model_for_kbit_training)",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        qlora_overrides={"grad_ckpt": True, "kbit_upcast": True},
        sources=("trl 0.21 sft_config.py inherits TrainingArguments.gradient_checkpointing=False; True from v0.22.0 "
                 "(huggingface/trl commit a222aeb, #3510)",
                 "trl 0.21 sft_trainer.py calls peft prepare_model_for_kbit_training for k-bit models: fp32 upcast of "
                 "non-quantized params (peft src/peft/utils/other.py) and use_gradient_checkpointing=True",
                 _HF_LOSS, _PEFT_LORA, _PEFT_FP32)),
    "torchtune": Recipe(
        name="torchtune", description="torchtune 0.7 single-device recipes (lora_finetune_single_device)",
        precision="bf16", autocast=False, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v", "o", "gate", "up", "down"), lora_dropout=0.0, adapter_fp32=False,
        loss="chunked", fp32_logits_copy=False, chunked_loss="chunked",
        full_overrides={"optimizer": "paged-adamw-8bit", "optimizer_in_backward": True},
        sources=("pytorch/torchtune@bd2a0fc (0.7.0) recipes/configs/llama3_1/8B_lora_single_device.yaml:24-29 "
                 "lora_attn_modules q/v/output_proj, apply_lora_to_mlp, rank 8, dropout 0.0; :61-65 torch AdamW "
                 "fused=True; :71 LinearCrossEntropyLoss; :90 dtype bf16; :93 enable_activation_checkpointing True",
                 "8B_full_single_device.yaml:59-60 bitsandbytes PagedAdamW8bit, :66 optimizer_in_bwd True",
                 "torchtune/modules/loss/cross_entropy_loss.py:19-180 LinearCrossEntropyLoss: 8 chunks "
                 "(num_output_chunks), ignored tokens masked out, each chunk's logits.float() then cross_entropy")),
    "litgpt": Recipe(
        name="litgpt", description="LitGPT finetune (bf16-true precision)",
        precision="bf16", autocast=False, optimizer="adamw", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.05, adapter_fp32=False,
        loss="chunked", fp32_logits_copy=False, quant="nf4", chunked_loss="chunked", plain_loss="plain",
        chunked_kind="chunked-kept", keeps_logits=True,
        arch_overrides={"tied_embeddings": False, "fused_qkv": True, "norm_style": "gemma"},
        fabric_fp32_output=True, keeps_previous_logits=True, quantizes_head=True, repeats_kv="grouped+mqa",
        lora_qkv_zero_pad=True, fused_gelu=True,
        sources=("LitGPT builds its own model (litgpt/model.py): an untied lm_head always, one fused qkv linear, "
                 "RMSNorm computed in fp32 with the weight applied before the cast back",
                 "litgpt/finetune/lora.py: precision bf16-true, lm_head_chunk_size=128, chunked_cross_entropy",
                 "litgpt/finetune/full.py fit(): `logits = model(input_ids)` stays in scope through fabric.backward, "
                 "so without chunking the bf16 logits live beside the saved log-softmax",
                 "litgpt/lora.py Config defaults: lora_r 8, lora_query/lora_value True, lora_dropout 0.05",
                 "torch.optim.AdamW without flags: foreach on CUDA (torch/optim/optimizer.py)",
                 "physics/litgpt.py: Fabric's fp32 outputs, the loop's kept logits, the quantized lm_head, repeated "
                 "k/v, the LoRA zero_pad save, F.gelu (each cited there)")),
    "unsloth": Recipe(
        name="unsloth", description="Unsloth FastLanguageModel + TRL SFTTrainer",
        precision="auto", autocast=True, optimizer="adamw-8bit", grad_ckpt=True, attn="flash",
        lora_rank=16, lora_targets=ALL_TARGETS, lora_dropout=0.0, adapter_fp32=True, loss="unsloth",
        fp32_logits_copy=False, ckpt_offload=True, fused_norm=True, chunked_loss="unsloth",
        sources=("unslothai/unsloth@015bdef (2026.8.19) unsloth/models/llama.py:3063-3079 get_peft_model r=16, all 7 "
                 "projections, lora_dropout=0.0, use_gradient_checkpointing='unsloth' (checkpoints offloaded to CPU)",
                 "unsloth notebooks: optim adamw_8bit",
                 "unsloth-zoo 2026.10.9 fused_losses/cross_entropy_loss.py:743-756 _use_chunked_ce -> "
                 "fused_losses/chunked_logprob.py:430-456 fused_linear_cross_entropy; fused_linear.py:69 "
                 "UNSLOTH_LOGPROB_CHUNK_GB default 2.0, chunked_logprob.py:47 8 bytes per logit",
                 "fused RMSNorm Triton kernel: unslothai/unsloth kernels/rms_layernorm.py")),
    "axolotl": Recipe(
        name="axolotl", description="axolotl 0.18 example configs (HF Trainer underneath)",
        precision="auto", autocast=True, optimizer="adamw-8bit", grad_ckpt=True, attn="flash",
        lora_rank=32, lora_targets=ALL_TARGETS, lora_dropout=0.05, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        sources=("axolotl-ai-cloud/axolotl@067b021 (0.18.0) examples/llama-3/lora-8b.yml:25 lora_r 32, :27 "
                 "lora_dropout 0.05, :28 lora_target_linear, :42 optimizer adamw_bnb_8bit, :49 "
                 "gradient_checkpointing true, :52 flash_attention_2",
                 "src/axolotl/loaders/model.py:345-346 use_reentrant defaults to False", _HF_LOSS,
                 "--chunked-ce means Liger (axolotl's liger plugin; cut_cross_entropy is modelled the same)")),
    "llamafactory": Recipe(
        name="llamafactory", description="LLaMA-Factory 0.9.6 SFT (HF Trainer underneath)",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=ALL_TARGETS, lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True, ckpt_reentrant=True,
        sources=("hiyouga/LLaMA-Factory@ff6d4d1 (0.9.6.dev0) src/llamafactory/hparams/finetuning_args.py:73-82 "
                 "lora_dropout 0.0, lora_rank 8, lora_target 'all'",
                 "src/llamafactory/hparams/model_args.py:137 enable_liger_kernel False, :145 "
                 "disable_gradient_checkpointing False (checkpointing on: model_utils/checkpointing.py:184-198), "
                 ":149 use_reentrant_gc True",
                 "optimizer: HF Trainer's default (adamw_torch_fused)", _HF_LOSS, _PEFT_FP32,
                 "--chunked-ce means Liger (enable_liger_kernel)")),
    "ms-swift": Recipe(
        name="ms-swift", description="ms-swift 4.6 sft (HF Trainer underneath)",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=ALL_TARGETS, lora_dropout=0.05, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        sources=("modelscope/ms-swift@3602360 (4.6.0.dev0) swift/trainers/arguments.py:134 gradient_checkpointing "
                 "True, :153 use_liger_kernel False",
                 "swift/arguments/tuner_args.py:126 target_modules all-linear, :133 lora_rank 8, :135 lora_dropout "
                 "0.05; swift/arguments/base_args/model_args.py:74 torch_dtype None (the checkpoint's)",
                 "optimizer: HF Trainer's default (adamw_torch_fused)", _HF_LOSS, _PEFT_FP32,
                 "--chunked-ce means Liger (use_liger_kernel)")),
    "pytorch": Recipe(
        name="pytorch", description="a plain PyTorch loop: model.to(dtype), no autocast, "
                                    "loss = F.cross_entropy(model(x).flatten(0, 1), y)",
        precision="auto", autocast=False, optimizer="adamw", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=False, loss="plain",
        fp32_logits_copy=False, chunked_loss="chunked", plain_loss="plain",
        sources=("rasbt/LLMs-from-scratch@7bd2631 ch05/10_llm-training-speed/01_opt_single_gpu.py "
                 "calc_loss_batch: logits = model(x); cross_entropy(logits.flatten(0, 1), y) in the model's dtype; "
                 "the logits die with the function, only log_softmax's output is saved",
                 "karpathy/nanoGPT train.py keeps `logits, loss = model(X, Y)` alive through backward (one more "
                 "B x S x V tensor than this recipe counts)",
                 "torch.optim.AdamW without flags is foreach on CUDA (torch/optim/optimizer.py)")),
    "mlx": Recipe(
        name="mlx", description="mlx-lm on Apple silicon (mlx_lm.lora)",
        precision="auto", autocast=False, optimizer="adamw", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=ALL_TARGETS, lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=False, quant="mlx-4bit", fused_norm=True,
        defaults={"batch_size": 4, "train_layers": 16},
        optimizers=("adamw", "sgd", "adafactor"),
        sources=("mlx-lm 0.32.2 mlx_lm/lora.py:45-82 CONFIG_DEFAULTS: optimizer adam, num_layers 16, batch_size 4, "
                 "max_seq_length 2048, grad_checkpoint False, lora_parameters rank 8, dropout 0, scale 20",
                 "mlx_lm/tuner/utils.py linear_to_lora_layers without keys: every Linear of the last num_layers "
                 "layers (since ml-explore/mlx-lm#515); full fine-tuning unfreezes only those layers "
                 "(lora.py:240-242)",
                 "MLX affine 4-bit, group 64, 16-bit scales and biases (mlx_lm.convert -q); the step model is "
                 "physics/mlx.py")),
    "mps": Recipe(
        name="mps", description="transformers v5 Trainer with PEFT on PyTorch's MPS backend (Apple silicon), "
                                "bf16=True (estimate_mps.py)",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True, methods=("full", "lora"),   # no bitsandbytes base (physics/mps_problems.py)
        sources=(_HF_TRAINER, "fused AdamW on MPS: torch 2.13 torch/utils/_foreach_utils.py:13-16 "
                 "_get_fused_kernels_supported_devices includes 'mps'", _PEFT_LORA, _PEFT_FP32, _HF_LOSS,
                 "no bitsandbytes: its MPS backend is not in a release (bitsandbytes-foundation/bitsandbytes#252, "
                 "multi-backend-refactor)")),
    "megatron": Recipe(
        name="megatron", description="Megatron-LM / Megatron-Core full training (pretrain_gpt), bf16 with fp32 main "
                                     "gradients, TP/PP/CP/EP layouts (physics/megatron.py)",
        precision="bf16", autocast=False, optimizer="adamw-fused", grad_ckpt=False, attn="flash",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=False, loss="plain",
        fp32_logits_copy=False, defaults={"method": "full"}, optimizers=("adamw-fused",), methods=("full",),
        sources=("NVIDIA/Megatron-LM@d98e8a64 megatron/training/theoretical_memory_usage.py: bf16 params, fp32 main "
                 "grads, fp32 main params and Adam states (18 B/param, 6 + 12/dp with --use-distributed-optimizer)",
                 "megatron/training/arguments.py:3156 --use-distributed-optimizer off by default; :3221 "
                 "--cp-comm-type p2p; megatron/core/transformer/transformer_config.py:532 recompute_granularity "
                 "None (no recompute) by default",
                 "Adam from Transformer Engine / apex FusedAdam: a fused kernel, no per-step temporaries")),
}
# LitGPT up to 0.5.4 pinned bitsandbytes==0.42.0 (Lightning-AI/litgpt@e5493986 pyproject.toml:36, the commit that
# published the config_hub/finetune QLoRA table); 0.5.5 moved to >=0.44 (Lightning-AI/litgpt@d2ed13c3). Everything
# else is the litgpt recipe's.
RECIPES["litgpt-0.4"] = replace(
    RECIPES["litgpt"], name="litgpt-0.4",
    description="LitGPT 0.4 - 0.5.4 finetune (bitsandbytes 0.42.0 for --quantize bnb.*)", bnb4_saves_input=True,
    sources=RECIPES["litgpt"].sources + (
        "litgpt's facts hold at Lightning-AI/litgpt@e5493986 (0.4.5): litgpt/finetune/lora.py:138 "
        "BitsandbytesPrecision(quantize[4:], dtype), :234 torch.cuda.max_memory_allocated(), :304 "
        "model(input_ids, lm_head_chunk_size=128)",
        "pyproject.toml:36 bitsandbytes==0.42.0: bitsandbytes@0.42.0 autograd/_functions.py:522-523 "
        "MatMul4Bit.forward keeps `ctx.tensors = (A, B)` (the input) whenever a gradient is needed; 0.43.2 keeps "
        "(None, B) (bitsandbytes@9e753741, #1270)",
        "lightning 2.3.0.dev20240428 fabric/plugins/precision/bitsandbytes.py:129-145 module_init_context replaces "
        "every torch.nn.Linear with _NF4Linear (bnb.nn.Linear4bit), :117-121 compute_dtype = the precision's dtype "
        "(bf16: the saved input is the layer's own bf16 input, no copy)"))


# lit-gpt before the LitGPT rename (Lightning-AI/lit-gpt@8641822, the commit of tutorials/resource-tables.md):
# finetune/lora.py:212 and :286-292 put the longest training sample in the first iteration ("so potential OOMs
# happen right away"), so the run's peak is that first step, with no earlier step's logits alive; bitsandbytes
# 0.41.1 (the table's version) keeps MatMul4Bit's input as 0.42.0 does.
RECIPES["lit-gpt"] = replace(
    RECIPES["litgpt-0.4"], name="lit-gpt", keeps_previous_logits=False, repeats_kv="grouped",
    description="lit-gpt (2023, before the LitGPT rename): the longest sample runs first",
    sources=RECIPES["litgpt-0.4"].sources + (
        "Lightning-AI/lit-gpt@8641822 finetune/lora.py:212 get_batch(..., longest_seq_ix if iter_num == 0), "
        ":286-292 the longest sample first: the peak step has no previous step's logits",
        "lit-gpt@8641822 lit_gpt/model.py CausalSelfAttention.forward repeats k and v only when "
        "n_query_groups != 1: multi-query attention reaches SDPA with one k/v head"))


# Answer.AI fsdp_qlora (AnswerDotAI/fsdp_qlora@1a9fddfb train.py): a transformers model with PEFT LoRA or
# bitsandbytes QLoRA in its own loop. :843-849 `output = model(input_ids, labels=...)`, `loss = output.loss`;
# :866 loss.backward(); :897 `output = None` only after the step: the model's logits live through the whole
# backward. transformers of early 2024 (4.38 models/llama/modeling_llama.py LlamaForCausalLM.forward) returns
# `logits = logits.float()` and computes the loss on `logits[..., :-1, :].contiguous()`.
RECIPES["fsdp-qlora"] = replace(
    RECIPES["hf"], name="fsdp-qlora", keeps_logits=True, fp32_logits_copy=False,
    description="Answer.AI fsdp_qlora train.py: its own loop holds the model output (fp32 logits) through backward",
    sources=RECIPES["hf"].sources + (
        "AnswerDotAI/fsdp_qlora@1a9fddfb train.py:843-849 output = model(...); loss = output.loss, :866 "
        "loss.backward(), :897 output = None after the step",
        "transformers 4.38 models/llama/modeling_llama.py LlamaForCausalLM.forward: logits = logits.float(); "
        "shift_logits = logits[..., :-1, :].contiguous()"))


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name.lower()]
    except KeyError:
        raise InvalidSetupError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}") from None
