"""StaticEngine's cache budget on CUDA: by default half the GPU's memory; a batch past
cache_bytes runs compiled, in chunks of rows that fit, with the tokens of one batch."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atlas.config import RuntimeConfig
from atlas.runtime.fast_engine import StaticEngine, cache_length
from atlas.runtime.session import make_runtime
from unit.test_fast_engine import requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_compiled_static_engine_chunks_a_batch_past_its_cache_budget_on_cuda(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).cuda()
    rt = make_runtime(model, AutoTokenizer.from_pretrained(tiny_model), RuntimeConfig())
    hf = rt.engine

    def engine(**kw):
        return StaticEngine(
            model,
            hf.vocab_size,
            hf.stop_token_ids,
            hf.pad_token_id,
            banned_token_ids=rt.grammars.banned_token_ids,
            **kw,
        )

    requests = requests_for(rt, 5)
    default = engine()
    assert default.cache_bytes == int(0.5 * torch.cuda.get_device_properties(0).total_memory)
    whole = engine(min_batch=1).generate(requests)
    length = cache_length(max(len(r.prompt_ids) for r in requests) + 1000, 64)
    two_rows = 2 * 2 * length * default.position_bytes
    fast = engine(min_batch=1, cache_bytes=two_rows + 1)
    assert fast.compiled and fast.chunk_rows(5, length) == 2
    chunked = fast.generate(requests)
    assert fast.last_timing["chunks"] == 3
    assert max(rows for rows, _ in fast._caches) == 2
    same = sum(x.token_ids == y.token_ids for x, y in zip(whole, chunked, strict=True))
    assert same >= 4, same  # float32, other batch shapes: a near-tie may flip one row
    torch.cuda.synchronize()
