"""StaticEngine's key/value budget and continuous batching on CUDA: by default half the GPU's
memory; a batch past cache_bytes runs captured, each waiting request placed as an ended row gives
positions back, with the tokens of one batch; a follow-up joins captured rows mid-generation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config.runtime import RuntimeConfig
from atlas.runtime.fast_engine import StaticEngine
from atlas.runtime.session import make_runtime
from unit.test_fast_engine import FollowUps, conversations, requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda_runtime(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    return make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())


def engine(rt, **kw) -> StaticEngine:
    fast = rt.engine
    return StaticEngine(
        fast.model, fast.vocab_size, fast.stop_token_ids, banned_token_ids=rt.grammars.banned_token_ids, **kw
    )


def test_captured_engine_runs_a_batch_past_its_cache_budget_as_positions_free(cuda_runtime):
    rt = cuda_runtime
    requests = requests_for(rt, 5)
    default = engine(rt)
    assert default.cache_bytes == int(0.5 * torch.cuda.get_device_properties(0).total_memory)
    whole = engine(rt, min_batch=1, max_rows=8).generate(requests)
    sizes = sorted(map(default.segment_size, requests))
    two = sizes[-1] + sizes[-2] + 8 + 1  # the two largest segments and the scratch rows
    fast = engine(rt, min_batch=1, max_rows=8, cache_bytes=two * default.position_bytes)
    budgeted = fast.generate(requests)
    assert fast.graphs and fast.last_timing["admissions"] >= 3
    assert fast.pool.positions <= two
    assert fast.last_timing["steps"] > max(len(g.token_ids) for g in whole)  # not one batch
    same = sum(x.token_ids == y.token_ids for x, y in zip(whole, budgeted, strict=True))
    assert same >= 4, same  # other bucket sizes, other GEMM kernels in bf16: a near-tie may flip one row
    torch.cuda.synchronize()


def test_a_follow_up_joins_captured_rows_and_nothing_is_compiled_again(cuda_runtime):
    """Continuous batching with the graphs: follow-ups (the conversation so far and a tool
    response) join the running rows and end before the longest first request; after the first
    serve, a second captures and compiles nothing new."""
    from torch._dynamo.utils import counters

    rt = cuda_runtime
    fast = engine(rt, min_batch=1, admit_wait=0)
    feed = FollowUps(rt, conversations(rt), follow_max_new=5)
    fast.serve(feed)
    long_ = max((2, 3), key=lambda t: len(feed.outs[t].token_ids))
    assert len(feed.outs[long_].token_ids) > 11
    assert feed.order.index(100) < feed.order.index(long_) and feed.order.index(101) < feed.order.index(long_)
    assert fast.last_timing["admissions"] >= 2 and fast.last_timing["reused_tokens"] > 0
    captured, compiled = fast.captures, counters["stats"]["unique_graphs"]
    again = FollowUps(rt, conversations(rt), follow_max_new=5)
    fast.serve(again)
    assert fast.captures == captured and counters["stats"]["unique_graphs"] == compiled
    assert fast.last_timing["graphs"] == 0
    assert [again.outs[t].token_ids for t in sorted(again.outs)] == [
        feed.outs[t].token_ids for t in sorted(feed.outs)
    ]
    torch.cuda.synchronize()


def test_an_admission_never_makes_the_host_wait_for_the_gpu(cuda_runtime, monkeypatch):
    """Follow-ups join a warm engine's rows without a host synchronisation: their indices reach
    the device through pinned memory, queued behind the running step's forward (a copy from
    pageable memory would first wait for it), so the CPU prepares the admission while the GPU
    works. CUDA's sync debug mode raises on any synchronising copy or read."""
    from atlas.runtime import fast_engine

    rt = cuda_runtime
    fast = engine(rt, min_batch=1, admit_wait=0)
    first = FollowUps(rt, conversations(rt), follow_max_new=5)
    fast.serve(first)  # warm: the pool, the buckets' graphs, the sampler's compile
    admit, admitted = fast_engine._Run.admit, []

    def strict(run):
        torch.cuda.set_sync_debug_mode("error")
        try:
            admit(run)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        admitted.append(run.step)

    monkeypatch.setattr(fast_engine._Run, "admit", strict)
    again = FollowUps(rt, conversations(rt), follow_max_new=5)
    fast.serve(again)
    assert len(admitted) >= 2 and fast.last_timing["reused_tokens"] > 0  # the follow-ups' admissions ran
    assert (
        fast.last_timing["prefill_gpu_s"] > 0
        and fast.last_timing["gpu_s"] > fast.last_timing["prefill_gpu_s"]
    )
    steps = fast.last_timing["by_bucket"]
    assert all(gpu > 0 for _, _, gpu in steps.values())  # every bucket's steps ran on the device
    assert [again.outs[t].token_ids for t in sorted(again.outs)] == [
        first.outs[t].token_ids for t in sorted(first.outs)
    ]
    torch.cuda.synchronize()


def test_a_prepared_engine_captures_nothing_while_it_serves(cuda_runtime):
    """prepare(rows) takes the pool at the budget and captures every bucket up to the one of
    `rows` (a step and a pick each): a serve of that many rows then captures, compiles and grows
    nothing, and generates what an engine that captured as it went does."""
    rt = cuda_runtime
    fast = engine(rt, min_batch=1, admit_wait=0, cache_bytes=2**30)
    fast.prepare(6)
    assert fast.pool.positions == fast.budget_positions()
    assert set(fast._buckets) == {1, 2, 4, 8} and fast.captures == 8
    assert fast.last_timing["graphs"] == 8 and fast.last_timing["prepare_s"] > 0
    feed = FollowUps(rt, conversations(rt), follow_max_new=5)
    fast.serve(feed)
    assert fast.captures == 8 and fast.last_timing["graphs"] == 0 and fast.last_timing["capture_s"] == 0
    assert fast.last_timing["pool_grows"] == 0 and fast.last_timing["admissions"] >= 2
    lazy = engine(rt, min_batch=1, admit_wait=0, cache_bytes=2**30)
    ref = FollowUps(rt, conversations(rt), follow_max_new=5)
    lazy.serve(ref)
    assert lazy.last_timing["graphs"] > 0
    assert [feed.outs[t].token_ids for t in sorted(feed.outs)] == [
        ref.outs[t].token_ids for t in sorted(ref.outs)
    ]
    torch.cuda.synchronize()
