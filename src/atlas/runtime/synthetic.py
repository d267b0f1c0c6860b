"""Synthetic rollout requests: the runtime measured on a batch of first turns without a dataset.

    reqs = tool_requests(rt, questions=32, samples=8, max_new=128, bounds=CodeBounds(64, 8))
    gens = rt.engine.generate(reqs)

Question q's prompt is a user turn asking question q; even questions get the GPQA tools, odd ones
the LCB tools, each with its call grammar. Sample s of question q has seed `seed + q * samples + s`.
"""

from __future__ import annotations

from atlas.runtime.engine import GenerationRequest
from atlas.runtime.tools import CodeBounds, gpqa_tools, lcb_tools


def tool_requests(
    rt, *, questions: int, samples: int, max_new: int, bounds: CodeBounds, seed: int = 0
) -> list[GenerationRequest]:
    out = []
    for q in range(questions):
        tools = gpqa_tools(bounds) if q % 2 == 0 else lcb_tools(bounds)
        ask = f"Question {q}: which option holds? Think, then call a tool."
        prompt = rt.chat_ids([{"role": "user", "content": ask}], [t.spec() for t in tools.values()])
        grammar = rt.grammars.get(tools)
        out += [
            GenerationRequest(prompt, grammar, max_new, seed=seed + q * samples + s) for s in range(samples)
        ]
    return out
