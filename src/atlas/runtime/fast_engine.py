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
- one query token attends per key/value head (`packed_gqa_attention`): the query heads that share
  a KV head are laid along the query axis, so the cache is read once per step. transformers'
  SDPA path copies every KV head `n_rep` times (`repeat_kv`) in a compiled decode step, which on
  a batch of 256 moves more bytes than the weights and the cache together;
- when at most half the rows are still live, the batch moves to the smaller bucket (its KV rows
  gathered into that bucket's cache): a step costs what the live rows need, not the batch that
  started. Finished rows in a bucket feed their last token; nothing reads them.

The caches are bounded: a call drops the caches of other lengths (a later turn's prompts are
longer), and a batch whose caches would pass `cache_bytes` (on a GPU, by default, half of the
device's memory) is generated in consecutive chunks of rows that fit. Every request keeps its own
sampling key, so chunks give the tokens one batch would.

On CPU (compile=False) it runs the same code eagerly; the tests compare it there with HFEngine.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import xgrammar as xgr
from transformers import AttentionInterface, AttentionMaskInterface, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from atlas.model.fused_lora import fused_lora, has_lora
from atlas.runtime.engine import Generation, GenerationRequest
from atlas.runtime.sampling import draw, seed_key, step_keys

KEEP_CACHES = 8  # buckets kept: one call's batch and the smaller ones it shrinks into (~2x its memory)
CACHE_SHARE = 0.5  # of the GPU's memory, for the KV caches when cache_bytes is not given
PACKED_GQA = "atlas_packed_gqa"


def packed_gqa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """SDPA for a decode step without copying the KV heads: the `n_rep` query heads of one KV
    head become that head's query rows ([b, heads, 1, d] -> [b, kv_heads, n_rep, d]); a mask
    shared by the heads ([b, 1, 1, L]) broadcasts over them. Anything else is plain SDPA."""
    groups = getattr(module, "num_key_value_groups", 1)
    shared_mask = attention_mask is None or attention_mask.shape[1] == attention_mask.shape[2] == 1
    if query.shape[2] != 1 or groups == 1 or not shared_mask:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    b, heads, _, dim = query.shape
    out = F.scaled_dot_product_attention(
        query.reshape(b, heads // groups, groups, dim),
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
    )
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_GQA, packed_gqa_attention)
AttentionMaskInterface.register(PACKED_GQA, sdpa_mask)


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
        shrink: bool = True,
        cache_bytes: int | None = None,
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
        self.min_batch, self.length_multiple, self.shrink = min_batch, length_multiple, shrink
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = inner.config
        self._cache_arg = (
            "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
        )
        self._caches: dict[tuple[int, int], StaticCache] = {}
        if cache_bytes is None and self.device.type == "cuda":
            cache_bytes = int(CACHE_SHARE * torch.cuda.get_device_properties(self.device).total_memory)
        self.cache_bytes = cache_bytes  # None: unbounded (CPU)
        head_dim = getattr(self.config, "head_dim", None) or (
            self.config.hidden_size // self.config.num_attention_heads
        )
        # keys and values of every layer at one position of one row
        self.position_bytes = (
            2
            * self.config.num_hidden_layers
            * self.config.num_key_value_heads
            * head_dim
            * torch.finfo(self.dtype).bits
            // 8
        )
        # CPU seconds of the last generate call: filling masks, launching (pick and the next
        # forward), waiting for the step's tokens, and reading them (accept, bookkeeping).
        self.last_timing: dict = {}
        cuda = self.device.type == "cuda"
        self.compiled = cuda if compile is None else compile
        if self.compiled:  # a graph per (rows, positions) bucket: more than dynamo's default 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._step = (
            torch.compile(self._decode, mode="reduce-overhead", fullgraph=False, dynamic=False)
            if self.compiled
            else self._decode
        )
        self._pick_fn = torch.compile(self._pick, dynamic=False) if self.compiled else self._pick
        # Compiled, the actor's LoRA runs fused into the base GEMM (atlas.model.fused_lora), with
        # fewer graph nodes than peft's forward (h200_rollout_1.7b_lora64{,_peft}.json).
        self.fuse_lora = self.compiled and has_lora(model)

    def chunk_rows(self, n: int, length: int) -> int:
        """Rows generated together so that a batch's caches (its bucket and the smaller ones it
        shrinks into: under twice the bucket) stay within cache_bytes; n when unbounded."""
        if self.cache_bytes is None:
            return n
        fits = self.cache_bytes // (2 * length * self.position_bytes)
        if fits < self.min_batch:  # the smallest bucket holds min_batch rows whatever the chunk
            raise RuntimeError(
                f"{self.min_batch} rows (min_batch) of KV cache at {length} positions "
                f"({self.min_batch * 2 * length * self.position_bytes} bytes with their shrink buckets) "
                f"pass the engine's cache_bytes ({self.cache_bytes})"
            )
        rows = 1
        while rows * 2 <= fits:  # a power of two: a bucket of its own
            rows *= 2
        return min(n, rows)

    def _cache(self, batch: int, length: int) -> StaticCache:
        """The bucket's cache, zeroed; the most recently used buckets of this length are kept (a
        cache of the report's model and batch takes tens of GB)."""
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
        return self._forward(ids, attention_mask, position_ids, cache_position, cache, None).float()

    def _pick(self, logits: torch.Tensor, bitmask: torch.Tensor, keys: torch.Tensor):
        """Tokens, their log-probs (0 where forced) and the sampled flags, all on the device: the
        temperature, the ban, the grammar's bitmask (bit t % 32 of word t // 32 set: allowed),
        log-softmax and the Gumbel-max draw, compiled into a few fused kernels on a GPU."""
        logits = logits.float() / self.temperature
        if self.constrained:
            allowed_bits = (bitmask[:, self._word] >> self._bit) & 1
            logits = torch.where((allowed_bits == 1) & self._unbanned, logits, float("-inf"))
        return draw(logits, keys, self.top_p)

    def _prefill(self, prompts: Sequence[Sequence[int]], rows: int, width: int, length: int):
        """The prompts left-padded into a cache of `rows` x `length` positions, run once each: a
        prompt asked several times (a question's samples) is computed once and its KV rows are
        copied. Padding rows hold one pad token (a copy of the first prompt when prompts are
        shared); nothing reads them. Returns the cache, the attention mask over all
        positions, the prompt positions and the last prompt token's logits, one row per row."""
        dev = self.device
        unique: dict[tuple[int, ...], int] = {}
        of = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        once = bucket(len(unique), self.min_batch)
        if once >= rows:  # nothing to share (or no smaller bucket to compute it in)
            once, of, texts = rows, list(range(len(prompts))), list(prompts)
        else:
            texts = list(unique)
        ids = torch.full((once, width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((once, length), dtype=torch.long)
        for i, p in enumerate(texts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) : width] = 1
        attn[len(texts) :, width - 1] = 1
        positions = (attn[:, :width].cumsum(-1) - 1).clamp(min=0)
        ids, attn, positions = ids.to(dev), attn.to(dev), positions.to(dev)
        cache = self._cache(once, length)
        logits = self._forward(ids, attn, positions, torch.arange(width, device=dev), cache, keep=1)
        if once == rows:
            return cache, attn, positions, logits
        index = torch.tensor(of + [0] * (rows - len(of)), device=dev)  # padding rows: unread copies
        return (
            self._gather(cache, index, length),
            *(t.index_select(0, index) for t in (attn, positions, logits)),
        )

    def _gather(self, cache: StaticCache, index: torch.Tensor, length: int) -> StaticCache:
        """The rows `index` of `cache`, in that order, in the cache of the bucket of len(index)
        rows (kept between calls, so a compiled step sees the same tensors each time)."""
        target = self._cache(len(index), length)
        for old, new in zip(cache.layers, target.layers, strict=True):
            if not new.is_initialized:  # shapes, dtype and device from a template of the new batch
                keys, values = (t[:1].expand(len(index), -1, -1, -1) for t in (old.keys, old.values))
                init = new.lazy_initialization
                init(keys, values) if len(inspect.signature(init).parameters) == 2 else init(keys)
            new.keys.copy_(old.keys.index_select(0, index))
            new.values.copy_(old.values.index_select(0, index))
            if isinstance(getattr(old, "cumulative_length", None), torch.Tensor):
                new.cumulative_length.copy_(old.cumulative_length)
            elif hasattr(old, "cumulative_length"):
                new.cumulative_length = old.cumulative_length
        return target

    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        before = self.config._attn_implementation  # the base model's config (through peft)
        self.config._attn_implementation = PACKED_GQA
        try:
            with fused_lora(self.model) if self.fuse_lora else contextlib.nullcontext():
                return self._generate(requests)
        finally:
            self.config._attn_implementation = before

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        width = max(len(r.prompt_ids) for r in requests)
        cap = max(r.max_new_tokens for r in requests)
        length = cache_length(width + cap, self.length_multiple)
        for key in [k for k in self._caches if k[1] != length]:  # another turn's: not read again soon
            del self._caches[key]
        step = self.chunk_rows(len(requests), length)
        outs, timing = [], None
        for start in range(0, len(requests), step):
            outs += self._generate_chunk(requests[start : start + step], width, cap, length)
            timing = _add_timing(timing, self.last_timing)
        self.last_timing = timing | {"chunks": -(-len(requests) // step)}
        return outs

    def _generate_chunk(self, requests, width: int, cap: int, length: int) -> list[Generation]:
        """Requests whose caches fit, as one batch in a cache of `length` positions; prompts
        left-padded to `width`, at most `cap` new tokens."""
        n = len(requests)
        rows = bucket(n, self.min_batch)
        dev = self.device
        cache, attn, positions, logits = self._prefill([r.prompt_ids for r in requests], rows, width, length)
        outs = [Generation() for _ in requests]
        matchers = [xgr.GrammarMatcher(r.grammar.grammar) for r in requests]
        active = list(range(n))
        row_of = list(range(n))  # request -> its row in the batch (rows move when the batch shrinks)
        pin = dev.type == "cuda"
        bitmask_host = xgr.allocate_token_bitmask(rows, self.vocab_size)
        bitmask_host = bitmask_host.pin_memory() if pin else bitmask_host
        bitmask_dev_full = torch.full_like(bitmask_host, -1, device=dev)
        bitmask, bitmask_dev = bitmask_host, bitmask_dev_full
        last_pos = positions[:, -1:].clone()
        seed_keys = torch.tensor(
            [seed_key(r.seed) for r in requests] + [0] * (rows - n), dtype=torch.int64, device=dev
        )
        host_full = {
            k: torch.empty(rows, dtype=d, pin_memory=pin)
            for k, d in (("tok", torch.long), ("lp", torch.float32), ("sampled", torch.bool))
        }
        host = host_full
        copied = torch.cuda.Event() if pin else None
        # Cache positions of the decode steps, made once: a tensor built from a Python list on
        # the device would wait for the GPU (a pageable copy syncs the stream) every step.
        step_positions = torch.arange(width, width + cap, device=dev)
        clock = dict.fromkeys(("fill_s", "launch_s", "wait_s", "host_s"), 0.0) | {"shrinks": 0}
        self.last_timing = clock

        step = 0
        while active:
            smaller = bucket(len(active), self.min_batch)
            if self.shrink and smaller < rows:
                # Live rows first, then finished ones to fill the bucket (their tokens are unread).
                live = [row_of[i] for i in active]
                taken = set(live)
                order = live + [r for r in range(rows) if r not in taken][: smaller - len(live)]
                index = torch.tensor(order, device=dev)
                cache = self._gather(cache, index, length)
                attn, last_pos, seed_keys, logits = (
                    t.index_select(0, index) for t in (attn, last_pos, seed_keys, logits)
                )
                rows = smaller
                for k, i in enumerate(active):
                    row_of[i] = k
                bitmask, bitmask_dev = bitmask_host[:rows], bitmask_dev_full[:rows]
                bitmask[len(active) :] = -1
                host = {k: v[:rows] for k, v in host_full.items()}
                clock["shrinks"] += 1
            t0 = time.perf_counter()
            if self.constrained:  # the masks for this step; the forward that made `logits` ran meanwhile
                self.batch_matcher.batch_fill_next_token_bitmask(
                    [matchers[i] for i in active], bitmask, indices=[row_of[i] for i in active]
                )
                bitmask_dev.copy_(bitmask, non_blocking=pin)
            mask_s = time.perf_counter() - t0
            clock["fill_s"] += mask_s
            if any(requests[i].bias is not None for i in active):  # scripted boundary cases only
                logits = logits.float()
                for i in active:
                    if (
                        requests[i].bias is not None
                        and (b := requests[i].bias(outs[i].token_ids)) is not None
                    ):
                        logits[row_of[i]] += b[: self.vocab_size].to(dev)
            tokens, lp, sampled = self._pick_fn(logits, bitmask_dev, step_keys(seed_keys, step))
            for k, v in (("tok", tokens), ("lp", lp), ("sampled", sampled)):
                host[k].copy_(v, non_blocking=pin)
            if pin:
                copied.record()
            # The next forward goes in the queue before the CPU waits for this step's tokens.
            last_pos += 1
            attn[:, width + step] = 1
            if step + 1 < cap:
                logits = self._step(
                    tokens.view(rows, 1), attn, last_pos, step_positions[step : step + 1], cache
                )
            t1 = time.perf_counter()
            if pin:
                copied.synchronize()
            t2 = time.perf_counter()
            clock["launch_s"] += t1 - t0 - mask_s
            clock["wait_s"] += t2 - t1

            toks, lps, flags = host["tok"].tolist(), host["lp"].tolist(), host["sampled"].tolist()
            if self.constrained:
                accepted = self.batch_matcher.batch_accept_token(
                    [matchers[i] for i in active], [toks[row_of[i]] for i in active]
                )
                if not all(accepted):
                    i = active[accepted.index(False)]
                    raise RuntimeError(
                        f"grammar rejected token {toks[row_of[i]]} it had allowed (row {i}, step {step})"
                    )
            still = []
            for i in active:
                g, tok = outs[i], toks[row_of[i]]
                g.mask_s += mask_s / len(active)
                g.token_ids.append(tok)
                g.logprobs.append(lps[row_of[i]])
                g.sampled.append(int(flags[row_of[i]]))
                if tok in self.stop_token_ids and (not self.constrained or matchers[i].is_terminated()):
                    g.finish_reason = "stop"
                elif len(g.token_ids) >= requests[i].max_new_tokens:
                    g.finish_reason = "length"
                else:
                    still.append(i)
            for i in set(active) - set(still):
                bitmask[row_of[i]] = -1  # a finished row: anything goes; its tokens are never read
            active = still
            step += 1
            clock["host_s"] += time.perf_counter() - t2
        clock["steps"] = step
        return outs


def _add_timing(total: dict | None, part: dict) -> dict:
    """The clock of several chunks: seconds, shrinks and steps summed."""
    if total is None:
        return dict(part)
    return {k: total[k] + part[k] for k in part}
