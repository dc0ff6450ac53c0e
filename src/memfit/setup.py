"""TrainingSetup: everything about a run that is not the model or the hardware. Frozen and validated.

Build one directly (fields default to what a user of the ``hf`` recipe gets) or with
``TrainingSetup.from_recipe("torchtune", method="lora", seq_len=4096)``, which takes that stack's defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import InvalidSetupError
from .recipes import ALL_TARGETS, RECIPES, get_recipe

METHODS = ("full", "lora", "qlora")
PRECISIONS = ("auto", "bf16", "fp16", "fp32", "bf16-mixed", "fp16-mixed")
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
}
OPTIMIZER_ALIASES = {"adamw-torch": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw-fused",
                     "adamw-torch-fused": "adamw-fused", "adamw_8bit": "adamw-8bit", "adamw_bnb_8bit": "adamw-8bit",
                     "paged_adamw_8bit": "paged-adamw-8bit", "paged_adamw_32bit": "paged-adamw",
                     "paged-adamw-32bit": "paged-adamw", "adam": "adamw", "adamw-foreach": "adamw"}
ATTENTION = ("sdpa", "flash", "eager")
QUANTS = ("nf4", "nf4-dq", "fp4", "int8")
SHARDS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-shard-grad-op", "hsdp")
OFFLOADS = ("none", "optimizer", "optimizer+params")

# Past these a number is a typo, not a plan: no single device trains 1M tokens per micro-batch.
MAX_SEQ_LEN = 1 << 21
MAX_BATCH = 1 << 16
MAX_RANK = 1 << 14


@dataclass(frozen=True)
class TrainingSetup:
    method: str = "lora"
    batch_size: int = 1
    seq_len: int = 2048
    precision: str = "auto"
    optimizer: str = "adamw-fused"
    grad_ckpt: bool = False
    attn: str = "sdpa"
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("q", "v")
    lora_dropout: float = 0.0
    quant: str = "nf4-dq"
    grad_accum: int = 1
    chunked_ce: bool = False
    optimizer_in_backward: bool = False
    recipe: str = "hf"
    gpus: int = 1                    # GPUs per node
    nodes: int = 1
    shard: str = "none"              # none | ddp | zero1 | zero2 | zero3 | fsdp | fsdp-shard-grad-op | hsdp
    offload: str = "none"            # none | optimizer | optimizer+params
    kbit_upcast: bool = False        # peft.prepare_model_for_kbit_training's fp32 upcast (TRL < 0.22)
    padding: bool = False            # batches carry a padding mask (attention_mask with zeros)
    ckpt_reentrant: bool = False     # torch.utils.checkpoint use_reentrant=True (transformers v4's default)

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise InvalidSetupError(problems)

    @classmethod
    def from_recipe(cls, recipe: str = "hf", **overrides) -> "TrainingSetup":
        """The recipe's defaults for the chosen method, then the caller's overrides (None means 'default')."""
        r = get_recipe(recipe)
        method = overrides.get("method") or "lora"
        values = dict(method=method, precision=r.precision, optimizer=r.optimizer, grad_ckpt=r.grad_ckpt,
                      attn=r.attn, lora_rank=r.lora_rank, lora_targets=r.lora_targets,
                      lora_dropout=r.lora_dropout, quant=r.quant, recipe=r.name,
                      chunked_ce=r.loss not in ("hf", "plain"))
        if method == "full":
            values.update(r.full_overrides)
        if method == "qlora":
            values.update(r.qlora_overrides)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def problems(self) -> list[str]:
        p: list[str] = []
        if self.method not in METHODS:
            p.append(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        for name, value, top in (("batch size", self.batch_size, MAX_BATCH), ("seq len", self.seq_len, MAX_SEQ_LEN),
                                 ("grad accum", self.grad_accum, 1 << 20), ("gpus", self.gpus, 1 << 16),
                                 ("lora rank", self.lora_rank, MAX_RANK)):
            if isinstance(value, bool) or not isinstance(value, int):
                p.append(f"{name} must be an integer, got {value!r}")
            elif value < 1:
                p.append(f"{name} must be at least 1, got {value}")
            elif value > top:
                p.append(f"{name} {value} is absurdly large (limit {top})")
        if self.precision not in PRECISIONS:
            p.append(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            p.append(f"optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.attn not in ATTENTION:
            p.append(f"attention {self.attn!r} is not one of {', '.join(ATTENTION)}")
        if self.quant not in QUANTS:
            p.append(f"quantization {self.quant!r} is not one of {', '.join(QUANTS)}")
        if self.recipe not in RECIPES:
            p.append(f"recipe {self.recipe!r} is not one of {', '.join(RECIPES)}")
        bad = [t for t in self.lora_targets if t not in ALL_TARGETS]
        if bad or not self.lora_targets:
            p.append(f"LoRA targets {', '.join(bad) or '(none)'} unknown; use all-linear or a list of "
                     f"{','.join(ALL_TARGETS)}")
        if not isinstance(self.lora_dropout, (int, float)) or not 0.0 <= self.lora_dropout < 1.0:
            p.append(f"LoRA dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.shard not in SHARDS:
            p.append(f"sharding {self.shard!r} is not one of {', '.join(SHARDS)}")
        if self.offload not in OFFLOADS:
            p.append(f"offload {self.offload!r} is not one of {', '.join(OFFLOADS)}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= 4096:
            p.append(f"nodes must be an integer from 1 to 4096, got {self.nodes!r}")
        if self.world_size > 1 and self.shard == "none":
            p.append("more than one GPU needs a layout: --shard ddp|zero1|zero2|zero3|fsdp|fsdp-shard-grad-op|hsdp")
        if self.offload != "none" and self.shard not in ("zero1", "zero2", "zero3", "fsdp", "hsdp"):
            p.append(f"--offload {self.offload} needs ZeRO or FSDP sharding (got {self.shard})")
        if self.offload == "optimizer+params" and self.shard not in ("zero3", "fsdp", "hsdp"):
            p.append("offloading parameters needs --shard zero3 or fsdp")
        if self.shard == "hsdp" and self.nodes < 2:
            p.append("hsdp shards within a node and replicates across nodes: give --nodes 2 or more")
        if self.method == "qlora" and self.precision in ("fp32",):
            p.append("QLoRA computes in 16-bit; precision fp32 contradicts it (use bf16 or fp16)")
        if self.ckpt_reentrant and not self.grad_ckpt:
            p.append("reentrant checkpointing needs --grad-ckpt")
        return p

    def replace(self, **changes) -> "TrainingSetup":
        return dataclasses.replace(self, **changes)

    def shape_free_key(self) -> tuple:
        """Every field except batch size and length: what the token-independent parts of an estimate depend on."""
        return (self.method, self.precision, self.optimizer, self.grad_ckpt, self.attn, self.lora_rank,
                self.lora_targets, self.lora_dropout, self.quant, self.grad_accum, self.chunked_ce,
                self.optimizer_in_backward, self.recipe, self.gpus, self.kbit_upcast, self.padding,
                self.ckpt_reentrant, self.nodes, self.shard, self.offload)

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes if isinstance(self.gpus, int) and isinstance(self.nodes, int) else 1

    @property
    def shard_degree(self) -> int:
        """Over how many GPUs model state is split (HSDP: the GPUs of one node; DDP: none)."""
        if self.shard in ("none", "ddp"):
            return 1
        return self.gpus if self.shard == "hsdp" else self.world_size

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def parse_targets(text: str) -> tuple[str, ...]:
    """'all-linear' | 'all' | 'q,k,v,o' | 'q_proj,v_proj' -> canonical target names."""
    raw = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    if raw in (["all-linear"], ["all"], ["all_linear"]):
        return ALL_TARGETS
    out = []
    for t in raw:
        t = t.removesuffix("_proj")
        out.append(t)
    bad = [t for t in out if t not in ALL_TARGETS]
    if bad or not out:
        raise InvalidSetupError(f"LoRA targets {text!r}: unknown {', '.join(bad) or '(empty)'}; use all-linear "
                                f"or a comma list of {','.join(ALL_TARGETS)}")
    return tuple(dict.fromkeys(out))


def normalize_optimizer(name: str) -> str:
    key = str(name).strip().lower()
    key = OPTIMIZER_ALIASES.get(key, OPTIMIZER_ALIASES.get(key.replace("-", "_"), key))
    return key
