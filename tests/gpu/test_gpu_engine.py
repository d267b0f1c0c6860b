"""The fast rollout path on a GPU: StaticEngine's FlashAttention over the key/value pool, its decode
step captured as CUDA graphs once per bucket, against the same engine run eagerly and HFEngine.
Skips without CUDA (CI has none)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config.runtime import RuntimeConfig
from atlas.runtime.engine import GenerationRequest, HFEngine
from atlas.runtime.fast_engine import StaticEngine
from atlas.runtime.kv_pool import KVPool, Layout, pool_attention
from atlas.runtime.session import make_runtime
from unit.test_fast_engine import requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_close_in_bf16(a, b) -> None:
    """Generations of the same 12 requests by two bf16 engines with other kernels: they agree on
    at least 20 tokens a row on average, and on the sampled tokens of each common prefix the
    log-probs are within bf16 rounding."""
    gaps, common = [], 0
    for x, y in zip(a, b, strict=True):
        same = next(
            (i for i, (p, q) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if p != q), None
        )
        same = min(len(x.token_ids), len(y.token_ids)) if same is None else same
        common += same
        gaps += [
            abs(p - q) for p, q, s in zip(x.logprobs[:same], y.logprobs[:same], x.sampled, strict=False) if s
        ]
    assert common >= 12 * 20, common
    assert sum(gaps) / len(gaps) < 0.02 and max(gaps) < 0.5, (sum(gaps) / len(gaps), max(gaps))


def one_layer(heads: int, kv_heads: int, dim: int) -> SimpleNamespace:
    """A model config of one layer with these attention heads, for a KVPool."""
    return SimpleNamespace(
        num_hidden_layers=1,
        num_key_value_heads=kv_heads,
        head_dim=dim,
        hidden_size=heads * dim,
        num_attention_heads=heads,
    )


def decode_layout(pool: KVPool, segments, **kw) -> Layout:
    """A decode step's Layout over `segments` [(used, start)]: one query a row, its key written at
    the row's last used position."""
    return Layout(
        pool=pool,
        write_at=torch.tensor([start + used - 1 for used, start in segments], device="cuda"),
        cu_q=torch.arange(len(segments) + 1, dtype=torch.int32, device="cuda"),
        starts=torch.tensor([s for _, s in segments] + [0], dtype=torch.int32, device="cuda"),
        used=torch.tensor([u for u, _ in segments], dtype=torch.int32, device="cuda"),
        max_q=1,
        max_k=pool.positions,
        **kw,
    )


@pytest.mark.parametrize(
    "rows",
    [
        [(1, 300, 0), (5, 5, 1000), (1, 1, 2000), (17, 900, 2100), (3, 40, 3500)],
        [(1, 300, 0), (1, 1, 1000), (1, 777, 1100), (1, 50, 2000), (1, 2000, 2050)],  # a decode step
    ],
    ids=["prompts-and-decode", "decode-step"],
)
def test_pool_attention_on_cuda_matches_the_row_by_row_float32_attention(rows):
    """Rows of 1 query (decode) and of several (a prompt, a prompt's tail) at scattered segments,
    grouped heads 4:1: FlashAttention-2 with seqused_k in bf16 against SDPA in float32; also a
    decode step alone (one query a row, where the kernel groups the query heads of a KV head)."""
    torch.manual_seed(0)
    cfg = one_layer(8, 2, 64)
    # rows: (queries, used, start)
    n = sum(r[0] for r in rows)
    bf = KVPool(cfg, 4096, "cuda", torch.bfloat16)
    bf.kv.normal_()
    fp = KVPool(cfg, 4096, "cuda", torch.float32)
    fp.kv.copy_(bf.kv)
    q = torch.randn(1, 8, n, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu, write, bounds = [0], [], []
    for queries, used, start in rows:
        write += range(start + used - queries, start + used)
        bounds.append((cu[-1], cu[-1] + queries, start, used))
        cu.append(cu[-1] + queries)

    def layout(pool, host_rows):
        return Layout(
            pool=pool,
            write_at=torch.tensor(write, device="cuda"),
            cu_q=torch.tensor(cu, dtype=torch.int32, device="cuda"),
            starts=torch.tensor([s for *_, s in rows] + [0], dtype=torch.int32, device="cuda"),
            used=torch.tensor([u for _, u, _ in rows], dtype=torch.int32, device="cuda"),
            max_q=max(r[0] for r in rows),
            max_k=4096,
            rows=host_rows,
        )

    module = SimpleNamespace(layer_idx=0)
    out, _ = pool_attention(module, q, k, v, None, scaling=0.125, atlas_kv=layout(bf, None))
    ref, _ = pool_attention(
        module, q.float(), k.float(), v.float(), None, scaling=0.125, atlas_kv=layout(fp, bounds)
    )
    assert out.shape == ref.shape == (1, n, 8, 64)
    assert (out.float() - ref).abs().max().item() < 2e-2
    assert torch.equal(bf.kv[0, 0, write], k[0].transpose(0, 1))  # the forward's keys, where it said


@pytest.mark.parametrize("splits", [1, 2, 8, 16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 64), (16, 8, 128)])
def test_split_decode_attention_matches_the_row_by_row_float32_attention(splits, heads, kv_heads, dim):
    """The decode step's split attention (atlas.runtime.decode_attention) on scattered segments
    whose used keys end inside, at and past a 64-key block, and rows shorter than the splits,
    against SDPA in float32; the keys the step writes land where the layout says."""
    torch.manual_seed(splits)
    cfg = one_layer(heads, kv_heads, dim)
    rows = [(1, 0), (63, 10), (64, 100), (65, 300), (777, 400), (2000, 1200), (129, 3300), (5, 3500)]
    bf = KVPool(cfg, 4096, "cuda", torch.bfloat16)
    bf.kv.normal_()
    fp = KVPool(cfg, 4096, "cuda", torch.float32)
    q = torch.randn(1, heads, len(rows), dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, len(rows), dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    write = [start + used - 1 for used, start in rows]

    def layout(pool, host_rows, n_splits):
        return decode_layout(pool, rows, rows=host_rows, splits=n_splits)

    module = SimpleNamespace(layer_idx=0)
    out, _ = pool_attention(module, q, k, v, None, scaling=dim**-0.5, atlas_kv=layout(bf, None, splits))
    fp.kv.copy_(bf.kv)  # the keys the step wrote, in float32
    bounds = [(i, i + 1, start, used) for i, (used, start) in enumerate(rows)]
    ref, _ = pool_attention(
        module, q.float(), k.float(), v.float(), None, scaling=dim**-0.5, atlas_kv=layout(fp, bounds, None)
    )
    assert out.shape == ref.shape == (1, len(rows), heads, dim)
    assert (out.float() - ref).abs().max().item() < 2e-2
    assert torch.equal(bf.kv[0, 1, write], v[0].transpose(0, 1))


def test_rows_of_a_prefix_group_read_the_leaders_keys_in_bf16():
    """The shared-prefix decode attention in bf16 on CUDA against the row-by-row float32 attention
    over the leader's first `pre` keys and each row's own keys past them (a member's own copy of
    the prefix is noise here)."""
    from atlas.runtime.decode_attention import members_per_tile

    torch.manual_seed(0)
    heads, kv_heads, dim = 16, 8, 128
    cfg = one_layer(heads, kv_heads, dim)
    rows = [(430, 0), (494, 500), (431, 1000), (5, 1500), (2000, 1600), (1500, 3700), (65, 5300)]
    groups = [(1, [0, 2], 430), (4, [5], 1400)]  # (leader, other members, pre)
    bf = KVPool(cfg, 6000, "cuda", torch.bfloat16)
    bf.kv.normal_()
    fp = KVPool(cfg, 6000, "cuda", torch.float32)
    fp.kv.copy_(bf.kv)
    q = torch.randn(1, heads, len(rows), dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, len(rows), dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    pre = [0] * len(rows)
    at = [start for _, start in rows]
    members = torch.full((len(rows), members_per_tile(heads, kv_heads)), -1, dtype=torch.int32)
    for lead, others, n in groups:
        members[lead, : 1 + len(others)] = torch.tensor([lead, *others])
        for i in [lead, *others]:
            pre[i], at[i] = n, rows[lead][1]

    module = SimpleNamespace(layer_idx=0)
    shared = decode_layout(
        bf,
        rows,
        splits=2,
        pre=torch.tensor(pre, dtype=torch.int32, device="cuda"),
        members=members.cuda(),
        prefix_splits=4,
    )
    out, _ = pool_attention(module, q, k, v, None, scaling=dim**-0.5, atlas_kv=shared)
    bounds = [(i, i + 1, start, used, at[i], pre[i]) for i, (used, start) in enumerate(rows)]
    ref, _ = pool_attention(
        module,
        q.float(),
        k.float(),
        v.float(),
        None,
        scaling=dim**-0.5,
        atlas_kv=decode_layout(fp, rows, rows=bounds),
    )
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_samples_of_a_prompt_share_its_keys_and_generate_as_flash_does(tiny_model):
    """3 questions x 4 samples through the captured engine, whose rows read each prompt's keys
    through their group's leader (in every bucket here), against FlashAttention-2 reading every
    row's own copy."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
    fast = rt.engine
    fast.share_min_rows = 1
    flash = StaticEngine(
        model,
        fast.vocab_size,
        fast.stop_token_ids,
        banned_token_ids=rt.grammars.banned_token_ids,
        decode_attention="flash",
    )
    requests = [
        GenerationRequest(q.prompt_ids, q.grammar, q.max_new_tokens, seed=100 * k + j)
        for j, q in enumerate(requests_for(rt, 3))
        for k in range(4)
    ]
    assert_close_in_bf16(flash.generate(requests), fast.generate(requests))
    assert fast.last_timing["shared_rows"] > 0 and flash.last_timing["shared_rows"] == 0


def test_split_and_flash_decode_attention_generate_alike_when_captured(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
    fast = rt.engine
    assert fast.decode_attention == "split"  # the default on CUDA
    flash = StaticEngine(
        model,
        fast.vocab_size,
        fast.stop_token_ids,
        banned_token_ids=rt.grammars.banned_token_ids,
        decode_attention="flash",
    )
    requests = requests_for(rt, 12)
    assert_close_in_bf16(flash.generate(requests), fast.generate(requests))


def test_captured_engine_matches_its_eager_self_and_hf_and_a_new_turn_captures_nothing(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rt = make_runtime(model, tokenizer, RuntimeConfig())
    fast = rt.engine
    assert isinstance(fast, StaticEngine) and fast.graphs and fast.flash
    banned = rt.grammars.banned_token_ids
    eager = StaticEngine(
        model, fast.vocab_size, fast.stop_token_ids, banned_token_ids=banned, graphs=False, compile=False
    )
    hf = HFEngine(
        model, fast.vocab_size, fast.stop_token_ids, tokenizer.pad_token_id, banned_token_ids=banned
    )
    requests = requests_for(rt, 12)
    a, e, h = fast.generate(requests), eager.generate(requests), hf.generate(requests)
    # The same kernels replayed: the same tokens (the compiled sampler may round differently at a tie).
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, e, strict=True)) >= 11
    # Against HFEngine in bf16 (other kernels): log-probs agree on the common prefix.
    assert_close_in_bf16(h, a)
    captured, pool = fast.captures, fast.pool
    assert fast.last_timing["graphs"] == captured >= 4  # the pick and the step of 16 rows and of 8
    again = fast.generate(requests)
    assert [g.token_ids for g in again] == [g.token_ids for g in a]
    # A next turn: fewer rows, each prompt its first turn's trajectory and more. Nothing is
    # compiled or captured again.
    from torch._dynamo.utils import counters

    compiled = counters["stats"]["unique_graphs"]
    turn = [
        GenerationRequest(
            r.prompt_ids + g.token_ids + r.prompt_ids[-9:], r.grammar, r.max_new_tokens, r.seed + 1
        )
        for r, g in list(zip(requests, a, strict=True))[:5]
    ]
    fast.generate(turn)
    assert fast.pool is pool and fast.captures == captured and fast.last_timing["graphs"] == 0
    assert counters["stats"]["unique_graphs"] == compiled
    # A call past the pool grows it: the graphs are captured again, into a new memory pool, and the
    # tokens are still the eager engine's.
    more = requests_for(rt, 40)
    grown, e = fast.generate(more), eager.generate(more)
    assert fast.pool is not pool and fast.pool.positions > pool.positions
    assert fast.last_timing["graphs"] >= 4 and fast.captures > captured
    assert sum(x.token_ids == y.token_ids for x, y in zip(grown, e, strict=True)) >= 38
    assert [g.token_ids for g in fast.generate(more)] == [g.token_ids for g in grown]


def test_a_gpu_memory_claim_caps_the_process_and_its_rollout_pool(tiny_model, monkeypatch):
    from atlas.runtime.fast_engine import CACHE_SHARE, usable_memory
    from atlas.stage import hold_gpu_memory

    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    monkeypatch.setenv("ATLAS_GPU_MEM_GB", "3")
    try:
        assert hold_gpu_memory() == 3.0
        assert abs(usable_memory(device) - 3 * 2**30) < 2**20
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
        rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
        assert rt.engine.cache_bytes == int(CACHE_SHARE * usable_memory(device))
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(4 * 2**30, dtype=torch.uint8, device=device)  # past the claim
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    assert usable_memory(device) == total


def test_liger_kernels_in_the_served_model_keep_its_log_probs(tiny_model):
    """The merged serving copy carries Liger's norms, SwiGLU and RoPE on a GPU (atlas.rl.serving):
    captured with them, the engine gives the plain model's log-probs within bf16 rounding."""
    pytest.importorskip("liger_kernel")
    from atlas.model.liger import applied, apply_liger

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    plain, fused = (
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda() for _ in range(2)
    )
    apply_liger(fused)
    assert applied(fused) and not applied(plain)
    rt = make_runtime(plain, tokenizer, RuntimeConfig())
    fused_rt = make_runtime(fused, tokenizer, RuntimeConfig())
    requests = requests_for(rt, 12)
    a, b = rt.engine.generate(requests), fused_rt.engine.generate(requests)
    assert fused_rt.engine.captures >= 4
    assert_close_in_bf16(a, b)


def test_the_fused_kernels_compute_their_torch_spelling_in_half_precision():
    from unit.test_fused_qwen3 import check_kernels

    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    check_kernels("cuda", {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-6}, env)


def test_the_fused_forward_generates_as_transformers_forward_does_when_captured(tiny_model):
    """On CUDA the engine runs the fused forward by default: captured, against transformers'
    forward captured (bf16, other kernels), and against its own eager self (the same kernels)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
    fast = rt.engine
    assert fast.fused is not None and fast.graphs
    banned = rt.grammars.banned_token_ids
    plain = StaticEngine(model, fast.vocab_size, fast.stop_token_ids, banned_token_ids=banned, fused=False)
    eager = StaticEngine(
        model, fast.vocab_size, fast.stop_token_ids, banned_token_ids=banned, graphs=False, compile=False
    )
    assert plain.fused is None and eager.fused is not None
    requests = [
        GenerationRequest(q.prompt_ids, q.grammar, q.max_new_tokens, seed=100 * k + j)
        for j, q in enumerate(requests_for(rt, 6))
        for k in range(2)
    ]
    a = fast.generate(requests)
    assert_close_in_bf16(plain.generate(requests), a)
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, eager.generate(requests), strict=True)) >= 11
    assert fast.last_timing["graphs"] >= 4


def test_the_split_pick_draws_what_its_torch_spelling_draws_on_cuda():
    from unit.test_split_pick import assert_same_picks, run_check

    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    assert_same_picks(run_check("cuda", env))


def test_the_captured_engine_picks_through_the_split_pick_as_through_the_torch_pick(tiny_model):
    """Captured, the engine picking through atlas.runtime.split_pick draws what it draws through
    the compiled torch pick (the same logits: only a tie to the last bits of a log-normaliser
    summed in another order could part them)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
    plain = rt.engine
    assert not plain.split_pick and plain.graphs
    banned = rt.grammars.banned_token_ids
    split = StaticEngine(
        model, plain.vocab_size, plain.stop_token_ids, banned_token_ids=banned, split_pick=True
    )
    requests = requests_for(rt, 12)
    a, b = split.generate(requests), plain.generate(requests)
    assert split.last_timing["graphs"] >= 4
    same = [x for x, y in zip(a, b, strict=True) if x.token_ids == y.token_ids]
    assert len(same) >= 11 and sum(len(x.token_ids) for x in same) > 500
    for x, y in zip(a, b, strict=True):
        if x.token_ids == y.token_ids:
            assert x.sampled == y.sampled
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
