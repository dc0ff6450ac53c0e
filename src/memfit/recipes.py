"""Recipe presets: the defaults each training stack really uses, with where each default comes from.

A recipe decides what the user did not: the dtype the model is loaded in, whether the trainer wraps the forward
in autocast, the optimizer implementation, checkpointing, the LoRA defaults, how the loss is computed. What the
user sets always wins (TrainingSetup resolves the rest through ``Recipe.default``). Sources are cited per field
in ``sources``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InvalidSetupError
from .options import ALL_TARGETS, OPTIMIZERS

# The setup options a recipe gives a default for (the rest come from the options table).
RECIPE_FIELDS = ("precision", "optimizer", "grad_ckpt", "attn", "lora_rank", "lora_targets", "lora_dropout", "quant")
# Every option whose default depends on the recipe or the method (setup.py resolves the last four from others).
RECIPE_DECIDED = RECIPE_FIELDS + ("chunked_ce", "optimizer_in_backward", "autocast", "ckpt_offload", "shard",
                                  "train_layers")


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
    loss: str                      # "hf" | "plain" | "chunked-fp32" | "chunked-kept" | "fused"
    fp32_logits_copy: bool         # accelerate's convert_outputs_to_fp32 under autocast
    quant: str = "nf4-dq"
    ckpt_offload: bool = False     # checkpoints kept in host memory (unsloth's offloaded checkpointing)
    fused_norm: bool = False       # norms are fused kernels that save only their input (MLX, Liger, Unsloth)
    defaults: dict = field(default_factory=dict)         # other setup options this stack sets (mlx: batch 4)
    full_overrides: dict = field(default_factory=dict)   # defaults that differ for full fine-tuning
    qlora_overrides: dict = field(default_factory=dict)  # defaults that differ for QLoRA
    # Stacks that build their own model code (LitGPT) change the architecture facts that matter for memory.
    arch_overrides: dict = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    optimizers: tuple[str, ...] = tuple(OPTIMIZERS)   # what the stack can instantiate

    def default(self, name: str, method: str):
        """This stack's default for setup option `name` with `method`, or None where it has none."""
        if method == "qlora" and name in self.qlora_overrides:
            return self.qlora_overrides[name]
        if method == "full" and name in self.full_overrides:
            return self.full_overrides[name]
        if name in self.defaults:
            return self.defaults[name]
        if name in RECIPE_FIELDS:
            return getattr(self, name)
        if name == "chunked_ce":
            return self.loss not in ("hf", "plain")
        return None


RECIPES: dict[str, Recipe] = {
    "hf": Recipe(
        name="hf", description="transformers v5 Trainer / TRL SFTTrainer with PEFT, bf16=True",
        precision="auto", autocast=True, optimizer="adamw-fused", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        qlora_overrides={"grad_ckpt": True},
        sources=("dtype='auto' default: huggingface/transformers#42805 (modeling_utils.py)",
                 "default optim adamw_torch_fused for torch>=2.8: huggingface/transformers#37358",
                 "bf16=True is autocast, no master copy: accelerate/accelerator.py prepare_model",
                 "LoraConfig defaults r=8, lora_dropout=0.0, q_proj/v_proj for Llama-style models: "
                 "huggingface/peft src/peft/tuners/lora/config.py and utils/constants.py",
                 "fp32 adapters: PEFT autocast_adapter_dtype=True, huggingface/peft#1706",
                 "loss upcasts logits to fp32: transformers src/transformers/loss/loss_utils.py",
                 "QLoRA enables gradient checkpointing: peft prepare_model_for_kbit_training "
                 "(use_gradient_checkpointing=True) and TRL >= 0.22's own k-bit preparation")),
    "torchtune": Recipe(
        name="torchtune", description="torchtune single-device recipes (lora_finetune_single_device)",
        precision="bf16", autocast=False, optimizer="adamw-fused", grad_ckpt=True, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v", "o", "gate", "up", "down"), lora_dropout=0.0, adapter_fp32=False,
        loss="chunked-fp32", fp32_logits_copy=False,
        full_overrides={"optimizer": "paged-adamw-8bit", "optimizer_in_backward": True},
        sources=("recipes/configs/llama3_1/8B_lora_single_device.yaml: dtype bf16, AdamW fused, "
                 "enable_activation_checkpointing True, lora_attn_modules q/v/output, apply_lora_to_mlp, rank 8",
                 "8B_full_single_device.yaml: PagedAdamW8bit with optimizer_in_bwd True",
                 "CEWithChunkedOutputLoss: torchtune/modules/loss/ce_chunked_output_loss.py (8 chunks, fp32)")),
    "litgpt": Recipe(
        name="litgpt", description="LitGPT finetune (bf16-true precision)",
        precision="bf16", autocast=False, optimizer="adamw", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.05, adapter_fp32=False,
        loss="chunked-kept", fp32_logits_copy=False, quant="nf4",
        arch_overrides={"tied_embeddings": False, "fused_qkv": True, "norm_style": "gemma"},
        sources=("LitGPT builds its own model (litgpt/model.py): an untied lm_head always, one fused qkv linear, "
                 "RMSNorm computed in fp32 with the weight applied before the cast back",
                 "litgpt/finetune/lora.py: precision bf16-true, lm_head_chunk_size=128, chunked_cross_entropy",
                 "litgpt/lora.py Config defaults: lora_r 8, lora_query/lora_value True, lora_dropout 0.05",
                 "torch.optim.AdamW without flags: foreach on CUDA (torch/optim/optimizer.py)")),
    "unsloth": Recipe(
        name="unsloth", description="Unsloth FastLanguageModel + TRL SFTTrainer",
        precision="auto", autocast=True, optimizer="adamw-8bit", grad_ckpt=True, attn="flash",
        lora_rank=16, lora_targets=ALL_TARGETS, lora_dropout=0.0, adapter_fp32=True, loss="fused",
        fp32_logits_copy=False, ckpt_offload=True, fused_norm=True,
        sources=("unsloth notebooks: r=16, all 7 projections, lora_dropout=0, optim adamw_8bit, "
                 "use_gradient_checkpointing='unsloth' (checkpoints offloaded to CPU)",
                 "fused cross-entropy and RMSNorm Triton kernels: unslothai/unsloth kernels/")),
    "axolotl": Recipe(
        name="axolotl", description="axolotl example configs (HF Trainer underneath)",
        precision="auto", autocast=True, optimizer="adamw-8bit", grad_ckpt=True, attn="flash",
        lora_rank=32, lora_targets=ALL_TARGETS, lora_dropout=0.05, adapter_fp32=True, loss="hf",
        fp32_logits_copy=True,
        sources=("axolotl examples/llama-3/lora-8b.yml: lora_r 32, lora_dropout 0.05, lora_target_linear, "
                 "gradient_checkpointing true, optimizer adamw_bnb_8bit, flash_attention true",)),
    "pytorch": Recipe(
        name="pytorch", description="a plain PyTorch loop (nanoGPT style): model.to(dtype), no autocast, "
                                    "F.cross_entropy on the logits as they are",
        precision="auto", autocast=False, optimizer="adamw", grad_ckpt=False, attn="sdpa",
        lora_rank=8, lora_targets=("q", "v"), lora_dropout=0.0, adapter_fp32=False, loss="plain",
        fp32_logits_copy=False,
        sources=("karpathy/nanoGPT train.py: logits, loss = model(X, Y); loss.backward(); torch.optim.AdamW "
                 "without flags is foreach on CUDA",)),
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
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name.lower()]
    except KeyError:
        raise InvalidSetupError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}") from None
