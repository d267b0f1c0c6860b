"""The rollout engine's key/value store: one pool of positions per layer, a segment of it per row.

    pool.kv[layer, 0 | 1]      [positions, kv_heads, head_dim]: keys | values
    row r's segment            positions [start_r, start_r + size_r): its prompt, then its tokens

A forward of the engine (atlas.runtime.fast_engine) packs its tokens into one row of N tokens and
hands the model a `Layout`: where each token's key and value go in the pool, which of the N
tokens belong to which row, and how many positions of each row's segment hold keys once they are
written. The attention function registered as "atlas_pool" writes the forward's keys and values
there, then attends each row's queries over its own used positions, causally (a row's queries
are its last tokens):

- on a GPU in half precision through FlashAttention-2's variable-length kernel (the one PyTorch
  ships, aten._flash_attention_forward) with `seqused_k`, so a decode step reads the keys each
  row has, not a padded cache's; in a decode step (one query a row) the kernel itself takes the
  query heads that share a KV head as one group, so each KV head is read once for them;
- in a decode step whose Layout sets `splits` (the engine's default on a GPU), through
  atlas.runtime.decode_attention: each row's keys split in that many parts, read once for a
  KV head's whole group;
- otherwise (a CPU, float32) row by row with SDPA, from host copies of the rows' bounds
  (`Layout.rows`): the same function, for the tests, and not capturable.

`attend` is that attention alone, over keys already written: atlas.runtime.fused_qwen3's forward,
which writes them in its RoPE kernel, calls it directly.

A prefill and a decode step are the same forward: a prompt is N tokens of one row, a decode step
one token of each row. Nothing here reads a tensor's value on the host, so a decode step can be
captured as a CUDA graph: its shapes depend only on the number of rows, and the layout's tensors
are rewritten in place between replays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from atlas.runtime.decode_attention import decode_attention

POOL_ATTENTION = "atlas_pool"


@dataclass
class Layout:
    """What one forward writes and reads. Tensors are on the pool's device."""

    pool: KVPool
    write_at: torch.Tensor  # [N] int64: pool position of each of the forward's N tokens
    cu_q: torch.Tensor  # [R + 1] int32: row r's tokens are [cu_q[r], cu_q[r + 1]) of the N
    starts: torch.Tensor  # [R + 1] int32: row r's segment starts at starts[r] (the last is unused)
    used: torch.Tensor  # [R] int32: positions of row r's segment holding keys after the writes
    max_q: int  # at least every row's token count in this forward
    max_k: int  # at least every used[r]
    # A prompt asked by several rows is computed once: its keys and values are also written to
    # the other rows' segments (copy_dst[j] <- the forward's token copy_src[j]).
    copy_src: torch.Tensor | None = None
    copy_dst: torch.Tensor | None = None
    # (q0, q1, start, used[, prefix_at, pre]) per row, on the host: set, the attention runs row by
    # row with SDPA (a row's first `pre` keys read at `prefix_at`, its group leader's segment)
    rows: list[tuple] | None = None
    # a decode step (one query a row) through atlas.runtime.decode_attention, its keys split in
    # this many parts
    splits: int | None = None
    # and, for rows that share a prefix with their group's leader, each row's prefix length [R]
    # int32, the leaders' member lists [R, members_per_tile] int32 and the prefix's splits
    pre: torch.Tensor | None = None
    members: torch.Tensor | None = None
    prefix_splits: int = 1


class KVPool:
    """Keys and values of `positions` positions for every layer of a model, in the model's dtype."""

    def __init__(self, config, positions: int, device, dtype):
        self.layers = config.num_hidden_layers
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.positions = positions
        self.kv = torch.zeros(
            (self.layers, 2, positions, self.kv_heads, self.head_dim), device=device, dtype=dtype
        )

    def move(self, src, dst) -> None:
        """Every layer's keys and values at positions `src` copied to positions `dst` (index
        arrays of one length); all of a layer's sources are read before any is written."""
        src_t, dst_t = to_device(src, self.kv.device), to_device(dst, self.kv.device)
        for layer in self.kv:  # [2, positions, heads, dim]
            layer.index_copy_(1, dst_t, layer.index_select(1, src_t))

    @staticmethod
    def position_bytes(config, dtype) -> int:
        """Bytes of one position: a key and a value in every layer."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return (
            2
            * config.num_hidden_layers
            * config.num_key_value_heads
            * head_dim
            * torch.finfo(dtype).bits
            // 8
        )


def to_device(values, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A host array (or list) on `device`, without making the host wait for the device: on a GPU
    the values go through pinned memory in a copy queued behind the device's work (a copy from
    pageable memory would first wait for everything queued, a decode step's forward included)."""
    host = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def flash(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a pool on `device` in `dtype` attends through FlashAttention-2: CUDA (or meta) in half
    precision. Anywhere else the engine sets Layout.rows."""
    return device.type != "cpu" and dtype in (torch.float16, torch.bfloat16)


def pool_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    atlas_kv: Layout | None = None,
    **kwargs,
):
    """transformers attention over the pool ("atlas_pool"): query [1, Hq, N, D], key and value
    [1, Hkv, N, D] of the forward's N packed tokens -> ([1, N, Hq, D], None)."""
    if atlas_kv is None or query.shape[0] != 1:
        raise ValueError(
            f"{POOL_ATTENTION} attention needs the engine's packed row and its Layout (atlas_kv); "
            f"got batch {query.shape[0]}, atlas_kv={atlas_kv is not None}"
        )
    if dropout:
        raise ValueError(f"{POOL_ATTENTION} attention has no dropout (got {dropout})")
    lay = atlas_kv
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, H, D]
    keys, values = lay.pool.kv[module.layer_idx, 0], lay.pool.kv[module.layer_idx, 1]
    keys.index_copy_(0, lay.write_at, k)
    values.index_copy_(0, lay.write_at, v)
    if lay.copy_src is not None:
        keys.index_copy_(0, lay.copy_dst, k.index_select(0, lay.copy_src))
        values.index_copy_(0, lay.copy_dst, v.index_select(0, lay.copy_src))
    return attend(q, keys, values, lay, scale).unsqueeze(0), None


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lay: Layout, scale: float
) -> torch.Tensor:
    """Each row's queries (q [N, Hq, D], the forward's packed tokens) over its used keys in one
    layer's pool (keys, values [positions, Hkv, D], already written) -> [N, Hq, D]."""
    if lay.splits is not None:  # a decode step, split along the keys
        return decode_attention(
            q, keys, values, lay.starts, lay.used, scale, lay.splits, lay.pre, lay.members, lay.prefix_splits
        )
    if lay.rows is None:  # FlashAttention-2 (CUDA, half precision; and the meta device of the tests)
        return torch.ops.aten._flash_attention_forward(
            q.contiguous(),
            keys,
            values,
            lay.cu_q,
            lay.starts,
            lay.max_q,
            lay.max_k,
            0.0,
            True,  # bottom-right aligned: a row's queries are its last `n` used positions
            False,
            scale=scale,
            seqused_k=lay.used,
        )[0]
    outs = []
    for q0, q1, start, used, *shared in lay.rows:
        n = q1 - q0
        qs = q[q0:q1].transpose(0, 1)  # [Hq, n, D]
        at, pre = shared or (start, 0)
        ks, vs = (
            torch.cat([t[at : at + pre], t[start + pre : start + used]]).transpose(0, 1)
            for t in (keys, values)
        )
        causal = torch.ones(n, used, dtype=torch.bool, device=q.device).tril(
            used - n
        )  # query i sees keys <= used - n + i
        outs.append(
            F.scaled_dot_product_attention(qs, ks, vs, attn_mask=causal, scale=scale, enable_gqa=True)
        )
    return torch.cat(outs, dim=1).transpose(0, 1)


def _no_mask(*args, **kwargs):
    return None  # the pool attention takes its rows from the Layout


def register() -> None:
    """Make "atlas_pool" known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(POOL_ATTENTION, pool_attention)
    AttentionMaskInterface.register(POOL_ATTENTION, _no_mask)


class Segments:
    """Which positions of a pool are free: first-fit allocation of contiguous runs, a freed run
    merged with its free neighbours. The engine places each request's segment here, and gives
    back what a finished row no longer needs (the tail its generation did not fill)."""

    def __init__(self, positions: int):
        self.positions = positions
        self.free: list[list[int]] = [[0, positions]] if positions else []  # [start, size], by start

    def take(self, size: int) -> int | None:
        """The start of `size` free positions (the first run that holds them), or None."""
        for run in self.free:
            if run[1] >= size:
                start = run[0]
                run[0] += size
                run[1] -= size
                if not run[1]:
                    self.free.remove(run)
                return start
        return None

    def give(self, start: int, size: int) -> None:
        """Positions [start, start + size) are free again."""
        if size <= 0:
            return
        if start < 0 or start + size > self.positions:
            raise ValueError(f"positions [{start}, {start + size}) lie outside a pool of {self.positions}")
        i = 0
        while i < len(self.free) and self.free[i][0] < start:
            i += 1
        before = self.free[i - 1] if i else None
        after = self.free[i] if i < len(self.free) else None
        if (before and before[0] + before[1] > start) or (after and start + size > after[0]):
            raise ValueError(f"positions [{start}, {start + size}) are already free in part")
        if before and before[0] + before[1] == start:
            before[1] += size
            if after and before[0] + before[1] == after[0]:
                before[1] += after[1]
                self.free.remove(after)
        elif after and start + size == after[0]:
            after[0], after[1] = start, after[1] + size
        else:
            self.free.insert(i, [start, size])

    def grow(self, positions: int) -> None:
        """The pool now has `positions`; the new ones are free."""
        old, self.positions = self.positions, positions
        self.give(old, positions - old)

    @property
    def largest(self) -> int:
        return max((size for _, size in self.free), default=0)

    @property
    def free_positions(self) -> int:
        return sum(size for _, size in self.free)
