"""Decode attention over the key/value pool (atlas.runtime.kv_pool), split along the keys: one
query token a row, each row's keys a segment of the pool, on a GPU through Triton.

    row r, KV head h, split s   attends the query heads of h's group (GQA) over the part s of
                                row r's used keys, and writes its unnormalised output, maximum
                                and sum (float32)
    row r, query head           combines its splits into the output

Why not FlashAttention-2's variable-length kernel for a decode step: it computes a tile of 64 or
128 query rows against every block of keys, and a decode step has one query a row (two with the
heads of a group folded in), so most of its matrix work is padding; and with fewer rows than the
GPU has multiprocessors it walks each row's keys on one of them. Here a program computes 16
query rows (a group's heads, padded for the tensor cores) and the keys are split so that a step
with few rows still fills the GPU. The number of splits is fixed per number of rows (`splits`):
a captured decode step's shapes stay static, and a split past a row's used keys does nothing.

Only the values the engine needs: no mask beyond the used keys, no dropout, no soft-capping, no
sliding window (the engine refuses sliding-window models).
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the engine attends row by row there
    triton = None

BLOCK_N = 64  # keys a loop iteration reads


def available(device: torch.device) -> bool:
    """Whether the split decode attention runs on `device` (CUDA with Triton, or Triton's
    interpreter on the CPU, TRITON_INTERPRET=1, for the tests)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def splits(rows: int, kv_heads: int, device: torch.device) -> int:
    """Splits of each row's keys for a step of `rows`: enough programs for four per
    multiprocessor, a power of two from 1 to 16."""
    sms = _multiprocessors(device.index or 0) if device.type == "cuda" else 8
    want = -(-4 * sms // (rows * kv_heads))
    n = 1
    while n < min(want, 16):
        n *= 2
    return n


if triton is not None:

    @triton.jit
    def _split_kernel(
        Q,
        K,
        V,
        Starts,
        Used,
        Acc,
        Stats,
        Out,
        scale,
        stride_qr,
        stride_qh,
        stride_kp,
        stride_kh,
        stride_or,
        stride_oh,
        HQ: tl.constexpr,
        S: tl.constexpr,
        G: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        D: tl.constexpr,
    ):
        r = tl.program_id(0)
        kh = tl.program_id(1)
        s = tl.program_id(2)
        start = tl.load(Starts + r).to(tl.int64)
        n = tl.load(Used + r)
        chunk = tl.cdiv(tl.cdiv(n, S), BLOCK_N) * BLOCK_N
        lo = s * chunk
        hi = tl.minimum(lo + chunk, n)
        heads = tl.arange(0, BLOCK_H)
        d = tl.arange(0, D)
        hmask = heads < G
        q = tl.load(
            Q + r * stride_qr + (kh * G + heads)[:, None] * stride_qh + d[None, :],
            mask=hmask[:, None],
            other=0.0,
        )
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        for j in range(lo, hi, BLOCK_N):
            keys = j + tl.arange(0, BLOCK_N)
            kmask = keys < hi
            at = (start + keys)[:, None] * stride_kp + kh * stride_kh + d[None, :]
            k = tl.load(K + at, mask=kmask[:, None], other=0.0)
            v = tl.load(V + at, mask=kmask[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k)) * scale
            qk = tl.where(kmask[None, :], qk, float("-inf"))
            new = tl.maximum(m, tl.max(qk, 1))
            alpha = tl.exp(m - new)
            p = tl.exp(qk - new[:, None])
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = new
        qh = kh * G + heads
        if S == 1:  # one split: the output itself
            out = acc / total[:, None]
            tl.store(
                Out + r * stride_or + qh[:, None] * stride_oh + d[None, :],
                out.to(Out.dtype.element_ty),
                mask=hmask[:, None],
            )
        else:
            at = (r * HQ + qh) * S + s
            tl.store(Acc + at[:, None] * D + d[None, :], acc, mask=hmask[:, None])
            tl.store(Stats + at * 2, m, mask=hmask)
            tl.store(Stats + at * 2 + 1, total, mask=hmask)

    @triton.jit
    def _combine_kernel(
        Acc,
        Stats,
        Out,
        stride_or,
        stride_oh,
        HQ: tl.constexpr,
        S: tl.constexpr,
        D: tl.constexpr,
    ):
        r = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, S)
        d = tl.arange(0, D)
        at = (r * HQ + h) * S + s
        m = tl.load(Stats + at * 2)
        total = tl.load(Stats + at * 2 + 1)
        top = tl.max(m, 0)
        w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)  # an empty split weighs nothing
        acc = tl.load(Acc + at[:, None] * D + d[None, :])
        out = tl.sum(acc * w[:, None], 0) / tl.sum(total * w, 0)
        tl.store(Out + r * stride_or + h * stride_oh + d, out.to(Out.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    used: torch.Tensor,
    scale: float,
    n_splits: int,
) -> torch.Tensor:
    """q [R, Hq, D] (one query a row) over keys and values [P, Hk, D] of the pool: row r attends
    positions [starts[r], starts[r] + used[r]). Returns [R, Hq, D] in q's dtype."""
    rows, hq, dim = q.shape
    hk = keys.shape[1]
    if (
        hq % hk
        or dim & (dim - 1)
        or keys.stride(2) != 1
        or q.stride(2) != 1
        or values.stride() != keys.stride()
    ):
        raise ValueError(
            f"decode attention needs query heads in whole groups per KV head, a power-of-two head "
            f"size and contiguous heads (q {tuple(q.shape)}, keys {tuple(keys.shape)})"
        )
    group = hq // hk
    out = torch.empty(rows, hq, dim, device=q.device, dtype=q.dtype)
    if n_splits > 1:
        acc = torch.empty(rows, hq, n_splits, dim, device=q.device, dtype=torch.float32)
        stats = torch.empty(rows, hq, n_splits, 2, device=q.device, dtype=torch.float32)
    else:
        acc = stats = out  # unused: the one split writes the output
    _split_kernel[(rows, hk, n_splits)](
        q,
        keys,
        values,
        starts,
        used,
        acc,
        stats,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        out.stride(0),
        out.stride(1),
        HQ=hq,
        S=n_splits,
        G=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N,
        D=dim,
    )
    if n_splits > 1:
        _combine_kernel[(rows, hq)](acc, stats, out, out.stride(0), out.stride(1), HQ=hq, S=n_splits, D=dim)
    return out
