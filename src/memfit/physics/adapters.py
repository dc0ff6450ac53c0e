"""PEFT methods besides plain LoRA: what each keeps in memory, one small record per method, read from peft 0.21.2.

Per adapted Linear a method has trainable tensors (`module_tensors`), frozen adapter tensors
(`module_frozen_params`), bytes it saves for backward per token (`saved_per_token`) and weight-sized tensors it
saves for backward once per module (`saved_per_module`: the materialized delta weight that F.linear keeps). The
whole-model extras (VeRA's shared projections, virtual-token embeddings, LN tuning's norm copies) are in
`extra_params`. Paths below are in peft 0.21.2 (src/peft/tuners/...).
"""

from __future__ import annotations

from dataclasses import dataclass

# IA3 scales the input of its "feedforward" modules and the output of the others; PEFT's default feedforward
# module is the MLP's down projection (peft utils/constants.py TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING:
# llama down_proj, gpt2 mlp.c_proj).
FEEDFORWARD_PARTS = frozenset({"down"})
# PEFT's default targets where they differ from LoRA's q,v (utils/constants.py
# TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING, llama: k_proj, v_proj, down_proj).
DEFAULT_TARGETS = {"ia3": ("k", "v", "down"),
                   # OSF: every projection (utils/constants.py TRANSFORMERS_MODELS_TO_OSF_TARGET_MODULES_MAPPING).
                   "osf": ("q", "k", "v", "o", "gate", "up", "down")}
# TinyLoraConfig.u = 64: the trainable vector's length per module (tuners/tinylora/config.py); weight_tying 0.0
# gives every adapted module its own vector (tuners/tinylora/model.py _create_and_replace: num_groups = modules).
TINYLORA_U = 64
# OFTConfig.oft_block_size = 32, BOFTConfig.boft_block_size = 4 (tuners/oft/config.py, tuners/boft/config.py).
DEFAULT_BLOCK_SIZE = {"oft": 32, "boft": 4}


def module_size(setup) -> int:
    """The per-module size knob the records take as `rank`: LoRA's rank, OFT/BOFT's block size, FourierFT's
    n_frequency."""
    if setup.method in ("oft", "boft"):
        return setup.oft_block_size
    if setup.method == "fourierft":
        return setup.n_frequency
    return setup.lora_rank


# transformers builds these families' projections as GPT-2 Conv1D, which LoHa, LoKr, OFT and BOFT do not adapt
# (peft 0.21.2 raises "Target module ... Conv1D ... not supported" in their _create_new_module).
CONV1D_MODEL_TYPES = ("gpt2",)
LINEAR_ONLY_METHODS = ("loha", "lokr", "oft", "boft", "osf")     # OSF: tuners/osf/layer.py dispatch_default


def check_modules(spec, setup, linears) -> None:
    """What PEFT refuses for these modules, refused the same way here (InvalidSetupError)."""
    from ..errors import InvalidSetupError, Problem

    problems = []
    if setup.method in LINEAR_ONLY_METHODS and spec.model_type in CONV1D_MODEL_TYPES and linears:
        problems.append(Problem("method", f"{{method}} {setup.method}: PEFT cannot adapt {spec.model_type}'s Conv1D "
                                          "projections with this method (it supports nn.Linear and Conv2d)"))
    if setup.method in ("oft", "boft"):
        bad = sorted({lin.d_in for lin in linears if lin.d_in % setup.oft_block_size})
        if bad:
            problems.append(Problem("oft_block_size", f"{{oft_block_size}} {setup.oft_block_size} does not divide the "
                                    f"input width {', '.join(map(str, bad))} of the adapted modules (PEFT refuses it)"))
    if setup.method == "osf":
        narrow = sorted({min(lin.d_in, lin.d_out) for lin in linears if min(lin.d_in, lin.d_out) <= setup.lora_rank})
        if narrow:
            problems.append(Problem("lora_rank", f"{{lora_rank}} {setup.lora_rank}: OSF's trainable rank must leave a "
                                    f"frozen rank (effective_rank > 0) below min(out, in) = {narrow[0]}"))
    if setup.method == "llama-adapter" and not setup.recipe.startswith("litgpt"):
        from .litgpt_adapter import PEFT_MODEL_TYPES

        if spec.model_type not in PEFT_MODEL_TYPES:
            problems.append(Problem("method", f"{{method}} llama-adapter: PEFT's adaption_prompt supports "
                                              f"{', '.join(PEFT_MODEL_TYPES)} attention, not {spec.model_type}'s "
                                              "(or use {recipe} litgpt)"))
    if setup.method == "fourierft":
        small = sorted({lin.d_in * lin.d_out for lin in linears if lin.d_in * lin.d_out < setup.n_frequency})
        if small:
            problems.append(Problem("n_frequency", f"{{n_frequency}} {setup.n_frequency} exceeds the {small[0]} "
                                    "entries of an adapted weight"))
    if problems:
        raise InvalidSetupError(problems)


@dataclass(frozen=True)
class Method:
    name: str
    keeps: str          # one line: what it keeps in memory beyond the frozen base (README table)
    source: str         # where its forward is


METHODS = {m.name: m for m in (
    Method("lora", "A (r x in) and B (out x r) per module; saves the adapter's input copy and the r-wide "
           "intermediate", "tuners/lora/layer.py Linear.forward"),
    Method("dora", "LoRA plus a magnitude vector (out); saves LoRA's tensors plus the base output and the LoRA "
           "output (2 x out per token: (m / norm(W) - 1) * base + m / norm(W) * lora)",
           "tuners/lora/dora.py DoraLinearLayer.forward:132-166"),
    Method("lora-fa", "LoRA with A frozen: no gradient or optimizer state for A, and lora_A saves no input "
           "(only B's r-wide input)", "optimizers/lorafa.py create_lorafa_optimizer (A.requires_grad=False)"),
    Method("adalora", "A (r x in), E (r) and B (out x r) per module; saves the input and the r-wide intermediate; "
           "the orthogonality loss (A A^T, B^T B) is r x r", "tuners/adalora/layer.py SVDLinear.forward"),
    Method("ia3", "one vector per module (out, or in for the feed-forward module); saves the scaled output (or "
           "the input cast to the vector's dtype)", "tuners/ia3/layer.py Linear.forward:172-199"),
    Method("loha", "2 x (A, B) pairs per module; materializes the out x in delta weight, which F.linear saves, "
           "and the module input", "tuners/loha/layer.py HadaWeight, Linear._get_delta_activations"),
    Method("lokr", "Kronecker factors per module; materializes the out x in delta weight, which F.linear saves, "
           "and the module input", "tuners/lokr/layer.py get_delta_weight, make_kron"),
    Method("vera", "shared frozen A (r x max in) and B (max out x r), per module lambda_d (r) and lambda_b (out); "
           "saves the r-wide and out-wide products and 16-bit casts of the sliced projections",
           "tuners/vera/layer.py Linear.forward:253-289"),
    Method("oft", "block-diagonal rotation of each module's input: in x (block - 1) / 2 parameters; saves a "
           "block-major copy of the input per module and seven (in/block) x block x block Cayley-Neumann tensors",
           "tuners/oft/layer.py OFTRotationModule.forward:243-283, _cayley_batch:118-157"),
    Method("boft", "butterfly rotation: an fp32 in x in permutation buffer per module, boft_R and a scale (out); saves "
           "in x in rotation matrices, the module input and its output",
           "tuners/boft/layer.py Linear.forward, cayley_batch:453-468"),
    Method("fourierft", "n_frequency spectral entries per module; materializes the out x in delta weight by ifft2, "
           "which F.linear saves, and a per-module cast of the input", "tuners/fourierft/layer.py:94-101, 178-189"),
    Method("ln-tuning", "a trainable copy of every norm; the norms save their normalized output",
           "tuners/ln_tuning/layer.py LNTuningLayer.forward"),
    Method("prompt", "a (virtual tokens x hidden) embedding; every activation covers s + virtual tokens",
           "peft_model.py PeftModelForCausalLM.forward (inputs_embeds = cat(prompts, embeds))"),
    Method("ptuning", "prompt tuning with a 3-layer MLP encoder (hidden -> hidden -> hidden -> hidden); "
           "activations cover s + virtual tokens", "tuners/p_tuning/model.py PromptEncoder"),
    Method("lisa", "full fine-tuning of --lisa-layers layers at a time plus the embedding, head and final norm: "
           "their gradients and optimizer state; every other layer saves what a frozen layer does",
           "LMFlow src/lmflow/pipeline/utils/lisa_trainer.py DynamicLayerActivationCallback; ms-swift "
           "DynamicLayerActivationCallback (same switch_active_layers)"),
    Method("osf", "an SVD split of each weight: trainable U_low (out x r), S_low (r), V_low (r x in) and frozen "
           "copies of them, plus the frozen top singular vectors on the non-square side (U_high out x (min - r) "
           "when out > in, V_high (min - r) x in when in > out); saves the cast input, the 2r-wide product and "
           "the concatenated factors A (out x 2r) and B (2r x in)",
           "tuners/osf/layer.py OSFLayer.update_layer:100-164, Linear.forward:316-354"),
    Method("tinylora", "a 64-entry vector per module (u) mixing fixed random r x r projections P; frozen SVD "
           "factors A (r x in), B (out x r) and P (u x r x r); saves only the r-wide product",
           "tuners/tinylora/layer.py TinyLoraLayer._init_svd:187-228, Linear.forward:375-417"),
    Method("llama-adapter", "from layer 2 on, a trainable 10 x hidden prompt and a gate per layer; the first two "
           "layers save nothing. LitGPT (--recipe litgpt*): a per-head gate, the prompt's second SDPA saves its "
           "output and logsumexp; elsewhere PEFT's adaption_prompt: a scalar gate, recomputed rotary queries and an "
           "eager fp32 softmax over the prompt",
           "LitGPT lit_gpt/adapter.py CausalSelfAttention.scaled_dot_product_attention:119-149 (lit-gpt@0f021f3a); "
           "tuners/adaption_prompt/layer.py AdaptedAttention.forward"),
    Method("llama-adapter-v2", "LLaMA-Adapter plus a trainable bias and scale (out each) on every Linear and lm_head "
           "and trainable norms; each Linear keeps its pre-scale output (lm_head: vocabulary-wide logits)",
           "LitGPT lit_gpt/adapter_v2.py AdapterV2Linear.forward, adapter_filter (lit-gpt@0f021f3a)"),
    Method("prefix", "a (virtual tokens x 2 x layers x kv width) embedding fed as past key/values: attention "
           "keys and values are s + virtual tokens long and take a mask", "tuners/prefix_tuning/model.py, "
           "peft_model.py get_prompt"),
)}


def method_table() -> str:
    """The README's table of methods (tools/readme_flags.py writes it; a test checks it)."""
    rows = ["| `--method` | what it keeps in memory beyond the frozen base | forward read from "
            "(peft 0.21.2 src/peft/) |", "|---|---|---|"]
    rows += [f"| {m.name} | {m.keeps} | {m.source} |" for m in METHODS.values()]
    return "\n".join(rows)


def lokr_factors(d_in: int, d_out: int, rank: int) -> tuple[int, ...]:
    """Element counts of LoKr's trainable tensors for one Linear (peft tuners/lokr/layer.py update_layer:
    shape ((out_l, out_k), (in_m, in_n)), w1 full unless decompose_both, w2 split into a rank-r pair when
    r < max(out_k, in_n) / 2)."""
    in_m, in_n = factorization(d_in)
    out_l, out_k = factorization(d_out)
    w1 = (out_l * in_m,)
    w2 = (out_k * rank, rank * in_n) if rank < max(out_k, in_n) / 2 else (out_k * in_n,)
    return w1 + w2


def factorization(dimension: int) -> tuple[int, int]:
    """peft tuners/lokr/layer.py factorization(dimension, factor=-1): the divisor pair nearest the square root,
    smaller first."""
    m, n = 1, dimension
    while m < n:
        new_m = m + 1
        while dimension % new_m:
            new_m += 1
        new_n = dimension // new_m
        if new_m + new_n > m + n:
            break
        m, n = new_m, new_n
    return (m, n) if m <= n else (n, m)


def module_tensors(method: str, d_in: int, d_out: int, rank: int, feedforward: bool) -> tuple[int, ...]:
    """Element counts of the trainable tensors one adapted Linear adds."""
    if method in ("lora", "qlora"):
        return (rank * d_in, rank * d_out)
    if method == "dora":
        return (rank * d_in, rank * d_out, d_out)                  # lora_magnitude_vector: one per output row
    if method == "lora-fa":
        return (rank * d_out,)
    if method == "adalora":
        # lora_A, lora_E, lora_B, and ranknum, which get_peft_model leaves requiring grad (the division by it in
        # the forward gives it a gradient)
        return (rank * d_in, rank, rank * d_out, 1)
    if method == "ia3":
        return (d_in if feedforward else d_out,)
    if method == "loha":
        return (d_out * rank, rank * d_in, d_out * rank, rank * d_in)
    if method == "lokr":
        return lokr_factors(d_in, d_out, rank)
    if method == "vera":
        return (rank, d_out)                                      # vera_lambda_d, vera_lambda_b
    if method == "oft":
        # OFTRotationModule.weight: (in / block, block * (block - 1) / 2), the skew-symmetric blocks' upper halves
        # (tuners/oft/layer.py:92).
        return (d_in // rank * (rank * (rank - 1) // 2),)
    if method == "boft":
        # boft_R (1, in / block, block, block) and boft_s (out, 1), one butterfly factor (BOFTConfig default
        # boft_n_butterfly_factor=1; tuners/boft/layer.py update_layer).
        return (d_in * rank, d_out)
    if method == "fourierft":
        return (rank,)                                            # fourierft_spectrum: n_frequency entries
    if method == "osf":
        return (d_out * rank, rank, rank * d_in)                  # osf_svd_params U_low, S_low, V_low
    if method == "tinylora":
        return (TINYLORA_U,)                                      # tinylora_v, one group per module
    return ()


def module_frozen_params(method: str, d_in: int, d_out: int, rank: int) -> int:
    """Frozen adapter elements per module: LoRA-FA's A; OSF's initial U/S/V_low and the stored high subspace;
    TinyLoRA's SVD factors and projections (buffers cast with the adapter: tuners_utils.py cast_adapter_dtype)."""
    if method == "lora-fa":
        return rank * d_in
    if method == "osf":
        # _osf_{U,S,V}_low_init; U_high only when out > in, V_high only when in > out (the square side is
        # recovered from the low-rank init: tuners/osf/layer.py:121-135).
        high = min(d_in, d_out) - rank
        return d_out * rank + rank + rank * d_in + (d_out * high if d_out > d_in else 0) + \
            (high * d_in if d_in > d_out else 0)
    if method == "tinylora":
        return rank * d_in + d_out * rank + TINYLORA_U * rank * rank     # tinylora_A, tinylora_B, tinylora_P
    return 0


def module_buffer_bytes(method: str, d_in: int, rank: int) -> int:
    """Buffers of one adapted module, in their own dtype: OFT's triu row and column indices, int64
    (tuners/oft/layer.py:101); BOFT's butterfly permutation boft_P, an fp32 in x in matrix per butterfly factor
    (tuners/boft/layer.py update_layer: register_buffer("boft_P", P))."""
    if method == "oft":
        return 2 * 8 * (rank * (rank - 1) // 2)
    if method == "boft":
        return 4 * d_in * d_in
    return 0


def saved_per_token(method: str, d_in: int, d_out: int, rank: int, in_bytes: int, out_bytes: int,
                    adapter_bytes: int, autocast: bool, feedforward: bool, dropout: float = 0.0) -> tuple[int, int]:
    """Per token: (bytes this module's adapter saves, bytes of an input copy shared with the other modules reading
    the same tensor). With dropout on the adapter's input (dora, adalora, vera, lora-fa), each module keeps
    CUDA's bool mask, and its dropout output replaces a shared input."""
    own, shared = _saved_per_token(method, d_in, d_out, rank, in_bytes, out_bytes, adapter_bytes, autocast,
                                   feedforward)
    if dropout > 0 and method in ("dora", "adalora", "vera", "lora-fa"):
        own, shared = own + d_in + shared, 0
        if method == "dora":
            # the base output is recomputed from the dropped input, in the adapter's matmul dtype
            own += d_out * ((2 if autocast else adapter_bytes) - out_bytes)
    return own, shared


def _saved_per_token(method: str, d_in: int, d_out: int, rank: int, in_bytes: int, out_bytes: int,
                     adapter_bytes: int, autocast: bool, feedforward: bool) -> tuple[int, int]:
    """Without dropout. `in_bytes`: the input's dtype; `adapter_bytes`: the adapter's;
    `out_bytes`: the base Linear's output dtype. Under autocast every matmul runs in
    16 bits on a cast of its fp32 operands, and the cast is what is saved."""
    ad = adapter_bytes
    mm = 2 if autocast else ad                                 # dtype of the adapter's matmul operands
    if method == "lora-fa":
        # lora_A's weight is frozen: it saves no input; lora_B saves its r-wide input.
        return mm * rank, 0
    if method == "dora":
        # LoRA's saves, then (m/||W|| - 1) * base_result saves base_result (16-bit base output) and
        # m/||W|| * lora_result saves lora_result (the adapter's output, in the matmul dtype).
        lora = (d_in * mm if input_copied(in_bytes, ad, autocast) else 0) + mm * rank
        shared = 0 if input_copied(in_bytes, ad, autocast) else d_in * in_bytes
        return lora + d_out * in_bytes + d_out * mm, shared
    if method == "adalora":
        # dropout(x) @ (A * E).T saves x (cast to the adapter dtype, then to 16 bits under autocast) and A*E;
        # the r-wide intermediate is saved for @ B.T; `/ ranknum` saves the out-wide product (layer.py:195).
        own = (d_in * mm if input_copied(in_bytes, ad, autocast) else 0) + mm * rank + mm * d_out
        shared = 0 if input_copied(in_bytes, ad, autocast) else d_in * in_bytes
        return own, shared
    if method == "ia3":
        # Feed-forward: (x.to(l.dtype) * l) saves the cast input (x itself when already in l's dtype);
        # others: result * l saves the base output.
        if feedforward:
            return (d_in * ad, 0) if in_bytes != ad else (0, d_in * ad)
        return d_out * out_bytes, 0
    if method == "oft":
        # OFTRotationModule.forward (tuners/oft/layer.py:243-283): x.to(fp32 weight dtype), then the einsum's bmm
        # saves its own copy of x laid out block-major (16-bit under autocast); the base Linear is frozen.
        return d_in * mm, 0
    if method == "boft":
        # x @ boft_rotation saves x (the module input, shared); result * boft_scale saves the base output
        # (tuners/boft/layer.py Linear.forward).
        return d_out * out_bytes, d_in * in_bytes
    if method in ("loha", "lokr", "fourierft"):
        # F.linear(x.to(delta.dtype), delta) (loha/layer.py _get_delta_activations, lokr/layer.py:336-343): the
        # delta trains, so the input is saved. When the input already has the delta's dtype it is the module input
        # itself, shared by every module reading it; otherwise each module saves its own cast (under autocast the
        # 16-bit re-cast of that copy).
        delta = _delta_bytes(method, adapter_bytes, autocast)
        if in_bytes == delta:
            return 0, d_in * in_bytes
        return d_in * (2 if autocast else delta), 0
    if method == "osf":
        # x_cast = x.to(A.dtype); h = F.linear(x_cast, B) saves x_cast (B trains): the input itself when it already
        # has the adapter dtype (shared), else a per-module cast (16-bit under autocast); F.linear(h, A) saves the
        # 2r-wide h (tuners/osf/layer.py:343-349).
        own = (d_in * mm if input_copied(in_bytes, ad, autocast) else 0) + mm * 2 * rank
        shared = 0 if input_copied(in_bytes, ad, autocast) else d_in * in_bytes
        return own, shared
    if method == "tinylora":
        # F.linear(x, A) with A frozen saves no input; F.linear(h, R) saves h (r) for R's gradient; B is frozen
        # (tuners/tinylora/layer.py:408-410).
        return mm * rank, 0
    if method == "vera":
        # x cast to lambda's dtype; F.linear(x, A) saves only the (16-bit) A slice (A is frozen); lambda_d * h
        # saves h (r); F.linear(.., B) saves the B slice; lambda_b * out saves out.
        return mm * rank + mm * d_out, 0
    raise AssertionError(method)


def input_copied(in_bytes: int, adapter_bytes: int, autocast: bool) -> bool:
    """Whether an adapter's first matmul saves its own copy of the module input rather than the input itself: the
    input is cast to the adapter's dtype (`x.to(lora_A.weight.dtype)`, a copy when the dtypes differ), and under
    autocast the matmul casts fp32 operands to 16 bits (a no-op on a 16-bit input with 16-bit adapters)."""
    return in_bytes != adapter_bytes or (autocast and adapter_bytes != 2)


def autocast_cast_elements(method: str, d_in: int, d_out: int, rank: int) -> int:
    """Adapter elements whose 16-bit casts live until backward under autocast with fp32 adapters: the operands of
    the adapter's matmuls (autocast caches casts of leaf parameters that need grad; F.linear saves the cast
    weight for the input's gradient). Elementwise-only adapters (IA3, VeRA's lambdas) and torch.kron (LoKr's w1)
    are not autocast ops."""
    if method in ("lora", "qlora", "dora", "lora-fa"):
        return rank * (d_in + d_out)
    if method == "adalora":
        # (A*E).T and B.T in the forward, and the orthogonality term's p @ p.T, which casts p and p.T separately
        # (adalora/model.py forward:239-256).
        return 3 * rank * (d_in + d_out)
    # LoHa and LoKr: HadaWeight / torch.kron save the fp32 factors themselves; the casts autocast caches for their
    # matmuls are freed when the forward ends.
    return 0


def _delta_bytes(method: str, adapter_bytes: int, autocast: bool) -> int:
    """dtype of the delta weight LoHa / LoKr / FourierFT build: LoHa's is a product of matmuls (16-bit under
    autocast); LoKr's torch.kron promotes to the fp32 factor w1 (kron is not an autocast op); FourierFT's
    ifft2 runs in fp32 and returns the spectrum's dtype (tuners/fourierft/layer.py:94-101)."""
    return 2 if (method == "loha" and autocast) else adapter_bytes


def saved_per_module(method: str, d_in: int, d_out: int, rank: int, autocast: bool, adapter_bytes: int,
                     x_bytes: int, dropout: float = 0.0) -> tuple[int, int]:
    """Weight-sized tensors saved for backward once per adapted module (not per token): (always, only where the
    module's input needs a gradient, i.e. not in a first layer fed by the frozen embedding, where F.linear keeps
    no weight). `x_bytes`: the module input's dtype."""
    mm = 2 if autocast else adapter_bytes
    if method == "dora" and dropout > 0:
        # With dropout DoRA recomputes the base output from the dropped input: F.linear(x, weight.to(x.dtype))
        # keeps a copy of the base weight in the adapter's dtype (16-bit under autocast) for x's gradient
        # (tuners/lora/dora.py:141-163).
        return 0, d_in * d_out * mm
    if method in ("loha", "lokr", "fourierft"):
        # FourierFT's spectrum positions (2 x n_frequency int64, a plain attribute, not a buffer) are saved by the
        # index_put that scatters the spectrum.
        indices = 2 * rank * 8 if method == "fourierft" else 0
        return indices, d_in * d_out * (2 if autocast else _delta_bytes(method, adapter_bytes, autocast))
    if method == "vera":
        return 0, (rank * (d_in + d_out) * mm if autocast else 0)   # autocast casts of the sliced A and B
    if method == "osf":
        # A = cat(U_low * S_low, -U_low_init * S_low_init) (out x 2r) is saved by F.linear(h, A) for h's gradient;
        # B = cat(V_low, V_low_init) (2r x in) by F.linear(x_cast, B) for x's (tuners/osf/layer.py:343-349). Both
        # are new tensors (cat), in the matmul dtype.
        return d_out * 2 * rank * mm, 2 * rank * d_in * mm
    if method == "tinylora":
        # The frozen A and B buffers are saved by reference; under autocast F.linear saves their 16-bit casts.
        return (d_out * rank * 2 if autocast else 0), (rank * d_in * 2 if autocast else 0)
    if method == "oft":
        # The Cayley-Neumann series (5 terms, OFTConfig default) saves the skew matrix and the bmm operands of its
        # powers, six (in / block) x block x block tensors, and the einsum keeps the rotation for x's gradient
        # (tuners/oft/layer.py:118-157, 243-283).
        return 6 * d_in * rank * mm, d_in * rank * mm
    if method == "boft":
        # torch.linalg.solve's Cayley transform keeps three fp32 (in / block) x block x block tensors; boft_P cast
        # to x's dtype and torch.eye(in) are kept by the bmm / matmul that build the rotation, and the in x in
        # rotation by x @ rotation (tuners/boft/layer.py cayley_batch:453-468, Linear.forward).
        copy_p = d_in * d_in * x_bytes if x_bytes != 4 else 0      # .to(x) of the fp32 buffer
        return 3 * d_in * rank * 4 + copy_p + d_in * d_in * x_bytes, d_in * d_in * x_bytes
    return 0, 0


def extra_params(spec, method: str, rank: int, virtual_tokens: int, linears,
                 peft: bool = False) -> tuple[tuple[tuple[int, int], ...], int]:
    """Adapter tensors that do not belong to one Linear: ((elements, count) of trainable tensors, frozen elements).
    `linears`: the adapted Linears of one layer (VeRA sizes its shared projections by the largest)."""
    h, p, L = spec.hidden_size, virtual_tokens, spec.num_layers
    if method in ("llama-adapter", "llama-adapter-v2"):
        from . import litgpt_adapter

        return litgpt_adapter.extra_params(spec, method, peft), 0
    if method == "vera" and linears:
        # vera_A (r x max in) and vera_B (max out x r), one frozen pair for the whole model (tuners/vera/model.py
        # _init_vera_A_vera_B), kept as buffers.
        return (), rank * (max(lin.d_in for lin in linears) + max(lin.d_out for lin in linears))
    if method == "prompt":
        return ((p * h, 1),), 0                                   # PromptEmbedding: nn.Embedding(p, h)
    if method == "ptuning":
        # PromptEncoder MLP with encoder_hidden_size = hidden: Embedding(p, h) + 3 Linear(h, h) with biases.
        return ((p * h, 1), (h * h, 3), (h, 3)), 0
    if method == "prefix":
        # PrefixEncoder without projection: Embedding(p, layers x 2 x kv width) (peft/utils/other.py #1901 uses
        # the key/value heads' width for grouped-query attention).
        return ((p * L * 2 * spec.kv_dim, 1),), 0
    if method == "ln-tuning":
        # A trainable deepcopy of every norm and the final norm (tuners/ln_tuning/layer.py update_layer:48), in
        # the norm's own dtype; the frozen originals are part of the base weights.
        per_norm = h * (2 if spec.norm_bias else 1)
        return ((per_norm, L * spec.norms_per_layer + 1),), 0
    return (), 0


def virtual_tokens(method: str, num_virtual_tokens: int) -> int:
    """Positions prompt and p-tuning add to every sequence: PEFT concatenates the virtual-token embeddings in front
    of the input embeddings and pads the labels with -100 (peft_model.py PeftModelForCausalLM.forward), so every
    layer, the logits and the loss run on s + virtual tokens."""
    return num_virtual_tokens if method in ("prompt", "ptuning") else 0


def first_layer_input_trains(method: str) -> bool:
    """The first layer's input needs a gradient: the trainable virtual-token embeddings are part of it."""
    return method in ("prompt", "ptuning")


def own_dtype(method: str) -> bool:
    """The adapter keeps its base module's dtype: LLaMA-Adapter's prompt and gate (PEFT creates them in q_proj's
    weight dtype, adaption_prompt/layer.py AdaptedAttention.__init__, and leaves them: they are no tuner layer that
    cast_adapter_dtype visits; LitGPT trains in the model's dtype); LN tuning's norm copies are deepcopies of the
    16-bit norms, and get_peft_model leaves them so (checked on the model peft 0.21.2 builds: the ln_tuning_layers weights are bf16
    for a bf16 model, unlike the fp32 adapters tuners_utils.py cast_adapter_dtype makes of LoRA-type layers)."""
    return method in ("ln-tuning", "llama-adapter", "llama-adapter-v2")


def extra_cast_elements(spec, method: str) -> int:
    """Elements of whole-model adapter weights whose 16-bit casts autocast keeps until backward: p-tuning's MLP
    encoder runs three Linear(h, h) under autocast, and F.linear saves each cast weight (tuners/p_tuning/model.py
    PromptEncoder.forward)."""
    return 3 * spec.hidden_size ** 2 if method == "ptuning" else 0


def prefix_extra_per_token(spec, virtual: int, seq_len: int, attn_bytes: int) -> int:
    """Prefix tuning, per token of one layer, beyond a padded-mask attention over s keys: the past key/values make
    every key and value s + p long (DynamicCache.update concatenates them, repeat_kv expands them to the query
    heads because a mask is present, and SDPA saves them), and the [b, 1, s, s + p] mask has p more columns
    (transformers masking_utils builds it because the key length differs from the query length)."""
    extra = virtual * attn_bytes + round(2 * virtual * spec.q_dim * attn_bytes / seq_len)
    if spec.fused_qkv and spec.position_embeddings:
        # Without rotary (GPT-2) the saved query is still a view of the fused qkv output, which keeps the key and
        # value parts of that storage alive although SDPA saves the concatenated copies.
        extra += 2 * spec.kv_dim * attn_bytes
    return extra


def lisa_layer_coefficients(spec, setup, stack, walk_layer) -> tuple[int, int]:
    """LISA: per-layer saved bytes averaged over the layers. The active layers save what full fine-tuning saves;
    the others are frozen but their input needs a gradient (the embedding trains), so they save what a frozen
    layer under an adapter does, without the adapter. `walk_layer(stack)` walks one layer under a stack."""
    from dataclasses import replace

    active = walk_layer(stack)
    frozen = walk_layer(replace(stack, base_trainable=False, lora_modules=(), method="lora"))
    n, total = stack.lora_layers, spec.num_layers
    return tuple(round((n * a + (total - n) * f) / total) for a, f in zip(active, frozen))


def assumption(setup, stack) -> str:
    """The estimate's assumption line for a PEFT method other than LoRA, or LISA."""
    method = METHODS[setup.method]
    if setup.method == "lisa":
        return (f"LISA: {stack.lora_layers} of the layers train at a time with the embedding, head and final norm "
                "(gradients and AdamW state for those); torch keeps the state of a parameter once created, so "
                "where the optimizer holds every layer (LMFlow creates it before the first switch) the state of "
                "each layer that has been active stays allocated and grows towards full fine-tuning's over a run "
                f"({method.source})")
    names = ",".join(sorted({m.linear.name for m in stack.lora_modules}))
    where = f" on {names} in {stack.lora_layers} layers" if names else ""
    knobs = {"oft": f"block size {setup.oft_block_size}", "boft": f"block size {setup.oft_block_size}",
             "fourierft": f"n_frequency {setup.n_frequency}", "ia3": "",
             "prefix": f"{setup.num_virtual_tokens} virtual tokens", "prompt": f"{setup.num_virtual_tokens} "
             "virtual tokens", "ptuning": f"{setup.num_virtual_tokens} virtual tokens", "ln-tuning": "",
             "osf": f"trainable rank {setup.lora_rank}", "llama-adapter": "", "llama-adapter-v2": "",
             "tinylora": f"SVD rank {setup.lora_rank}, u {TINYLORA_U}"}
    knob = knobs.get(setup.method, f"rank {setup.lora_rank}")
    return (f"{setup.method}{' ' + knob if knob else ''}{where}, adapters in "
            f"{'fp32' if stack.adapter_bytes == 4 else '16-bit'}: {method.keeps} (peft 0.21.2 {method.source})")
