"""The vocabulary of a request, defined once: every option of a training setup, the hardware and the dataset.

Each option has a name (the ``TrainingSetup`` field and the JSON key), a type, its unit, allowed values, help,
the global default (recipes override it: recipes.py), the methods it applies to, and its key in each trainer's
config. From this table come the command-line flags (``add_options``), the JSON API's validation and schema
(``values_from_json``, ``json_schema``), the web form's defaults (``GET /api/schema``), the command that
reproduces a suggestion (``command_line``) and the key names ``memfit check`` reads and edits (``tool_key``).
No option is spelled out anywhere else.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .errors import InvalidSetupError, Problem, UsageError
from .physics.mlx_eras import ERAS as _MLX_ERAS

MLX_RELEASES = tuple(_MLX_ERAS)

# The PEFT methods besides LoRA (physics/adapters.py has each one's memory and the PEFT source it follows).
PEFT_METHODS = ("dora", "adalora", "ia3", "loha", "lokr", "vera", "oft", "boft", "fourierft", "prefix", "prompt",
                "ptuning", "ln-tuning", "lora-fa", "osf", "tinylora", "llama-adapter", "llama-adapter-v2")
METHODS = ("full", "lora", "qlora") + PEFT_METHODS + ("lisa",)
ADAPTER_METHODS = ("lora", "qlora") + PEFT_METHODS
# Methods that change LoRA's initialisation, scaling or learning rates, never its tensors: they cost what LoRA
# costs (peft 0.21.2 LoraConfig use_rslora, init_lora_weights="pisa"/"olora"; LoRA+ is an optimizer grouping,
# peft optimizers/loraplus.py). Accepted as spellings of lora.
LORA_EQUIVALENTS = {"rslora": "lora", "pissa": "lora", "olora": "lora", "lora-plus": "lora", "loraplus": "lora"}
# Methods whose adapters sit in Linear layers (take --lora-rank and --lora-targets).
LINEAR_ADAPTER_METHODS = ("lora", "qlora", "dora", "adalora", "ia3", "loha", "lokr", "vera", "oft", "boft",
                          "fourierft", "lora-fa", "osf", "tinylora")
# Those with a rank (OFT/BOFT have a block size, FourierFT a number of frequencies, IA3 neither).
RANKED_METHODS = ("lora", "qlora", "dora", "adalora", "loha", "lokr", "vera", "lora-fa", "osf", "tinylora")
# LitGPT's LLaMA-Adapter (v1, v2): adapters of LitGPT's own model, not of a PEFT-wrapped transformers model.
LITGPT_METHODS = ("llama-adapter", "llama-adapter-v2")
VIRTUAL_TOKEN_METHODS = ("prefix", "prompt", "ptuning")
# PEFT methods that peft 0.21.2 trains on a bitsandbytes base (`--quant`; QDoRA is dora + nf4-dq): LoRA's bnb
# layers carry DoRA and LoRA-FA (tuners/lora/bnb.py), IA3 and AdaLoRA have their own (tuners/ia3/bnb.py,
# tuners/adalora/bnb.py); VeRA, OFT and BOFT wrap any quantized linear through utils/quantization_utils.py
# resolve_quantization_backend (tuners/vera/model.py:43, tuners/oft/model.py:38, tuners/boft/model.py:41);
# FourierFT, LoHa and LoKr take bnb's Linear4bit/Linear8bitLt as the nn.Linear subclasses they are and only add
# F.linear(x, delta) to the base output (tuners/fourierft/model.py:96, tuners/lycoris_utils.py:252); the
# virtual-token methods wrap no linear, and LN tuning trains the norms, which bitsandbytes leaves unquantized.
QUANTIZABLE_METHODS = ("dora", "lora-fa", "adalora", "ia3", "vera", "oft", "boft", "fourierft", "loha", "lokr",
                       "ln-tuning") + VIRTUAL_TOKEN_METHODS + LITGPT_METHODS   # LitGPT: --quantize bnb.nf4
# Methods that take only some of the bitsandbytes bases, and why the others fail in PEFT.
QUANT_ONLY = {
    "loha": (("int8",), "LoHa sizes its factors from base_layer.weight.shape (peft 0.21.2 tuners/loha/layer.py:137), "
                        "which a bitsandbytes 4-bit layer packs to [n/2, 1]"),
    "lokr": (("int8",), "LoKr reshapes its delta to base_layer.weight.shape (peft 0.21.2 tuners/lokr/layer.py:277), "
                        "which a bitsandbytes 4-bit layer packs to [n/2, 1]"),
}
# Methods that cannot train on a quantized base, and why (what `--quant` with them says).
QUANT_REFUSED = {
    "osf": "OSF takes the SVD of the base weight and trains its low-rank part in place (peft 0.21.2 "
           "tuners/osf/layer.py:112), which a quantized weight cannot be",
    "tinylora": "TinyLoRA takes the SVD of the base weight (peft 0.21.2 tuners/tinylora/layer.py:210), which a "
                "quantized weight cannot give",
    "lisa": "LISA trains whole layers, which a quantized base cannot (its weights take no gradient)",
}
PRECISIONS = ("auto", "bf16", "fp16", "fp32", "bf16-mixed", "fp16-mixed", "fp8")
OPTIMIZERS = {
    "adamw": "torch AdamW, foreach implementation (the CUDA default when no flag is given)",
    "adamw-fused": "torch AdamW(fused=True), HF Trainer's adamw_torch_fused",
    "adamw-loop": "torch AdamW(foreach=False), the for-loop implementation",
    "adamw-bnb": "bitsandbytes 32-bit AdamW (fp32 states even for bf16 weights)",
    "adamw-8bit": "bitsandbytes AdamW8bit (blockwise 8-bit states)",
    "paged-adamw": "bitsandbytes PagedAdamW (32-bit states in CUDA managed memory)",
    "paged-adamw-8bit": "bitsandbytes PagedAdamW8bit (8-bit states in CUDA managed memory)",
    "sgd": "torch SGD with momentum",
    "adafactor": "transformers Adafactor (factored second moment, no first moment)",
    # memory-saving optimizers: physics/optimizers.py has each one's state, temporaries and source
    "galore": "GaLore AdamW (galore-torch): Adam on a rank-r projection of each decoder matrix's gradient",
    "galore-8bit": "GaLore AdamW8bit (galore-torch on bitsandbytes): the projected moments in 8 bits",
    "q-galore": "Q-GaLore AdamW8bit (q-galore-torch): GaLore 8-bit with the projection stored as uint8 with "
                "per-256 scales and zeros",
    "apollo": "APOLLO AdamW (apollo-torch): Adam on a rank-r random projection, channel-wise scaling",
    "muon": "torch.optim.Muon for decoder matrices, fused AdamW for the other tensors",
    "adam-mini": "Adam-mini (adam-mini): one second-moment value per head / output row",
    "lion": "Lion (lion-pytorch): one momentum, sign update",
    "lion-8bit": "bitsandbytes Lion8bit (one 8-bit momentum)",
    "came": "CAME (came-pytorch): fp32 momentum + factored second moment and instability",
    "lomo": "LOMO (lomo-optim): fused update inside backward, no state, each gradient freed at once",
    "adalomo": "AdaLomo (lomo-optim): LOMO with a factored fp32 second moment",
}
# HF TrainingArguments.optim names (transformers training_args.py OptimizerNames) and other spellings.
OPTIMIZER_ALIASES = {"adamw-torch": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw-fused",
                     "adamw-torch-fused": "adamw-fused", "adamw_8bit": "adamw-8bit", "adamw_bnb_8bit": "adamw-8bit",
                     "paged_adamw_8bit": "paged-adamw-8bit", "paged_adamw_32bit": "paged-adamw",
                     "paged-adamw-32bit": "paged-adamw", "adam": "adamw", "adamw-foreach": "adamw",
                     # transformers 5.24.0 training_args.py:132,144-157 OptimizerNames
                     "galore_adamw": "galore", "galore_adamw_8bit": "galore-8bit", "apollo_adamw": "apollo",
                     "lion_8bit": "lion-8bit", "adam_mini": "adam-mini",
                     # VITA-Group/Q-GaLore run_pretrain.py --optimizer q_galore_adamw8bit
                     "q_galore_adamw8bit": "q-galore", "qgalore": "q-galore"}
BNB_OPTIMIZERS = ("adamw-bnb", "adamw-8bit", "paged-adamw", "paged-adamw-8bit")
ATTENTION = ("sdpa", "flash", "eager")
BNB_QUANTS = ("nf4", "nf4-dq", "fp4", "int8")
# MLX affine quantization, group size 64, 16-bit scales and biases (mlx_lm.convert -q --q-bits 4|8)
MLX_QUANTS = ("mlx-4bit", "mlx-8bit")
# Pre-quantized int4 checkpoints (GPTQ, AWQ), group 128: physics/quantized_base.py
PREQUANT_QUANTS = ("gptq-int4", "awq-int4")
QUANTS = BNB_QUANTS + MLX_QUANTS + PREQUANT_QUANTS + ("none",)
SHARDS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-shard-grad-op", "hsdp")
OFFLOADS = ("none", "optimizer", "optimizer+params")
ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# Targets that are parameters, not nn.Linear (PEFT target_parameters): transformers v5's fused 3-D MoE experts.
# all-linear never includes them (PEFT's all-linear matches nn.Linear modules only).
PARAM_TARGETS = ("experts",)
# LoRA outside the decoder layers (physics/lora_outer.py): PEFT's lora.Embedding and lm_head.
OUTER_TARGETS = ("embed", "head")
OUTER_ALIASES = {"lm_head": "head", "output": "head", "embed_tokens": "embed", "embeddings": "embed",
                 "embedding": "embed", "wte": "embed", "tok_embeddings": "embed"}
# The loss kernels memfit prices (physics/loss.py has each one's memory and its source).
LOSSES = {
    "hf": "transformers ForCausalLMLoss: logits.float() then cross_entropy (full fp32 logits)",
    "plain": "F.cross_entropy on the logits in their own dtype (a plain PyTorch loop)",
    "chunked": "the stack's chunked cross-entropy (torchtune LinearCrossEntropyLoss, LitGPT chunked_cross_entropy)",
    "liger": "Liger-Kernel fused linear cross-entropy (no full logits; chunks sized by vocab / hidden)",
    "unsloth": "unsloth-zoo fused linear cross-entropy (logit chunks capped at 2 GiB)",
    "trl-chunked-nll": "TRL 1.7-1.14 loss_type chunked_nll (256-token chunks, transient fp32 copy of lm_head)",
    "trl-fused-head": "TRL >= 1.15 fused LM head (4096 x 32768 logit tiles, fp32 gradient accumulators)",
}
# The trainers memfit prices (physics/trainers.py has each one's extra memory and its source in TRL 1.16.0).
TRAINERS = {
    "sft": "supervised fine-tuning (one forward and backward of the batch)",
    "dpo": "DPO: chosen and rejected as one concatenated batch, plus a reference model's log-probs",
    "ipo": "IPO (DPO with loss_type ipo): the same memory as DPO",
    "orpo": "ORPO: concatenated chosen and rejected, no reference model",
    "simpo": "SimPO (CPO with loss_type simpo): concatenated pair, no reference model",
    "cpo": "CPO: concatenated pair, no reference model",
    "kto": "KTO: unpaired rows, a no-grad KL pass on mismatched completions, plus a reference model",
    "grpo": "GRPO: num_generations completions per prompt, generation memory, completion-only log-probs",
    "rloo": "RLOO: as GRPO, with a reference model (beta 0.05)",
    "ppo": "PPO: policy, reference, reward and value models, generation memory",
    "gkd": "GKD: a teacher's weights and logits, on-policy student generation, full logits for the JSD loss",
}
REF_MODELS = ("auto", "adapter-off", "precomputed", "copy", "none")
GENERATIONS = ("hf", "vllm-colocate", "vllm-server")
RECIPE_NAMES = ("hf", "trl", "trl-1.14", "trl-0.21", "torchtune", "litgpt", "litgpt-0.4", "lit-gpt", "unsloth",
                "axolotl", "llamafactory", "ms-swift", "pytorch", "mlx", "megatron", "mps", "fsdp-qlora")
RECOMPUTE = ("none", "selective", "full")   # Megatron --recompute-granularity (none: the flag not given)
PP_STAGES = ("worst", "first", "last")      # which Megatron pipeline stage the verdict is about
TOOLS = ("axolotl", "llamafactory", "torchtune", "trl", "mlx")

# Past these a number is a typo, not a plan: no single device trains 2M tokens per micro-batch.
MAX_SEQ_LEN = 1 << 21
MAX_BATCH = 1 << 16
MAX_RANK = 1 << 14

_ACCUM = "gradient_accumulation_steps"


@dataclass(frozen=True)
class Option:
    name: str                       # the TrainingSetup field / request key, and the JSON key
    kind: str                       # "int" | "float" | "bool" | "choice" | "targets" | "text"
    help: str
    group: str = "setup"            # "setup" | "hardware" | "dataset"
    default: object = None          # the global default (None: decided from other fields, see setup.py)
    choices: tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    below_maximum: bool = False     # the maximum itself is excluded (dropout < 1)
    methods: tuple[str, ...] = ()   # the methods it applies to (empty: every method)
    flag: str = ""                  # when the flag is not --name-with-dashes
    tool_keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    web: bool = True                # offered by the JSON API (paths on the server's disk are not)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def _keys(**keys: str) -> Mapping[str, str]:
    return MappingProxyType(keys)


SETUP_OPTIONS: tuple[Option, ...] = (
    Option("recipe", "choice", "the training stack whose defaults fill what you do not set", default="hf",
           choices=RECIPE_NAMES),
    Option("method", "choice", "what trains: every weight, a LoRA adapter, an adapter on a 4-bit base, or "
           "another PEFT method (rslora, pissa, olora and lora-plus cost what lora costs)",
           default="lora", choices=METHODS, aliases=MappingProxyType(LORA_EQUIVALENTS),
           tool_keys=_keys(axolotl="adapter", llamafactory="finetuning_type", torchtune="model._component_",
                           trl="use_peft", mlx="fine_tune_type")),
    Option("batch_size", "int", "micro-batch size per GPU", default=1, unit="sequences", minimum=1,
           maximum=MAX_BATCH,
           tool_keys=_keys(axolotl="micro_batch_size", llamafactory="per_device_train_batch_size",
                           torchtune="batch_size", trl="per_device_train_batch_size", mlx="batch_size")),
    Option("seq_len", "int", "max sequence length", default=2048, unit="tokens", minimum=1, maximum=MAX_SEQ_LEN,
           tool_keys=_keys(axolotl="sequence_len", llamafactory="cutoff_len", torchtune="tokenizer.max_seq_len",
                           trl="max_length", mlx="max_seq_length")),
    Option("grad_accum", "int", "gradient accumulation steps (the effective batch is batch x accumulation)",
           default=1, minimum=1, maximum=1 << 20,
           # mlx-lm 0.32.2 mlx_lm/lora.py CONFIG_DEFAULTS: grad_accumulation_steps
           tool_keys=_keys(axolotl=_ACCUM, llamafactory=_ACCUM, torchtune=_ACCUM, trl=_ACCUM,
                           mlx="grad_accumulation_steps")),
    Option("precision", "choice", "auto: the checkpoint's dtype as the recipe trains it; bf16/fp16: pure "
           "16-bit; *-mixed: fp32 weights under autocast; fp8: bf16 weights with float8 matmuls (torchao)",
           default="auto", choices=PRECISIONS,
           tool_keys=_keys(axolotl="bf16", llamafactory="bf16", torchtune="dtype", trl="bf16")),
    Option("autocast", "bool", "the trainer wraps the forward in torch.autocast (with precision auto)",
           flag="--autocast"),
    Option("optimizer", "choice", "optimizer implementation (HF names such as adamw_torch_fused work too)",
           default="adamw-fused", choices=tuple(OPTIMIZERS), aliases=MappingProxyType(OPTIMIZER_ALIASES),
           tool_keys=_keys(axolotl="optimizer", llamafactory="optim", torchtune="optimizer._component_",
                           trl="optim", mlx="optimizer")),
    Option("optimizer_in_backward", "bool", "step the optimizer inside backward (torchtune optimizer_in_bwd)",
           default=False, tool_keys=_keys(torchtune="optimizer_in_bwd")),
    Option("galore_rank", "int", "GaLore's and Q-GaLore's projection rank (transformers' default for optim galore_*)",
           default=128, minimum=1, maximum=MAX_RANK, methods=("full",)),
    Option("apollo_rank", "int", "APOLLO's projection rank (1 with --apollo-rank 1 is APOLLO-Mini's rank)",
           default=128, minimum=1, maximum=MAX_RANK, methods=("full",)),
    Option("muon_params", "choice", "what Muon steps: hidden (decoder matrices; AdamW for embeddings, head and "
           "1-D tensors) or all-2d (every 2-D tensor, as torch's Muon example)", default="hidden",
           choices=("hidden", "all-2d")),
    Option("grad_ckpt", "bool", "gradient (activation) checkpointing", default=False,
           tool_keys=_keys(axolotl="gradient_checkpointing", llamafactory="disable_gradient_checkpointing",
                           torchtune="enable_activation_checkpointing", trl="gradient_checkpointing",
                           mlx="grad_checkpoint")),
    Option("ckpt_reentrant", "bool", "reentrant checkpointing (transformers v4's default; v5 is non-reentrant)",
           default=False, flag="--reentrant"),
    Option("ckpt_offload", "bool", "checkpoints kept in host memory (unsloth's offloaded checkpointing)"),
    Option("attn", "choice", "attention kernel", default="sdpa", choices=ATTENTION,
           tool_keys=_keys(axolotl="flash_attention", llamafactory="flash_attn", trl="attn_implementation")),
    Option("chunked_ce", "bool", "chunked cross-entropy: on picks the recipe's chunked loss, off its plain one "
           "(shorthand for --loss; it must agree with an explicit --loss)", default=False,
           tool_keys=_keys(axolotl="cut_cross_entropy", llamafactory="enable_liger_kernel",
                           torchtune="loss._component_", trl="use_liger_kernel")),
    Option("loss", "choice", "the loss kernel (logits and cross-entropy memory)", default="hf",
           choices=tuple(LOSSES)),
    Option("lora_rank", "int", "LoRA rank (for adalora its initial rank; loha, lokr, vera: their rank; osf: the "
           "trainable SVD rank, min(out, in) - effective_rank; tinylora: the frozen SVD rank r)", default=8,
           minimum=1, maximum=MAX_RANK, methods=RANKED_METHODS,
           tool_keys=_keys(axolotl="lora_r", llamafactory="lora_rank", torchtune="model.lora_rank", trl="lora_r",
                           mlx="lora_parameters.rank")),
    Option("lora_targets", "targets", f"all-linear or a comma list of {','.join(ALL_TARGETS)}, plus embed and "
           "head (lm_head) for LoRA on the embedding and the output projection, and experts for the fused MoE "
           "experts (PEFT target_parameters)",
           default=("q", "v"), methods=LINEAR_ADAPTER_METHODS,
           tool_keys=_keys(axolotl="lora_target_modules", llamafactory="lora_target",
                           torchtune="model.lora_attn_modules", trl="lora_target_modules")),
    Option("lora_dropout", "float", "LoRA dropout probability", default=0.0, minimum=0.0, maximum=1.0,
           below_maximum=True, methods=("lora", "qlora", "dora", "adalora", "vera", "lora-fa"),
           tool_keys=_keys(axolotl="lora_dropout", llamafactory="lora_dropout", torchtune="model.lora_dropout",
                           trl="lora_dropout", mlx="lora_parameters.dropout")),
    Option("train_layers", "int", "train only the last N layers (mlx-lm --num-layers): the adapters' layers, or "
           "the unfrozen ones in full fine-tuning", minimum=1, maximum=10_000, tool_keys=_keys(mlx="num_layers")),
    Option("mlx_release", "choice", "the mlx-lm / MLX release whose step to model (mlx recipe): current, or an "
           "older one (eager step, float32 logits, mlx 0.24's recomputed attention; physics/mlx_eras.py)",
           default="current", choices=MLX_RELEASES),
    Option("quant", "choice", "the quantized frozen base of QLoRA (or of any other adapter method but osf and "
           "tinylora, loha/lokr int8 only; QDoRA is dora nf4-dq; none: 16-bit): bitsandbytes (nf4, nf4-dq, fp4, int8 = LLM.int8), a GPTQ or AWQ int4 checkpoint (gptq-int4, "
           "awq-int4; qlora) or MLX affine, group 64 (mlx-4bit, mlx-8bit)", default="nf4-dq",
           choices=QUANTS, methods=("qlora",) + QUANTIZABLE_METHODS,
           tool_keys=_keys(axolotl="load_in_4bit", llamafactory="quantization_bit", trl="load_in_4bit")),
    Option("adapter_fp32", "bool", "adapters (their gradients and optimizer state too) in fp32: PEFT "
           "get_peft_model(autocast_adapter_dtype=True), its default; false keeps them in the model's dtype",
           methods=ADAPTER_METHODS, tool_keys=_keys(axolotl="peft_autocast_adapter_dtype")),
    Option("kbit_upcast", "bool", "peft prepare_model_for_kbit_training's fp32 upcast of norms, embeddings and "
           "lm_head (TRL < 0.22 called it)", default=False, methods=("qlora",) + QUANTIZABLE_METHODS),
    Option("num_virtual_tokens", "int", "virtual tokens prefix, prompt and p-tuning prepend (peft "
           "PromptLearningConfig.num_virtual_tokens)", default=20, unit="tokens", minimum=1, maximum=1 << 16,
           methods=VIRTUAL_TOKEN_METHODS),
    Option("lisa_layers", "int", "LISA: layers trained at a time (ms-swift lisa_activated_layers, LMFlow "
           "lisa_activated_layers; ms-swift suggests 2 or 8)", default=2, minimum=1, maximum=10_000,
           methods=("lisa",)),
    Option("oft_block_size", "int", "OFT / BOFT block size (PEFT's defaults: oft 32, boft 4); it must divide each "
           "adapted module's input width", minimum=1, maximum=1 << 16, methods=("oft", "boft")),
    Option("n_frequency", "int", "FourierFT's trainable spectral entries per module (peft FourierFTConfig "
           "n_frequency)", default=1000, minimum=1, maximum=1 << 30, methods=("fourierft",)),
    Option("padding", "bool", "batches carry a padding mask (not packed)", default=False),
    Option("compile", "bool", "torch.compile on the model (inductor): norms, activations and dropout are fused and "
           "recomputed in backward instead of saved (physics/compile.py)", default=False,
           tool_keys=_keys(axolotl="torch_compile", llamafactory="torch_compile", torchtune="compile",
                           trl="torch_compile")),
    Option("gpus", "int", "GPUs per node", default=1, minimum=1, maximum=1 << 16),
    Option("nodes", "int", "nodes (machines), each with --gpus GPUs", default=1, minimum=1, maximum=4096),
    Option("shard", "choice", "data-parallel layout; with more than one GPU, none means replicas (ddp)",
           choices=SHARDS),
    Option("offload", "choice", "ZeRO / FSDP CPU offload", default="none", choices=OFFLOADS),
    # Long context and Megatron layouts (physics/context_parallel.py, physics/megatron.py).
    Option("cp", "int", "context/sequence-parallel degree: each sequence split over N GPUs (Ulysses or ring "
           "attention, as the recipe's engine does it)", default=1, unit="GPUs", minimum=1, maximum=1 << 12,
           tool_keys=_keys(axolotl="context_parallel_size")),
    Option("activation_offload", "bool", "saved activations in host memory between forward and backward "
           "(torchtune/TRL activation offloading; with --grad-ckpt it is --ckpt-offload)", default=False,
           tool_keys=_keys(axolotl="activation_offloading", trl="activation_offloading",
                           torchtune="enable_activation_offloading")),
    Option("tp", "int", "Megatron tensor-parallel degree", default=1, unit="GPUs", minimum=1, maximum=1 << 10),
    Option("pp", "int", "Megatron pipeline-parallel degree (1F1B schedule)", default=1, unit="GPUs", minimum=1,
           maximum=1 << 10),
    Option("ep", "int", "Megatron expert-parallel degree (MoE models)", default=1, unit="GPUs", minimum=1,
           maximum=1 << 12),
    Option("vpp", "int", "Megatron virtual pipeline stages per GPU (interleaved 1F1B; 1: not interleaved)",
           default=1, minimum=1, maximum=1 << 10),
    Option("sequence_parallel", "bool", "Megatron sequence parallelism: norm and dropout activations split over "
           "the tensor-parallel GPUs", default=False),
    Option("recompute", "choice", "Megatron activation recompute (--recompute-granularity)", default="none",
           choices=RECOMPUTE),
    Option("distributed_optimizer", "bool", "Megatron distributed optimizer: fp32 master weights and Adam state "
           "sharded over the data- and context-parallel GPUs", default=False),
    Option("pp_stage", "choice", "the Megatron pipeline stage estimated: the first (embedding, most micro-batches "
           "in flight), the last (output layer, logits) or the worst of the two", default="worst",
           choices=PP_STAGES),
    Option("moe_capacity_factor", "float", "Megatron --moe-expert-capacity-factor: tokens per expert capped at "
           "factor x the balanced share, the rest dropped (not given: dropless)", minimum=0.0),
    Option("moe_pad_expert_input_to_capacity", "bool", "Megatron --moe-pad-expert-input-to-capacity: every expert "
           "gets exactly its capacity (needs --moe-capacity-factor)", default=False),
    # Preference and RL trainers (physics/trainers.py; the trainers each applies to: trainers.TRAINER_OPTIONS).
    Option("trainer", "choice", "what one step trains: SFT, a preference loss, online RL or distillation",
           default="sft", choices=tuple(TRAINERS)),
    Option("ref_model", "choice", "the reference model: auto (TRL's choice: adapter-off with LoRA, a copy for full "
           "fine-tuning), the adapter disabled, precomputed log-probs, a second copy of the weights, or none",
           default="auto", choices=REF_MODELS, tool_keys=_keys(trl="precompute_ref_log_probs")),
    Option("prompt_len", "int", "prompt tokens per row (the rest of the row is the completion)", unit="tokens",
           minimum=1, maximum=MAX_SEQ_LEN),
    Option("completion_len", "int", "completion tokens per row (GRPO/RLOO max_completion_length, GKD "
           "max_new_tokens)", unit="tokens", minimum=1, maximum=MAX_SEQ_LEN,
           tool_keys=_keys(trl="max_completion_length")),
    Option("num_generations", "int", "completions sampled per prompt (GRPO, RLOO)", minimum=1, maximum=MAX_BATCH,
           tool_keys=_keys(trl="num_generations")),
    Option("generation", "choice", "how completions are generated: HF generate, vLLM on the training GPU, or a vLLM "
           "server on other GPUs", choices=GENERATIONS, tool_keys=_keys(trl="vllm_mode")),
    Option("vllm_gpu_util", "float", "the fraction of the card vLLM co-located on it reserves", minimum=0.0,
           maximum=1.0, below_maximum=True, tool_keys=_keys(trl="vllm_gpu_memory_utilization")),
    Option("vllm_sleep", "bool", "vLLM sleep mode: its weights and KV cache are released while the trainer runs",
           tool_keys=_keys(trl="vllm_enable_sleep_mode")),
    Option("teacher", "text", "the teacher model of GKD (a catalog name, Hugging Face id or config.json)",
           tool_keys=_keys(trl="teacher_model_name_or_path")),
    # Vision-language models (vision.py): the images each sample carries. The tower is frozen (physics/vision.py).
    Option("image_size", "text", "a VLM's image size before the processor resizes it, WIDTHxHEIGHT (default: "
           "the largest max_pixels allows)", unit="pixels", tool_keys=_keys(axolotl="image_size")),
    Option("images_per_sample", "int", "images in each training sample of a VLM", default=1, unit="images",
           minimum=0, maximum=4096),
    Option("max_pixels", "int", "a VLM processor's upper bound on pixels per image (Qwen-VL; default: the "
           "model's preprocessor_config.json)", unit="pixels", minimum=1, maximum=1 << 32,
           tool_keys=_keys(llamafactory="image_max_pixels", axolotl="processor_kwargs.max_pixels", **{"ms-swift": "max_pixels"})),
    Option("min_pixels", "int", "a VLM processor's lower bound on pixels per image (Qwen-VL)", unit="pixels",
           minimum=1, maximum=1 << 32,
           tool_keys=_keys(llamafactory="image_min_pixels", axolotl="processor_kwargs.min_pixels")),
    Option("image_tokens", "int", "tokens per image, given directly instead of computed from the image size",
           unit="tokens", minimum=1, maximum=MAX_SEQ_LEN),
)

REQUEST_OPTIONS: tuple[Option, ...] = (
    Option("gpu", "text", "a GPU from `memfit gpus` (e.g. rtx-4090, a100-80gb), or auto: this machine's",
           group="hardware"),
    Option("memory", "text", "a card's own memory, e.g. 24GiB (never system RAM)", group="hardware"),
    Option("mac", "text", "an Apple-silicon Mac's unified memory, e.g. 36GB", group="hardware"),
    Option("mac_wired_limit", "text", "override the Mac's GPU limit (sysctl iogpu.wired_limit_mb)",
           group="hardware"),
    Option("host_ram", "text", "the machine's RAM, checked against what offload moves to it (e.g. 256GB)",
           group="hardware"),
    Option("dataset", "text", "JSONL, JSON, CSV or Parquet training data (text, prompt/completion, "
           "instruction/output or chat messages)", group="dataset", web=False),
    Option("tokenizer", "text", "tokenizer.json or a model directory (with its chat template)", group="dataset",
           web=False),
)

BY_NAME: Mapping[str, Option] = MappingProxyType({o.name: o for o in SETUP_OPTIONS + REQUEST_OPTIONS})
SETUP_FIELDS = tuple(o.name for o in SETUP_OPTIONS)
HARDWARE_FIELDS = tuple(o.name for o in REQUEST_OPTIONS if o.group == "hardware")


# ---- words: how each face names an option --------------------------------------------------------------------
def flag_name(name: str) -> str:
    option = BY_NAME.get(name)
    return option.cli_flag if option else "--" + name.replace("_", "-")


def json_name(name: str) -> str:
    return name


def tool_key(name: str, tool: str) -> str | None:
    """The key that sets option `name` in `tool`'s config (dotted for nested keys), or None."""
    return BY_NAME[name].tool_keys.get(tool)


# ---- values: parsing and checking, the same for every face ---------------------------------------------------
def parse_targets(value) -> tuple[str, ...]:
    """'all-linear' | 'q,k,v,o' | 'q_proj,v_proj' | a list of those -> canonical target names."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    raw = [str(t).strip().lower() for t in items if str(t).strip()]
    if raw in (["all-linear"], ["all"], ["all_linear"]):
        return ALL_TARGETS
    expanded = []
    for t in raw:
        # all-linear plus the outer modules: "all-linear,head" (PEFT's all-linear leaves lm_head out)
        expanded += list(ALL_TARGETS) if t in ("all-linear", "all", "all_linear") else [OUTER_ALIASES.get(t, t)]
    out = tuple(dict.fromkeys(t.removesuffix("_proj") for t in expanded))
    known = ALL_TARGETS + OUTER_TARGETS + PARAM_TARGETS
    bad = [t for t in out if t not in known]
    if bad or not out:
        raise ValueError(f"unknown LoRA target {', '.join(bad) or '(none)'}; use all-linear or a comma list of "
                         f"{','.join(known)}")
    return out


def normalize(option: Option, value, from_text: bool = False):
    """The canonical value of `option` (raises ValueError with a reason). Text from the command line is parsed;
    JSON values must already have the right type."""
    kind = option.kind
    if kind == "int":
        if from_text:
            try:
                value = int(str(value).replace("_", ""))
            except ValueError:
                raise ValueError(f"{value!r} is not a whole number") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number, got {value!r}")
        return value
    if kind == "float":
        if from_text:
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"must be a number, got {value!r}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if kind == "targets":
        if not isinstance(value, (str, list, tuple)):
            raise ValueError(f"must be all-linear or a list of {','.join(ALL_TARGETS)}, got {value!r}")
        return parse_targets(value)
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    if kind == "choice":
        key = value.strip().lower()
        key = option.aliases.get(key, option.aliases.get(key.replace("-", "_"), key))
        if key not in option.choices:
            raise ValueError(f"{value!r} is not one of {', '.join(option.choices)}")
        return key
    if len(value) > 4096 or any(ord(c) < 32 for c in value):
        raise ValueError("is not a plausible value (too long, or control characters)")
    return value


def check_range(option: Option, value) -> str | None:
    """Why `value` is outside what `option` can mean, or None."""
    if option.kind not in ("int", "float") or value is None:
        return None
    def num(x) -> str:   # 2097152, not 2.09715e+06
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    if option.minimum is not None and value < option.minimum:
        return f"must be at least {num(option.minimum)}, got {value}"
    if option.maximum is not None:
        if option.below_maximum and value >= option.maximum:
            return f"must be below {num(option.maximum)}, got {value}"
        if value > option.maximum:
            return f"{value} is absurdly large (limit {num(option.maximum)})"
    return None


def values_from_json(body: Mapping, allowed: tuple[str, ...] | None = None) -> dict:
    """Typed option values from a JSON object (null means the default); every problem is collected. Unknown keys
    and wrong types raise UsageError (malformed request); the setup's own rules are TrainingSetup's."""
    names = allowed or tuple(o.name for o in SETUP_OPTIONS + REQUEST_OPTIONS if o.web)
    problems, out = [], {}
    for key, value in body.items():
        if key not in names:
            problems.append(f"unknown option {key!r} (known: {', '.join(names)})")
            continue
        if value is None:
            continue
        try:
            out[key] = normalize(BY_NAME[key], value)
        except ValueError as exc:
            problems.append(f"{key}: {exc}")
    if problems:
        raise UsageError("; ".join(problems))
    return out


def values_from_args(args: argparse.Namespace, names: tuple[str, ...]) -> dict:
    """Typed option values from parsed command-line text (flags not given are left out)."""
    problems, out = [], {}
    for name in names:
        value = getattr(args, name, None)
        if value is None:
            continue
        option = BY_NAME[name]
        try:
            out[name] = normalize(option, value, from_text=True) if option.kind != "bool" else value
        except ValueError as exc:
            problems.append(Problem(name, f"{{{name}}} {exc}"))
    if problems:
        raise InvalidSetupError(problems)
    return out


# ---- generated faces ------------------------------------------------------------------------------------------
def _help(option: Option) -> str:
    text = option.help
    if option.kind == "choice":
        text += f": {'|'.join(option.choices)}"
    if option.unit:
        text += f" ({option.unit})"
    if option.methods:
        text += f"; only with method {' or '.join(option.methods)}"
    return text


def flag_reference(group: str = "setup") -> str:
    """The README's flag reference for a group, one line an option (a test keeps the README equal to it)."""
    lines = []
    for option in SETUP_OPTIONS + REQUEST_OPTIONS:
        if option.group != group:
            continue
        if option.kind == "bool":
            words = f"{option.cli_flag} / --no-{option.cli_flag[2:]}"
        elif option.kind == "choice":
            words = f"{option.cli_flag} {'|'.join(option.choices)}"
        else:
            words = f"{option.cli_flag} {option.name.upper()}"
        help_text = option.help + (f" ({option.unit})" if option.unit else "")
        if option.methods:
            help_text += f"; only with method {' or '.join(option.methods)}"
        lines.append(f"{words}\n    {help_text}")
    return "\n".join(lines)


def add_options(parser: argparse.ArgumentParser, group: str, names: tuple[str, ...] | None = None) -> None:
    """The flags of one group of options. Values stay text here: the library parses and checks them, so the
    command line, the JSON API and Python refuse the same things with the same words."""
    titles = {"setup": "training setup (unset flags take the recipe's defaults, marked * in the output)",
              "hardware": "hardware (one of --gpu, --memory, --mac)", "dataset": "dataset check"}
    g = parser.add_argument_group(titles[group])
    for option in SETUP_OPTIONS + REQUEST_OPTIONS:
        if option.group != group or (names is not None and option.name not in names):
            continue
        if option.kind == "bool":
            g.add_argument(option.cli_flag, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                           help=_help(option))
        else:
            g.add_argument(option.cli_flag, dest=option.name, default=None, metavar=option.name.upper(),
                           help=_help(option))


def json_schema() -> dict:
    """A JSON Schema of the request body of POST /api/estimate (GET /api/schema), with each option's default,
    unit and the methods it applies to, for the web form and API clients."""
    types = {"int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
             "text": {"type": "string"},
             "targets": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"enum": list(ALL_TARGETS + PARAM_TARGETS)}}]}}
    from .recipes import RECIPE_DECIDED

    props: dict = {"model": {"type": "string", "description": "a catalog name or Hugging Face id"},
                   "config": {"type": "object", "description": "the contents of a config.json (instead of model)"}}
    for option in SETUP_OPTIONS + REQUEST_OPTIONS:
        if not option.web:
            continue
        prop = dict(types.get(option.kind, {"type": "string", "enum": list(option.choices)}))
        prop["description"] = option.help
        prop["x-group"] = option.group
        if option.name in RECIPE_DECIDED:
            prop["x-recipe-default"] = True     # the recipe (and the method) decide it: no single default
        elif option.default is not None:
            prop["default"] = list(option.default) if isinstance(option.default, tuple) else option.default
        if option.unit:
            prop["x-unit"] = option.unit
        if option.methods:
            prop["x-methods"] = list(option.methods)
        if option.minimum is not None:
            prop["minimum"] = option.minimum
        if option.maximum is not None:
            prop["exclusiveMaximum" if option.below_maximum else "maximum"] = option.maximum
        props[option.name] = prop
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "memfit estimate request",
            "type": "object", "properties": props, "additionalProperties": False,
            "oneOf": [{"required": ["model"]}, {"required": ["config"]}]}


def flag_words(name: str, value) -> list[str]:
    """The command-line words that set option `name` to `value`."""
    option = BY_NAME[name]
    if option.kind == "bool":
        return [option.cli_flag if value else "--no-" + option.cli_flag[2:]]
    if option.kind == "targets":
        value = ",".join(value)
    return [option.cli_flag, _quote(str(value))]


def _quote(text: str) -> str:
    return f"'{text}'" if any(c in text for c in " \"'$;&|<>()`\\") or not text else text


def command_line(command: str, model_ref: str, values: Mapping[str, object]) -> str:
    """`memfit COMMAND MODEL --flag value ...` for the given option values, in the table's order."""
    words = ["memfit", command, _quote(model_ref)]
    for option in SETUP_OPTIONS + REQUEST_OPTIONS:
        if option.name in values and values[option.name] is not None:
            words += flag_words(option.name, values[option.name])
    return " ".join(words)
