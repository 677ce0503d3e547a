"""The engine's decode step for Llama-shaped models, written out instead of run through transformers.

A decode step feeds one token per running row. Through transformers' forward it costs, besides
the matmuls, a cache object, mask and position bookkeeping and hundreds of small ops per step;
and each ``nn.Linear`` multiplies by a weight in plain layout, which oneDNN rearranges for its
kernel on every call. Here the step calls the model's own embedding, norms, rotary table,
activation and LM head, but
  - q/k/v and gate/up are each one matmul (their weights stacked), rotary runs once over q and k;
  - every projection's weight is prepacked once into oneDNN's layout (``torch.ops.mkldnn``, what
    inductor's CPU freezing does): measured on SmolLM2's 30 layers at 61 rows, bf16, 2 cores,
    the projections took 46.9 ms per step packed against 63.8 ms plain;
  - keys and values are written straight into the engine's KV buffers (``kv.BatchKV.write``) and
    attention is ``attention.attend`` over the live window;
  - LoRA deltas come from ``lora.MultiLoRA.add_delta``, q/k/v and gate/up as groups (two
    matmuls per group, not per module).
On the CPU the arithmetic is transformers' own, op for op, so logits are bit-identical in bf16
where bf16 is native (tested, mixed adapters included; where oneDNN emulates bf16, as on AVX-512
without avx512_bf16, its prepacked kernel can round a last bit apart from transformers' matmul);
``benchmarks/rollout.py`` compares the decode rates of both paths. A GPU takes the same maths in
fewer kernels (``_GpuForms``), rounded differently.

The packed weights are copies (the model's size again) of base weights that never change while
an engine serves: training touches only adapters. Models of another shape keep transformers'
forward (``FusedDecoder.build`` -> None).

Prepacking is ISA-specific (``cpu.py``), so the weights take one of three layouts:
  - ``onednn``: prepacked in the model's dtype (fp32 anywhere; bf16 where oneDNN has bf16 kernels);
  - ``onednn-fp32``: a bf16 model on a CPU without them (AVX2 only, or bf16 kernels that fail their
    probe): the weights prepacked as fp32, activations cast up and results rounded back to bf16.
    Not bit-identical to transformers' bf16 matmuls (one bf16 rounding apart, as the training pass
    is), but emulated bf16 matmuls were 7x slower than fp32 ones on an AVX2 EPYC
    (``benchmarks/rollout.py``'s fallback side compares);
  - ``plain``: torch without oneDNN (or an fp32 prepack that failed its probe): ``F.linear`` as
    transformers.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Literal

import structlog
import torch
import torch.nn.functional as F

from ..cpu import CpuFeatures, host
from .attention import attend, attend_biased, attend_chunk
from .kv import BatchKV
from .lora import Key, MultiLoRA, SlotLoRA
from .slots import SlotKV

log = structlog.get_logger()

# Model types whose decoder layers are Llama's: pre-norm attention with rotary q/k, then a gated MLP.
_FAMILIES = {"llama", "mistral", "qwen2"}

Layout = Literal["onednn", "onednn-fp32", "plain"]


def weight_layout(dtype: torch.dtype, cpu: CpuFeatures | None = None) -> tuple[Layout, str]:
    """The layout of the fused step's frozen weights for a model in ``dtype`` on ``cpu``, and why.

    Each prepacked layout is also probed once with a tiny weight: a CPU whose flags promise more
    than its kernels do gets the next layout down, never an engine that fails its first step.
    """
    cpu = cpu or host()
    if not cpu.onednn:
        return "plain", "torch has no oneDNN prepack"
    if dtype not in (torch.float32, torch.bfloat16):
        return "plain", f"no oneDNN prepack for {dtype}"
    if dtype == torch.bfloat16 and not (cpu.onednn_bf16 and _prepack_runs(dtype)):
        # bf16 kernels missing or failing their probe: fp32 prepacked beats emulated bf16 matmuls
        reason = ("oneDNN bf16 prepack failed its probe" if cpu.onednn_bf16 else
                  "no oneDNN bf16 kernels on this CPU (needs avx512bw+avx512vl+avx512dq or avx_ne_convert)")
        return ("onednn-fp32", reason) if _prepack_runs(torch.float32) else ("plain", reason + "; fp32 prepack failed")
    if not _prepack_runs(dtype):
        return "plain", f"oneDNN {dtype} prepack failed its probe"
    return "onednn", f"oneDNN prepacked {dtype}"


@lru_cache(maxsize=None)
def _prepack_runs(dtype: torch.dtype) -> bool:
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=dtype), 1)
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 8, dtype=dtype), w, None, "none", [], "")
        return True
    except RuntimeError as exc:
        log.warning("engine.prepack_probe_failed", dtype=str(dtype), error=" ".join(str(exc).split()))
        return False


class _Linear:
    """``x @ W.T + b`` for a frozen weight, in the given layout (the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows_hint: int, layout: Layout):
        self.layout, self.dtype = layout, weight.dtype
        if layout == "onednn-fp32":
            weight, bias = weight.float(), None if bias is None else bias.float()
        self.bias = bias
        self.weight = weight if layout == "plain" else torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "plain":
            return F.linear(x, self.weight, self.bias)
        if self.layout == "onednn-fp32":
            x = x.float()
        out = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return out.to(self.dtype)

    def add_to(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``h + self(x)``, in the matmul's own add where the layout has one (plain, no bias)."""
        if self.layout == "plain" and self.bias is None:
            return torch.addmm(h, x, self.weight.t())
        return h + self(x)


def _stacked(*linears: torch.nn.Linear, rows_hint: int, layout: Layout) -> _Linear:
    weight = torch.cat([m.weight for m in linears])
    biases = [m.bias for m in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(linears, biases)])
    return _Linear(weight, bias, rows_hint, layout)


class _Layer:
    def __init__(self, layer: torch.nn.Module, names: dict[torch.nn.Module, str], lora: MultiLoRA, rows_hint: int,
                 layout: Layout):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm, self.act = layer.input_layernorm, layer.post_attention_layernorm, mlp.act_fn
        self.qkv = _stacked(attn.q_proj, attn.k_proj, attn.v_proj, rows_hint=rows_hint, layout=layout)
        self.o = _stacked(attn.o_proj, rows_hint=rows_hint, layout=layout)
        self.gate_up = _stacked(mlp.gate_proj, mlp.up_proj, rows_hint=rows_hint, layout=layout)
        self.down = _stacked(mlp.down_proj, rows_hint=rows_hint, layout=layout)
        self.q_size, self.kv_size = attn.q_proj.out_features, attn.k_proj.out_features
        self.inner = mlp.gate_proj.out_features
        self.scaling = attn.scaling
        # LoRA keys: q/k/v and gate/up as groups (one pair of matmuls each, lora.MultiLoRA.group)
        self.qkv_key = lora.group((names[attn.q_proj], names[attn.k_proj], names[attn.v_proj]))
        self.gate_up_key = lora.group((names[mlp.gate_proj], names[mlp.up_proj]))
        self.o_key, self.down_key = names[attn.o_proj], names[mlp.down_proj]


class FusedDecoder:
    def __init__(self, model: torch.nn.Module, lora: MultiLoRA, rows_hint: int, layout: Layout, layout_reason: str = ""):
        self.lora = lora
        self.layout, self.layout_reason = layout, layout_reason
        # On a GPU a step is bound by kernel launches, so it takes the forms with fewer (_GpuForms);
        # tests set this on the CPU to check them there.
        self.gpu = next(model.parameters()).device.type == "cuda"
        base = model.base_model
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = base.layers[0].self_attn.head_dim
        names = {m: n for n, m in model.named_modules()}
        with torch.inference_mode():
            self.layers = [_Layer(layer, names, lora, rows_hint, layout) for layer in base.layers]
            self.lm_head = _stacked(model.get_output_embeddings(), rows_hint=rows_hint, layout=layout)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether ``model`` has Llama's shape (the step below): else transformers' forward steps."""
        config = model.config
        if config.model_type not in _FAMILIES or getattr(config, "sliding_window", None) is not None:
            return False
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            return False
        base = getattr(model, "base_model", None)
        parts = ("embed_tokens", "norm", "rotary_emb", "layers")
        return base is not None and all(hasattr(base, p) for p in parts) and model.get_output_embeddings() is not None

    @classmethod
    def build(cls, model: torch.nn.Module, lora: MultiLoRA, rows_hint: int = 64,
              cpu: CpuFeatures | None = None) -> FusedDecoder | None:
        """The fused decode step for ``model`` (weights laid out for ``cpu``, default this machine's),
        or None when its shape is not Llama's."""
        if not cls.supports(model):
            return None
        device = next(model.parameters()).device
        layout = weight_layout(model.dtype, cpu) if device.type == "cpu" else ("plain", f"{device.type}: no prepacking off the CPU")
        return cls(model, lora, rows_hint, *layout)

    def __call__(self, ids: torch.Tensor, kv: BatchKV | SlotKV, positions: torch.Tensor,
                 lora: MultiLoRA | SlotLoRA | None = None, lora_mode: str = "mixed",
                 last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [rows, vocab] for ``ids`` [rows], each row's next token; writes its K/V to ``kv``.

        ``ids`` [rows, width] with ``positions`` [rows, width] is a prefill chunk (static path
        only: ``SlotKV.chunk``): each token attends to its row's columns before it, and the
        logits come back for one token per row, at flat index ``last`` [rows] (row * width + its
        last real token; the tokens after it are padding, whose keys land past the row's end and
        are never read). The caller routes adapters (``lora.route``; for the static path's
        ``SlotLoRA``, its ``route``) and advances ``kv`` after the step. ``lora`` None: the
        engine's ``MultiLoRA``; ``lora_mode``: ``SlotLoRA.mode``'s answer for the step.
        """
        lora = self.lora if lora is None else lora
        rows, width = ids.shape[0], ids.shape[1] if ids.dim() == 2 else 1
        tokens, heads, kv_heads, dim = rows * width, self.heads, self.kv_heads, self.head_dim
        kv.reserve()
        h = self.embed(ids.reshape(tokens))  # [tokens, hidden]
        cos, sin = (t.reshape(tokens, 1, -1) for t in self.rotary(h, positions))  # [tokens, 1, dim]: over heads
        banned = kv.banned(kv_heads)
        forms = (_GpuForms if self.gpu else _CpuForms)(cos, sin, banned, ids.dim() == 2)
        lora.begin(rows, lora_mode, width)
        for index, layer in enumerate(self.layers):
            x = forms.norm(layer.input_norm, h)
            qkv = layer.qkv(x)
            lora.add_delta(layer.qkv_key, x, qkv)
            k_end = layer.q_size + layer.kv_size
            q, k = forms.rotate(qkv[:, :k_end].view(tokens, heads + kv_heads, dim), heads)
            keys, values = kv.write(index, k.unflatten(0, (rows, width)).transpose(1, 2),
                                    qkv[:, k_end:].view(rows, width, kv_heads, dim).transpose(1, 2))
            out = forms.attend(q.unflatten(0, (rows, width)), keys, values, layer.scaling).reshape(tokens, heads * dim)
            h = forms.residual(h, layer.o, out, lora, layer.o_key)
            x = forms.norm(layer.post_norm, h)
            gate_up = layer.gate_up(x)
            lora.add_delta(layer.gate_up_key, x, gate_up)
            act = layer.act(gate_up[:, :layer.inner]) * gate_up[:, layer.inner:]
            h = forms.residual(h, layer.down, act, lora, layer.down_key)
        if last is not None:
            h = h.index_select(0, last)
        return self.lm_head(forms.norm(self.norm, h))


class _CpuForms:
    """transformers' own ops in its order: the CPU's step gives its logits bit for bit."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, banned: torch.Tensor, chunk: bool = False):
        self.cos, self.sin, self.banned, self.chunk = cos, sin, banned, chunk

    @staticmethod
    def norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return module(x)

    def rotate(self, qk: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary on q and k at once ([rows, heads + kv_heads, dim]): ``t * cos + rotate_half(t) * sin``."""
        half = qk.shape[-1] // 2
        qk = (qk * self.cos) + (torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * self.sin)
        return qk[:, :heads], qk[:, heads:]

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float) -> torch.Tensor:
        """``q`` [rows, width, heads, dim]: one token a row (decode) or a prefill ``chunk``."""
        if self.chunk:
            return attend_chunk(q, keys, values, self.banned, scaling)
        return attend(q[:, 0], keys, values, self.banned, scaling)

    @staticmethod
    def residual(h: torch.Tensor, linear: _Linear, x: torch.Tensor, lora: MultiLoRA | SlotLoRA, key: Key) -> torch.Tensor:
        """``h + linear(x)`` with ``x``'s LoRA delta in ``linear``'s output."""
        out = linear(x)
        lora.add_delta(key, x, out)
        return h + out


class _GpuForms:
    """The same arithmetic in fewer kernels, for a GPU, where a small model's decode step costs a
    few microseconds per kernel whatever the kernel does (2.9 ms for about 630 kernels at 256 rows
    on the H100, docs/gpu.md). It rounds where transformers does not (once where it rounds twice),
    so its logits differ from the CPU forms' in the last bits:
      - RMSNorm in one kernel (transformers' is six elementwise ops);
      - rotary as a batched matmul with each row's rotation (``_rotation``), for q and
        for k apart, so q comes out contiguous for attention (three elementwise kernels and a copy);
      - attention scores from one ``baddbmm`` with the mask as an additive bias, and the softmax in
        the model's dtype (its kernel accumulates in fp32; asking for an fp32 result adds two casts);
      - the residual add inside the o and down projections' matmul (``addmm``).
    """

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, banned: torch.Tensor, chunk: bool = False):
        self.rotation, self.chunk = _rotation(cos, sin), chunk
        self.bias = torch.zeros(banned.shape, dtype=cos.dtype, device=banned.device).masked_fill_(banned, float("-inf"))

    @staticmethod
    def norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)

    def rotate(self, qk: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.bmm(qk[:, :heads], self.rotation), torch.bmm(qk[:, heads:], self.rotation)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float) -> torch.Tensor:
        if self.chunk:
            return attend_chunk(q, keys, values, self.bias, scaling)
        return attend_biased(q[:, 0], keys, values, self.bias, scaling)

    @staticmethod
    def residual(h: torch.Tensor, linear: _Linear, x: torch.Tensor, lora: MultiLoRA | SlotLoRA, key: Key) -> torch.Tensor:
        h = linear.add_to(h, x)
        lora.add_delta(key, x, h)
        return h


def _rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each row's rotary embedding as a matrix R [rows, dim, dim] (from ``cos``, ``sin`` [rows, 1, dim]),
    ``t @ R`` being transformers' ``t * cos + rotate_half(t) * sin``: R[j, j] = cos[j], and
    rotate_half sends t[j + dim/2] to column j negated and t[j - dim/2] to column j + dim/2."""
    cos, sin = cos[:, 0], sin[:, 0]
    half = cos.shape[-1] // 2
    rotation = torch.diag_embed(cos)
    columns = torch.arange(cos.shape[-1], device=cos.device)
    rotation[:, columns.roll(-half), columns] = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return rotation
