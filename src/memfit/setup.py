"""TrainingSetup: everything about a run that is not the model or the hardware. Frozen and validated.

A setup is a recipe plus the values you set. ``TrainingSetup(method="qlora")`` and
``TrainingSetup(recipe="torchtune", method="full", seq_len=4096)`` fill every field you leave out (or pass as
None) with that recipe's default for the method, and otherwise the options table's (options.py), so the Python
API, the command line, the web page and ``memfit check`` resolve the same request to the same setup. The fields
you set are kept in ``explicit``: ``replace`` re-resolves the others (switching to QLoRA under the hf recipe turns
on the checkpointing it implies), and the reproducing command names only them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import InvalidSetupError, Problem
from .options import (ALL_TARGETS, ATTENTION, BY_NAME, MAX_BATCH, MAX_RANK, MAX_SEQ_LEN, METHODS, OFFLOADS,  # noqa: F401
                      MLX_QUANTS, OPTIMIZER_ALIASES, OPTIMIZERS, PRECISIONS, QUANTS, SETUP_FIELDS, SHARDS,
                      check_range,
                      normalize)
from .options import parse_targets as _parse_targets
from .physics.optimizers import IN_BACKWARD, optimizer_problems
from .options import BNB_QUANTS, PEFT_METHODS, PREQUANT_QUANTS, QUANT_ONLY, QUANT_REFUSED, QUANTIZABLE_METHODS
from .physics.adapters import DEFAULT_BLOCK_SIZE, DEFAULT_TARGETS
from .recipes import CHUNKED_LOSSES, RECIPES
from .physics import trainers as _trainers

_SHARDED = ("zero1", "zero2", "zero3", "fsdp", "fsdp-shard-grad-op", "hsdp")


@dataclass(frozen=True)
class TrainingSetup:
    """One training run's setup. Sizes: ``batch_size`` sequences per GPU per micro-batch, ``seq_len`` tokens."""

    recipe: str | None = None                   # whose defaults fill the rest (recipes.py); None: hf
    method: str | None = None                   # full | lora | qlora
    batch_size: int | None = None               # sequences per micro-batch per GPU
    seq_len: int | None = None                  # tokens per sequence (the max length: no padding assumed)
    grad_accum: int | None = None               # micro-batches per optimizer step: gradients persist between
    precision: str | None = None                # auto = the checkpoint's dtype as the recipe trains it
    autocast: bool | None = None                # forward under torch.autocast (Trainer bf16=True)
    optimizer: str | None = None                # memfit's name (options.OPTIMIZERS)
    optimizer_in_backward: bool | None = None   # steps inside backward: no full set of gradients at once
    galore_rank: int | None = None              # GaLore projection rank (optimizer galore, galore-8bit)
    apollo_rank: int | None = None              # APOLLO projection rank
    muon_params: str | None = None              # hidden | all-2d: the tensors Muon (not AdamW) steps
    grad_ckpt: bool | None = None               # keep only each layer's input, recompute in backward
    ckpt_reentrant: bool | None = None          # torch.utils.checkpoint use_reentrant=True (transformers v4)
    ckpt_offload: bool | None = None            # checkpoints in host memory (unsloth)
    attn: str | None = None                     # the kernel asked for (physics/stack.py says what runs)
    chunked_ce: bool | None = None              # shorthand: the recipe's chunked (True) or plain (False) loss
    loss: str | None = None                     # the loss kernel (options.LOSSES); decides chunked_ce
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | None = None
    lora_dropout: float | None = None           # > 0 saves a dropout mask per adapted input
    train_layers: int | None = None             # only the last N layers train (None: all; mlx-lm: 16)
    mlx_release: str | None = None              # mlx-lm / MLX release of the mlx recipe (physics/mlx_eras.py)
    quant: str | None = None                    # QLoRA's 4-bit (or 8-bit) base
    adapter_fp32: bool | None = None            # PEFT autocast_adapter_dtype (the recipe's default)
    kbit_upcast: bool | None = None             # prepare_model_for_kbit_training's fp32 upcast (TRL < 0.22)
    num_virtual_tokens: int | None = None       # prefix / prompt / p-tuning: tokens prepended
    lisa_layers: int | None = None              # LISA: layers trained at a time
    oft_block_size: int | None = None           # OFT / BOFT block size (None: PEFT's default for the method)
    n_frequency: int | None = None              # FourierFT spectral entries per module
    padding: bool | None = None                 # batches carry a padding mask (attention_mask with zeros)
    compile: bool | None = None                 # torch.compile (inductor): pointwise ops recomputed, not saved
    gpus: int | None = None                     # GPUs per node
    nodes: int | None = None
    shard: str | None = None                    # more than one GPU and none given: replicas (ddp)
    offload: str | None = None                  # none | optimizer | optimizer+params
    cp: int | None = None                       # GPUs one sequence is split over (physics/context_parallel.py)
    activation_offload: bool | None = None      # saved activations (with checkpointing: checkpoints) on the host
    tp: int | None = None                       # Megatron tensor / pipeline / expert parallel (physics/megatron.py)
    pp: int | None = None
    ep: int | None = None
    vpp: int | None = None                      # virtual pipeline stages per GPU (interleaved schedule)
    sequence_parallel: bool | None = None
    recompute: str | None = None                # Megatron recompute granularity: none | selective | full
    distributed_optimizer: bool | None = None
    pp_stage: str | None = None                 # worst | first | last pipeline stage
    moe_capacity_factor: float | None = None    # Megatron MoE capacity factor (None: dropless)
    moe_pad_expert_input_to_capacity: bool | None = None
    # Preference and RL trainers (physics/trainers.py resolves their TRL defaults).
    trainer: str | None = None                  # sft | dpo | ... (options.TRAINERS)
    ref_model: str | None = None                # auto resolves to adapter-off | precomputed | copy | none
    prompt_len: int | None = None               # tokens of the prompt in a row (seq_len = prompt + completion)
    completion_len: int | None = None
    num_generations: int | None = None          # GRPO/RLOO completions per prompt
    generation: str | None = None               # hf | vllm-colocate | vllm-server
    vllm_gpu_util: float | None = None          # vLLM gpu_memory_utilization (a fraction of the card)
    vllm_sleep: bool | None = None
    teacher: str | None = None                  # GKD's teacher model reference
    # The card's total memory, set from the hardware (report.py): vLLM co-located reserves a fraction of it.
    card_bytes: int | None = field(default=None, repr=False)
    image_size: str | None = None               # "WxH" before the processor's resize (None: the largest)
    images_per_sample: int | None = None
    max_pixels: int | None = None               # None: the model's processor default
    min_pixels: int | None = None
    image_tokens: int | None = None             # per image, given directly
    # The fields the caller set (everything else is the recipe's). Not part of equality: two setups that
    # resolve to the same values are the same run.
    explicit: frozenset = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self):
        problems: list = []
        given = {}
        for name in SETUP_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                given[name] = normalize(BY_NAME[name], value)
            except ValueError as exc:
                problems.append(Problem(name, f"{{{name}}} {exc}"))
        if problems:
            raise InvalidSetupError(problems)
        recipe = RECIPES[given.get("recipe", "hf")]
        method = given.get("method", recipe.defaults.get("method", "lora"))
        values = {}
        for name in SETUP_FIELDS:
            if name in given:
                values[name] = given[name]
            elif name not in ("autocast", "ckpt_offload", "ckpt_reentrant", "shard", "loss", "chunked_ce") + \
                    _trainers.TRAINER_OPTIONS_KEYS:
                values[name] = recipe.default(name, method)
                if values[name] is None:
                    values[name] = BY_NAME[name].default
        # Defaults that follow from other fields.
        if "lora_targets" not in given and method in DEFAULT_TARGETS:
            values["lora_targets"] = DEFAULT_TARGETS[method]     # PEFT's own default for the method
        if "quant" not in given and method in PEFT_METHODS:
            values["quant"] = "none"        # a PEFT method's base stays 16-bit unless --quant says otherwise
        if "oft_block_size" not in given:
            values["oft_block_size"] = DEFAULT_BLOCK_SIZE.get(method)
        if "autocast" not in given:
            values["autocast"] = recipe.autocast if values["precision"] == "auto" else \
                values["precision"].endswith("-mixed")
        if "optimizer_in_backward" not in given and values["optimizer"] in IN_BACKWARD:
            values["optimizer_in_backward"] = True    # LOMO / AdaLomo update inside backward by design
        if "ckpt_offload" not in given:
            # Activation offload under checkpointing offloads only the checkpoints: that is ckpt_offload.
            values["ckpt_offload"] = (recipe.ckpt_offload or values["activation_offload"]) and values["grad_ckpt"]
        if "ckpt_reentrant" not in given:
            values["ckpt_reentrant"] = bool(recipe.default("ckpt_reentrant", method)) and values["grad_ckpt"]
        _trainers.resolve(given, values)     # the trainer's TRL defaults (seq_len, loss, generation, reference)
        # One fact, two spellings: `loss` names the kernel; `chunked_ce` says whether it is one of the chunked ones.
        # An explicit loss wins; else an explicit chunked_ce picks the recipe's chunked or plain loss; else the
        # recipe's default. (problems() refuses an explicit pair that disagrees.)
        if "loss" not in given and "loss" not in values:
            values["loss"] = recipe.loss_for(given["chunked_ce"]) if "chunked_ce" in given else \
                recipe.default("loss", method)
        values["chunked_ce"] = given.get("chunked_ce", values["loss"] in CHUNKED_LOSSES)
        if "shard" not in given or (given["shard"] == "none" and values["gpus"] * values["nodes"] > 1):
            # `--gpus 4` alone (or with shard none) means four replicas, as torchrun with DDP runs them.
            values["shard"] = "ddp" if values["gpus"] * values["nodes"] > 1 else "none"
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "explicit", frozenset(given))
        problems = self.problems()
        if problems:
            raise InvalidSetupError(problems)

    @classmethod
    def from_recipe(cls, recipe: str = "hf", **overrides) -> "TrainingSetup":
        """The recipe's defaults for the chosen method, then the caller's overrides (None means 'default')."""
        return cls(recipe=recipe, **overrides)

    def problems(self) -> list[Problem]:
        """Every combination that cannot be right, in option names (each face words them its own way)."""
        p: list[Problem] = []
        for name in SETUP_FIELDS:
            why = check_range(BY_NAME[name], getattr(self, name))
            if why:
                p.append(Problem(name, f"{{{name}}} {why}"))
        for name in SETUP_FIELDS:
            methods = BY_NAME[name].methods
            if name == "quant" and self.method in QUANT_REFUSED:
                if "quant" in self.explicit and self.quant != "none":
                    p.append(Problem("quant", f"{{quant}} with {{method}} {self.method}: "
                                              f"{QUANT_REFUSED[self.method]}"))
                continue
            if name in self.explicit and methods and self.method not in methods:
                p.append(Problem(name, f"{{{name}}} only applies to {{method}} {' or '.join(methods)} "
                                       f"(method is {self.method})"))
        if self.offload != "none" and self.shard not in _SHARDED:
            p.append(Problem("offload", f"{{offload}} {self.offload} needs ZeRO or FSDP sharding: {{shard}} "
                                        f"zero1|zero2|zero3|fsdp|hsdp (shard is {self.shard})"))
        elif self.offload == "optimizer+params" and self.shard not in ("zero3", "fsdp", "hsdp"):
            p.append(Problem("offload", "offloading parameters needs {shard} zero3, fsdp or hsdp"))
        if self.shard == "hsdp" and self.nodes < 2:
            p.append(Problem("shard", "hsdp shards within a node and replicates across nodes: give {nodes} 2 or "
                                      "more"))
        if "experts" in (self.lora_targets or ()) and self.method in ("lora", "qlora") and self.lora_dropout:
            p.append(Problem("lora_dropout", f"{{lora_dropout}} {self.lora_dropout}: PEFT's LoRA on expert "
                                             "parameters (target experts) does not support dropout (set it to 0)"))
        if self.precision == "fp8" and (self.method != "full" or self.recipe == "mlx"):
            p.append(Problem("precision", "{precision} fp8 (torchao float8 training) is modelled for {method} full "
                                          "on CUDA recipes: float8 linears save their high-precision input even "
                                          "when frozen, and MLX has no float8 training"))
        if self.method == "qlora" and self.quant == "none":
            p.append(Problem("quant", "QLoRA is LoRA on a quantized base: {quant} none contradicts it (use lora)"))
        if self.method in QUANTIZABLE_METHODS and self.quant in MLX_QUANTS + PREQUANT_QUANTS:
            p.append(Problem("quant", f"{{quant}} {self.quant} is "
                                      + ("an MLX conversion, for {method} qlora under {recipe} mlx"
                                         if self.quant in MLX_QUANTS else "a GPTQ/AWQ checkpoint, modelled for "
                                                                          "{method} qlora")
                                      + "; PEFT methods take a bitsandbytes base (nf4, nf4-dq, fp4, int8)"))
        if self.method in QUANT_ONLY and self.quant in BNB_QUANTS and self.quant not in QUANT_ONLY[self.method][0]:
            takes, why = QUANT_ONLY[self.method]
            p.append(Problem("quant", f"{{quant}} {self.quant} with {{method}} {self.method}: {why} "
                                      f"(use {{quant}} {' or '.join(takes)})"))
        if self.quantized_base and self.precision == "fp32":
            p.append(Problem("precision", "QLoRA computes in 16-bit; {precision} fp32 contradicts it (use bf16 or "
                                          "fp16)"))
        if "autocast" in self.explicit and self.precision != "auto" and \
                self.autocast != self.precision.endswith("-mixed"):
            p.append(Problem("autocast", f"{{autocast}} contradicts {{precision}} {self.precision} (bf16/fp16 are "
                                         f"pure 16-bit, *-mixed always autocast; use precision auto)"))
        if "loss" in self.explicit and "chunked_ce" in self.explicit and \
                (self.loss in CHUNKED_LOSSES) != bool(self.chunked_ce):
            p.append(Problem("chunked_ce", f"{{chunked_ce}} contradicts {{loss}} {self.loss} (a "
                                           f"{'chunked' if self.loss in CHUNKED_LOSSES else 'full-logits'} loss); "
                                           "give one of them"))
        if self.method == "prefix" and self.grad_ckpt:
            # The prefix's key/value cache is extended again when a checkpointed layer is recomputed, and PEFT
            # raises (huggingface/peft#869, PR #2191).
            p.append(Problem("grad_ckpt", "prefix tuning cannot run with {grad_ckpt} (PEFT refuses it: the prefix "
                                          "cache grows again when a layer is recomputed); turn checkpointing off"))
        if self.method == "llama-adapter-v2" and not self.recipe.startswith("litgpt"):
            p.append(Problem("method", "{method} llama-adapter-v2 is LitGPT's finetune/adapter_v2.py: it needs "
                                       "{recipe} litgpt (PEFT has no v2; llama-adapter is PEFT's adaption_prompt)"))
        if self.ckpt_reentrant and not self.grad_ckpt:
            p.append(Problem("ckpt_reentrant", "{ckpt_reentrant} checkpointing needs {grad_ckpt}"))
        if self.ckpt_offload and not self.grad_ckpt:
            p.append(Problem("ckpt_offload", "{ckpt_offload} moves checkpoints to the host: it needs {grad_ckpt}"))
        if self.optimizer_in_backward and self.grad_accum > 1:
            # torchtune refuses this combination (recipes/full_finetune_single_device.py: optimizer_in_bwd
            # "is not supported" with gradient accumulation): the gradients would be gone before accumulating.
            p.append(Problem("optimizer_in_backward", "{optimizer_in_backward} cannot accumulate gradients: "
                                                      "set {grad_accum} 1"))
        mlx = self.recipe == "mlx"
        if mlx and (self.method in PEFT_METHODS or self.method == "lisa"):
            p.append(Problem("method", f"{{method}} {self.method} is a PEFT method: the mlx recipe trains full, lora "
                                       "or qlora"))
        if self.method == "qlora" and (self.quant in MLX_QUANTS) != mlx:
            p.append(Problem("quant", "{quant} " + (f"{self.quant} is bitsandbytes: the mlx recipe quantizes with "
                                                   f"MLX (mlx-4bit, mlx-8bit)" if mlx else
                                                   f"{self.quant} is an MLX conversion: it needs {{recipe}} mlx")))
        if mlx and self.chunked_ce:
            p.append(Problem("chunked_ce", "mlx-lm has no chunked cross-entropy (mlx_lm/tuner/trainer.py "
                                           "default_loss): {chunked_ce} does not apply to {recipe} mlx"))
        if mlx and self.precision.endswith("-mixed"):
            p.append(Problem("precision", "MLX has no autocast: {precision} is the model's dtype (auto, bf16, fp16 "
                                          "or fp32) under the mlx recipe"))
        if self.train_layers is not None and self.method == "full" and not mlx:
            p.append(Problem("train_layers", "{train_layers} with {method} full (the last N layers unfrozen) is "
                                             "modelled for {recipe} mlx only"))
        if self.mlx_release != "current" and not mlx:
            p.append(Problem("mlx_release", "{mlx_release} is an mlx-lm release: it needs {recipe} mlx"))
        if mlx and (self.world_size > 1 or self.shard != "none"):
            p.append(Problem("gpus", "mlx-lm trains on one Apple-silicon GPU: {gpus}, {nodes} and {shard} do not "
                                     "apply"))
        if self.recipe == "mps":
            from .physics.mps_problems import mps_problems

            p += mps_problems(self)
        from .physics import context_parallel, megatron

        p += context_parallel.setup_problems(self) + megatron.setup_problems(self)
        p += optimizer_problems(self)
        if self.optimizer not in get_optimizers(self.recipe):
            p.append(Problem("optimizer", f"{{optimizer}} {self.optimizer} is not one the {self.recipe} recipe can "
                                          f"use ({', '.join(get_optimizers(self.recipe))})"))
        p += _trainers.problems(self)
        return p

    def replace(self, **changes) -> "TrainingSetup":
        """A new setup with `changes` set (None: back to the recipe's default); the fields not set explicitly
        are resolved again, so they follow the recipe for the new method."""
        values = {name: getattr(self, name) for name in self.explicit}   # the recipe too, when it was set
        values.update(changes)
        values.setdefault("card_bytes", self.card_bytes)
        return TrainingSetup(**values)

    def with_method(self, method: str) -> "TrainingSetup":
        """The same run with another method; the options that do not apply to it go back to the recipe's."""
        drop = {name: None for name in SETUP_FIELDS if BY_NAME[name].methods and method not in BY_NAME[name].methods}
        return self.replace(**drop, method=method)

    def overrides(self) -> dict:
        """The values the caller set: with the recipe, all it takes to rebuild this setup."""
        out = {name: getattr(self, name) for name in SETUP_FIELDS if name in self.explicit}
        if self.recipe != "hf":
            out["recipe"] = self.recipe
        return {name: out[name] for name in SETUP_FIELDS if name in out}

    def shape_free_key(self) -> tuple:
        """Every field except batch size and length: what the token-independent parts of an estimate depend on."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.compare and f.name not in ("batch_size", "seq_len"))

    @property
    def quantized_base(self) -> bool:
        """The frozen base is quantized: QLoRA, or a PEFT method given a bitsandbytes --quant (QDoRA)."""
        return self.method == "qlora" or (self.method in QUANTIZABLE_METHODS and self.quant != "none")

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def shard_degree(self) -> int:
        """Over how many GPUs model state is split (HSDP: the GPUs of one node; DDP: none)."""
        if self.shard in ("none", "ddp"):
            return 1
        return self.gpus if self.shard == "hsdp" else self.world_size

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def get_optimizers(recipe: str) -> tuple[str, ...]:
    return RECIPES[recipe].optimizers


def parse_targets(value) -> tuple[str, ...]:
    """Canonical LoRA target names from 'all-linear', 'q,k,v' or 'q_proj,v_proj' (or a list of them)."""
    try:
        return _parse_targets(value)
    except ValueError as exc:
        raise InvalidSetupError(Problem("lora_targets", f"{{lora_targets}} {value!r}: {exc}")) from None


def normalize_optimizer(name: str) -> str:
    """memfit's name for an optimizer spelled the HF way (adamw_torch_fused) or memfit's; unknown names pass
    through for TrainingSetup to refuse with the list."""
    key = str(name).strip().lower()
    return OPTIMIZER_ALIASES.get(key, OPTIMIZER_ALIASES.get(key.replace("-", "_"), key))


__all__ = ["TrainingSetup", "normalize_optimizer", "parse_targets", "ALL_TARGETS", "METHODS", "OPTIMIZERS"]
