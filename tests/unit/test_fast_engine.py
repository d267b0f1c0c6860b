"""Seeded sampling and the fast rollout engine: StaticEngine against HFEngine on the tiny model
(CPU, eager here; the device benchmark compares them on a GPU as well)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from atlas.config.runtime import RuntimeConfig
from atlas.runtime import kv_pool
from atlas.runtime.engine import GenerationRequest
from atlas.runtime.fast_engine import StaticEngine, bucket, pool_positions
from atlas.runtime.kv_pool import KVPool, Layout, Segments, pool_attention
from atlas.runtime.sampling import M32, gumbel, keys_for, row_key, sample, top_p_keep, uniform
from atlas.runtime.session import load_runtime
from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools


def test_gumbel_max_samples_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    logp = probs.log().expand(20_000, -1)
    tokens = sample(logp, keys_for(list(range(20_000)), 0, "cpu"))
    freq = torch.bincount(tokens, minlength=5).double() / 20_000
    assert freq[4] == 0.0  # -inf is never drawn
    for f, p in zip(freq.tolist(), probs.tolist(), strict=True):
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / 20_000) + 1e-9, (freq, probs)


def test_noise_is_per_row_and_per_step_and_the_same_in_any_batch():
    keys = keys_for([7, 8, 9], 3, "cpu")
    alone = gumbel(keys[1:2], 1000)
    assert torch.equal(gumbel(keys, 1000)[1], alone[0])  # independent of batch mates
    assert not torch.equal(gumbel(keys_for([8], 4, "cpu"), 1000)[0], alone[0])  # the step matters
    assert row_key(8, 3) != row_key(8 + (1 << 40), 3)  # every bit of a large seed counts
    g = gumbel(keys_for(list(range(50)), 0, "cpu"), 4000)
    assert torch.isfinite(g).all() and abs(g.mean().item() - 0.5772) < 0.01  # Gumbel(0, 1) mean


def test_uniform_never_reaches_0_or_1_and_the_noise_stays_finite():
    extremes = torch.tensor([0, 1, (1 << 9) - 1, M32 - (1 << 9), M32], dtype=torch.int64)
    u = uniform(extremes)
    assert (u > 0).all() and (u < 1).all(), u
    assert torch.isfinite(-torch.log(-torch.log(u))).all()
    # Over a real vocabulary no draw lands on a disallowed token (a NaN score would).
    logp = torch.full((64, 151_936), float("-inf"))
    logp[:, 7] = 0.0
    assert set(sample(logp, keys_for(list(range(64)), 59, "cpu")).tolist()) == {7}


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_keep(logp, 0.7).tolist() == [[True, True, False, False]]
    assert top_p_keep(logp, 0.81).tolist() == [[True, True, True, False]]
    tokens = sample(logp.expand(2000, -1), keys_for(list(range(2000)), 0, "cpu"), top_p=0.7)
    assert set(tokens.tolist()) == {0, 1}


def test_buckets_and_pool_sizes():
    assert [bucket(n, 8) for n in (1, 8, 9, 200, 256, 257)] == [8, 8, 16, 256, 256, 512]
    # a quarter more than asked, rounded up to an eighth of the power of two above
    assert [pool_positions(n) for n in (10, 1000, 340_000)] == [64, 1280, 458_752]
    assert all(pool_positions(n) >= n + n // 4 for n in range(1, 5000, 7))


def test_segments_place_first_fit_and_merge_what_is_given_back():
    seg = Segments(100)
    a, b, c = seg.take(30), seg.take(30), seg.take(30)
    assert (a, b, c) == (0, 30, 60) and seg.free == [[90, 10]]
    assert seg.take(11) is None  # 10 free, in one run
    seg.give(b, 30)
    assert seg.take(31) is None and seg.largest == 30  # 40 free, but not in one run
    seg.give(a + 10, 20)  # the tail of a: merged with b's run
    assert seg.free == [[10, 50], [90, 10]] and seg.take(45) == 10
    seg.give(c, 30)  # merged with the runs before and after it
    assert seg.free == [[55, 45]]
    seg.grow(150)
    assert seg.free == [[55, 95]] and seg.free_positions == 95
    with pytest.raises(ValueError, match=r"positions \[60, 70\) are already free"):
        seg.give(60, 10)
    with pytest.raises(ValueError, match="outside a pool of 150"):
        seg.give(140, 20)


@pytest.fixture(scope="module")
def runtime(tiny_model):
    return load_runtime(tiny_model, RuntimeConfig())


def requests_for(rt, n: int, max_new: int = 1000):
    code = CodeBounds(64, 8)
    out = []
    for i in range(n):
        tools = gpqa_tools(code) if i % 2 == 0 else lcb_tools(code)
        prompt = rt.chat_ids(
            [{"role": "user", "content": f"Question {i}: solve it. " * (1 + i % 4)}],
            [t.spec() for t in tools.values()],
        )
        out.append(GenerationRequest(prompt, rt.grammars.get(tools), max_new, seed=1000 + i))
    return out


def eager_static_engine(runtime, **kwargs) -> StaticEngine:
    """StaticEngine over the runtime's model, uncompiled (CPU), with its HFEngine's settings."""
    hf = runtime.engine
    return StaticEngine(
        hf.model,
        hf.vocab_size,
        hf.stop_token_ids,
        banned_token_ids=runtime.grammars.banned_token_ids,
        **{"graphs": False, "compile": False} | kwargs,
    )


def assert_same_rows(a, b) -> None:
    """HFEngine's and StaticEngine's generations agree: tokens, flags, log-probs to 1e-4."""
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.sampled == y.sampled
        assert x.finish_reason == y.finish_reason
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_static_engine_matches_the_hf_engine_token_for_token(runtime):
    hf, fast = runtime.engine, eager_static_engine(runtime)
    requests = requests_for(runtime, 5)  # 5 rows in a bucket of 8: padding rows ride along
    a, b = hf.generate(requests), fast.generate(requests)
    forced = 0
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.sampled == y.sampled and x.finish_reason == y.finish_reason == "stop"
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
        assert all(lp == 0.0 for lp, s in zip(y.logprobs, y.sampled, strict=True) if s == 0)
        forced += y.sampled.count(0)
    assert forced > 0  # the call's fixed parts are forced tokens
    # Each request's segment holds its prompt and its cap (the grammar's bound, under 1000 here).
    bound = requests[0].grammar.token_bound
    assert fast._caps(requests)[0] == bound < 1000
    sizes = [len(r.prompt_ids) + r.grammar.token_bound for r in requests]
    assert [fast.segment_size(r) for r in requests] == sizes
    assert fast.pool.positions >= sum(map(fast.segment_size, requests)) + fast.max_rows + 1  # + scratch
    # A second call reuses the pool and still agrees; a token cap is honoured.
    pool = fast.pool
    short = requests_for(runtime, 3, max_new=5)
    for x, y in zip(hf.generate(short), fast.generate(short), strict=True):
        assert x.token_ids == y.token_ids and len(y.token_ids) <= 5
    assert fast.pool is pool


def test_pool_attention_row_by_row_equals_attention_over_each_rows_keys():
    """Three rows in scattered segments of a pool: a decode row (1 query after 6 cached keys), a
    prompt (4 queries, 4 keys) and a prompt's tail (2 queries after 3 cached keys). Keys and
    values land at write_at, and each row's queries see its own keys only, causally."""
    torch.manual_seed(0)
    cfg = SimpleNamespace(
        num_hidden_layers=2, num_key_value_heads=2, head_dim=8, hidden_size=32, num_attention_heads=4
    )
    pool = KVPool(cfg, 64, "cpu", torch.float32)
    pool.kv.normal_()
    rows = [(1, 7, 3), (4, 4, 20), (2, 5, 40)]  # (queries, used after the writes, segment start)
    n = sum(r[0] for r in rows)
    q = torch.randn(1, 4, n, 8)
    k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
    cu, write, host = [0], [], []
    for queries, used, start in rows:
        write += range(start + used - queries, start + used)
        host.append((cu[-1], cu[-1] + queries, start, used))
        cu.append(cu[-1] + queries)
    layout = Layout(
        pool=pool,
        write_at=torch.tensor(write),
        cu_q=torch.tensor(cu, dtype=torch.int32),
        starts=torch.tensor([s for *_, s in rows] + [0], dtype=torch.int32),
        used=torch.tensor([u for _, u, _ in rows], dtype=torch.int32),
        max_q=4,
        max_k=64,
        rows=host,
    )
    before = pool.kv.clone()
    out, _ = pool_attention(SimpleNamespace(layer_idx=1), q, k, v, None, scaling=0.5, atlas_kv=layout)
    keys, values = pool.kv[1]
    assert torch.equal(keys[write], k[0].transpose(0, 1)) and torch.equal(values[write], v[0].transpose(0, 1))
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[write] = False
    assert torch.equal(pool.kv[:, :, untouched], before[:, :, untouched]) and torch.equal(
        pool.kv[0], before[0]
    )
    for (queries, used, start), (q0, *_) in zip(rows, host, strict=True):
        ks, vs = keys[start : start + used], values[start : start + used]  # [used, 2, 8]
        for i in range(queries):
            sees = used - queries + i + 1  # query i is position used - queries + i
            for h in range(4):
                score = (q[0, h, q0 + i] @ ks[:sees, h // 2].T) * 0.5
                want = score.softmax(-1) @ vs[:sees, h // 2]
                assert torch.allclose(out[0, q0 + i, h], want, atol=1e-5)


def test_the_decode_step_and_the_pick_read_no_tensor_on_the_host(tiny_model, monkeypatch):
    """What a CUDA graph captures must never wait for the GPU (an .item(), a .tolist(), a Python
    `if` on a tensor): on the meta device, which holds no values, the step and the pick still run,
    through the FlashAttention path, on a bucket's buffers."""
    cfg = AutoConfig.from_pretrained(tiny_model)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    engine = StaticEngine(model, cfg.vocab_size, [0], graphs=False, compile=False)
    assert engine.flash
    engine.pool = KVPool(cfg, 4096, torch.device("meta"), torch.bfloat16)
    rb = engine._rows(16)
    calls = []
    attend = kv_pool.pool_attention
    monkeypatch.setattr(kv_pool, "pool_attention", lambda *a, **k: calls.append(1) or attend(*a, **k))
    kv_pool.register()  # the counting attention, for this test only
    try:
        with torch.no_grad(), engine.pool_attention():  # as generate runs them
            engine._decode(rb)
            engine._pick_into(rb)
    finally:
        monkeypatch.undo()
        kv_pool.register()
    assert len(calls) == cfg.num_hidden_layers  # every layer attended through the pool
    assert rb.logits.shape == (16, cfg.vocab_size) and rb.tok.device.type == "meta"


def test_the_batch_shrinks_as_rows_finish_and_tokens_stay_the_same(runtime):
    """With min_batch 1, 5 requests start in 8 rows and move to 4, 2 and 1 rows as they finish
    (only their logits move; their keys stay in the pool); every row still equals the HF engine's,
    and the model's attention implementation is given back afterwards."""
    hf, fast = runtime.engine, eager_static_engine(runtime, min_batch=1)
    requests = requests_for(runtime, 5)
    a, b = hf.generate(requests), fast.generate(requests)
    lengths = sorted(len(y.token_ids) for y in b)
    assert lengths[0] < lengths[1] < lengths[-1]  # rows finish at different steps
    assert_same_rows(a, b)
    assert {y.finish_reason for y in b} == {"stop"}
    assert set(fast._buckets) == {8, 4, 2, 1} and fast.last_timing["shrinks"] == 3
    assert fast.last_timing["steps"] == lengths[-1]
    assert hf.model.config._attn_implementation == "sdpa"


def test_prompts_past_the_prefill_budget_run_in_several_forwards_with_the_same_tokens(runtime):
    requests = requests_for(runtime, 5)
    whole = eager_static_engine(runtime).generate(requests)
    small = eager_static_engine(runtime, prefill_budget=1)  # every prompt a forward of its own
    assert_same_rows(whole, small.generate(requests))
    assert small.last_timing["prefill_tokens"] == sum(len(r.prompt_ids) for r in requests)


def test_a_batch_past_the_cache_budget_waits_for_positions_with_the_same_tokens(runtime):
    """cache_bytes that hold 2 requests' segments at a time: 5 requests start 2 by 2, each
    waiting one placed in the positions an ended row gave back, and every row equals one batch's;
    a budget under one request is refused with the numbers."""
    requests = requests_for(runtime, 5)
    whole = eager_static_engine(runtime, min_batch=1, max_rows=8).generate(requests)
    probe = eager_static_engine(runtime, min_batch=1, max_rows=8)
    sizes = sorted(map(probe.segment_size, requests))
    two = sizes[-1] + sizes[-2] + probe.max_rows + 1  # the two largest segments and the scratch rows
    fast = eager_static_engine(runtime, min_batch=1, max_rows=8, cache_bytes=two * probe.position_bytes)
    budgeted = fast.generate(requests)
    assert_same_rows(whole, budgeted)
    assert fast.pool.positions <= two
    assert fast.last_timing["admissions"] >= 3  # 2, then the others as rows end
    # not all at once: one batch would end with its longest row
    assert fast.last_timing["steps"] > max(len(g.token_ids) for g in whole)
    assert fast.last_timing["rows"] == sum(len(g.token_ids) for g in whole)
    tight = eager_static_engine(runtime, cache_bytes=probe.position_bytes * 8)
    with pytest.raises(
        RuntimeError, match=r"one request needs \d+ key/value positions .* cache_bytes \(\d+\)"
    ):
        tight.generate(requests)


def test_the_sampler_compiles_once_for_every_bucket(runtime):
    """The pick is compiled with the number of rows symbolic: the buckets of one call (8, 4, 2)
    and of a later turn with longer prompts reuse the one graph dynamo traced."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fast = eager_static_engine(runtime, min_batch=2, compile=backend)
    requests = requests_for(runtime, 5)
    first = fast.generate(requests)
    assert set(fast._buckets) == {8, 4, 2} and len(graphs) == 1
    assert_same_rows(runtime.engine.generate(requests), first)
    turn = [
        GenerationRequest(r.prompt_ids + g.token_ids, r.grammar, r.max_new_tokens, r.seed + 1)
        for r, g in zip(requests[:3], first[:3], strict=True)
    ]
    fast.generate(turn)
    assert len(graphs) == 1


def test_each_row_is_reported_the_moment_it_finishes(runtime):
    """on_finish gets every row once, in the order the rows end (while longer rows still run),
    with its generation already whole; both engines."""
    requests = requests_for(runtime, 5)
    for engine in (runtime.engine, eager_static_engine(runtime, min_batch=1)):
        seen = []
        outs = engine.generate(
            requests, on_finish=lambda i, g, seen=seen: seen.append((i, len(g.token_ids), g))
        )
        assert sorted(i for i, _, _ in seen) == list(range(5))
        assert [n for _, n, _ in seen] == sorted(n for _, n, _ in seen)  # shortest first
        assert [i for i, _, _ in seen] != list(range(5))  # not simply in request order at the end
        assert all(g is outs[i] and n == len(g.token_ids) for i, n, g in seen)


def test_a_next_turn_reuses_the_keys_its_conversation_left(runtime):
    """A turn's prompts are the last turn's prompt, generation and a tool response: the keys and
    values of what the last call left are reused and only the rest is computed, with the HF
    engine's tokens. A prompt that does not continue its key's tokens is computed whole."""
    hf, fast = runtime.engine, eager_static_engine(runtime)
    keys = [object() for _ in range(4)]
    first = [
        GenerationRequest(r.prompt_ids, r.grammar, r.max_new_tokens, r.seed, cache_key=k)
        for r, k in zip(requests_for(runtime, 4), keys, strict=True)
    ]
    a = fast.generate(first)
    assert fast.last_timing["reused_tokens"] == 0
    response = runtime.tool_response_ids("ok 42")
    second = [
        GenerationRequest(
            r.prompt_ids + g.token_ids + response, r.grammar, r.max_new_tokens, r.seed + 7, cache_key=k
        )
        for r, g, k in zip(first, a, keys, strict=True)
    ]
    # this one does not begin with what its key left: its generation's last token differs
    second[3].prompt_ids[len(first[3].prompt_ids) + len(a[3].token_ids) - 1] += 1
    b = fast.generate(second)
    assert_same_rows(hf.generate(second), b)
    # The pool held each prompt and every token fed after it: the whole generation, its last
    # token too (the step after a row's end runs while the cap is not reached).
    reused = fast.last_timing["reused_tokens"]
    assert reused == sum(len(r.prompt_ids) + len(g.token_ids) for r, g in zip(first[:3], a[:3], strict=True))
    assert fast.last_timing["prefill_tokens"] == sum(len(r.prompt_ids) for r in second) - reused
    # Rows cut at their cap: the loop ends on their last token, which is never fed, so the pool
    # holds all but that one.
    capped = [
        GenerationRequest(r.prompt_ids, r.grammar, 5, r.seed, cache_key=k)
        for r, k in zip(requests_for(runtime, 2), keys, strict=False)
    ]
    c = fast.generate(capped)
    assert {g.finish_reason for g in c} == {"length"}
    again = [
        GenerationRequest(
            r.prompt_ids + g.token_ids + response, r.grammar, r.max_new_tokens, r.seed, cache_key=k
        )
        for r, g, k in zip(capped, c, keys, strict=False)
    ]
    assert_same_rows(hf.generate(again), fast.generate(again))
    assert fast.last_timing["reused_tokens"] == sum(len(r.prompt_ids) + 4 for r in capped)


def checked_tiles(monkeypatch) -> list[int]:
    """Wrap every step's `_Run.share` with a check of what the GPU kernel reads beside PRE and
    LEAD: the members table. Each leader lists itself first, then rows of its own group only,
    all of them with the group's prefix length and the leader's segment start; every row with a
    prefix is listed once; a row no leader lists reads its own keys. Returns the tiles seen."""
    from atlas.runtime import fast_engine

    share, seen = fast_engine._Run.share, []

    def checked(self, rows, lives, starts, h):
        share(self, rows, lives, starts, h)
        members = self.rb.members_host.numpy()
        listed = []
        for lead in range(self.rb.rows):
            tile = [int(j) for j in members[lead] if j >= 0]
            assert list(members[lead][len(tile) :]) == [-1] * (members.shape[1] - len(tile))
            if not tile:
                continue
            assert tile[0] == lead and len(tile) > 1, tile
            group = self.live[lead].group
            for j in tile:
                assert self.live[j].group == group
                assert h[fast_engine.PRE, j] == group[1] and h[fast_engine.LEAD, j] == self.live[lead].start
            listed += tile
            seen.append(len(tile))
        assert len(listed) == len(set(listed))
        assert {j for j in rows if h[fast_engine.PRE, j] > 0} == set(listed)

    monkeypatch.setattr(fast_engine._Run, "share", checked)
    return seen


def test_the_samples_of_a_prompt_and_their_next_turns_read_its_keys_through_a_leader(runtime, monkeypatch):
    """2 questions x 3 samples (different seeds): each prompt runs once in the prefill and its keys
    are written to its 3 rows' segments; the rows are a prefix group of the prompt's length, and
    their next turns (each prompt now its own) stay in it through their kept keys. In tiles of 2
    rows a group of 3 splits into a pair and a row alone. Every row reads the prompt's keys from
    its tile leader's segment (the rows path off a GPU), with the HF engine's tokens."""
    hf, fast = runtime.engine, eager_static_engine(runtime, min_batch=1, shrink=False, share_min_rows=1)
    fast._per_tile = 2
    tiles = checked_tiles(monkeypatch)
    questions = requests_for(runtime, 2)
    keys = [object() for _ in range(6)]
    first = [
        GenerationRequest(
            q.prompt_ids, q.grammar, q.max_new_tokens, seed=100 * k + j, cache_key=keys[3 * j + k]
        )
        for j, q in enumerate(questions)
        for k in range(3)
    ]
    a = fast.generate(first)
    assert_same_rows(hf.generate(first), a)
    assert len({tuple(g.token_ids) for g in a}) > 2  # the samples of one question differ
    assert fast.last_timing["prefill_tokens"] == sum(len(q.prompt_ids) for q in questions)
    groups = [fast._kept_groups[k] for k in keys]
    assert [pre for _, pre in groups] == [len(q.prompt_ids) for q in questions for _ in range(3)]
    assert len({g for g, _ in groups[:3]}) == len({g for g, _ in groups[3:]}) == 1
    assert groups[0][0] != groups[3][0]
    # a pair of each group shares; its row alone does not
    assert 0 < fast.last_timing["shared_rows"] <= 4 * fast.last_timing["steps"]
    assert set(tiles) == {2}
    response = runtime.tool_response_ids("ok 42")
    second = [
        GenerationRequest(
            r.prompt_ids + g.token_ids + response, r.grammar, r.max_new_tokens, r.seed + 7, cache_key=k
        )
        for r, g, k in zip(first, a, keys, strict=True)
    ]
    b = fast.generate(second)
    assert_same_rows(hf.generate(second), b)
    assert fast.last_timing["reused_tokens"] > 0 and fast.last_timing["shared_rows"] > 0
    # buckets below SHARE_MIN_ROWS (all of these, by default) read each row's own copy
    own = eager_static_engine(runtime, min_batch=1, shrink=False)
    assert_same_rows(a, own.generate(first))
    assert own.last_timing["shared_rows"] == 0


def test_episodes_through_the_static_engine_equal_the_hf_engines(runtime, data_dir, monkeypatch):
    """The episode loop through the eager StaticEngine, continuously batched (a next turn joins
    the running rows when its tool returns, reuses its conversation's keys and stays in its
    question's prefix group), gives the HF engine's episodes and records, whose engine runs each
    turn as one batch."""
    from atlas.runtime.episode import EpisodeSpec, run_episodes
    from atlas.runtime.inputs import read_questions, read_tests
    from unit.test_runtime import GRADERS as graders
    from unit.test_runtime import RUNTIME as cfg

    questions = read_questions(data_dir / "val.parquet")
    tests = read_tests(data_dir / "tests.parquet")
    picked = [q for q in questions if q["source"] == "gpqa"][:2] + [
        q for q in questions if q["source"] == "lcb"
    ][:2]
    specs = [EpisodeSpec(q, tests.get(q["question_uid"], []), k) for q in picked for k in range(2)]
    # every arrival joins at the next step; a question's 2 samples read its keys through a leader
    fast = eager_static_engine(runtime, admit_wait=0, share_min_rows=1)
    tiles = checked_tiles(monkeypatch)
    fast_rt = replace(runtime, engine=fast)
    a, b = (
        run_episodes(r, specs, cfg, graders, run="t", step=0, phase="val", seed=3) for r in (runtime, fast_rt)
    )
    later = sum(len(ep.records) for ep in b) - len(b)  # generations after an episode's first
    assert later > 0 and fast.last_timing["admissions"] > 1
    assert fast.last_timing["reused_tokens"] > 0 and fast.last_timing["shared_rows"] > 0
    assert set(tiles) == {2}  # a question's 2 samples
    assert fast._kept == {} and fast._kept_groups == {}  # an ended episode's keys are given back
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.sampled == y.sampled and x.end_reason == y.end_reason
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
        fields = ("turn", "tool", "arguments", "tool_status", "score", "action_token", "tool_output_sha256")
        assert [[getattr(r, f) for f in fields] for r in x.records] == [
            [getattr(r, f) for f in fields] for r in y.records
        ]


def test_a_runtime_on_a_gpu_generates_with_the_static_engine(runtime):
    from atlas.runtime.engine import HFEngine
    from atlas.runtime.session import make_runtime

    model = runtime.engine.model
    assert type(make_runtime(model, runtime.tokenizer, RuntimeConfig()).engine) is HFEngine  # CPU
    fast = make_runtime(model, runtime.tokenizer, RuntimeConfig(), fast=True).engine
    assert type(fast) is StaticEngine and not fast.graphs and not fast.flash  # float32 on a CPU
    requests = requests_for(runtime, 2, max_new=8)
    assert [g.token_ids for g in fast.generate(requests)] == [
        g.token_ids for g in runtime.engine.generate(requests)
    ]


class FollowUps:
    """A feed: the given requests, and for each that ends a follow-up made from it (its prompt,
    its generation and a tool response), handed out at the next poll, once."""

    def __init__(self, rt, requests, follow_max_new=1000):
        self.rt, self.ready, self.follow_max_new = rt, list(enumerate(requests)), follow_max_new
        self.requests = dict(enumerate(requests))
        self.order, self.outs = [], {}

    def poll(self, block=False, settle=False):
        from atlas.runtime.engine import Arrivals

        ready, self.ready = self.ready, []
        return Arrivals(ready, [], more=len(self.outs) < 2 * len([t for t in self.requests if t < 100]))

    def finished(self, tag, gen):
        self.order.append(tag)
        self.outs[tag] = gen
        if tag < 100:  # a first request: its follow-up continues the conversation
            r = self.requests[tag]
            follow = GenerationRequest(
                r.prompt_ids + gen.token_ids + self.rt.tool_response_ids(f"result {tag}"),
                r.grammar,
                self.follow_max_new,
                r.seed + 1,
                cache_key=r.cache_key,
            )
            self.requests[100 + tag] = follow
            self.ready.append((100 + tag, follow))


def conversations(rt, caps=(4, 6, 1000, 1000)):
    """Requests that open conversations (a new cache key each), with these token caps; by default
    two that end within a few tokens and two long ones, whose follow-ups (FollowUps) arrive while
    the long ones still run."""
    return [
        GenerationRequest(r.prompt_ids, r.grammar, n, r.seed, cache_key=object())
        for r, n in zip(requests_for(rt, len(caps)), caps, strict=True)
    ]


def test_a_follow_up_joins_the_running_rows_and_equals_a_batch_of_its_own(runtime):
    """Continuous batching: a request that arrives while other rows generate joins them at the
    next step (its prompt prefilled, its conversation's keys reused) and ends before the longest
    first request does; every generation equals the HF engine's of the same request alone."""
    first = conversations(runtime)
    fast = eager_static_engine(runtime, min_batch=1, admit_wait=0)
    feed = FollowUps(runtime, first, follow_max_new=5)
    fast.serve(feed)
    long_ = max((2, 3), key=lambda t: len(feed.outs[t].token_ids))
    assert len(feed.outs[long_].token_ids) > 6 + 5  # long enough to outlive both follow-ups
    assert feed.order.index(100) < feed.order.index(long_)  # joined while the long rows ran
    assert feed.order.index(101) < feed.order.index(long_)
    assert fast.last_timing["admissions"] >= 2
    assert fast.last_timing["reused_tokens"] > 0
    # the steps overlapped: fewer than the rows' tokens run one after another
    assert fast.last_timing["steps"] < len(feed.outs[long_].token_ids) + 2 * 5
    hf = runtime.engine
    for tag, gen in feed.outs.items():
        alone = hf.generate([feed.requests[tag]])[0]
        assert_same_rows([alone], [gen])


def test_kept_keys_are_evicted_when_the_pool_is_full_and_tokens_stay_the_same(runtime):
    """A budget that holds the running rows but not every conversation's kept keys: the oldest
    kept keys are evicted for a new request (it then computes its whole prompt), with the same
    tokens."""
    first = conversations(runtime, caps=(3, 3, 3, 3))
    probe = eager_static_engine(runtime, min_batch=1, max_rows=4)
    probe._new_pool(100_000)  # room for every segment: nothing is evicted
    roomy = FollowUps(runtime, first, follow_max_new=3)
    probe.serve(roomy)
    assert probe.last_timing["evicted"] == 0
    follow = min(probe.segment_size(roomy.requests[100 + t]) for t in range(4))
    kept = sum(len(r.prompt_ids) + 2 for r in first)  # each first request keeps prompt + 2 fed tokens
    budget = follow + kept - 1 + probe.max_rows + 1  # no follow-up fits until kept keys go
    fast = eager_static_engine(runtime, min_batch=1, max_rows=4, cache_bytes=budget * probe.position_bytes)
    tight = FollowUps(runtime, first, follow_max_new=3)
    fast.serve(tight)
    assert fast.last_timing["evicted"] > 0
    assert fast.last_timing["reused_tokens"] < probe.last_timing["reused_tokens"]
    for tag in roomy.outs:
        assert_same_rows([roomy.outs[tag]], [tight.outs[tag]])


def test_compaction_moves_every_held_segment_to_the_front_with_its_keys(runtime):
    """A pool with free runs between held segments: compact() packs the scratch rows, the live
    rows' segments, the kept keys and a segment placed for an admission under way to the front,
    in order, moving the positions that hold keys, and leaves one free run at the end."""
    from atlas.runtime import fast_engine

    fast = eager_static_engine(runtime, min_batch=1, max_rows=2)
    fast._clock = {"compactions": 0}
    fast._new_pool(400)
    pool = fast.pool
    for i in range(pool.positions):
        pool.kv[:, :, i] = i  # every position holds its own number
    seg = fast.segments
    assert fast._scratch == 0 and seg.free == [[3, pool.positions - 3]]
    a, gap, b, c, gap2, d = seg.take(50), seg.take(30), seg.take(60), seg.take(20), seg.take(5), seg.take(15)
    seg.give(gap, 30)
    seg.give(gap2, 5)
    run = fast_engine._Run(fast, feed=None)
    live = fast_engine._Live(
        tag=0, request=None, gen=None, matcher=None, key=0, cap=10, start=b, size=60, length=45
    )
    run.live = [None, live]
    fast._kept = {"k1": (list(range(40)), a), "k2": (list(range(20)), c)}  # a's last 10: freed
    seg.give(a + 40, 10)
    placed = [["t", None, d, 15]]
    run.compact(placed)
    assert fast._scratch == 0 and live.start == 43 and fast._kept["k1"][1] == 3
    assert fast._kept["k2"][1] == 103 and list(fast._kept) == ["k1", "k2"] and placed[0][2] == 123
    assert fast.segments.free == [[138, pool.positions - 138]]
    assert fast._clock["compactions"] == 1
    for start, old, n in ((43, b, 45), (3, a, 40), (103, c, 20)):  # the held keys moved with them
        assert torch.equal(pool.kv[:, :, start : start + n, 0, 0][0, 0], torch.arange(old, old + n).float())


def test_compacting_at_every_admission_changes_no_token(runtime, monkeypatch):
    """Follow-ups joining running rows, with the pool compacted before every admission (live rows
    and kept keys moved): the same generations as without."""
    from atlas.runtime import fast_engine

    plain = FollowUps(runtime, conversations(runtime), follow_max_new=5)
    eager_static_engine(runtime, min_batch=1, admit_wait=0).serve(plain)
    admit = fast_engine._Run.admit

    def compacting(self):
        if self.e.pool is not None:
            self.compact()
        admit(self)

    monkeypatch.setattr(fast_engine._Run, "admit", compacting)
    fast = eager_static_engine(runtime, min_batch=1, admit_wait=0)
    moved = FollowUps(runtime, conversations(runtime), follow_max_new=5)
    fast.serve(moved)
    assert fast.last_timing["compactions"] >= 2 and fast.last_timing["reused_tokens"] > 0
    for tag in plain.outs:
        assert_same_rows([plain.outs[tag]], [moved.outs[tag]])


def test_a_pool_too_small_for_the_next_batch_is_sized_for_it_before_rows_run(runtime):
    """A first call leaves a small pool; the next call's batch needs more than twice it, under a
    budget that does not hold both pools at once (so the pool cannot grow by copying while rows
    run). With nothing live, the pool is sized for the whole batch before any row starts, and the
    batch runs as one (its steps are its longest row's), not a few rows at a time."""
    requests = requests_for(runtime, 6)
    probe = eager_static_engine(runtime, min_batch=1)
    need = sum(map(probe.segment_size, requests)) + probe.max_rows + 1
    fast = eager_static_engine(runtime, min_batch=1, cache_bytes=int(1.3 * need) * probe.position_bytes)
    fast.generate(requests[:1])
    small = fast.pool.positions
    assert small < need / 2 and small + need > fast.budget_positions()  # no copy-growth possible
    gens = fast.generate(requests)
    assert fast.pool.positions >= need and fast.last_timing["admissions"] == 1
    assert fast.last_timing["steps"] == max(len(g.token_ids) for g in gens)


def test_a_feed_that_promises_more_but_has_none_in_flight_is_an_error(runtime):
    """A blocking poll that brings nothing while the feed says more will come would spin the
    engine forever: it stops with the feed's name instead."""
    from atlas.runtime.engine import Arrivals

    class Stuck:
        def poll(self, block=False, settle=False):
            return Arrivals([], [], more=True)

        def finished(self, tag, gen):
            raise AssertionError("nothing was asked")

    with pytest.raises(RuntimeError, match="Stuck: more requests due, none in flight"):
        eager_static_engine(runtime).serve(Stuck())
