"""The PEFT config the trace applies for each adapter method (peft 0.21.2), built from the same Stack the
analytic estimate reads, so both price the same modules.

The configs follow each method's PEFT defaults except where memfit's options set them: rank, targets, dropout,
the layers that train, the virtual tokens. LoRA-FA is PEFT LoRA with lora_A frozen (peft 0.21.2
src/peft/optimizers/lorafa.py create_lorafa_optimizer sets `requires_grad = False` on every lora_A weight).
"""

from __future__ import annotations

import contextlib

from ..options import VIRTUAL_TOKEN_METHODS
from ..physics.adapters import FEEDFORWARD_PARTS
from ..physics.stack import Stack
from ..setup import TrainingSetup
from ..spec import ModelSpec


def _norm_names(model) -> list[str]:
    """Names of the norm modules outside attention (no q/k norms), as PEFT target suffixes."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if "Norm" in type(module).__name__ and ".attn" not in name and ".self_attn" not in name
                   and ".attention" not in name})


def peft_config(spec: ModelSpec, setup: TrainingSetup, stack: Stack, model=None):
    """The PEFT config for `setup.method` (not LoRA/QLoRA, which trace/build.py applies)."""
    import peft

    method = setup.method
    names = target_names(spec, stack)
    layers = {}
    if stack.lora_layers < spec.num_layers:
        layers["layers_to_transform"] = list(range(spec.num_layers - stack.lora_layers, spec.num_layers))
    r = setup.lora_rank
    common = dict(target_modules=names, task_type="CAUSAL_LM", **layers)
    if method in ("dora", "lora-fa"):
        return peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=setup.lora_dropout, bias="none",
                               use_dora=method == "dora", **common)
    if method == "adalora":
        # total_step is required by AdaLoraConfig; the schedule does not change what one step keeps.
        return peft.AdaLoraConfig(init_r=r, target_r=max(1, r * 2 // 3), lora_alpha=2 * r,
                                  lora_dropout=setup.lora_dropout, total_step=1000, **common)
    if method == "ia3":
        ff = target_names(spec, stack, FEEDFORWARD_PARTS)
        return peft.IA3Config(feedforward_modules=ff, **common)
    if method == "loha":
        return peft.LoHaConfig(r=r, alpha=r, **common)
    if method == "lokr":
        return peft.LoKrConfig(r=r, alpha=r, **common)
    if method == "vera":
        return peft.VeraConfig(r=r, vera_dropout=setup.lora_dropout, **common)
    if method == "oft":
        return peft.OFTConfig(oft_block_size=setup.oft_block_size, r=0, **common)
    if method == "boft":
        return peft.BOFTConfig(boft_block_size=setup.oft_block_size, boft_block_num=0, **common)
    if method == "fourierft":
        return peft.FourierFTConfig(n_frequency=setup.n_frequency, **common)
    if method == "osf":
        # memfit's rank is OSF's trainable rank: effective_rank (the frozen top of the SVD) = min(out, in) - r per
        # module, set per module name through rank_pattern (tuners/osf/model.py), as PEFT's MetaMathQA
        # experiment osf/llama-3.2-3B-rank128 does.
        from ..params import layer_linears

        widths = {lin.name: min(lin.d_in, lin.d_out) for lin in layer_linears(spec)}
        pattern = {name: widths[name.rsplit(".", 1)[-1]] - r for name in names}
        return peft.OSFConfig(rank_pattern=pattern, **common)
    if method == "tinylora":
        return peft.TinyLoraConfig(r=r, **common)
    if method == "ln-tuning":
        # target_modules None: PEFT's own per-family norm list (peft 0.21.2 utils/constants.py
        # TRANSFORMERS_MODELS_TO_LNTUNING_TARGET_MODULES_MAPPING, llama: input_layernorm, post_attention_layernorm,
        # norm).
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LNTUNING_TARGET_MODULES_MAPPING as known

        # Families PEFT has no list for (GPT-NeoX): every norm of the layers and the final norm, as
        # physics/adapters.py counts them.
        return peft.LNTuningConfig(task_type="CAUSAL_LM",
                                   target_modules=None if spec.model_type in known else _norm_names(model))
    if method == "llama-adapter":
        # PEFT's LLaMA-Adapter with LitGPT's prompt length and first adapted layer (physics/litgpt_adapter.py).
        from ..physics.litgpt_adapter import PROMPT_LENGTH

        return peft.AdaptionPromptConfig(adapter_len=PROMPT_LENGTH, adapter_layers=stack.lora_layers,
                                         task_type="CAUSAL_LM")
    n = setup.num_virtual_tokens
    if method == "prompt":
        return peft.PromptTuningConfig(num_virtual_tokens=n, task_type="CAUSAL_LM")
    if method == "ptuning":
        return peft.PromptEncoderConfig(num_virtual_tokens=n, encoder_hidden_size=spec.hidden_size,
                                        task_type="CAUSAL_LM")
    if method == "prefix":
        return peft.PrefixTuningConfig(num_virtual_tokens=n, task_type="CAUSAL_LM")
    raise AssertionError(f"no PEFT config for method {method}")   # options.PEFT_METHODS lists those handled


def target_names(spec: ModelSpec, stack: Stack, parts=None) -> list[str]:
    """PEFT target_modules for the adapted Linears (those serving `parts`, when given). A name two Linears share
    (GPT-2's attn.c_proj and mlp.c_proj) is qualified by its parent, since PEFT matches names as suffixes."""
    from ..params import layer_linears

    counts: dict[str, int] = {}
    for lin in layer_linears(spec):
        counts[lin.name] = counts.get(lin.name, 0) + 1
    out = set()
    for m in stack.lora_modules:
        if parts is not None and not set(m.linear.parts) & parts:
            continue
        name = m.linear.name
        if counts[name] > 1:
            name = ("attn." if set(m.linear.parts) <= {"q", "k", "v", "o"} else "mlp.") + name
        out.add(name)
    return sorted(out)


def apply(model, spec: ModelSpec, setup: TrainingSetup, stack: Stack):
    import torch
    from peft import get_peft_model

    # The base model lives on the meta device; a prompt encoder PEFT creates would be a real CPU module, which
    # to_empty cannot swap for a fake tensor. Build it on the meta device too. (Tuner layers follow their base
    # layer's device already, and BOFT computes its permutations with .item(), which the meta device refuses.)
    with torch.device("meta") if setup.method in VIRTUAL_TOKEN_METHODS else contextlib.nullcontext():
        model = get_peft_model(model, peft_config(spec, setup, stack, model),
                               autocast_adapter_dtype=stack.adapter_bytes == 4)
    if "word_embeddings" in model._modules:
        # Prompt learning keeps the model's input embedding a second time as PeftModel.word_embeddings
        # (peft_model.py _setup_prompt_encoder); materializing the shared module twice under FakeTensorMode fails.
        # Keep the reference as a plain attribute: the forward still finds it, to_empty visits the module once.
        embedding = model._modules.pop("word_embeddings")
        object.__setattr__(model, "word_embeddings", embedding)
    if setup.method == "tinylora":
        # Every TinyLoRA layer registers the tuner's one ModuleDict of vectors as its own submodule
        # (tuners/tinylora/layer.py update_layer: self.tinylora_v = tinylora_v); under FakeTensorMode to_empty cannot
        # swap a parameter it reaches through several modules. Keep the layers' references as plain attributes: the
        # forward still finds them, and the tuner model's registration materializes each vector once.
        for module in model.modules():
            if "tinylora_v" in module._modules and hasattr(module, "_tinylora_v_key"):
                object.__setattr__(module, "tinylora_v", module._modules.pop("tinylora_v"))
    if setup.method == "lora-fa":
        for name, p in model.named_parameters():
            if ".lora_A." in name:
                p.requires_grad_(False)
    if setup.method in ("loha", "lokr"):
        # LyCORIS layers draw `torch.rand(1) > module_dropout` every forward (peft tuners/lycoris_utils.py:241);
        # a fake tensor cannot be turned into a bool. With module_dropout 0 (the default) the draw always passes.
        for module in model.modules():
            if hasattr(module, "module_dropout"):
                for name in list(module.module_dropout):
                    module.module_dropout[name] = _AlwaysBelow()
    return model


class _AlwaysBelow:
    """Compares below any tensor: `torch.rand(1) > _AlwaysBelow()` is True without reading the tensor."""

    def __lt__(self, other):
        return True


def freeze_inactive_layers(layers, active: int) -> None:
    """LISA's switch_active_layers (LMFlow src/lmflow/pipeline/utils/lisa_trainer.py; ms-swift's callback is the
    same): every decoder layer frozen, then `active` layers unfrozen; the embedding, final norm and head keep
    training. It draws the layers at random; which ones does not change the bytes, so the trace takes the last."""
    for layer in layers[:len(layers) - active]:
        for p in layer.parameters():
            p.requires_grad_(False)
