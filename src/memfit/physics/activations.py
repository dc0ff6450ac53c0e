"""Activations: the tensors autograd saves for backward, walked op by op through one decoder layer.

The op rules (research/memory-physics.md section 3.1, each checked byte for byte with saved_tensors_hooks on a
real HF Llama): a Linear saves its input only if its weight trains; under autocast each Linear casts an fp32
input to bf16 separately and saves that copy; HF RMSNorm saves an fp32 copy of its input and rsqrt, plus the
normalized output when its weight trains; SiLU/GELU save their input; a gated product saves both operands;
flash / mem-efficient SDPA save q, k, v, out and an fp32 logsumexp; eager attention saves the fp32 softmax
(4 B) and its bf16 cast (2 B) per score; PEFT casts each adapted module's input to the adapter dtype and
lora_A saves that copy. For Llama this walk reproduces the closed forms of section 3.3, e.g. full FT bf16 SDPA
= bs(16h + 4qd + 4kvd + 8i + 8) + 4bas.
"""

from __future__ import annotations

from ..spec import ACT_SAVED_TENSORS, ModelSpec
from ..setup import TrainingSetup
from dataclasses import replace

from ..options import LITGPT_METHODS
from ..params import layer_linears
from . import adapters, litgpt_adapter, quantized_base
from .compile import compiled_coefficients, compiled_mlp_bytes_per_token
from .litgpt import repeats_kv, zero_pad_saved_per_token
from .lora_outer import embed_saved_per_token
from .stack import Stack


class _Walk:
    """Accumulates saved bytes as two coefficients: bytes per token, and bytes per token per position (the s^2
    terms of eager attention and padding masks). Storages shared by several ops are added once."""

    def __init__(self, spec: ModelSpec, setup: TrainingSetup, stack: Stack):
        self.spec, self.setup, self.st = spec, setup, stack
        self.per_token = 0
        self.per_token_position = 0
        # LN tuning trains a copy of every norm (physics/adapters.py): the norms save their normalized output.
        self.norms_train = stack.base_trainable or stack.method in ("ln-tuning", "llama-adapter-v2")
        # LLM.int8 linears keep their input for backward (physics/quantized_base.py int8_keeps_input).
        self.int8 = quantized_base.int8_keeps_input(setup, stack)
        self.int8_first_inputs = 0                    # what the int8 linears reading the layer's input keep

    def add(self, per_token_bytes: int) -> None:
        self.per_token += per_token_bytes

    def add_quadratic(self, per_token_position_bytes: int) -> None:
        self.per_token_position += per_token_position_bytes

    @property
    def coefficients(self) -> tuple[int, int]:
        return self.per_token, self.per_token_position

    # -- building blocks ---------------------------------------------------------------------------------------
    def norm(self, width: int, in_bytes: int, trainable: bool, input_shared: bool = False) -> int:
        """Saves of one norm over `width` features; returns the dtype bytes of its output.
        `input_shared`: another norm already saves this very input tensor (GPT-NeoX's two parallel norms)."""
        spec, st = self.spec, self.st
        if st.fused_norm or st.compiled:
            self.add((0 if input_shared else width * in_bytes) + 4)   # fused kernel: input + rstd
        elif spec.norm_kind == "layernorm":
            # aten native_layer_norm saves input, mean, rstd (fp32 on CUDA); under autocast it runs in fp32,
            # on a new fp32 copy of a 16-bit input, and returns fp32.
            copy = st.autocast and in_bytes != 4
            self.add((0 if input_shared and not copy else width * (4 if st.autocast else in_bytes)) + 8)
            return 4 if st.autocast else in_bytes
        else:
            # x.float() (a copy of a 16-bit input, the input itself when fp32) and rsqrt
            self.add((0 if input_shared and in_bytes == 4 else width * 4) + 4)
            if trainable:
                # Llama: weight * x_norm.to(input_dtype) saves x_norm in the input dtype;
                # Gemma: (x_norm * (1 + w.float())) in fp32 saves x_norm in fp32.
                self.add(width * (4 if spec.norm_style == "gemma" else in_bytes))
        return in_bytes

    def linear_inputs(self, width: int, in_bytes: int, n_consumers: int, residual: bool = True) -> None:
        """What trainable base Linears reading one input save (nothing when the base is frozen).
        `residual`: the input is in the model's dtype (a norm output), which autocast may have to cast."""
        if not self.st.base_trainable or (self.st.compiled and residual):
            return                                    # (compiled: the norm output is recomputed from its input)
        if self.st.autocast and (in_bytes == 4 or (residual and self.st.residual_cast)):
            self.add(n_consumers * width * 2)         # one 16-bit cast per Linear
        else:
            self.add(width * in_bytes)                # one shared storage

    def lora(self, parts: set[str], width: int, in_bytes: int, input_saved: bool = False) -> None:
        """Saves of the LoRA branches on the modules in `parts` that read one input of `width` features, then
        what int8 base linears reading that input keep of it.
        `input_saved`: that input is already kept by another op (SDPA's out feeding o_proj)."""
        input_saved = self._adapters(parts, width, in_bytes, input_saved)
        if not self.int8:
            return
        # MatMul8bitLt keeps the tensor its base linear reads. OFT and BOFT rotate the input and IA3 scales a
        # feed-forward one before the base layer (peft 0.21.2 tuners/oft/layer.py:656 base_layer(x.to(previous_dtype)),
        # boft/layer.py:642 base_layer(x_rotated), ia3/layer.py:192-193 base_layer(interm)): a new tensor per module,
        # in the input's dtype, needing a grad even in the first layer (the adapter trains).
        transformed = {m.linear.parts for m in self.st.lora_modules if set(m.linear.parts) & parts
                       and m.linear.d_in == width and _transforms_input(m)}
        self.add(len(transformed) * width * in_bytes)
        direct = any(lin.parts not in transformed for lin in layer_linears(self.spec)
                     if set(lin.parts) & parts and lin.d_in == width)
        if direct and not input_saved:
            # The others keep the input itself: new memory only when no other op saved that storage.
            self.add(width * in_bytes)
            if parts & {"q", "k", "v"}:
                self.int8_first_inputs = width * in_bytes

    def _adapters(self, parts: set[str], width: int, in_bytes: int, input_saved: bool) -> bool:
        """The adapters' saves; returns whether the input tensor itself is now saved by some op."""
        st, p = self.st, self.setup.lora_dropout
        modules = [m for m in st.lora_modules if set(m.linear.parts) & parts and m.linear.d_in == width]
        if not modules:
            return input_saved
        ad = st.adapter_bytes
        shared_counted = input_saved
        if st.compiled:
            p = 0.0                                   # compiled dropout: mask and output recomputed (compile.py)
        for m in modules:
            if m.kind not in ("lora", "qlora"):
                lin_out = in_bytes if st.quantized else st.compute_bytes
                own, shared = adapters.saved_per_token(m.kind, width, m.linear.d_out, m.rank, in_bytes, lin_out, ad,
                                                       st.autocast, m.feedforward, p)
                self.add(own + (0 if shared_counted else shared))
                shared_counted = shared_counted or shared > 0
                continue
            if st.autocast and adapters.input_copied(in_bytes, ad, True):
                self.add(width * (3 if p > 0 else 2) + 2 * m.rank)
                continue
            # (16-bit adapters under autocast on a 16-bit input: no cast, as without autocast)
            if p > 0:
                self.add(width * (1 + ad) + ad * m.rank)   # bool mask (CUDA) + dropout output, + lora_B input
            elif in_bytes == ad:
                if not shared_counted and not self.st.base_trainable:
                    self.add(width * ad)                  # lora_A saves the input itself, shared
                    shared_counted = True
                self.add(ad * m.rank)
            else:
                self.add(width * ad + ad * m.rank)          # per-module cast copy + lora_B input
        return shared_counted

    # -- the layer ---------------------------------------------------------------------------------------------
    def layer(self) -> tuple[int, int]:
        spec, st, s = self.spec, self.st, self.setup
        h, qd, kvd = spec.hidden_size, spec.q_dim, spec.kv_dim
        res, train = st.residual_bytes, st.base_trainable
        # bitsandbytes Linear4bit returns its input's dtype (output.to(inp_dtype)); other linears the compute dtype.
        lin_out = res if st.quantized else st.compute_bytes
        cmp = 2 if st.autocast else lin_out          # dtype attention runs in (autocast casts q/k/v)
        a = spec.num_heads
        attn = st.attn

        x = self.norm(h, res, self.norms_train) if not _post_norm(spec) else res
        attn_in_consumers = 1 if spec.fused_qkv else 3
        mlp_shares_input = spec.parallel_attn_mlp and spec.norms_per_layer == 1
        if mlp_shares_input:
            attn_in_consumers += 1 if spec.fused_gate_up or spec.mlp_kind == "plain" else 2
        self.linear_inputs(h, x, attn_in_consumers)
        self.lora({"q", "k", "v"} | ({"gate", "up"} if mlp_shares_input else set()), h, x)
        self.add(zero_pad_saved_per_token(spec, s, st))

        # q/k norms (Qwen3, Gemma 3, OLMo 2) then rotary: q_embed and k_embed are new tensors SDPA saves.
        if spec.qk_norm != "none":
            self.norm_qk(qd, kvd, cmp, train)
        repeat_kv = attn == "eager" or (attn == "sdpa" and s.padding) or repeats_kv(spec, st)
        k_saved = qd if repeat_kv else kvd
        # (LitGPT repeats k and v itself, so SDPA gets equal head counts and takes its fused kernels.)
        math_sdpa = attn != "eager" and spec.attn_kv_broadcast and not repeats_kv(spec, st)
        if math_sdpa:
            # SDPA's math path: scaled q, broadcast-expanded k^T and v (bmm inputs), the softmax output.
            self.add(cmp * 3 * qd)
            self.add_quadratic(cmp * a)
        else:
            self.add(cmp * (qd + 2 * k_saved))         # q, k, v as the attention kernel saves them
            # (qkv_out: what the fused qkv linear returns; Linear4bit keeps its input's dtype, so an fp32 LayerNorm
            # output under autocast gives fp32 q/k/v that SDPA then casts: no view of the fused output is saved.)
            qkv_out = x if st.quantized else lin_out
            if spec.fused_qkv and spec.position_embeddings == 0 and not repeat_kv and qkv_out == cmp:
                # Rotary makes q and k new tensors, but v stays a view of the fused qkv output, and a saved view
                # keeps its whole storage alive (GPT-NeoX query_key_value, Phi-3 qkv_proj).
                self.add(cmp * (qd + kvd))
        if math_sdpa:
            pass
        elif attn == "eager":
            # fp32 softmax, plus its cast to the compute dtype (a no-op in fp32); with dropout the cast is
            # replaced by a bool mask and the dropout output.
            per_score = 4 + ((1 + cmp) if spec.attn_dropout > 0 else (2 if cmp == 2 else 0))
            if spec.attn_logit_softcap:
                per_score += cmp                       # tanh output saved by the soft-capping
            self.add_quadratic(per_score * a)          # b*a*s^2 = T*a*s
        else:
            self.add(4 * a)                            # logsumexp, fp32 [b, a, s]
            if attn == "sdpa" and s.padding:
                self.add_quadratic(cmp)                # per-layer additive mask (convert_boolean_attn_mask)
        if attn != "eager" and not math_sdpa:
            self.add(cmp * qd)                         # the kernel's saved output
        # o_proj reads transpose(1,2).contiguous() of the attention output. It is a no-op when q kept the
        # [b, s, a, d] layout of the q_proj output. Eager and math attention, partial rotary (torch.cat) and rotary
        # on a slice of a fused qkv output (not dense, so the result is laid out head-major) make q head-major;
        # the flash output follows q's layout, and the contiguous() is then a copy a trainable o_proj keeps.
        rotary = spec.position_embeddings == 0
        o_input_copied = (attn == "eager" or math_sdpa or spec.partial_rotary_factor < 1.0
                          or (spec.fused_qkv and rotary))
        if o_input_copied and train:
            self.add(cmp * qd)
        self.lora({"o"}, qd, cmp, input_saved=not o_input_copied)
        if spec.resid_dropout > 0 and not st.compiled:
            self.add(h)                                # bool dropout mask on CUDA

        if _post_norm(spec):
            self.norm(h, lin_out, self.norms_train)   # OLMo 2: norm on the attention output
        if spec.norms_per_layer == 4:
            self.norm(h, lin_out, self.norms_train)   # Gemma 2/3 post_attention_layernorm
        if not mlp_shares_input:
            # GPT-NeoX's parallel residual: both norms read the same layer input.
            y = self.norm(h, res, self.norms_train, input_shared=spec.parallel_attn_mlp) if not _post_norm(spec) else res
            self.linear_inputs(h, y, 1 if spec.fused_gate_up or spec.mlp_kind == "plain" else 2)
            self.lora({"gate", "up"}, h, y)
        else:
            y = x
        # Linear4bit returns its input's dtype: the MLP runs in the norm output's dtype (fp32 after a LayerNorm
        # under autocast); other linears return the compute dtype.
        self.mlp(y if st.quantized else lin_out, train)
        if _post_norm(spec) or spec.norms_per_layer == 4:
            self.norm(h, lin_out, self.norms_train)               # post_feedforward_layernorm
        if spec.resid_dropout > 0 and not st.compiled:
            self.add(h)
        return self.coefficients

    def norm_qk(self, qd: int, kvd: int, cmp: int, train: bool) -> None:
        # rsqrt per head (Qwen 3, Gemma 3 normalize each head) or per token (OLMo 2 normalizes all heads at once)
        rows = self.spec.num_heads + self.spec.num_kv_heads if self.spec.qk_norm == "head" else 2
        self.add(4 * (qd + kvd) + 4 * rows)            # fp32 copies + rsqrt
        if train:
            self.add((4 if self.spec.norm_style == "gemma" else cmp) * (qd + kvd))

    def mlp(self, cmp: int, train: bool) -> None:
        spec = self.spec
        act_extra = ACT_SAVED_TENSORS.get(spec.activation, 1) - 1
        if spec.is_moe:
            k, e_i, h = spec.experts_per_token, spec.moe_intermediate_size, spec.hidden_size
            self.add(4 * spec.num_experts + (h * cmp if train else 0))   # router softmax (fp32), router input
            # per routed token: gathered input (if experts train), gate_up out, act out, product (if down trains),
            # down out saved by the routing-weight multiply.
            # LoRA on the experts (physics/moe.py) makes their weights need grad just as training them does.
            experts_train = train or any(m.linear.parts == ("experts",) for m in self.st.lora_modules)
            per = cmp * (2 * e_i + e_i + h) + (cmp * (h + e_i) if experts_train else 0)
            self.add(k * per)
            if spec.shared_expert_intermediate_size:
                si = spec.shared_expert_intermediate_size
                self.add(cmp * (3 * si + (si if train else 0)))
            return
        i = spec.intermediate_size
        if self.st.compiled:
            self.add(compiled_mlp_bytes_per_token(spec, cmp))
            if not train:
                self.lora({"down"}, i, cmp, input_saved=True)   # its input is recomputed, lora_B's kept
            return
        if spec.mlp_kind == "gated":
            self.add(cmp * i * (3 + act_extra))        # gate out, act out, up out
        else:
            self.add(cmp * i * (1 + act_extra))        # fc1 out (activation input)
        if train:
            self.add(cmp * i)                          # down/fc2 input
        else:
            self.lora({"down"}, i, cmp)


def _transforms_input(module) -> bool:
    return module.kind in ("oft", "boft") or (module.kind == "ia3" and module.feedforward)


def _post_norm(spec: ModelSpec) -> bool:
    return spec.traits.get("post_norm", False)


def layer_coefficients(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, int]:
    """(bytes per token, bytes per token per position) one decoder layer saves, averaged over the layers.
    Independent of b; a sliding window shorter than the sequence makes its layers' SDPA take a mask."""
    if stack.compiled:
        return compiled_coefficients(_Walk(spec, setup, replace(stack, compiled=False)).layer(),
                                     _Walk(spec, setup, stack).layer())
    if stack.method == "lisa":
        return adapters.lisa_layer_coefficients(spec, setup, stack, lambda st: _Walk(spec, setup, st).layer())
    if stack.method in LITGPT_METHODS:
        return _litgpt_adapter_coefficients(spec, setup, stack)
    if stack.method == "prefix":
        per_token, per_position = _Walk(spec, setup.replace(padding=True), stack).layer()
        attn_bytes = 2 if stack.autocast else stack.compute_bytes
        return per_token + adapters.prefix_extra_per_token(spec, setup.num_virtual_tokens, setup.seq_len,
                                                          attn_bytes), per_position
    plain = _Walk(spec, setup, stack).layer()
    window = spec.sliding_window
    if not window or setup.seq_len <= window or setup.padding or stack.attn != "sdpa":
        return plain
    masked = _Walk(spec, setup.replace(padding=True), stack).layer()
    f = spec.sliding_fraction
    return (round(f * masked[0] + (1 - f) * plain[0]), round(f * masked[1] + (1 - f) * plain[1]))


def _litgpt_adapter_coefficients(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> tuple[int, int]:
    """LitGPT's LLaMA-Adapter v1/v2 (physics/litgpt_adapter.py): the frozen layer's walk, and what its input norm
    and base SDPA save (v1's first adapted layer saves neither)."""
    frozen = _Walk(spec, setup, stack).layer()
    cmp = 2 if stack.autocast else stack.compute_bytes
    norm = _Walk(spec, setup, stack)
    norm.norm(spec.hidden_size, stack.residual_bytes, False)
    qd, kvd = spec.q_dim, spec.kv_dim
    sdpa = cmp * (2 * qd + 2 * kvd) + 4 * spec.num_heads        # q, k, v, out, logsumexp
    if spec.fused_qkv and spec.position_embeddings == 0:
        sdpa += cmp * (qd + kvd)                                   # v's view keeps the fused qkv output
    return litgpt_adapter.layer_coefficients(spec, stack.method, frozen, cmp, norm.per_token + sdpa,
                                             litgpt_adapter.is_peft(setup))


def _tokens(setup: TrainingSetup) -> int:
    return setup.batch_size * setup.seq_len


def layer_activation_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Bytes one decoder layer saves for backward at this batch and length (no checkpointing)."""
    per_token, per_position = layer_coefficients(spec, setup, stack)
    return _tokens(setup) * (per_token + per_position * setup.seq_len)


def adapted_layers(spec: ModelSpec, stack: Stack) -> int:
    """Layers that save activations. With mlx-lm's adapters on the last N layers only, the frozen prefix saves
    nothing (no tensor in it requires grad)."""
    if stack.method in ("full", "lisa"):
        return spec.num_layers
    return stack.lora_layers



def int8_first_layer_per_token(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Bytes per token the walk counted for int8 linears reading the first adapted layer's input, which needs no
    grad there (a frozen embedding, no trainable norm in front): MatMul8bitLt's needs_input_grad is False and it
    keeps nothing. Taken back from the layers' activations (without checkpointing)."""
    walk = _Walk(spec, setup, stack)
    outer = {m.linear.parts[0] for m in stack.outer_lora}
    if not walk.int8 or setup.grad_ckpt or adapters.first_layer_input_trains(stack.method) or "embed" in outer \
            or (walk.norms_train and not _post_norm(spec)):
        return 0
    walk.layer()
    return walk.int8_first_inputs


def checkpoint_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Kept per layer under gradient checkpointing: the layer's input hidden states (section 3.5)."""
    return _tokens(setup) * spec.hidden_size * stack.residual_bytes


def layer_backward_temp_bytes(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Transient grads inside one layer's backward: grad of the layer output and of the MLP intermediates
    (about 3 x the intermediate width), or eager attention's score gradients when those are larger."""
    T = _tokens(setup)
    cmp, res = stack.compute_bytes, stack.residual_bytes
    width = (spec.experts_per_token * spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size)
    mlp = T * (3 * width * cmp + 2 * spec.hidden_size * res)
    attn = 0
    if stack.attn == "eager":
        # At the softmax backward the layer keeps its saved fp32 softmax (in the walk), the bf16 probabilities
        # are already freed, and the fp32 grad and softmax_backward's output exist: 2 x 4 - 2 = 6 B per score
        # beyond the walk (matches the trace within a few percent).
        attn = 6 * T * spec.num_heads * setup.seq_len
    return max(mlp, attn)


def head_coefficient(spec: ModelSpec, setup: TrainingSetup, stack: Stack) -> int:
    """Bytes per token saved outside the layers: embedding indices and dropout, final norm, lm_head input,
    labels. With a frozen base, the first layer's input norm saves nothing (the embedding output needs no
    grad), which the per-layer walk counted for every layer: it is taken back here (without checkpointing;
    with it, only checkpoints and the top layer's recomputation are alive)."""
    walk = _Walk(spec, setup, stack)
    train = stack.base_trainable
    outer = {m.linear.parts[0]: m for m in stack.outer_lora}
    if not train and stack.lora_layers == spec.num_layers and not _post_norm(spec) and not setup.grad_ckpt \
            and not adapters.first_layer_input_trains(stack.method) and "embed" not in outer \
            and stack.method != "llama-adapter-v2":           # (its first norm trains: it saves its input)
        first = _Walk(spec, setup, stack)
        first.norm(spec.hidden_size, stack.residual_bytes, False)
        walk.add(-first.per_token)
    if train:
        walk.add(8)                                    # embedding saves the int64 indices
    if spec.embd_dropout > 0 and not stack.compiled:
        walk.add(spec.hidden_size)
    if spec.embed_norm and (train or setup.grad_ckpt):
        # BLOOM's word_embeddings_layernorm saves its input once that input needs a grad: the base trains, or
        # gradient checkpointing made the embedding output require grad (transformers 5.25 modeling_utils.py
        # :3192-3200 enable_input_require_grads for every input_ids model). A frozen base without it: nothing.
        walk.norm(spec.hidden_size, stack.residual_bytes, True)
    walk.norm(spec.hidden_size, stack.residual_bytes, walk.norms_train)
    walk.linear_inputs(spec.hidden_size, stack.residual_bytes, 1)
    walk.add(quantized_base.head_saved_per_token_bytes(spec, setup, stack))
    if "embed" in outer:
        walk.add(embed_saved_per_token(outer["embed"].rank, stack.adapter_bytes, stack.autocast))
    if "head" in outer:
        # lm_head's adapter reads the final norm output like any adapted linear (the walk's LoRA rule).
        head = _Walk(spec, setup, replace(stack, lora_modules=(outer["head"],)))
        head.lora({"head"}, spec.hidden_size, stack.residual_bytes)
        walk.add(head.per_token)
    walk.add(litgpt_adapter.lm_head_per_token(spec, stack.method, stack.compute_bytes))
    walk.add(8)                                        # int64 labels saved by the loss
    return walk.per_token
