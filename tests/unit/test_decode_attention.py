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

from atlas.runtime.decode_attention import decode_attention

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
    out = decode_attention(q, keys, values, starts, used, d**-0.5, spec["splits"])
    ref = torch.cat([
        F.scaled_dot_product_attention(
            q[i : i + 1].double().transpose(0, 1),
            keys[s : s + u].double().transpose(0, 1),
            values[s : s + u].double().transpose(0, 1),
            scale=d**-0.5, enable_gqa=True,
        ).transpose(0, 1)
        for i, (u, s) in enumerate(rows)
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


@pytest.fixture(scope="module")
def checked() -> list[dict]:
    return run_checks(
        [
            dict(seed=splits, dtype=dtype, heads=heads, rows=ROWS, splits=splits, q_scale=q_scale)
            for splits, dtype, heads, q_scale, _ in CASES
        ]
    )


@pytest.mark.parametrize(
    "case", range(len(CASES)), ids=["1-split", "4-splits", "8-splits-big-scores", "16-splits-fp16"]
)
def test_split_decode_attention_equals_attention_over_each_rows_keys(checked, case):
    splits, dtype, heads, q_scale, bound = CASES[case]
    got = checked[case]
    assert got["shape"] == [len(ROWS), heads[0], heads[2]] and got["dtype"] == f"torch.{dtype}"
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
