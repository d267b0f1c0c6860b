"""The split decode attention (atlas.runtime.decode_attention) without a GPU: its Triton kernels run
in Triton's interpreter on the CPU, against SDPA row by row. The interpreter needs Triton, which
the CPU install leaves out (scripts/cpu-overrides.txt): ATLAS_TRITON names a folder that holds it
(`uv pip install --target .triton triton==3.5.0`, as .ci/run does), put on the path of a
subprocess only. The interpreter has no bfloat16: float32 and float16 here, bf16 on a GPU
(tests/gpu/test_gpu_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
import torch.nn.functional as F
from triton.runtime import interpreter

# NumPy 2 no longer turns a one-element array into an int; the interpreter's scalars are such
# arrays, and a loop bound read from memory needs one.
_patch = interpreter._patch_lang_tensor
def _scalars(tensor):
    _patch(tensor)
    tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])
interpreter._patch_lang_tensor = _scalars

from atlas.runtime.decode_attention import decode_attention, members_per_tile

results = []
for spec in json.loads(sys.argv[1]):
    torch.manual_seed(spec["seed"])
    dtype = getattr(torch, spec["dtype"])
    hq, hk, d = spec["heads"]
    rows = spec["rows"]  # [used, start]
    size = max(u + s for u, s in rows) + 64
    keys, values = (torch.randn(size, hk, d, dtype=dtype) for _ in range(2))
    q = torch.randn(len(rows), hq, d, dtype=dtype) * spec["q_scale"]
    starts = torch.tensor([s for _, s in rows] + [0], dtype=torch.int32)
    used = torch.tensor([u for u, _ in rows], dtype=torch.int32)
    # groups: [leader, other members, pre]. A member's own copy of the prefix is noise here, so
    # that only the leader's keys give the reference.
    prefix = [(s, 0) for _, s in rows]  # per row: where its first `pre` keys are read, and pre
    shared = {}
    if "groups" in spec:
        pre = torch.zeros(len(rows), dtype=torch.int32)
        members = torch.full((len(rows), members_per_tile(hq, hk)), -1, dtype=torch.int32)
        for lead, others, n in spec["groups"]:
            members[lead, : 1 + len(others)] = torch.tensor([lead, *others])
            for i in [lead, *others]:
                pre[i] = n
                prefix[i] = (rows[lead][1], n)
            for i in others:
                s = rows[i][1]
                keys[s : s + n], values[s : s + n] = torch.randn(2, n, hk, d, dtype=dtype)
        shared = dict(pre=pre, members=members, prefix_splits=spec["prefix_splits"])
    out = decode_attention(q, keys, values, starts, used, d**-0.5, spec["splits"], **shared)

    def own(t, i):
        (u, s), (at, n) = rows[i], prefix[i]
        return torch.cat([t[at : at + n], t[s + n : s + u]]).double().transpose(0, 1)

    ref = torch.cat([
        F.scaled_dot_product_attention(
            q[i : i + 1].double().transpose(0, 1), own(keys, i), own(values, i),
            scale=d**-0.5, enable_gqa=True,
        ).transpose(0, 1)
        for i in range(len(rows))
    ])
    results.append({"shape": list(out.shape), "dtype": str(out.dtype), "gap": (out.double() - ref).abs().max().item(),
                      "finite": bool(torch.isfinite(out).all())})
print(json.dumps(results))
"""

# used keys: one, inside a 64-key block, at its end, one past it, and long; rows out of order in the pool
ROWS = [[1, 0], [63, 2000], [64, 100], [65, 300], [700, 1100], [5, 1900]]


def run_checks(specs: list[dict]) -> list[dict]:
    """Each spec's check, all in one subprocess (one import of torch and Triton)."""
    folder = os.environ.get("ATLAS_TRITON")
    if not folder or not (Path(folder) / "triton").is_dir():
        pytest.skip(
            "Triton's interpreter: set ATLAS_TRITON to a folder holding triton (uv pip install --target)"
        )
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, str(src)]))
    done = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(specs)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = [
    (1, "float32", [4, 2, 32], 1.0, 1e-5),  # one split writes the output itself
    (4, "float32", [4, 2, 32], 1.0, 1e-5),  # splits past a short row's keys do nothing
    # scores in the hundreds: exp of a split's maximum would overflow float32 unscaled
    (8, "float32", [4, 2, 32], 40.0, 1e-4),
    (16, "float16", [8, 1, 64], 1.0, 2e-3),  # more splits than some rows have blocks; 8 heads a group
]


# Rows sharing a prefix with their group's leader: a group of three (prefix ending inside a block,
# a member one key past it), a group whose prefix is whole blocks, a group of two with one own key
# each, and rows of no group between them; [leader, other members, pre].
SHARED_ROWS = [
    [70, 0],
    [80, 200],
    [66, 400],
    [5, 600],
    [130, 800],
    [129, 1000],
    [65, 1200],
    [41, 1400],
    [41, 1500],
]
SHARED = [
    # (own splits, prefix splits, dtype, heads, q_scale, bound, groups)
    (1, 1, "float32", [4, 2, 32], 1.0, 1e-5, [[1, [0, 2], 65], [4, [5], 128], [7, [8], 40]]),
    (4, 2, "float32", [4, 2, 32], 40.0, 1e-4, [[1, [0, 2], 65], [4, [5], 128], [7, [8], 40]]),
    (2, 8, "float16", [8, 1, 64], 1.0, 2e-3, [[1, [0], 65], [2, [6], 64], [4, [5], 128], [8, [7], 40]]),
]


@pytest.fixture(scope="module")
def checked() -> list[dict]:
    plain = [
        dict(seed=splits, dtype=dtype, heads=heads, rows=ROWS, splits=splits, q_scale=q_scale)
        for splits, dtype, heads, q_scale, _ in CASES
    ]
    shared = [
        dict(
            seed=7,
            dtype=dtype,
            heads=heads,
            rows=SHARED_ROWS,
            splits=own,
            prefix_splits=pre,
            q_scale=scale,
            groups=groups,
        )
        for own, pre, dtype, heads, scale, _, groups in SHARED
    ]
    return run_checks(plain + shared)


@pytest.mark.parametrize(
    "case", range(len(CASES)), ids=["1-split", "4-splits", "8-splits-big-scores", "16-splits-fp16"]
)
def test_split_decode_attention_equals_attention_over_each_rows_keys(checked, case):
    splits, dtype, heads, q_scale, bound = CASES[case]
    got = checked[case]
    assert got["shape"] == [len(ROWS), heads[0], heads[2]] and got["dtype"] == f"torch.{dtype}"
    assert got["finite"]
    assert got["gap"] < bound, got


@pytest.mark.parametrize(
    "case", range(len(SHARED)), ids=["1+1-splits", "4+2-splits-big-scores", "2+8-splits-fp16"]
)
def test_rows_of_a_group_read_the_leaders_prefix_and_their_own_keys_after_it(checked, case):
    """Each member's own copy of the prefix is noise: only attention over the leader's first `pre`
    keys, then the member's own keys past them, matches. Rows of no group attend their own keys."""
    own, pre, dtype, heads, scale, bound, groups = SHARED[case]
    got = checked[len(CASES) + case]
    assert got["shape"] == [len(SHARED_ROWS), heads[0], heads[2]] and got["dtype"] == f"torch.{dtype}"
    assert got["finite"]
    assert got["gap"] < bound, got


def test_a_step_with_few_rows_splits_the_keys_until_the_gpu_is_full():
    """Four programs a multiprocessor (8 of them off a GPU), in a power of two of splits from 1 to
    16: a step's shapes, and so its captured graph, depend only on its rows."""
    import torch

    from atlas.runtime.decode_attention import splits

    cpu = torch.device("cpu")
    assert [splits(rows, 8, cpu) for rows in (1, 2, 4, 8, 64)] == [4, 2, 1, 1, 1]
    assert [splits(rows, 1, cpu) for rows in (1, 3, 32)] == [16, 16, 1]
    assert splits(5, 2, cpu) == 4  # 32 programs wanted over 10: four splits, the power of two above 3.2
