#!/usr/bin/env python
"""Decode attention benchmark: one decode step's attention over the key/value pool, per layer,
through the engine's two kernels, on a GPU.

    python scripts/bench_attention.py [--heads 16 --kv-heads 8 --dim 128] [--out attention.json]
    python scripts/bench_attention.py --shared 8 --prefix 430 --used 64,600 [--out shared.json]

flash   FlashAttention-2's variable-length kernel (PyTorch's aten._flash_attention_forward) with
        seqused_k: the engine's decode steps with `decode_attention="flash"`
split   atlas.runtime.decode_attention with the engine's number of splits for the rows (the default)

For each number of rows and used keys per row (segments laid out one after another in a pool
as large as the rows need), the device microseconds per layer (CUDA events around replays of a
CUDA graph of 20 calls, as the engine's captured decode step runs them), the keys
and values read (GB) and the bandwidth they make; the defaults are Qwen3-1.7B's heads.

`--shared N --prefix P`: the rows come in groups of N samples of one prompt of P keys, then
`used` keys of their own; each row's segment holds a copy of the prompt's keys, as in the
engine. The split kernel reading every row's copy against the same kernel reading each group's
prompt once through its leader (the engine's prefix groups); GB is what each reads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from atlas.runtime import decode_attention as split


def timed(fn, n: int = 20, replays: int = 5) -> float:
    """Device microseconds per call: `n` calls captured as one CUDA graph (as the engine replays
    its decode step, so that no launch from the host is timed), replayed `replays` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # compiles, workspaces
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (n * replays)


def one_shape(rows: int, used: int, hq: int, hk: int, dim: int, dev, dtype) -> dict:
    """Both kernels on `rows` segments of `used` keys each, laid out one after another."""
    size = rows * used + 64
    keys, values = (torch.randn(size, hk, dim, device=dev, dtype=dtype) for _ in range(2))
    q = torch.randn(rows, hq, dim, device=dev, dtype=dtype)
    starts = torch.arange(rows + 1, device=dev, dtype=torch.int32) * used
    lengths = torch.full((rows,), used, device=dev, dtype=torch.int32)
    cu = torch.arange(rows + 1, device=dev, dtype=torch.int32)
    scale = dim**-0.5
    n_splits = split.splits(rows, hk, dev)

    def flash():
        return torch.ops.aten._flash_attention_forward(
            q, keys, values, cu, starts, 1, size, 0.0, True, False, scale=scale, seqused_k=lengths
        )[0]

    def splitkv():
        return split.decode_attention(q, keys, values, starts, lengths, scale, n_splits)

    gap = (flash().float() - splitkv().float()).abs().max().item()
    gb = rows * used * hk * dim * 2 * keys.element_size() / 1e9
    return dict(
        rows=rows,
        used=used,
        splits=n_splits,
        gb=gb,
        flash_us=timed(flash),
        split_us=timed(splitkv),
        max_gap=gap,
    )


def shared_shape(
    rows: int, group: int, prefix: int, own: int, hq: int, hk: int, dim: int, dev, dtype
) -> dict:
    """The split kernel over rows whose first `prefix` keys are their group's prompt (a copy in
    each row's segment), read per row and read once per group."""
    seg = prefix + own
    size = rows * seg + 64
    keys, values = (torch.randn(size, hk, dim, device=dev, dtype=dtype) for _ in range(2))
    q = torch.randn(rows, hq, dim, device=dev, dtype=dtype)
    starts = torch.arange(rows + 1, device=dev, dtype=torch.int32) * seg
    lengths = torch.full((rows,), seg, device=dev, dtype=torch.int32)
    for r in range(rows):  # each group's rows hold the same copy of its prompt
        lead = r - r % group
        keys[r * seg : r * seg + prefix] = keys[lead * seg : lead * seg + prefix]
        values[r * seg : r * seg + prefix] = values[lead * seg : lead * seg + prefix]
    per_tile = split.members_per_tile(hq, hk)
    pre = torch.full((rows,), prefix, device=dev, dtype=torch.int32)
    members = torch.full((rows, per_tile), -1, dtype=torch.int32)
    for r in range(0, rows, min(group, per_tile)):
        tile = list(range(r, min(r + min(group, per_tile), rows)))
        members[r, : len(tile)] = torch.tensor(tile)
    members = members.to(dev)
    scale = dim**-0.5
    n_splits = split.splits(rows, hk, dev)
    prefix_splits = split.splits(max(rows // per_tile, 1), hk, dev)

    def copies():
        return split.decode_attention(q, keys, values, starts, lengths, scale, n_splits)

    def shared():
        return split.decode_attention(
            q, keys, values, starts, lengths, scale, n_splits, pre, members, prefix_splits
        )

    gap = (copies().float() - shared().float()).abs().max().item()
    per_key = hk * dim * 2 * keys.element_size() / 1e9
    return dict(
        rows=rows,
        group=group,
        prefix=prefix,
        own=own,
        copies_gb=rows * seg * per_key,
        shared_gb=(-(-rows // group) * prefix + rows * own) * per_key,
        copies_us=timed(copies),
        shared_us=timed(shared),
        max_gap=gap,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--rows", default="8,16,32,64,128,256")
    p.add_argument("--used", default="600,1200,2000")
    p.add_argument("--shared", type=int, default=0, help="rows in groups of this many samples of a prompt")
    p.add_argument("--prefix", type=int, default=430, help="the prompt's keys, with --shared")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA device")
    dev, dtype = torch.device("cuda"), torch.bfloat16
    hq, hk, dim = args.heads, args.kv_heads, args.dim
    print(f"{torch.cuda.get_device_name()}: {hq} query heads, {hk} KV heads, head size {dim}, bf16")
    if args.shared:
        print(f"groups of {args.shared} rows sharing a prompt of {args.prefix} keys, then their own")
        print(
            f"{'rows':>5} {'own':>5} {'GB':>7} {'copies us':>10} {'GB':>7} {'shared us':>10} {'speed-up':>8}"
        )
        table = []
        for rows in map(int, args.rows.split(",")):
            for own in map(int, args.used.split(",")):
                row = shared_shape(rows, args.shared, args.prefix, own, hq, hk, dim, dev, dtype)
                table.append(row)
                print(
                    f"{rows:5d} {own:5d} {row['copies_gb']:7.3f} {row['copies_us']:10.1f} {row['shared_gb']:7.3f} "
                    f"{row['shared_us']:10.1f} {row['copies_us'] / row['shared_us']:8.2f}  gap {row['max_gap']:.1e}"
                )
        if args.out:
            args.out.write_text(
                json.dumps(
                    dict(device=torch.cuda.get_device_name(), shape=[hq, hk, dim], rows=table), indent=1
                )
            )
        return
    print(
        f"{'rows':>5} {'used':>5} {'splits':>6} {'GB':>7} {'flash us':>9} {'TB/s':>5} {'split us':>9} {'TB/s':>5} {'speed-up':>8}"
    )
    table = []
    for rows in map(int, args.rows.split(",")):
        for used in map(int, args.used.split(",")):
            row = one_shape(rows, used, hq, hk, dim, dev, dtype)
            table.append(row)
            gb, f_us, s_us = row["gb"], row["flash_us"], row["split_us"]
            print(
                f"{rows:5d} {used:5d} {row['splits']:6d} {gb:7.3f} {f_us:9.1f} {gb / f_us * 1e3:5.2f} "
                f"{s_us:9.1f} {gb / s_us * 1e3:5.2f} {f_us / s_us:8.2f}"
            )
    if args.out:
        args.out.write_text(
            json.dumps(dict(device=torch.cuda.get_device_name(), shape=[hq, hk, dim], rows=table), indent=1)
        )


if __name__ == "__main__":
    main()
