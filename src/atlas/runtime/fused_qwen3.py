"""The rollout engine's forward of a Qwen3 model in half the kernels of transformers' own.

A decode step with few rows costs what its kernels cost, not what its bytes do: transformers'
Qwen3 layer (with Liger's norms, SwiGLU and RoPE) launches about twenty kernels, seven of them
matrix products, and the 1.7B model's 28 layers run some 600 of them for 8 rows as for 256. Here
a layer is

    add + RMSNorm            one kernel: the residual's sum, and the sum normed
    q, k, v projections      one matrix product over the three weights stored side by side
    q/k norms, RoPE, store   one kernel: the queries normed and rotated; the keys normed, rotated
                             and written to the pool (kv_pool), the values written beside them
    attention                kv_pool.attend (atlas.runtime.decode_attention in a decode step)
    o projection
    add + RMSNorm
    gate and up projections  one matrix product
    SiLU(gate) * up          one kernel
    down projection

with the model's own weights: `fuse_projections` makes each layer's q, k and v weights (and its
gate and up weights) views of one tensor, with the same values, so the model's modules still
work and a MergedModel's refresh writes into them. Each kernel rounds where transformers' code
rounds (to the model's dtype after each elementwise operation), and each has a torch spelling,
the same operations as transformers', that runs where Triton does not (the CPU tests compare the
two forwards there) and is the kernels' reference (tests/unit/test_fused_qwen3.py runs the
kernels in Triton's interpreter).

`FusedQwen3.supports(model)` says why a model does not qualify (None: it does): a plain Qwen3
causal LM (no peft wrapper: an adapter's forward is peft's), default RoPE, no bias, no sliding
window, SiLU, a power-of-two head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from atlas.runtime.kv_pool import Layout, attend

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the torch spelling runs
    triton = None


# -- the torch spelling: transformers' operations, in its order ---------------------------------


def add_rms_norm_torch(delta, residual, weight, eps):
    """(weight * RMSNorm(residual + delta), residual + delta); delta None: residual alone."""
    if delta is not None:
        residual = residual + delta
    x = residual.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(residual.dtype), residual


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def qk_rope_store_torch(qkv, q_weight, k_weight, cos, sin, positions, write_at, keys, values, heads, eps):
    """Queries [N, Hq, D] normed and rotated; keys normed, rotated and written to `keys` at
    write_at, values written to `values` there."""
    hq, hk = heads
    d = cos.shape[-1]
    q, k, v = qkv.view(qkv.shape[0], hq + 2 * hk, d).split([hq, hk, hk], dim=1)
    q, _ = add_rms_norm_torch(None, q, q_weight, eps)
    k, _ = add_rms_norm_torch(None, k, k_weight, eps)
    c, s = cos[positions][:, None], sin[positions][:, None]
    keys.index_copy_(0, write_at, _rotate(k, c, s))
    values.index_copy_(0, write_at, v)
    return _rotate(q, c, s)


def silu_mul_torch(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# -- the Triton kernels ---------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(
        delta, residual, weight, out, width, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
    ):
        # one token a program; the residual is updated in place
        row = tl.program_id(0).to(tl.int64) * width
        cols = tl.arange(0, BLOCK)
        inside = cols < width
        x = tl.load(residual + row + cols, mask=inside, other=0.0)
        if HAS_DELTA:
            d = tl.load(delta + row + cols, mask=inside, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
            tl.store(residual + row + cols, x, mask=inside)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / width + eps)
        w = tl.load(weight + cols, mask=inside, other=0.0)
        y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
        tl.store(out + row + cols, y.to(x.dtype), mask=inside)

    @triton.jit
    def _qk_rope_store_kernel(
        qkv, q_weight, k_weight, cos, sin, positions, write_at, q_out, keys, values, eps,
        HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        # program (token n, head h) of the HQ query, HK key and HK value heads
        n = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        i = tl.arange(0, D)
        partner = (i + D // 2) % D  # rotate_half(x)[i] = -x[i + D/2] for i < D/2, x[i - D/2] after
        head = qkv + n * (HQ + 2 * HK) * D + h * D
        x = tl.load(head + i)
        at = tl.load(write_at + n)
        if h >= HQ + HK:
            tl.store(values + at * (HK * D) + (h - HQ - HK) * D + i, x)
        else:
            xp = tl.load(head + partner)
            if h < HQ:
                w = tl.load(q_weight + i).to(tl.float32)
                wp = tl.load(q_weight + partner).to(tl.float32)
            else:
                w = tl.load(k_weight + i).to(tl.float32)
                wp = tl.load(k_weight + partner).to(tl.float32)
            xf = x.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
            y = ((xf * rstd).to(x.dtype).to(tl.float32) * w).to(x.dtype).to(tl.float32)
            yp = ((xp.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * wp).to(x.dtype).to(tl.float32)
            yp = tl.where(i < D // 2, -yp, yp)
            p = tl.load(positions + n)
            c = tl.load(cos + p * D + i).to(tl.float32)
            s = tl.load(sin + p * D + i).to(tl.float32)
            a = (y * c).to(x.dtype).to(tl.float32)
            b = (yp * s).to(x.dtype).to(tl.float32)
            rotated = (a + b).to(x.dtype)
            if h < HQ:
                tl.store(q_out + n * (HQ * D) + h * D + i, rotated)
            else:
                tl.store(keys + at * (HK * D) + (h - HQ) * D + i, rotated)

    @triton.jit
    def _silu_mul_kernel(gate_up, out, width, BLOCK: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        g = tl.load(gate_up + n * 2 * width + cols, mask=inside, other=0.0)
        u = tl.load(gate_up + n * 2 * width + width + cols, mask=inside, other=0.0)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
        tl.store(out + n * width + cols, (s * u.to(tl.float32)).to(g.dtype), mask=inside)


def add_rms_norm(delta, residual, weight, eps):
    """add_rms_norm_torch through one kernel; `residual` is updated in place (and returned)."""
    n, width = residual.shape
    out = torch.empty_like(residual)
    block = triton.next_power_of_2(width)
    _add_rms_norm_kernel[(n,)](
        residual if delta is None else delta, residual, weight, out, width, eps,
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=max(1, min(16, block // 256)),
    )  # fmt: skip
    return out, residual


def qk_rope_store(qkv, q_weight, k_weight, cos, sin, positions, write_at, keys, values, heads, eps):
    """qk_rope_store_torch through one kernel."""
    hq, hk = heads
    n, d = qkv.shape[0], cos.shape[-1]
    q = torch.empty(n, hq, d, device=qkv.device, dtype=qkv.dtype)
    _qk_rope_store_kernel[(n, hq + 2 * hk)](
        qkv, q_weight, k_weight, cos, sin, positions, write_at, q, keys, values, eps,
        HQ=hq, HK=hk, D=d, num_warps=1,
    )  # fmt: skip
    return q


def silu_mul(gate_up):
    """silu_mul_torch through one kernel."""
    n, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(n, width, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    _silu_mul_kernel[(n, triton.cdiv(width, block))](gate_up, out, width, BLOCK=block, num_warps=4)
    return out


# -- the model ------------------------------------------------------------------------------------


def fuse_projections(linears) -> torch.Tensor:
    """One weight tensor holding these linear layers' weights one after the other ([sum of outs,
    in]); each layer's weight becomes a view of it, with its values. Layers already so fused
    (their weights adjacent views of one tensor, in this order) are left as they are.

    Fusing re-points each Parameter's data: what held the old tensors (a CUDA graph captured
    over them) no longer sees the model's weights, and a weight that shared its storage with
    another model's (a merged copy's layer without an adapter shares the base's) becomes a copy,
    as much memory again."""
    weights = [m.weight for m in linears]
    first = weights[0]
    rows = sum(w.shape[0] for w in weights)
    if all(w.is_contiguous() for w in weights):
        offset, adjacent = first.storage_offset(), True
        for w in weights:
            adjacent &= w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            adjacent &= w.storage_offset() == offset
            offset += w.numel()
        if adjacent:
            return first.new_empty(0).set_(
                first.untyped_storage(), first.storage_offset(), (rows, first.shape[1])
            )
    fused = torch.cat([w.detach() for w in weights])
    at = 0
    for m, w in zip(linears, weights, strict=True):
        m.weight.data = fused[at : at + w.shape[0]]
        at += w.shape[0]
    return fused


@dataclass
class _Layer:
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor


class FusedQwen3:
    """`forward(ids, positions, layout, keep)`: the engine's packed forward (StaticEngine._forward)
    over a Qwen3 causal LM's weights, through the Triton kernels where they run (`triton_kernels`:
    where decode_attention's do) or their torch spelling."""

    @staticmethod
    def supports(model) -> str | None:
        """Why `model` cannot run here, or None."""
        config = getattr(model, "config", None)
        if hasattr(model, "get_base_model") or any(hasattr(m, "lora_A") for m in model.modules()):
            return "a peft model (its adapters' forward is peft's)"
        if config is None or config.model_type != "qwen3" or not hasattr(model, "lm_head"):
            return f"not a Qwen3 causal LM ({getattr(config, 'model_type', None)!r})"
        rope = (getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}).get(
            "rope_type", "default"
        )
        if rope != "default":
            return f"RoPE type {rope!r}"
        if config.attention_bias or config.hidden_act != "silu":
            return "attention bias or an activation other than SiLU"
        if getattr(config, "use_sliding_window", False):
            return "sliding-window attention"
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if head_dim & (head_dim - 1):
            return f"head size {head_dim}, not a power of two"
        return None

    def __init__(self, model, triton_kernels: bool):
        if why := self.supports(model):
            raise ValueError(f"the fused Qwen3 forward: {why}")
        config = model.config
        self.eps = config.rms_norm_eps
        self.heads = (config.num_attention_heads, config.num_key_value_heads)
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.vocab_size = config.vocab_size
        base = model.model
        self.embed, self.norm, self.lm_head = base.embed_tokens.weight, base.norm.weight, model.lm_head.weight
        self.layers = []
        self._views = []  # (a module's weight, the fused tensor it must stay a view of)
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                _Layer(
                    qkv=fuse_projections([attn.q_proj, attn.k_proj, attn.v_proj]),
                    o=attn.o_proj.weight,
                    gate_up=fuse_projections([mlp.gate_proj, mlp.up_proj]),
                    down=mlp.down_proj.weight,
                    norm_in=layer.input_layernorm.weight,
                    norm_post=layer.post_attention_layernorm.weight,
                    q_norm=attn.q_norm.weight,
                    k_norm=attn.k_norm.weight,
                )
            )
            self._views += [
                (attn.q_proj.weight, self.layers[-1].qkv),
                (mlp.gate_proj.weight, self.layers[-1].gate_up),
            ]
        # cos and sin of every position, as transformers' rotary embedding computes them; a
        # request past them is refused when it arrives (the kernel reads the table unchecked)
        rotary = base.rotary_emb
        self.positions = config.max_position_embeddings
        positions = torch.arange(self.positions, device=self.embed.device)
        freqs = positions[:, None].float() * rotary.inv_freq.to(device=self.embed.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = (angles.cos() * rotary.attention_scaling).to(self.embed.dtype)
        self.sin = (angles.sin() * rotary.attention_scaling).to(self.embed.dtype)
        if triton_kernels:
            self._norm, self._qk, self._act = add_rms_norm, qk_rope_store, silu_mul
        else:
            self._norm, self._qk, self._act = add_rms_norm_torch, qk_rope_store_torch, silu_mul_torch

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, lay: Layout, keep) -> torch.Tensor:
        """Logits [K, vocab] (float32) of the kept positions (keep: 0 for all, or their indices)."""
        for weight, fused in self._views:  # each admission and each capture: a host-side check
            if weight.data_ptr() != fused.data_ptr():
                raise RuntimeError(
                    "the fused forward: the model's weights were replaced after the engine fused them "
                    "(load_state_dict(assign=True), a move to another device); build a new engine"
                )
        residual = F.embedding(ids, self.embed)
        copied = None if lay.copy_src is None else lay.write_at.index_select(0, lay.copy_src)
        delta = None
        n = ids.shape[0]
        for i, layer in enumerate(self.layers):
            h, residual = self._norm(delta, residual, layer.norm_in, self.eps)
            keys, values = lay.pool.kv[i, 0], lay.pool.kv[i, 1]
            q = self._qk(
                F.linear(h, layer.qkv), layer.q_norm, layer.k_norm, self.cos, self.sin,
                positions, lay.write_at, keys, values, self.heads, self.eps,
            )  # fmt: skip
            if copied is not None:  # a prompt computed once, its keys written to its other rows
                keys.index_copy_(0, lay.copy_dst, keys.index_select(0, copied))
                values.index_copy_(0, lay.copy_dst, values.index_select(0, copied))
            out = attend(q, keys, values, lay, self.scale).reshape(n, -1)
            h, residual = self._norm(F.linear(out, layer.o), residual, layer.norm_post, self.eps)
            delta = F.linear(self._act(F.linear(h, layer.gate_up)), layer.down)
        if isinstance(keep, int):  # the last `keep` positions; 0: all (transformers' logits_to_keep)
            delta, residual = delta[-keep:], residual[-keep:]
        else:
            delta, residual = delta.index_select(0, keep), residual.index_select(0, keep)
        h, _ = self._norm(delta, residual, self.norm, self.eps)
        return F.linear(h, self.lm_head)[:, : self.vocab_size].float()
