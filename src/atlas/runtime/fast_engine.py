"""StaticEngine: the rollout engine's fast path, with HFEngine's contract (atlas.runtime.engine).

Per generated token it returns the same things (id, log-prob under the masked distribution,
sampled 1 / forced 0, finish reason) and, with the same log-probs, the same tokens: sampling is
atlas.runtime.sampling's seeded Gumbel-max in both engines. What makes it fast on a GPU:

- a static KV cache (transformers' StaticCache) per (batch, length) bucket, reused across calls,
  so every decode step has the same shapes and the one-token step can be captured as a CUDA graph
  (torch.compile mode="reduce-overhead");
- the grammar masks of the whole batch filled by xgrammar's BatchGrammarMatcher (C++ threads) on
  the CPU while the GPU runs the next forward, then copied (pinned, non-blocking) and applied on
  the GPU; sampling, log-probs and the forced test run on the GPU for the whole batch, and only
  three small vectors come back each step;
- finished rows stay in the batch (fixed shapes) and feed their last token; nothing reads them.

On CPU (compile=False) it runs the same code eagerly; the tests compare it there with HFEngine.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence

import torch
import xgrammar as xgr
from transformers import StaticCache

from atlas.runtime.engine import Generation, GenerationRequest
from atlas.runtime.sampling import draw, seed_key, step_keys

KEEP_CACHES = 2


def bucket(n: int, minimum: int) -> int:
    """The power of two at or above n (at least `minimum`): a few shapes, few compilations."""
    size = minimum
    while size < n:
        size *= 2
    return size


def cache_length(n: int, multiple: int) -> int:
    """Positions for n tokens: rounded up to a quarter of the power of two below n (and to
    `multiple`), so a decode step reads at most ~25% padding of the KV cache while the number of
    distinct lengths (each a compilation) stays logarithmic."""
    step = max(multiple, bucket(n, 1) // 8)
    return -(-n // step) * step


class StaticEngine:
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
        compile: bool | None = None,
        min_batch: int = 8,
        length_multiple: int = 64,
    ):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size
        self.stop_token_ids = set(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self.top_p = top_p
        self.constrained = constrained
        self._unbanned = torch.ones(vocab_size, dtype=torch.bool, device=self.device)
        self._unbanned[list(banned_token_ids)] = False
        vocab = torch.arange(vocab_size, device=self.device)
        self._word, self._bit = vocab // 32, (vocab % 32).to(torch.int32)  # where token t's bit lives
        self.batch_matcher = xgr.BatchGrammarMatcher()
        self.min_batch, self.length_multiple = min_batch, length_multiple
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = inner.config
        self._cache_arg = (
            "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
        )
        self._caches: dict[tuple[int, int], StaticCache] = {}
        cuda = self.device.type == "cuda"
        self.compiled = cuda if compile is None else compile
        self._step = (
            torch.compile(self._decode, mode="reduce-overhead", fullgraph=False)
            if self.compiled
            else self._decode
        )
        self._pick_fn = torch.compile(self._pick, dynamic=False) if self.compiled else self._pick

    def _cache(self, batch: int, length: int) -> StaticCache:
        """The bucket's cache, zeroed; the two most recently used buckets are kept (a cache of
        the report's model and batch takes tens of GB)."""
        key = (batch, length)
        cache = self._caches.pop(key, None) or StaticCache(config=self.config, max_cache_len=length)
        self._caches[key] = cache
        while len(self._caches) > KEEP_CACHES:
            self._caches.pop(next(iter(self._caches)))
        cache.reset()
        return cache

    def _forward(self, ids, attention_mask, position_ids, cache_position, cache, keep: int | None):
        kwargs = {self._cache_arg: cache}
        if keep is not None:
            kwargs["logits_to_keep"] = keep
        return self.model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache_position=cache_position,
            use_cache=True,
            **kwargs,
        ).logits[:, -1, : self.vocab_size]

    def _decode(self, ids, attention_mask, position_ids, cache_position, cache):
        return self._forward(ids, attention_mask, position_ids, cache_position, cache, None)

    def _pick(self, logits: torch.Tensor, bitmask: torch.Tensor, keys: torch.Tensor):
        """Tokens, their log-probs (0 where forced) and the sampled flags, all on the device: the
        temperature, the ban, the grammar's bitmask (bit t % 32 of word t // 32 set: allowed),
        log-softmax and the Gumbel-max draw, compiled into a few fused kernels on a GPU."""
        logits = logits.float() / self.temperature
        if self.constrained:
            allowed_bits = (bitmask[:, self._word] >> self._bit) & 1
            logits = torch.where((allowed_bits == 1) & self._unbanned, logits, float("-inf"))
        return draw(logits, keys, self.top_p)

    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        n = len(requests)
        rows = bucket(n, self.min_batch)
        width = max(len(r.prompt_ids) for r in requests)
        cap = max(r.max_new_tokens for r in requests)
        length = cache_length(width + cap, self.length_multiple)
        dev = self.device
        cache = self._cache(rows, length)
        outs = [Generation() for _ in requests]
        matchers = [xgr.GrammarMatcher(r.grammar.grammar) for r in requests]
        active = list(range(n))
        pin = dev.type == "cuda"
        bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
        bitmask = bitmask.pin_memory() if pin else bitmask
        bitmask_dev = torch.full_like(bitmask, -1, device=dev)

        # Left-padded prompts in a cache of `length` positions; padding rows hold one pad token.
        ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((rows, length), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids) : width] = 1
        attn[n:, width - 1] = 1
        positions = (attn[:, :width].cumsum(-1) - 1).clamp(min=0)
        ids, attn, positions = ids.to(dev), attn.to(dev), positions.to(dev)
        logits = self._forward(ids, attn, positions, torch.arange(width, device=dev), cache, keep=1)
        last_pos = positions[:, -1:].clone()
        seed_keys = torch.tensor(
            [seed_key(r.seed) for r in requests] + [0] * (rows - n), dtype=torch.int64, device=dev
        )
        host = {
            k: torch.empty(rows, dtype=d, pin_memory=pin)
            for k, d in (("tok", torch.long), ("lp", torch.float32), ("sampled", torch.bool))
        }
        copied = torch.cuda.Event() if pin else None

        step = 0
        while active:
            t0 = time.perf_counter()
            if self.constrained:  # the masks for this step; the forward that made `logits` ran meanwhile
                self.batch_matcher.batch_fill_next_token_bitmask(
                    [matchers[i] for i in active], bitmask, indices=active
                )
                bitmask_dev.copy_(bitmask, non_blocking=pin)
            mask_s = time.perf_counter() - t0
            if any(requests[i].bias is not None for i in active):  # scripted boundary cases only
                logits = logits.float()
                for i in active:
                    if (
                        requests[i].bias is not None
                        and (b := requests[i].bias(outs[i].token_ids)) is not None
                    ):
                        logits[i] += b[: self.vocab_size].to(dev)
            tokens, lp, sampled = self._pick_fn(logits, bitmask_dev, step_keys(seed_keys, step))
            for k, v in (("tok", tokens), ("lp", lp), ("sampled", sampled)):
                host[k].copy_(v, non_blocking=pin)
            if pin:
                copied.record()
            # The next forward goes in the queue before the CPU waits for this step's tokens.
            last_pos += 1
            attn.scatter_(1, (width + step) * torch.ones((rows, 1), dtype=torch.long, device=dev), 1)
            if step + 1 < cap:
                logits = self._step(
                    tokens.view(rows, 1),
                    attn,
                    last_pos,
                    torch.tensor([width + step], device=dev),
                    cache,
                ).float()
            if pin:
                copied.synchronize()

            toks, lps, flags = host["tok"].tolist(), host["lp"].tolist(), host["sampled"].tolist()
            if self.constrained:
                accepted = self.batch_matcher.batch_accept_token(
                    [matchers[i] for i in active], [toks[i] for i in active]
                )
                if not all(accepted):
                    i = active[accepted.index(False)]
                    raise RuntimeError(
                        f"grammar rejected token {toks[i]} it had allowed (row {i}, step {step})"
                    )
            still = []
            for i in active:
                g, tok = outs[i], toks[i]
                g.mask_s += mask_s / len(active)
                g.token_ids.append(tok)
                g.logprobs.append(lps[i])
                g.sampled.append(int(flags[i]))
                if tok in self.stop_token_ids and (not self.constrained or matchers[i].is_terminated()):
                    g.finish_reason = "stop"
                elif len(g.token_ids) >= requests[i].max_new_tokens:
                    g.finish_reason = "length"
                else:
                    still.append(i)
            for i in set(active) - set(still):
                bitmask[i] = -1  # a finished row: anything goes; its tokens are never read
            active = still
            step += 1
        return outs
