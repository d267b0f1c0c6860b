"""A rollout server for the verl agent loop backed by the local HFEngine, for CPU runs and tests.

It answers `generate(request_id, prompt_ids=..., sampling_params=...)` the way verl's LLM server
client does (a TokenOutput), but generates with this project's HFEngine: the structural tag in
`sampling_params["structured_outputs"]` is compiled with the runtime's own grammar compiler and
enforced exactly as the local engine enforces it, and the request's `seed` keys the sampler, so an
episode played through the agent loop draws the same tokens as the same episode played by
`atlas.runtime.episode.run_episodes`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from atlas.runtime.engine import GenerationRequest
from atlas.runtime.grammar import CompiledCall
from atlas.runtime.session import Runtime


def structural_tag_of(structured_outputs) -> str:
    """The structural tag JSON of a structured-output request (vLLM's params object or a dict)."""
    tag = (
        structured_outputs.get("structural_tag")
        if isinstance(structured_outputs, dict)
        else getattr(structured_outputs, "structural_tag", None)
    )
    if not tag:
        raise ValueError(f"expected a structural_tag in structured_outputs, got {structured_outputs!r}")
    return tag


class HFServerManager:
    """verl's server-manager interface over one HFEngine (one request at a time: the engine's
    model is not shared between threads)."""

    def __init__(self, rt: Runtime):
        if rt.engine is None:
            raise ValueError(
                "HFServerManager needs a runtime with an engine (atlas.runtime.session.make_runtime)"
            )
        self.rt = rt
        self._lock = threading.Lock()

    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        temperature = params.get("temperature", self.rt.engine.temperature)
        if temperature != self.rt.engine.temperature:
            raise ValueError(
                f"temperature {temperature} but the engine samples at {self.rt.engine.temperature}"
            )
        tag = structural_tag_of(params["structured_outputs"])
        call = CompiledCall((), self.rt.grammars.from_tag_json(tag), params["max_tokens"], tag)
        request = GenerationRequest(list(prompt_ids), call, params["max_tokens"], int(params.get("seed", 0)))
        with self._lock:
            gen = self.rt.engine.generate([request])[0]
        return TokenOutput(
            token_ids=gen.token_ids,
            log_probs=gen.logprobs if params.get("logprobs") else None,
            stop_reason="completed",
        )

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        return await asyncio.to_thread(self._generate, prompt_ids, sampling_params)
