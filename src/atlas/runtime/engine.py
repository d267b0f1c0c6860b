"""Rollout engines: grammar-constrained batched sampling that reports what it did per token.

For every generated token an engine returns the id, its log-prob under the masked (grammar +
temperature) distribution, and whether it was sampled (1) or forced (0). A token is forced when
the grammar admits exactly one token: nothing was chosen, so it carries log-prob 0 and is kept
out of the policy loss. Log-probs are taken before top-p truncation (as vLLM reports them), so
a PPO ratio recomputed under the same masks matches them.

`HFEngine` is plain transformers + xgrammar on CPU or one CUDA device: left-padded batch, a
KV cache, one GrammarMatcher per row with the masks filled for the whole batch at once, and
Gumbel-max sampling over noise hashed from the request's seed (atlas.runtime.sampling), so a row's
tokens do not depend on its batch mates. `atlas.runtime.fast_engine.StaticEngine` is the fast
path on a GPU with the same contract.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import xgrammar as xgr

from atlas.runtime.grammar import CompiledCall
from atlas.runtime.sampling import draw, seed_key, step_keys

# A per-row logit bias for scripted boundary cases: given the tokens generated so far, an additive
# bias over the vocabulary (or None). It steers sampling; the grammar still decides what is legal.
LogitBias = Callable[[list[int]], torch.Tensor | None]


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    grammar: CompiledCall
    max_new_tokens: int
    seed: int
    bias: LogitBias | None = None
    # The conversation this request continues (an episode's key, new for every rollout). An engine
    # may keep the keys and values of the key's last request and reuse those of the tokens this
    # prompt begins with: a key is for one policy, never across a weight update.
    cache_key: object | None = None


@dataclass
class Generation:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 sampled, 0 forced (grammar left one token)
    finish_reason: str = "length"  # "stop": grammar completed with a stop token; "length": cap hit
    mask_s: float = 0.0  # time spent filling and applying grammar masks for this row's batch
    engine_s: float = 0.0  # the engine's wall time while it worked on this row, shared among its rows


# Called with a request's index and its finished generation as soon as that row ends (while the
# batch's other rows still generate): the episode loop starts the row's tool call there.
OnFinish = Callable[[int, Generation], None]


@dataclass
class Arrivals:
    """What a feed has for the engine now."""

    requests: list[tuple[object, GenerationRequest]]  # (tag, request): ready to generate
    ended: list[object]  # cache keys that no later request continues: their keys may go
    more: bool  # whether a later poll may bring requests


class Feed(Protocol):
    """Requests that become ready while an engine runs (the episode loop's next turns, once their
    tools return), and where finished generations go.

    poll(block, settle): the requests ready now. `block`: wait until one is ready or none can
    come. `settle`: first wait until nothing the feed runs is in flight, so every request that
    can be made is made (an engine that generates in rounds asks this)."""

    def poll(self, block: bool = False, settle: bool = False) -> Arrivals: ...

    def finished(self, tag: object, gen: Generation) -> None: ...


class ListFeed:
    """A fixed list of requests as a feed; the generations land in `outs`, in request order."""

    def __init__(self, requests: Sequence[GenerationRequest], on_finish: OnFinish | None = None):
        self.requests, self.on_finish = list(requests), on_finish
        self.outs: list[Generation | None] = [None] * len(self.requests)
        self._given = False

    def poll(self, block: bool = False, settle: bool = False) -> Arrivals:
        given, self._given = self._given, True
        return Arrivals([] if given else list(enumerate(self.requests)), [], False)

    def finished(self, tag: object, gen: Generation) -> None:
        self.outs[tag] = gen
        if self.on_finish is not None:
            self.on_finish(tag, gen)


def serve_in_rounds(generate, feed: Feed, forget=None) -> None:
    """Serve a feed through a batch `generate(requests, on_finish)`: once nothing is in flight,
    every ready request in one call, until none is left. A row goes to the feed the moment it
    ends; its `engine_s` (the call's wall time shared evenly) is set when the call returns, before
    the feed is polled again. `forget(keys)`, when given, gets the conversations that ended."""
    while True:
        arrivals = feed.poll(block=True, settle=True)
        if forget is not None:
            forget(arrivals.ended)
        if not arrivals.requests:
            return
        tags = [tag for tag, _ in arrivals.requests]
        reported: set[int] = set()

        def finished(i: int, gen: Generation, tags=tags, reported=reported) -> None:
            reported.add(i)
            feed.finished(tags[i], gen)

        t = time.perf_counter()
        gens = generate([r for _, r in arrivals.requests], on_finish=finished)
        share = (time.perf_counter() - t) / len(gens)
        for gen in gens:
            gen.engine_s = share
        for i, gen in enumerate(gens):
            if i not in reported:  # an engine that did not report this row
                finished(i, gen)


class RolloutEngine(Protocol):
    def generate(
        self, requests: Sequence[GenerationRequest], on_finish: OnFinish | None = None
    ) -> list[Generation]: ...

    def serve(self, feed: Feed) -> None: ...

    def prepare(self, rows: int) -> None:
        """Pay the first serve's one-time costs (memory, captures, compiles) for up to `rows` rows."""


class HFEngine:
    def __init__(
        self,
        model,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        constrained: bool = True,
        banned_token_ids: Sequence[int] = (),
    ):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size = vocab_size
        self.stop_token_ids = set(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self.top_p = top_p
        self.constrained = constrained  # False only for benchmarks and the naive-grammar ablation
        # Control tokens a generation may never hold (<|im_start|>, padding, ...): -inf always.
        self.ban = torch.zeros(vocab_size, device=self.device)  # made once, on the logits' device
        self.ban[list(banned_token_ids)] = float("-inf")
        self.batch_matcher = xgr.BatchGrammarMatcher()
        # transformers 5 renamed the KV cache argument and output from past_key_values to cache.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # through peft
        self._cache_arg = (
            "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
        )

    def prepare(self, rows: int) -> None:
        """Nothing to prepare: it runs eagerly, with a cache per call."""

    def serve(self, feed: Feed) -> None:
        """A feed in rounds (serve_in_rounds): the batch of a round runs to its last row."""
        serve_in_rounds(self.generate, feed)

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], on_finish: OnFinish | None = None
    ) -> list[Generation]:
        if not requests:
            return []
        n = len(requests)
        outs = [Generation() for _ in requests]
        matchers = [xgr.GrammarMatcher(r.grammar.grammar) for r in requests]
        seed_keys = torch.tensor([seed_key(r.seed) for r in requests], dtype=torch.int64, device=self.device)
        active = list(range(n))
        bitmask = xgr.allocate_token_bitmask(n, self.vocab_size)

        # Left-pad the prompts; positions count real tokens only.
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache, last_pos = getattr(out, self._cache_arg), positions[:, -1]
        logits = out.logits[:, -1, : self.vocab_size].float()

        step = 0
        while active:
            logits = logits / self.temperature
            if self.constrained:
                logits += self.ban
            t0 = time.perf_counter()
            for i in active:
                if requests[i].bias is not None:
                    b = requests[i].bias(outs[i].token_ids)
                    if b is not None:
                        logits[i] += b[: self.vocab_size].to(logits.device)
            if self.constrained:
                self.batch_matcher.batch_fill_next_token_bitmask(
                    [matchers[i] for i in active], bitmask, indices=active
                )
                xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=active)
            mask_s = time.perf_counter() - t0
            tokens, chosen, flags = draw(logits, step_keys(seed_keys, step), self.top_p)
            tokens, chosen, flags = tokens.tolist(), chosen.tolist(), flags.tolist()

            next_ids = torch.full((n,), self.pad_token_id, dtype=torch.long)
            still = []
            for i in active:
                g = outs[i]
                g.mask_s += mask_s / len(active)
                tok, lp, sampled = tokens[i], chosen[i], int(flags[i])
                if self.constrained and not matchers[i].accept_token(tok):
                    raise RuntimeError(f"grammar rejected token {tok} it had allowed (row {i}, step {step})")
                g.token_ids.append(tok)
                g.logprobs.append(lp)
                g.sampled.append(sampled)
                next_ids[i] = tok
                if tok in self.stop_token_ids and (not self.constrained or matchers[i].is_terminated()):
                    g.finish_reason = "stop"
                elif len(g.token_ids) >= requests[i].max_new_tokens:
                    g.finish_reason = "length"
                else:
                    still.append(i)
                    continue
                if on_finish is not None:
                    on_finish(i, g)
            active = still
            step += 1
            if not active:
                break
            # One more position for every row (finished rows feed padding that nothing reads).
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=attn.device)], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=next_ids.view(n, 1).to(self.device),
                attention_mask=attn,
                position_ids=last_pos.view(n, 1),
                use_cache=True,
                **{self._cache_arg: cache},
            )
            cache = getattr(out, self._cache_arg)
            logits = out.logits[:, -1, : self.vocab_size].float()
        return outs
