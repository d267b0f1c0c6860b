"""StaticEngine's key/value budget on CUDA: by default half the GPU's memory; a batch past
cache_bytes runs captured, in chunks of requests that fit, with the tokens of one batch."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config import RuntimeConfig
from atlas.runtime.fast_engine import StaticEngine
from atlas.runtime.session import make_runtime
from unit.test_fast_engine import requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_captured_engine_chunks_a_batch_past_its_cache_budget_on_cuda(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())

    def engine(**kw):
        fast = rt.engine
        return StaticEngine(
            model, fast.vocab_size, fast.stop_token_ids, banned_token_ids=rt.grammars.banned_token_ids, **kw
        )

    requests = requests_for(rt, 5)
    default = engine()
    assert default.cache_bytes == int(0.5 * torch.cuda.get_device_properties(0).total_memory)
    whole = engine(min_batch=1).generate(requests)
    caps = default._caps(requests)
    two = sum(len(r.prompt_ids) + c for r, c in list(zip(requests, caps, strict=True))[:2]) + 3  # + scratch
    fast = engine(min_batch=1, cache_bytes=two * default.position_bytes)
    assert fast.graphs and fast.chunks(requests)[0] == 2
    chunked = fast.generate(requests)
    assert fast.last_timing["chunks"] == len(fast.chunks(requests)) >= 3
    assert fast.pool.positions <= two
    same = sum(x.token_ids == y.token_ids for x, y in zip(whole, chunked, strict=True))
    assert same >= 4, same  # other bucket sizes, other GEMM kernels in bf16: a near-tie may flip one row
    torch.cuda.synchronize()
