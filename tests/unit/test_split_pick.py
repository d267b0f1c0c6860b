"""The decode step's pick split along the vocabulary (atlas.runtime.split_pick): its Triton
kernels, run in Triton's interpreter on the CPU, draw what its torch spelling draws, token for
token, with the same log-probs and sampled flags; and the engine picking through them generates
what it generates through the torch pick (on a GPU: tests/gpu/test_gpu_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atlas.runtime import decode_attention, split_pick
from atlas.runtime.fast_engine import StaticEngine
from unit.test_fused_qwen3 import interpreter_env

CHECK = r"""
import json, os, sys
device = sys.argv[1]
if device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
import torch
torch.set_default_device(device)
from atlas.runtime import split_pick as sp
from atlas.runtime.sampling import keys_for

g = torch.Generator(device).manual_seed(5)
vocab, rows, block = 3000, 24, 512  # 6 chunks, the last one partly past the vocabulary
words = (vocab + 31) // 32
logits = torch.randn(rows, vocab, generator=g) * 3
bits = torch.rand(rows, vocab, generator=g) < 0.3
bits[0] = True                                  # everything allowed
bits[1] = False; bits[1, 2999] = True           # forced: one token, in the last partial chunk
bits[2] = False; bits[2, [5, 1700]] = True      # two tokens, in different chunks
bits[3] = False; bits[3, 600:700] = True        # one chunk's tokens only (the others all -inf)
bits[4, 100] = True; logits[4, 100] = 40.0      # a row that all but certainly draws token 100
bitmask = torch.zeros(rows, words, dtype=torch.int64)
index = torch.arange(vocab)
bitmask.index_add_(1, index // 32, bits.long() << (index % 32))
bitmask = torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask).to(torch.int32)
unbanned = torch.ones(vocab, dtype=torch.bool)
unbanned[[7, 1701, 2500]] = False
keys = keys_for(list(range(900, 900 + rows)), 11, device)

out = {}
for name, constrained, temperature in (("masked", True, 0.7), ("free", False, 1.0)):
    a = sp.pick_torch(logits, bitmask, keys, unbanned, temperature, constrained)
    b = sp.pick(logits, bitmask, keys, unbanned, temperature, constrained, block=block)
    out[name] = {
        "torch": [a[0].tolist(), a[1].tolist(), a[2].tolist()],
        "split": [b[0].tolist(), b[1].tolist(), b[2].tolist()],
        "dtypes": [str(t.dtype) for t in b],
    }
print(json.dumps(out))
"""


def run_check(device: str, env: dict | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, device], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_same_picks(got: dict) -> None:
    for name in ("masked", "free"):
        (ta, la, sa), (tb, lb, sb) = got[name]["torch"], got[name]["split"]
        assert got[name]["dtypes"] == ["torch.int64", "torch.float32", "torch.bool"]
        assert tb == ta and sb == sa, name
        assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-5, name
        assert len(set(ta)) > 12  # the rows drew many different tokens
    masked_tokens, _, masked_sampled = got["masked"]["split"]
    assert masked_tokens[1] == 2999 and masked_sampled[1] is False and got["masked"]["split"][1][1] == 0.0
    assert masked_tokens[2] in (5, 1700) and masked_sampled[2] is True
    assert 600 <= masked_tokens[3] < 700 and masked_tokens[4] == 100
    assert not {7, 1701, 2500} & set(masked_tokens)  # the banned tokens, never drawn


def test_the_split_pick_draws_what_its_torch_spelling_draws():
    """Tokens, sampled flags exactly, log-probs to 1e-5: a row with everything allowed, a forced
    row whose token is in the last, partial chunk, a row of two tokens in different chunks, a row
    whose allowed tokens fill one chunk, banned tokens; constrained with a temperature, and free."""
    assert_same_picks(run_check("cpu", interpreter_env()))


ENGINE = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
from atlas.config.runtime import RuntimeConfig
from atlas.runtime import split_pick
from atlas.runtime.session import load_runtime
from unit.test_fast_engine import eager_static_engine, requests_for

split_pick.BLOCK = 1024  # the tiny model's 2,048 tokens in two chunks
rt = load_runtime(sys.argv[1], RuntimeConfig())
requests = requests_for(rt, 2, max_new=16)
requests += [requests[0]]
out = {}
for name in ("torch", "split"):
    engine = eager_static_engine(rt, split_pick=name == "split", min_batch=4)
    assert engine.split_pick == (name == "split")
    out[name] = [[g.token_ids, g.logprobs, g.sampled, g.finish_reason] for g in engine.generate(requests)]
print(json.dumps(out))
"""


def test_the_engine_generates_through_the_split_pick_what_it_does_through_the_torch_pick(tiny_model):
    env = interpreter_env()
    env["PYTHONPATH"] += os.pathsep + str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", ENGINE, str(tiny_model)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(len(row[0]) for row in got["split"]) >= 40
    for (ta, la, sa, fa), (tb, lb, sb, fb) in zip(got["torch"], got["split"], strict=True):
        assert ta == tb and sa == sb and fa == fb
        assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-5


def test_the_split_pick_is_refused_where_it_cannot_run(runtime_for_refusal, monkeypatch):
    with pytest.raises(ValueError, match="split_pick=True: its Triton kernels do not run on cpu"):
        StaticEngine(*runtime_for_refusal, split_pick=True, graphs=False, compile=False)
    monkeypatch.setattr(decode_attention, "available", lambda device: True)  # the top_p refusal alone
    with pytest.raises(ValueError, match=r"split_pick=True draws with top_p 1 \(got top_p 0.9\)"):
        StaticEngine(*runtime_for_refusal, split_pick=True, top_p=0.9, graphs=False, compile=False)
    engine = StaticEngine(*runtime_for_refusal, top_p=0.9, graphs=False, compile=False)
    with pytest.raises(ValueError, match="top_p 1"):  # switched on later (bench_rollout --split-pick)
        engine.split_pick = True
    assert not engine.split_pick
    assert StaticEngine(*runtime_for_refusal, split_pick=True, graphs=False, compile=False).split_pick


def test_the_split_pick_names_inputs_of_other_shapes():
    logits, keys = torch.zeros(2, 100), torch.zeros(2, dtype=torch.int64)
    unbanned = torch.ones(100, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"need a bitmask \[2, 4\], keys \[2\] and unbanned \[100\] \(got \(2, 3\)"
    ):
        split_pick.pick(logits, torch.zeros(2, 3, dtype=torch.int32), keys, unbanned, 1.0, True)
    with pytest.raises(ValueError, match="must be contiguous"):
        split_pick.pick(logits.t(), torch.zeros(100, 4, dtype=torch.int32).t(), keys, unbanned, 1.0, True)


@pytest.fixture
def runtime_for_refusal(tiny_model):
    from atlas.config.runtime import RuntimeConfig
    from atlas.runtime.session import load_runtime

    hf = load_runtime(tiny_model, RuntimeConfig()).engine
    return hf.model, hf.vocab_size, hf.stop_token_ids
