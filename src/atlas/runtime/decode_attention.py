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

Rows that share a prefix (the samples of one prompt, and their later turns) read it once. Each
such row still holds the prefix's keys in its own segment (copied there, the same bits), but a
step may name groups of rows that share their first `pre` keys, with a leader among them:

    row r, KV head h, own split s      row r's query heads of h's group over its keys past `pre`
    leader r, KV head h, prefix split  the query heads of every member (up to `members_per_tile`
                                       rows, `BLOCK_H` query rows together) over the leader's
                                       first `pre` keys
    row r, query head                  combines its own and its prefix splits

so a prefix of n keys shared by 8 rows is read once instead of 8 times, and its matrix products
fill the tensor cores' 16 rows with 8 rows' queries instead of padding one row's 2. The decode
attention of a step reads mostly such prefixes when prompts are long and answers short.

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


def tile_rows(heads: int, kv_heads: int) -> int:
    """Query rows a program computes: a KV head's group of query heads, at least 16 (the tensor
    cores' smallest tile), a power of two."""
    return max(16, triton.next_power_of_2(heads // kv_heads)) if triton else max(16, heads // kv_heads)


def members_per_tile(heads: int, kv_heads: int) -> int:
    """Rows of a prefix group one program attends for: as many as fill its tile (8 for Qwen3's
    groups of 2 query heads)."""
    return max(1, tile_rows(heads, kv_heads) // (heads // kv_heads))


if triton is not None:

    @triton.jit
    def _attend(
        q,
        K,
        V,
        base,
        n,
        parts,
        s,
        kh,
        scale,
        stride_kp,
        stride_kh,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        D: tl.constexpr,
    ):
        """Split s of `parts` of the n keys at pool positions base.. for KV head kh: the query tile
        q's running maximum, sum and unnormalised output (online softmax, float32)."""
        chunk = tl.cdiv(tl.cdiv(n, parts), BLOCK_N) * BLOCK_N
        lo = s * chunk
        hi = tl.minimum(lo + chunk, n)
        d = tl.arange(0, D)
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        for j in range(lo, hi, BLOCK_N):
            keys = j + tl.arange(0, BLOCK_N)
            kmask = keys < hi
            at = (base + keys)[:, None] * stride_kp + kh * stride_kh + d[None, :]
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
        return m, total, acc

    @triton.jit
    def _merge(m, total, acc):
        """One query head's output from its splits' maxima, sums and unnormalised outputs."""
        top = tl.max(m, 0)
        w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)  # an empty split weighs nothing
        return tl.sum(acc * w[:, None], 0) / tl.sum(total * w, 0)

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
        heads = tl.arange(0, BLOCK_H)
        d = tl.arange(0, D)
        hmask = heads < G
        q = tl.load(
            Q + r * stride_qr + (kh * G + heads)[:, None] * stride_qh + d[None, :],
            mask=hmask[:, None],
            other=0.0,
        )
        m, total, acc = _attend(q, K, V, start, n, S, s, kh, scale, stride_kp, stride_kh, BLOCK_H, BLOCK_N, D)
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
        out = _merge(
            tl.load(Stats + at * 2), tl.load(Stats + at * 2 + 1), tl.load(Acc + at[:, None] * D + d[None, :])
        )
        tl.store(Out + r * stride_or + h * stride_oh + d, out.to(Out.dtype.element_ty))

    @triton.jit
    def _shared_kernel(
        Q,
        K,
        V,
        Starts,
        Used,
        Pre,
        Members,
        Acc,
        Stats,
        scale,
        stride_qr,
        stride_qh,
        stride_kp,
        stride_kh,
        HQ: tl.constexpr,
        S: tl.constexpr,
        SP: tl.constexpr,
        SLOTS: tl.constexpr,
        G: tl.constexpr,
        M: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        D: tl.constexpr,
    ):
        r = tl.program_id(0)
        kh = tl.program_id(1)
        p = tl.program_id(2)  # S own splits of row r, then SP splits of the prefix r leads
        shared = p >= S
        s = tl.where(shared, p - S, p)
        parts = tl.where(shared, SP, S)
        start = tl.load(Starts + r).to(tl.int64)
        pre = tl.load(Pre + r)
        lead = tl.load(Members + r * M)  # r itself where r leads a group, else -1
        base = tl.where(shared, start, start + pre)
        n = tl.where(shared, tl.where(lead >= 0, pre, 0), tl.load(Used + r) - pre)
        t = tl.arange(0, BLOCK_H)
        member = tl.where(shared, t // G, 0)
        head = tl.where(shared, t % G, t)
        row = tl.load(Members + r * M + member, mask=shared & (member < M), other=-1)
        row = tl.where(shared, row, r)
        live = tl.where(shared, (member < M) & (row >= 0) & (lead >= 0), t < G)
        qh = kh * G + head
        d = tl.arange(0, D)
        q = tl.load(
            Q + row.to(tl.int64)[:, None] * stride_qr + qh[:, None] * stride_qh + d[None, :],
            mask=live[:, None],
            other=0.0,
        )
        m, total, acc = _attend(
            q, K, V, base, n, parts, s, kh, scale, stride_kp, stride_kh, BLOCK_H, BLOCK_N, D
        )
        slot = (row.to(tl.int64) * HQ + qh) * SLOTS + p
        tl.store(Acc + slot[:, None] * D + d[None, :], acc, mask=live[:, None])
        tl.store(Stats + slot * 2, m, mask=live)
        tl.store(Stats + slot * 2 + 1, total, mask=live)

    @triton.jit
    def _shared_combine_kernel(
        Acc,
        Stats,
        Pre,
        Out,
        stride_or,
        stride_oh,
        HQ: tl.constexpr,
        S: tl.constexpr,
        SP: tl.constexpr,
        SLOTS: tl.constexpr,
        D: tl.constexpr,
    ):
        r = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.arange(0, SLOTS)
        d = tl.arange(0, D)
        # the prefix's slots count only for a row in a group (their leader wrote them)
        ok = (s < S) | ((s < S + SP) & (tl.load(Pre + r) > 0))
        at = (r * HQ + h) * SLOTS + s
        out = _merge(
            tl.load(Stats + at * 2, mask=ok, other=float("-inf")),
            tl.load(Stats + at * 2 + 1, mask=ok, other=0.0),
            tl.load(Acc + at[:, None] * D + d[None, :], mask=ok[:, None], other=0.0),
        )
        tl.store(Out + r * stride_or + h * stride_oh + d, out.to(Out.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    starts: torch.Tensor,
    used: torch.Tensor,
    scale: float,
    n_splits: int,
    pre: torch.Tensor | None = None,
    members: torch.Tensor | None = None,
    prefix_splits: int = 1,
) -> torch.Tensor:
    """q [R, Hq, D] (one query a row) over keys and values [P, Hk, D] of the pool: row r attends
    positions [starts[r], starts[r] + used[r]). Returns [R, Hq, D] in q's dtype.

    With `pre` [R] int32 and `members` [R, members_per_tile] int32: row r's first pre[r] keys
    (pre[r] > 0) are those of its group's leader, read once for the group in `prefix_splits`
    parts; members[l] lists leader l's rows (l first, then the others, -1 after them) and is -1
    throughout for a row that leads none. Every row with pre[r] > 0 must be listed by exactly one
    leader whose pre equals its own; rows with pre[r] = 0 attend their own keys alone."""
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
    if pre is not None:
        per_tile = members_per_tile(hq, hk)
        if members is None or tuple(members.shape) != (rows, per_tile) or pre.shape != (rows,):
            raise ValueError(
                f"decode attention with shared prefixes needs pre [{rows}] and members "
                f"[{rows}, {per_tile}] (got {None if members is None else tuple(members.shape)})"
            )
        parts = n_splits + prefix_splits
        slots = triton.next_power_of_2(parts)
        acc = torch.empty(rows, hq, slots, dim, device=q.device, dtype=torch.float32)
        stats = torch.empty(rows, hq, slots, 2, device=q.device, dtype=torch.float32)
        _shared_kernel[(rows, hk, parts)](
            q,
            keys,
            values,
            starts,
            used,
            pre,
            members,
            acc,
            stats,
            scale,
            q.stride(0),
            q.stride(1),
            keys.stride(0),
            keys.stride(1),
            HQ=hq,
            S=n_splits,
            SP=prefix_splits,
            SLOTS=slots,
            G=group,
            M=per_tile,
            BLOCK_H=tile_rows(hq, hk),
            BLOCK_N=BLOCK_N,
            D=dim,
        )
        _shared_combine_kernel[(rows, hq)](
            acc,
            stats,
            pre,
            out,
            out.stride(0),
            out.stride(1),
            HQ=hq,
            S=n_splits,
            SP=prefix_splits,
            SLOTS=slots,
            D=dim,
        )
        return out
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
