"""Padding removal for the PPO update: the rows of a right-padded batch packed into one row.

    packed = pack(input_ids, attention)          # [B, T] right-padded -> [1, N], N = real tokens
    hidden = decoder(**packed.model_kwargs())    # one forward over N tokens, no padding computed
    values = packed.unpack(value_head(hidden))   # back to [B, T], 0 on padding

Every row restarts its position_ids at 0. transformers (5.x masking_utils) reads packed rows from
exactly that: with no 2-D attention mask and no KV cache, `find_packed_sequence_indices` marks a new
sequence wherever a position does not follow its predecessor by 1, and the causal mask becomes
block-causal, so no token attends across rows. That is the CPU path (sdpa with the block mask)
and the tests check it against the padded forward.

On a GPU, `packed_attention(model)` swaps in "atlas_varlen", an attention function that runs
FlashAttention-2's variable-length kernel (the one PyTorch ships, aten._flash_attention_forward)
over the packed rows, given their cumulative lengths (`cu_seq_lens_q`, passed through the model
as transformers' FlashAttentionKwargs). It computes only the block-diagonal causal part and no
N x N mask is ever built. Without CUDA the same function attends row by row with sdpa, so the
plumbing is testable on a CPU.

Torch only (no pydantic, polars or xgrammar): the GPU benchmarks import it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

VARLEN = "atlas_varlen"


@dataclass
class Packed:
    """The real tokens of a right-padded [B, T] batch as one row of N tokens."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]: 0, 1, ... restarting at every row
    cu_seqlens: torch.Tensor  # [B + 1] int32: row r is packed[cu[r]:cu[r + 1]]
    lengths: list[int]  # real tokens per row
    width: int  # T of the padded batch

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def starts(self) -> list[int]:
        """Packed index of each row's first token (host ints: no device sync)."""
        out, at = [], 0
        for n in self.lengths:
            out.append(at)
            at += n
        return out

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def model_kwargs(self) -> dict:
        """Keyword arguments of a transformers decoder forward over the packed row: no attention
        mask and no cache (else transformers does not look for packed rows), the position ids,
        and the cumulative lengths the varlen kernel reads."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": None,
            "use_cache": False,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }

    def index(self, row: int, positions: torch.Tensor) -> torch.Tensor:
        """Packed indices of `positions` (indices into padded row `row`)."""
        return positions + self.starts[row]

    def unpack(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[1, N, ...] or [N, ...] packed values -> [B, T, ...], `fill` on padding."""
        x = x[0] if x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] == self.tokens else x
        if x.shape[0] != self.tokens:
            raise ValueError(f"unpack: expected {self.tokens} packed positions, got {tuple(x.shape)}")
        out = x.new_full((len(self.lengths), self.width, *x.shape[1:]), fill)
        rows, cols = self._scatter_index(x.device)
        out[rows, cols] = x
        return out

    def _scatter_index(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.repeat_interleave(
            torch.arange(len(self.lengths), device=device), torch.tensor(self.lengths, device=device)
        )
        return rows, self.position_ids[0].to(device)


def pack(input_ids: torch.Tensor, attention: torch.Tensor) -> Packed:
    """Pack a right-padded batch: row r's tokens are input_ids[r, :attention[r].sum()]."""
    if input_ids.shape != attention.shape or input_ids.dim() != 2:
        raise ValueError(
            f"pack: input_ids {tuple(input_ids.shape)} and attention {tuple(attention.shape)} "
            "must be the same [B, T] shape"
        )
    lengths = attention.sum(-1)
    width = input_ids.shape[1]
    # Right padding only: each row's mask is 1...1 0...0, so its real tokens are a prefix.
    prefix = torch.arange(width, device=attention.device) < lengths[:, None]
    if not torch.equal(prefix, attention.bool()):
        raise ValueError("pack: attention must be right-padded (every row's 1s before its 0s)")
    if (lengths == 0).any():
        raise ValueError(f"pack: rows {torch.nonzero(lengths == 0).flatten().tolist()} have no tokens")
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = lengths.cumsum(0)
    positions = torch.arange(width, device=input_ids.device).expand_as(input_ids)[prefix]
    return Packed(
        input_ids=input_ids[prefix].unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        cu_seqlens=cu,
        lengths=lengths.tolist(),
        width=width,
    )


class _VarlenFlash(torch.autograd.Function):
    """FlashAttention-2 over packed rows (causal within each row), through PyTorch's own kernel.

    q [N, Hq, D], k and v [N, Hkv, D] (Hq a multiple of Hkv: the kernel reads grouped heads
    natively). Forward and backward call the aten ops directly, so no N x N mask exists."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_len: int, scale: float):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            cu,
            cu,
            ctx.max_len,
            ctx.max_len,
            0.0,
            True,
            rng,
            unused,
            scale=ctx.scale,
        )
        return dq, dk, dv, None, None, None


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function over packed rows (registered as "atlas_varlen").

    query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None), like sdpa's."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1:
        raise ValueError(
            f"{VARLEN} attention needs one packed row and its cu_seq_lens_q: call the model with "
            f"Packed.model_kwargs() (got batch {query.shape[0]}, cu_seq_lens_q={cu is not None})"
        )
    if dropout:
        raise ValueError(f"{VARLEN} attention has no dropout (got {dropout})")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [N, H, D]
    if q.is_cuda:
        out = _VarlenFlash.apply(q, k, v, cu.to(torch.int32), int(kwargs["max_length_q"]), scale)
        return out.unsqueeze(0), None
    # Without CUDA: row by row, causal, grouped heads (the same function, slower).
    rows = []
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        rows.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True))
    return torch.cat(rows, dim=1).transpose(0, 1).unsqueeze(0), None


def _no_mask(*args, **kwargs):
    return None  # the varlen kernel takes the row boundaries from cu_seq_lens instead


def register_varlen() -> None:
    """Make "atlas_varlen" known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, _no_mask)


@contextlib.contextmanager
def packed_attention(model):
    """Run a block with the model's attention set to "atlas_varlen", then restore the one before.

    `model` is a transformers PreTrainedModel (or a peft model around one). Generation needs the
    usual implementation back (its static cache and padding masks), hence the context."""
    register_varlen()
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = inner.config._attn_implementation
    inner.set_attn_implementation(VARLEN)
    try:
        yield model
    finally:
        inner.set_attn_implementation(before)


def decoder(model):
    """The transformer stack of a transformers causal LM (or a peft model around one): the module
    whose forward gives the final, normed hidden states (`last_hidden_state`) without the head.
    LoRA layers live inside it, so the active adapter applies."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    stack = getattr(inner, inner.base_model_prefix, None)
    if stack is None or not hasattr(stack, "layers"):
        raise ValueError(f"{type(inner).__name__}: no decoder stack at .{inner.base_model_prefix}")
    return stack


def token_budget_cut(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive rows of `indices` while their tokens (`lengths[row]`) fit `budget`; a row
    longer than the budget goes alone. Every row lands in exactly one micro-batch, in order."""
    out, cur, used = [], [], 0
    for i in indices:
        n = lengths[i]
        if cur and used + n > budget:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    return out + ([cur] if cur else [])
