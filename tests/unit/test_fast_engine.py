"""Seeded sampling and the fast rollout engine: StaticEngine against HFEngine on the tiny model
(CPU, eager here; the device benchmark compares them on a GPU as well)."""

from __future__ import annotations

import math

import pytest
import torch

from atlas.config import RuntimeConfig
from atlas.runtime.engine import GenerationRequest
from atlas.runtime.fast_engine import StaticEngine, bucket, cache_length, packed_gqa_attention
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


def test_buckets():
    assert [bucket(n, 8) for n in (1, 8, 9, 200, 256, 257)] == [8, 8, 16, 256, 256, 512]


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
        hf.pad_token_id,
        banned_token_ids=runtime.grammars.banned_token_ids,
        compile=False,
        **kwargs,
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
    # A second call reuses the cache of its bucket and still agrees; a token cap is honoured.
    short = requests_for(runtime, 3, max_new=5)
    for x, y in zip(hf.generate(short), fast.generate(short), strict=True):
        assert x.token_ids == y.token_ids and len(y.token_ids) <= 5
    width = max(len(r.prompt_ids) for r in short)
    assert list(fast._caches)[-1] == (8, cache_length(width + 5, 64))  # (rows, positions), most recent last


def test_packed_gqa_decode_attention_equals_sdpa_over_repeated_heads():
    """One query token per row against 3 KV heads shared by 4 query heads each, with a padding
    mask: the packed form equals SDPA over the repeated KV heads."""
    torch.manual_seed(0)
    b, kv, groups, length, dim = 5, 3, 4, 37, 16
    module = torch.nn.Module()
    module.num_key_value_groups = groups
    query = torch.randn(b, kv * groups, 1, dim)
    key, value = torch.randn(b, kv, length, dim), torch.randn(b, kv, length, dim)
    mask = torch.rand(b, 1, 1, length) > 0.3
    mask[..., 0] = True

    def repeated_heads(q, m):  # what transformers' repeat_kv path computes, as [b, q, heads, d]
        k, v = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.25).transpose(
            1, 2
        )

    out, _ = packed_gqa_attention(module, query, key, value, mask, scaling=0.25)
    assert out.shape == (b, 1, kv * groups, dim)
    assert torch.allclose(out, repeated_heads(query, mask), atol=1e-6)
    # A prompt (several query tokens) takes plain SDPA, the same numbers as the repeated heads.
    q2 = torch.randn(b, kv * groups, 3, dim)
    causal = torch.ones(3, length, dtype=torch.bool).tril(length - 3)[None, None].expand(b, 1, 3, length)
    out2, _ = packed_gqa_attention(module, q2, key, value, causal, scaling=0.25)
    assert torch.allclose(out2, repeated_heads(q2, causal), atol=1e-6)


def test_the_batch_shrinks_as_rows_finish_and_tokens_stay_the_same(runtime):
    """With min_batch 1, 5 requests start in 8 rows and move to 4, 2 and 1 rows as they finish
    (their KV rows gathered); every row still equals the HF engine's, and the prompt's
    attention implementation is given back afterwards."""
    hf, fast = runtime.engine, eager_static_engine(runtime, min_batch=1)
    requests = requests_for(runtime, 5)
    a, b = hf.generate(requests), fast.generate(requests)
    lengths = sorted(len(y.token_ids) for y in b)
    assert lengths[0] < lengths[1] < lengths[-1]  # rows finish at different steps
    assert_same_rows(a, b)
    assert {y.finish_reason for y in b} == {"stop"}
    assert {rows for rows, _ in fast._caches} == {8, 4, 2, 1}
    assert hf.model.config._attn_implementation == "sdpa"


def test_a_prompt_asked_several_times_is_computed_once(runtime):
    """3 questions x 4 samples (different seeds): the prompt runs in a bucket of 4 rows, its KV
    rows are copied to the 16-row batch, and every sample equals the HF engine's."""
    # shrink off, so the 4-row cache can only be the prompts' own
    hf, fast = runtime.engine, eager_static_engine(runtime, min_batch=1, shrink=False)
    questions = requests_for(runtime, 3)
    requests = [
        GenerationRequest(q.prompt_ids, q.grammar, q.max_new_tokens, seed=100 * k + j)
        for j, q in enumerate(questions)
        for k in range(4)
    ]
    a, b = hf.generate(requests), fast.generate(requests)
    assert len({tuple(y.token_ids) for y in b}) > 3  # the samples of one question differ
    assert_same_rows(a, b)
    width = max(len(r.prompt_ids) for r in requests)
    length = cache_length(width + 1000, 64)
    assert set(fast._caches) == {(4, length), (16, length)}


def test_a_batch_past_the_cache_budget_runs_in_chunks_with_the_same_tokens(runtime):
    """cache_bytes that fit 2 rows (with their shrink buckets): 5 requests run as 3 chunks, and
    every row equals one batch's; a call at another length drops the caches of this one; a
    budget under one row is refused with the numbers."""
    requests = requests_for(runtime, 5)
    whole = eager_static_engine(runtime, min_batch=1).generate(requests)
    width = max(len(r.prompt_ids) for r in requests)
    length = cache_length(width + 1000, 64)
    probe = eager_static_engine(runtime)
    two_rows = 2 * 2 * length * probe.position_bytes
    fast = eager_static_engine(runtime, min_batch=1, cache_bytes=two_rows + 1)
    assert (fast.chunk_rows(5, length), fast.chunk_rows(1, length)) == (2, 1)
    chunked = fast.generate(requests)
    assert fast.last_timing["chunks"] == 3
    assert_same_rows(whole, chunked)
    assert max(rows for rows, _ in fast._caches) == 2
    short = requests_for(runtime, 2, max_new=5)
    fast.generate(short)
    assert {n for _, n in fast._caches} == {cache_length(max(len(r.prompt_ids) for r in short) + 5, 64)}
    tight = eager_static_engine(runtime, cache_bytes=probe.position_bytes)
    with pytest.raises(RuntimeError, match=r"8 rows \(min_batch\) .* pass the engine's cache_bytes \(\d+\)"):
        tight.generate(requests)
    # two rows fit, but the smallest bucket is 4 rows: refused rather than past the budget
    with pytest.raises(RuntimeError, match=r"4 rows \(min_batch\)"):
        eager_static_engine(runtime, min_batch=4, cache_bytes=two_rows + 1).chunk_rows(5, length)


def test_a_runtime_on_a_gpu_generates_with_the_static_engine(runtime):
    from atlas.runtime.engine import HFEngine
    from atlas.runtime.session import make_runtime

    model = runtime.engine.model
    assert type(make_runtime(model, runtime.tokenizer, RuntimeConfig()).engine) is HFEngine  # CPU
    fast = make_runtime(model, runtime.tokenizer, RuntimeConfig(), fast=True).engine
    assert type(fast) is StaticEngine and not fast.compiled  # eager off CUDA
    requests = requests_for(runtime, 2, max_new=8)
    assert [g.token_ids for g in fast.generate(requests)] == [
        g.token_ids for g in runtime.engine.generate(requests)
    ]
