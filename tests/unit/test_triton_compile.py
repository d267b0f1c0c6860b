"""Every Triton kernel of the rollout engine (atlas.runtime.decode_attention, fused_qwen3,
split_pick) compiles for a GPU on a machine without one: the engine's own launchers run on CPU
tensors with the launch caught, and each launch's kernel, argument types and constants are
compiled for sm_90 (Hopper) with the ptxas of the triton wheel. Triton's interpreter, which the
other kernel tests run, lets through what only the compiler refuses (a type mixed in an
operation, a shape a `tl.dot` cannot take), so a kernel edited where no GPU is at hand is
compiled here before it reaches one."""

from __future__ import annotations

import json
import subprocess
import sys

from unit.test_fused_qwen3 import interpreter_env

COMPILE = r"""
import json
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.jit import JITFunction

launches = []
JITFunction.run = lambda self, *args, grid, warmup, **kwargs: launches.append((self, args, kwargs))

from atlas.runtime import decode_attention as da, fused_qwen3 as fq, split_pick as sp

# the launches of a decode step at the 1.7B shape's heads: 16 query and 8 KV heads of 128, bf16
bf16, i32 = torch.bfloat16, torch.int32
rows, hq, hk, d, slots = 8, 16, 8, 128, 64
q, keys, values = torch.zeros(rows, hq, d, dtype=bf16), torch.zeros(slots, hk, d, dtype=bf16), torch.zeros(slots, hk, d, dtype=bf16)
starts, used = torch.zeros(rows, dtype=i32), torch.ones(rows, dtype=i32)
da.decode_attention(q, keys, values, starts, used, 0.088, 1)
da.decode_attention(q, keys, values, starts, used, 0.088, 4)
members = torch.full((rows, da.members_per_tile(hq, hk)), -1, dtype=i32)
da.decode_attention(q, keys, values, starts, used, 0.088, 2, pre=torch.zeros(rows, dtype=i32), members=members, prefix_splits=2)
x = torch.zeros(rows, 2048, dtype=bf16)
fq.add_rms_norm(x, x.clone(), torch.ones(2048, dtype=bf16), 1e-6)
fq.add_rms_norm(None, x.clone(), torch.ones(2048, dtype=bf16), 1e-6)
cos = torch.zeros(64, d, dtype=bf16)
fq.qk_rope_store(torch.zeros(rows, (hq + 2 * hk) * d, dtype=bf16), torch.ones(d, dtype=bf16), torch.ones(d, dtype=bf16),
                 cos, cos, torch.zeros(rows, dtype=torch.int64), torch.arange(rows), keys, values, (hq, hk), 1e-6)
fq.silu_mul(torch.zeros(rows, 2 * 6144, dtype=bf16))
vocab = 151936
logits, keys64 = torch.zeros(rows, vocab), torch.zeros(rows, dtype=torch.int64)
bitmask, unbanned = torch.zeros(rows, (vocab + 31) // 32, dtype=i32), torch.ones(vocab, dtype=torch.bool)
sp.pick(logits, bitmask, keys64, unbanned, 1.0, True)
sp.pick(logits, bitmask, keys64, unbanned, 1.0, False)

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64", torch.bool: "i1"}
out = []
for fn, args, kwargs in launches:
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    signature, constants = {}, {}
    for p in fn.params:
        value = bound[p.name]
        if p.is_constexpr:
            signature[p.name], constants[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, int):
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            signature[p.name] = "fp32"
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    done = compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32), options=options)
    ops = sorted({line.split("=", 1)[1].split()[0] for line in done.asm["ttir"].splitlines() if " = " in line})
    out.append({"kernel": fn.fn.__name__, "constants": {k: str(v) for k, v in constants.items()}, "cubin": len(done.asm["cubin"]), "ops": ops})
print(json.dumps(out))
"""


def test_every_engine_kernel_compiles_for_a_hopper_gpu(tmp_path):
    env = interpreter_env() | {"TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(k["cubin"] > 2000 for k in got), got
    assert {k["kernel"] for k in got} == {
        "_split_kernel",
        "_combine_kernel",
        "_shared_kernel",
        "_shared_combine_kernel",
        "_add_rms_norm_kernel",
        "_qk_rope_store_kernel",
        "_silu_mul_kernel",
        "_stats_kernel",
        "_draw_kernel",
        "_finish_kernel",
    }
    # the split pick's noise hash: unsigned shifts and an unsigned conversion to float, as
    # atlas.runtime.sampling's int64 arithmetic computes it (unconstrained: no bitmask shifted)
    draw = next(
        k["ops"] for k in got if k["kernel"] == "_draw_kernel" and k["constants"]["CONSTRAINED"] == "False"
    )
    assert "arith.shrui" in draw and "arith.uitofp" in draw, draw
    assert "arith.shrsi" not in draw and "arith.sitofp" not in draw, draw
