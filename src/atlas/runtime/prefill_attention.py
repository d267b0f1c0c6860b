"""Prefill attention over the key/value pool (atlas.runtime.kv_pool) for a captured prefill: the
packed prompts of an admission, each a segment of the pool, on a GPU through Triton.

    tile t, KV head h   attends BLOCK_M query tokens of one prompt, with the query heads of h's
                        group (GQA) folded into the tile's rows, causally over that prompt's used
                        keys, and writes their output

A captured prefill's shapes depend only on its token bucket (atlas.runtime.fast_engine), so its
kernels cannot be sized by the admission's number of prompts or its longest prompt, as
FlashAttention-2's variable-length kernel is (a grid of the longest prompt's query blocks times
the prompts). Here the grid is a list of tiles, rewritten between replays: a prompt of n new
tokens takes ceil(n / BLOCK_M) tiles, so a bucket of T tokens and at most R prompts needs
T / BLOCK_M + R of them (`tiles_for`), and a tile past the list's end (prompt -1) does nothing.

Query i of a prompt with n new tokens and u used keys (its kept keys, then the n just written)
sees keys [0, u - n + i]. Only what the engine needs: no dropout, no soft-capping, no sliding
window.
"""

from __future__ import annotations

import numpy as np
import torch

from atlas.runtime.decode_attention import available, triton

if triton is not None:
    import triton.language as tl

BLOCK_M = 64  # query tokens of a tile
BLOCK_N = 64  # keys a loop iteration reads

__all__ = ["BLOCK_M", "available", "prefill_attention", "tiles", "tiles_for"]


def tiles_for(tokens: int, prompts: int) -> int:
    """Tiles a prefill of at most `tokens` new tokens in at most `prompts` prompts can need."""
    return -(-tokens // BLOCK_M) + prompts


def tiles(new: np.ndarray, size: int) -> np.ndarray:
    """The tile list of prompts with `new` tokens each, [size, 2] int32: (prompt, query block) per
    tile, then (-1, 0) up to `size`."""
    blocks = -(-np.asarray(new, dtype=np.int64) // BLOCK_M)
    if blocks.sum() > size:
        raise ValueError(
            f"{int(blocks.sum())} tiles for prompts of {list(new)} tokens, past the list's {size}"
        )
    out = np.full((size, 2), -1, dtype=np.int32)
    out[:, 1] = 0
    prompt = np.repeat(np.arange(len(blocks)), blocks)
    out[: len(prompt), 0] = prompt
    out[: len(prompt), 1] = np.arange(len(prompt)) - np.repeat(np.cumsum(blocks) - blocks, blocks)
    return out


if triton is not None:

    @triton.jit
    def _prefill_kernel(
        Q,
        K,
        V,
        Out,
        Tiles,
        CuQ,
        Starts,
        Used,
        scale,
        stride_qt,
        stride_qh,
        stride_kp,
        stride_kh,
        stride_ot,
        stride_oh,
        G: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        D: tl.constexpr,
    ):
        t = tl.program_id(0)
        kh = tl.program_id(1)
        prompt = tl.load(Tiles + 2 * t)
        if prompt >= 0:
            block = tl.load(Tiles + 2 * t + 1)
            q0 = tl.load(CuQ + prompt)
            n = tl.load(CuQ + prompt + 1) - q0
            start = tl.load(Starts + prompt).to(tl.int64)
            used = tl.load(Used + prompt)
            r = tl.arange(0, BLOCK_M * BLOCK_H)  # row r: query token r // BLOCK_H, head r % BLOCK_H
            i = block * BLOCK_M + r // BLOCK_H
            g = r % BLOCK_H
            rmask = (i < n) & (g < G)
            d = tl.arange(0, D)
            token = (q0 + i).to(tl.int64)
            head = kh * G + g
            q = tl.load(
                Q + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=rmask[:, None],
                other=0.0,
            )
            last = used - n + i  # the last key query i sees
            m = tl.full([BLOCK_M * BLOCK_H], float("-inf"), tl.float32)
            total = tl.zeros([BLOCK_M * BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_M * BLOCK_H, D], tl.float32)
            hi = tl.minimum(used, used - n + (block + 1) * BLOCK_M)  # keys the tile's last query sees
            for j in range(0, hi, BLOCK_N):
                keys = j + tl.arange(0, BLOCK_N)
                kmask = keys < hi
                at = (start + keys)[:, None] * stride_kp + kh * stride_kh + d[None, :]
                k = tl.load(K + at, mask=kmask[:, None], other=0.0)
                v = tl.load(V + at, mask=kmask[:, None], other=0.0)
                qk = tl.dot(q, tl.trans(k)) * scale
                # key 0 is every query's, so a row's maximum is finite from the first block on
                qk = tl.where(kmask[None, :] & (keys[None, :] <= last[:, None]), qk, float("-inf"))
                new = tl.maximum(m, tl.max(qk, 1))
                alpha = tl.exp(m - new)
                p = tl.exp(qk - new[:, None])
                total = total * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m = new
            out = acc / total[:, None]
            tl.store(
                Out + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                out.to(Out.dtype.element_ty),
                mask=rmask[:, None],
            )


def prefill_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tile_list: torch.Tensor,
    cu_q: torch.Tensor,
    starts: torch.Tensor,
    used: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [N, Hq, D] (the packed prompts' new tokens: prompt p's are [cu_q[p], cu_q[p + 1])) over
    keys and values [P, Hk, D] of the pool: prompt p's segment starts at starts[p] and holds
    used[p] keys, its new tokens' last. `tile_list` [tiles, 2] from `tiles`. Returns [N, Hq, D]
    in q's dtype; a token no prompt holds (a bucket's padding) is left unwritten."""
    tokens, hq, dim = q.shape
    hk = keys.shape[1]
    if (
        hq % hk
        or dim & (dim - 1)
        or keys.stride(2) != 1
        or q.stride(2) != 1
        or values.stride() != keys.stride()
    ):
        raise ValueError(
            f"prefill attention needs query heads in whole groups per KV head, a power-of-two head "
            f"size and contiguous heads (q {tuple(q.shape)}, keys {tuple(keys.shape)})"
        )
    group = hq // hk
    out = torch.empty(tokens, hq, dim, device=q.device, dtype=q.dtype)
    _prefill_kernel[(tile_list.shape[0], hk)](
        q,
        keys,
        values,
        out,
        tile_list,
        cu_q,
        starts,
        used,
        scale,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        out.stride(0),
        out.stride(1),
        G=group,
        BLOCK_H=triton.next_power_of_2(group),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        D=dim,
    )
    return out
