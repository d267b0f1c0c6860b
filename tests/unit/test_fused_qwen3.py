"""The rollout engine's fused Qwen3 forward (atlas.runtime.fused_qwen3): its torch spelling
generates what transformers' forward does, the weights it fuses stay the model's (a merged model's
refresh reaches it), and its Triton kernels, run in Triton's interpreter on the CPU, compute their
torch spelling (float32 and float16; bf16 on a GPU, tests/gpu/test_gpu_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from atlas.config.runtime import RuntimeConfig
from atlas.config.training import TrainingConfig
from atlas.model.merged import MergedModel
from atlas.model.policy import ActorCritic
from atlas.runtime import fused_qwen3
from atlas.runtime.fast_engine import StaticEngine
from atlas.runtime.fused_qwen3 import FusedQwen3, fuse_projections
from atlas.runtime.kv_pool import KVPool
from atlas.runtime.session import load_runtime
from unit.test_fast_engine import assert_same_rows, eager_static_engine, requests_for

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)


@pytest.fixture(scope="module")
def runtime(tiny_model):
    return load_runtime(tiny_model, RuntimeConfig())


def test_the_fused_forward_generates_what_transformers_forward_does(runtime):
    """Token for token, log-probs to 1e-4 (float32): prompts computed once for several rows, a
    prefill past its budget in several forwards, rows that end and a batch that shrinks."""
    requests = requests_for(runtime, 5)
    requests += [requests[1]] * 3  # one prompt asked by several rows: computed once, copied
    plain = eager_static_engine(runtime, fused=False)
    fused = eager_static_engine(runtime, fused=True, prefill_budget=300)
    assert plain.fused is None and fused.fused is not None
    a, b = plain.generate(requests), fused.generate(requests)
    assert_same_rows(a, b)
    assert sum(len(x.token_ids) for x in b) > 200
    # transformers' own forward still runs on the fused weights, with the same logits
    model = runtime.engine.model
    ids = torch.tensor([requests[0].prompt_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    attn = model.model.layers[0].self_attn
    qkv = fused.fused.layers[0].qkv
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.k_proj.weight.data_ptr() == qkv[attn.q_proj.weight.shape[0]].data_ptr()


def test_the_fused_decode_step_reads_no_tensor_on_the_host(tiny_model, monkeypatch):
    """As transformers' forward (test_fast_engine): on the meta device, which holds no values, a
    bucket's decode step and pick run through the fused forward, every layer through the pool.
    The engine's vocabulary is smaller than the model's head (a tokenizer's under a padded head):
    its logits are the engine's."""
    cfg = AutoConfig.from_pretrained(tiny_model)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    engine = StaticEngine(model, cfg.vocab_size - 4, [0], graphs=False, compile=False, fused=True)
    engine.pool = KVPool(cfg, 4096, torch.device("meta"), torch.bfloat16)
    rb = engine._rows(16)
    calls = []
    attend = fused_qwen3.attend
    monkeypatch.setattr(fused_qwen3, "attend", lambda *a: calls.append(1) or attend(*a))
    with torch.no_grad():
        engine._decode(rb)
        engine._pick_into(rb)
    assert len(calls) == cfg.num_hidden_layers
    assert rb.logits.shape == (16, cfg.vocab_size - 4) and rb.tok.device.type == "meta"


def test_fusing_keeps_the_weights_and_a_second_fuse_copies_nothing():
    layers = [torch.nn.Linear(6, n, bias=False) for n in (8, 4, 4)]
    before = [m.weight.detach().clone() for m in layers]
    fused = fuse_projections(layers)
    assert torch.equal(fused, torch.cat(before))
    for m, w in zip(layers, before, strict=True):
        assert torch.equal(m.weight, w) and m.weight.untyped_storage().data_ptr() == fused.data_ptr()
    again = fuse_projections(layers)
    assert again.data_ptr() == fused.data_ptr() and again.shape == (16, 6)
    with torch.no_grad():
        layers[1].weight.add_(1.0)  # an in-place update of one layer shows in the fused tensor
    assert torch.equal(fused[8:12], before[1] + 1.0)
    x = torch.randn(3, 6)
    assert torch.allclose(x @ fused.T, torch.cat([m(x) for m in layers], dim=1).detach())
    # layers in another order are not the same fused tensor: a copy, in that order
    other = fuse_projections([layers[2], layers[0]])
    assert torch.equal(other, torch.cat([before[2], before[0]]))


def test_a_merged_models_refresh_reaches_the_fused_forward(tiny_model):
    ac = ActorCritic(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        TRAINING,
        seed=0,
    )
    merged = MergedModel(ac.peft, "actor")
    fused = FusedQwen3(merged.model, triton_kernels=False)
    qkv = fused.layers[0].qkv.clone()
    with torch.no_grad():
        for name, p in ac.peft.named_parameters():
            if "lora_B" in name and "actor" in name:
                p.add_(0.05)
    merged.refresh()
    assert not torch.equal(fused.layers[0].qkv, qkv)
    q = merged.model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(fused.layers[0].qkv[: q.shape[0]], q)


def test_models_the_fused_forward_cannot_run_are_named(runtime, tiny_model):
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)
    assert "peft" in FusedQwen3.supports(ac.peft)
    with pytest.raises(ValueError, match="fused=True: a peft model"):
        StaticEngine(ac.peft, runtime.engine.vocab_size, [0], fused=True)
    assert FusedQwen3.supports(runtime.engine.model) is None
    # by default, off the GPU: transformers' forward
    assert StaticEngine(runtime.engine.model, runtime.engine.vocab_size, [0]).fused is None


def test_a_request_past_the_models_positions_is_refused_when_it_arrives(runtime):
    """The fused forward reads cos and sin from a table of max_position_embeddings rows: a request
    whose prompt and cap reach past it is refused by name, before anything runs."""
    engine = eager_static_engine(runtime, fused=True)
    request = requests_for(runtime, 1)[0]
    size = engine.segment_size(request)
    engine.fused.positions = size - 1
    with pytest.raises(
        RuntimeError, match=f"reaches position {size} .* max_position_embeddings \\({size - 1}\\)"
    ):
        engine.generate([request])
    engine.fused.positions = size
    assert len(engine.generate([request])[0].token_ids) > 0


CHECK = r"""
import json, os, sys
device, dtypes = json.loads(sys.argv[1])
if device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
import torch
torch.set_default_device(device)
from atlas.runtime import fused_qwen3 as fq

out = {}
for name in dtypes:
    dtype = getattr(torch, name)
    g = torch.Generator(device).manual_seed(3)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype)
    # add + RMSNorm over a width that is not a power of two, with and without the sum
    delta, residual, weight = rnd(5, 96), rnd(5, 96) * 4, rnd(96)
    a, ra = fq.add_rms_norm_torch(delta, residual, weight, 1e-6)
    kept = residual.clone()
    b, rb = fq.add_rms_norm(delta, residual, weight, 1e-6)
    c, _ = fq.add_rms_norm_torch(None, kept, weight, 1e-6)
    d, rd = fq.add_rms_norm(None, kept.clone(), weight, 1e-6)
    # q/k norms, RoPE and the pool's writes: 4 query and 2 KV heads of 32, 6 tokens
    hq, hk, dim, n, slots = 4, 2, 32, 6, 40
    qkv, qw, kw = rnd(n, (hq + 2 * hk) * dim), rnd(dim), rnd(dim)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    f = torch.arange(300).float()[:, None] * inv
    ang = torch.cat((f, f), -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    positions = torch.tensor([0, 7, 299, 31, 32, 150])
    write_at = torch.tensor([3, 39, 0, 17, 18, 25])
    kt, vt = torch.zeros(slots, hk, dim, dtype=dtype), torch.zeros(slots, hk, dim, dtype=dtype)
    k2, v2 = kt.clone(), vt.clone()
    qa = fq.qk_rope_store_torch(qkv, qw, kw, cos, sin, positions, write_at, kt, vt, (hq, hk), 1e-6)
    qb = fq.qk_rope_store(qkv, qw, kw, cos, sin, positions, write_at, k2, v2, (hq, hk), 1e-6)
    # SiLU(gate) * up over a width past one block
    gu = rnd(3, 2 * 1100) * 3
    sa, sb = fq.silu_mul_torch(gu), fq.silu_mul(gu)
    gap = lambda x, y: (x.double() - y.double()).abs().max().item()
    out[name] = {
        "norm": gap(a, b), "sum": gap(ra, rb), "sum_in_place": rb.data_ptr() == residual.data_ptr(),
        "norm_alone": gap(c, d), "alone_unchanged": gap(rd, kept),
        "q": gap(qa, qb), "keys": gap(kt, k2), "values": gap(vt, v2),
        "untouched": int((k2.abs().sum((1, 2)) != 0).sum()),
        "silu": gap(sa, sb), "scale": [a.abs().max().item(), qa.abs().max().item(), sa.abs().max().item()],
    }
print(json.dumps(out))
"""


def interpreter_env() -> dict:
    folder = os.environ.get("ATLAS_TRITON")
    if not folder or not (Path(folder) / "triton").is_dir():
        pytest.skip(
            "Triton's interpreter: set ATLAS_TRITON to a folder holding triton (uv pip install --target)"
        )
    src = Path(__file__).resolve().parents[2] / "src"
    return dict(os.environ, PYTHONPATH=os.pathsep.join([folder, str(src)]))


def check_kernels(device: str, bounds: dict[str, float], env: dict | None = None) -> None:
    """CHECK on `device` in each dtype of `bounds`: every kernel within its bound (relative to
    the largest output) of its torch spelling."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps([device, list(bounds)])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for dtype, bound in bounds.items():
        r = got[dtype]
        assert all(s > 1 for s in r["scale"]), r  # the outputs are not all zero
        for key in ("norm", "sum", "norm_alone", "alone_unchanged", "q", "keys", "values", "silu"):
            assert r[key] <= bound * max(r["scale"]), (dtype, key, r)
        assert r["sum_in_place"] and r["untouched"] == 6, r  # 6 tokens' keys written, nowhere else


def test_the_triton_kernels_compute_their_torch_spelling():
    check_kernels("cpu", {"float32": 1e-6, "float16": 1e-3}, interpreter_env())


def test_weights_replaced_after_fusing_are_named(tiny_model):
    """Weights replaced after fusing (not refreshed in place) stop the next forward instead of
    serving stale ones."""
    rt = load_runtime(tiny_model, RuntimeConfig())
    requests = requests_for(rt, 2)
    fused = eager_static_engine(rt, fused=True)
    assert len(fused.generate(requests)) == 2
    attn = rt.engine.model.model.layers[1].self_attn
    attn.k_proj.weight.data = attn.k_proj.weight.data.clone()  # k alone: q_proj still a view
    assert len(fused.generate(requests)) == 2
    attn.q_proj.weight.data = attn.q_proj.weight.data.clone()
    with pytest.raises(RuntimeError, match="weights were replaced after the engine fused them"):
        fused.generate(requests)
