"""StaticEngine: the rollout engine's fast path, with HFEngine's contract (atlas.runtime.engine).

Per generated token it returns the same things (id, log-prob under the masked distribution,
sampled 1 / forced 0, finish reason) and, with the same log-probs, the same tokens: sampling is
atlas.runtime.sampling's seeded Gumbel-max in both engines. What makes it fast on a GPU:

- it serves a feed (`serve`; atlas.runtime.engine.Feed) with continuous batching: a request that
  arrives while rows generate (an episode's next turn, once its tool returned) joins them at a
  step's boundary after its prompt's prefill, and a row that ends frees its place. Arrivals are
  gathered until they are ADMIT_SHARE of the running rows or the oldest waited ADMIT_WAIT steps
  (a prefill forward costs several decode steps). `generate` serves a fixed list;
- keys and values live in one pool (atlas.runtime.kv_pool), each request in a segment of its
  prompt plus its token cap, placed first-fit (kv_pool.Segments); attention reads the positions
  a row has filled, not a padded cache's (a decode step through a split-KV Triton kernel,
  atlas.runtime.decode_attention; a prefill through FlashAttention-2);
- a plain Qwen3 model (the merged serving copy, the base) runs atlas.runtime.fused_qwen3's
  forward on a GPU: each layer's projections in two matrix products and its norms, RoPE, key and
  value writes and SwiGLU in three Triton kernels, half the kernels of transformers' layer, which
  is what a step of few rows and an admission's eager forward cost;
- the prompts of an admission are one packed forward (a prompt asked by several rows, a question's
  samples, is computed once and its keys and values written to every row's segment), and a
  request that continues a conversation (`cache_key`) reuses what that conversation's last request
  left in the pool: a next turn computes only the tool response and what follows;
- the rows of such a prompt form a prefix group, and their next turns stay in it: a decode step
  of SHARE_MIN_ROWS rows or more reads the prompt's keys once for up to 8 rows of a group,
  through the first of them (its leader), instead of once per row
  (atlas.runtime.decode_attention's shared prefixes);
- a decode step has static shapes per number of rows (a bucket: a power of two), whatever the
  prompts' lengths: it is captured once as a CUDA graph per bucket and replayed, and the rows'
  positions and segments are rewritten in a small buffer between replays. A new turn, a row that
  joins or one that ends never compiles or traces the model again;
- the grammar masks of the whole batch are filled by xgrammar's BatchGrammarMatcher (C++ threads)
  on the CPU while the GPU runs the next forward, then copied (pinned, non-blocking); sampling,
  log-probs and the forced test run on the GPU for the whole batch (compiled once, for any
  number of rows, and captured like the step), and only three small vectors come back a step;
- the rows move to the smaller bucket when at most half of it is live and to a larger one when
  arrivals need it: only the live rows' logits move (their keys stay in the pool). Empty rows of
  a bucket write and read one scratch position each;
- a row goes to the feed the step it ends, so the episode loop starts its tool call while the
  other rows still generate.

A row that ends gives back the part of its segment it did not fill and keeps the rest for its
conversation (kept keys, a cache: the oldest go when a request needs their positions, an ended
conversation's at once). The pool is sized for what waits (by a quarter more) up to `cache_bytes`
(on a GPU, by default, half of the memory the process may use). With rows live it grows only by
copying, while both pools fit the budget; otherwise requests wait for the positions that ending
rows give back, and when enough are free but in short runs the held segments are packed to the
front. A larger pool is a new tensor: its graphs are captured again.

`last_timing` holds the last serve's CPU seconds: `prefill_s` (admissions), `capture_s` (graph
capture and the sampler's compile), `fill_s` (grammar masks), `launch_s`, `wait_s` (for the GPU),
`host_s` (accepting tokens, bookkeeping), `feed_s` (the feed's own work in this thread: an
episode's parse, tool start and next request), `idle_s` (nothing to generate until the feed
brought more); on a GPU, from events around each step's pick and forward and each admission,
`gpu_s` (the device's seconds, of which `prefill_gpu_s` admissions'); with `steps`, `rows`
(summed over steps), `by_bucket` (steps, wall seconds and GPU seconds per bucket),
`admissions`, `shrinks`, `graphs` (captured), `pool_grows`, `evicted` (kept keys), `compactions`,
`prefill_tokens` (the prompt tokens the prefill ran), `reused_tokens` (those it did not: their
keys were in the pool) and `shared_rows` (rows that read their prompt's keys through their
group's leader, summed over steps).

On CPU, or with a float32 model, it runs the same functions eagerly with a row-by-row attention;
the tests compare it there with HFEngine token for token.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import xgrammar as xgr

from atlas.model.liger import liger_rope
from atlas.runtime import decode_attention as split_attention
from atlas.runtime import kv_pool
from atlas.runtime import split_pick as pick_kernels
from atlas.runtime.engine import Feed, Generation, GenerationRequest, ListFeed, OnFinish
from atlas.runtime.fused_qwen3 import FusedQwen3
from atlas.runtime.kv_pool import POOL_ATTENTION, KVPool, Layout, Segments, to_device
from atlas.runtime.sampling import seed_key, step_keys
from atlas.stage import GPU_MEMORY_ENV

CACHE_SHARE = 0.5  # of the GPU's memory, for the key/value pool when cache_bytes is not given


def usable_memory(device: torch.device) -> int:
    """Bytes of `device` this process may allocate: its total memory times the per-process
    fraction a job's GPU memory claim set (atlas.stage.hold_gpu_memory; 1 when none)."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # newer torch only
    if fraction is not None:
        return int(total * fraction(device))
    claim = float(os.environ.get(GPU_MEMORY_ENV) or 0)
    return min(total, int(claim * 2**30)) if claim > 0 else total


PREFILL_BUDGET = 32768  # prompt tokens in one prefill forward at most (a longer prompt goes alone)
MAX_ROWS = 512  # rows generating at once, at most; more requests wait for a row to end
# Requests that arrive while rows generate join them at the next step when they are at least
# ADMIT_SHARE of the rows generating, or when the oldest has waited ADMIT_WAIT steps: a prefill
# forward has a fixed cost of several decode steps, so arrivals are gathered, not run one by one.
ADMIT_SHARE = 0.5
ADMIT_WAIT = 32
# Buckets of at least this many rows read a shared prompt's keys once per group: below it a
# step's attention is too small for the saved reads to pay for the second kernel's programs.
SHARE_MIN_ROWS = 128
# What a serve's clock (`last_timing`) holds besides `by_bucket`: seconds, then counts.
CLOCK_SECONDS = (
    "prefill_s",
    "capture_s",
    "fill_s",
    "launch_s",
    "wait_s",
    "host_s",
    "feed_s",
    "idle_s",
    "gpu_s",
    "prefill_gpu_s",
)
CLOCK_COUNTS = (
    "steps",
    "rows",
    "admissions",
    "shrinks",
    "graphs",
    "pool_grows",
    "evicted",
    "compactions",
    "prefill_tokens",
    "reused_tokens",
    "shared_rows",
)
# host buffer rows: positions fed, where their keys go, segment starts, used positions, pick keys,
# the prefix a row shares with its group (positions; 0: none) and where that prefix is read (the
# group leader's segment start)
POS, WRITE, START, USED, KEY, PRE, LEAD = META = range(7)


def bucket(n: int, minimum: int) -> int:
    """The power of two at or above n (at least `minimum`): few shapes, few graphs."""
    size = minimum
    while size < n:
        size *= 2
    return size


def pool_positions(need: int) -> int:
    """Positions for a pool that must hold `need`: a quarter more, rounded up to an eighth of the
    power of two at or above it, so that the next turn's somewhat longer prompts still fit."""
    want = need + need // 4
    step = max(64, bucket(want, 1) // 8)
    return -(-want // step) * step


@dataclass
class Rows:
    """One bucket's buffers (kept across calls: a captured graph reads the same tensors)."""

    rows: int
    tok: torch.Tensor  # [rows] the pick's tokens, and the decode step's input
    lp: torch.Tensor  # [rows] their log-probs
    sampled: torch.Tensor  # [rows] their sampled flags
    logits: torch.Tensor  # [rows, vocab] float32: the decode step's output, the pick's input
    meta: torch.Tensor  # [7, rows + 1] int64 on the device: POS, WRITE, START, USED, KEY, PRE, LEAD
    meta_host: torch.Tensor  # the same, pinned
    members: torch.Tensor  # [rows, members_per_tile] int32: each group leader's rows (-1: none)
    members_host: torch.Tensor  # the same, pinned
    bitmask: torch.Tensor  # [rows, words] int32 grammar masks, pinned
    bitmask_dev: torch.Tensor
    out_host: dict[str, torch.Tensor]  # pinned copies of tok, lp, sampled
    cu_q: torch.Tensor  # [rows + 1] int32: one query token per row
    graphs: dict[str, torch.cuda.CUDAGraph] = field(default_factory=dict)


class StaticEngine:
    def __init__(
        self,
        model,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        constrained: bool = True,
        banned_token_ids: Sequence[int] = (),
        graphs: bool | None = None,
        compile=None,
        min_batch: int = 8,
        shrink: bool = True,
        cache_bytes: int | None = None,
        prefill_budget: int = PREFILL_BUDGET,
        max_rows: int = MAX_ROWS,
        admit_share: float = ADMIT_SHARE,
        admit_wait: int = ADMIT_WAIT,
        decode_attention: str | None = None,
        share_prefixes: bool = True,
        share_min_rows: int = SHARE_MIN_ROWS,
        fused: bool | None = None,
        split_pick: bool = False,
    ):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size
        self.stop_token_ids = set(stop_token_ids)
        self.temperature = temperature
        self.top_p = top_p
        self.constrained = constrained
        self._unbanned = torch.ones(vocab_size, dtype=torch.bool, device=self.device)
        self._unbanned[list(banned_token_ids)] = False
        self._places = pick_kernels.bit_places(vocab_size, self.device)  # token t's bit in a mask row
        self.batch_matcher = xgr.BatchGrammarMatcher()
        self.min_batch, self.shrink, self.prefill_budget = min_batch, shrink, prefill_budget
        self.max_rows = bucket(max_rows, min_batch)  # rows generating at once, at most
        self._scratch_rows = self.max_rows + 1  # a scratch position per row of the largest bucket
        self.admit_share, self.admit_wait = admit_share, admit_wait
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = inner.config
        if getattr(self.config, "sliding_window", None) and getattr(self.config, "use_sliding_window", False):
            raise ValueError(
                f"{type(inner).__name__}: sliding-window attention is not supported by StaticEngine"
            )
        # every layer type gets no mask: the pool attention takes its rows from the Layout
        self._masks = dict.fromkeys(getattr(self.config, "layer_types", None) or ["full_attention"])
        self._masks.setdefault("full_attention", None)
        cuda = self.device.type == "cuda"
        self.flash = kv_pool.flash(self.device, self.dtype)  # else the attention runs row by row
        # a decode step attends through the split kernel (atlas.runtime.decode_attention) or
        # FlashAttention-2 ("flash"); "split" by default where it runs: CUDA in half precision
        self._kernels = split_attention.available(self.device)  # atlas's Triton kernels run here
        split_ok = self.flash and self._kernels
        if decode_attention is None:
            decode_attention = "split" if split_ok else "flash"
        if decode_attention not in ("split", "flash") or (decode_attention == "split" and not split_ok):
            raise ValueError(
                f"decode_attention {decode_attention!r}: 'flash', or 'split' on CUDA in half precision "
                f"with Triton (got {self.device}, {self.dtype})"
            )
        self.decode_attention = decode_attention
        # a plain Qwen3 model runs atlas.runtime.fused_qwen3's forward: by default where its
        # Triton kernels run (CUDA), and on request elsewhere in its torch spelling (the tests)
        # (its kernels run where the decode attention's do)
        why = FusedQwen3.supports(model)
        if fused is None:
            fused = why is None and self.flash and self._kernels
        if fused and why:
            raise ValueError(f"fused=True: {why}")
        self.fused = FusedQwen3(model, self._kernels) if fused else None
        self.split_pick = split_pick
        # rows that share a prompt (a question's samples, and their later turns) read its keys
        # once a step, through their group's leader (decode_attention's shared prefixes); off,
        # each row reads its own copy. Set both before the first serve: a captured step keeps the
        # kernel it was captured with (either reads the same keys: every row holds its copy)
        self.share_prefixes, self.share_min_rows = share_prefixes, share_min_rows
        self._per_tile = split_attention.members_per_tile(
            self.config.num_attention_heads, self.config.num_key_value_heads
        )
        self._groups = 0  # prefix groups made so far: the next one's id
        if cache_bytes is None and cuda:
            cache_bytes = int(CACHE_SHARE * usable_memory(self.device))
        self.cache_bytes = cache_bytes  # None: unbounded (CPU)
        self.position_bytes = KVPool.position_bytes(self.config, self.dtype)
        if graphs and not (cuda and self.flash):
            raise ValueError(
                f"CUDA graphs need a CUDA model in half precision (got {self.device}, {self.dtype})"
            )
        self.graphs = cuda and self.flash if graphs is None else graphs
        compile = self.graphs if compile is None else compile
        backend = "inductor" if compile is True else compile  # a name or a callable (the tests count)
        # The torch spelling's pick: one compile for every bucket (the number of rows is a
        # symbolic size), on its first call.
        self._pick_torch_fn = (
            torch.compile(self._pick_torch, dynamic=True, backend=backend) if compile else self._pick_torch
        )
        self._graph_pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.pool: KVPool | None = None
        self.segments: Segments | None = None  # which of the pool's positions are taken
        self._scratch = 0  # bucket row j's scratch position: _scratch + j
        # cache_key -> (tokens, segment start): the keys and values a finished row left in the
        # pool for its conversation's next request (oldest first: evicted first)
        self._kept: dict[object, tuple[list[int], int]] = {}
        # cache_key -> (group, prefix length): the prefix group a conversation's kept keys belong to
        self._kept_groups: dict[object, tuple[int, int]] = {}
        self._buckets: dict[int, Rows] = {}
        self._state = None  # the model's adapter state the graphs were captured under
        self.captures = 0  # graphs captured by this engine, over its life
        self.last_timing: dict = {}
        kv_pool.register()

    @property
    def split_pick(self) -> bool:
        """Whether the pick's reductions split along the vocabulary (atlas.runtime.split_pick)
        instead of running the compiled torch spelling. Set it before the first serve, as the
        forward: a captured pick keeps the kernels it was captured with."""
        return self._split_pick

    @split_pick.setter
    def split_pick(self, on: bool) -> None:
        if on and self.top_p < 1.0:  # a nucleus needs a sort, which only the torch spelling does
            raise ValueError(f"split_pick=True draws with top_p 1 (got top_p {self.top_p}); leave it off")
        if on and not self._kernels:
            raise ValueError(f"split_pick=True: its Triton kernels do not run on {self.device}")
        self._split_pick = on

    # -- the pool and the buckets -------------------------------------------------------------

    def budget_positions(self) -> int | None:
        return None if self.cache_bytes is None else self.cache_bytes // self.position_bytes

    def _new_pool(self, need: int) -> None:
        """A pool for `need` positions (a quarter more, within the budget); the scratch positions of
        the largest bucket first. Whatever the old pool kept goes with it."""
        scratch = self._scratch_rows
        size = pool_positions(need + scratch)
        if (budget := self.budget_positions()) is not None:
            size = min(size, budget)
        self.pool = None
        self._kept, self._kept_groups = {}, {}
        self._drop_graphs()  # they write into the old pool
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the old pool's memory, before the larger one is taken
        self.pool = KVPool(self.config, size, self.device, self.dtype)
        self.segments = Segments(size)
        self._scratch = self.segments.take(scratch)

    def _grow_pool(self, need: int, live: bool) -> bool:
        """A larger pool, for `need` more positions than are taken; False at the budget. With rows
        generating (`live`) their keys are copied over, which holds both pools at once: only
        while the two fit the budget. Otherwise the kept keys go (they are a cache) and the old
        pool is freed before the new one is taken."""
        taken = self.pool.positions - self.segments.free_positions
        budget = self.budget_positions()
        size = pool_positions((taken if live else self._scratch_rows) + need)
        if budget is not None:
            size = min(size, budget)
        if size <= self.pool.positions or (
            live and budget is not None and self.pool.positions + size > budget
        ):
            return False
        self._clock["pool_grows"] += 1
        if not live:
            self._new_pool(need)
            return True
        old = self.pool
        self._drop_graphs()  # they write into the old pool
        self.pool = KVPool(self.config, size, self.device, self.dtype)
        self.pool.kv[:, :, : old.positions].copy_(old.kv)
        del old
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.segments.grow(size)
        return True

    def _place(self, size: int, want: int, keep: set, live: bool, compact=None) -> int | None:
        """The start of a segment of `size` positions: from free positions (packed first by
        `compact` when they suffice but lie in shorter runs), the positions of the oldest kept
        keys not in `keep`, or a larger pool (sized for `want`, all that waits). None while rows
        hold the positions it needs."""
        # kept keys go before the pool grows: they only save prefill, while a new pool means
        # capturing every graph again (and it takes both pools at once while rows are live)
        while (start := self.segments.take(size)) is None:
            if compact is not None and self.segments.free_positions >= size:
                compact()
                compact = None
            elif not (self._evict(keep) or self._grow_pool(max(want, size), live)):
                return None
        return start

    def _evict(self, keep: set) -> bool:
        for key in self._kept:
            if key not in keep:
                self._forget(key)
                self._clock["evicted"] += 1
                return True
        return False

    def forget(self, keys) -> None:
        """Conversations that no later request continues: their kept keys go."""
        for key in keys:
            self._forget(key)

    def _forget(self, key) -> None:
        """Drop a conversation's kept keys and give their positions back."""
        self._kept_groups.pop(key, None)
        if (old := self._kept.pop(key, None)) is not None:
            self.segments.give(old[1], len(old[0]))

    def _drop_graphs(self) -> None:
        """Forget every captured graph. Their memory pool goes with the last of them, so later
        captures take a new pool handle (capturing into a handle whose graphs are all gone fails
        an assertion in PyTorch's caching allocator)."""
        for rb in self._buckets.values():
            rb.graphs.clear()
        if self.graphs:
            self._graph_pool = torch.cuda.graph_pool_handle()

    def _rows(self, rows: int) -> Rows:
        if rows in self._buckets:
            return self._buckets[rows]
        dev, pin = self.device, self.device.type == "cuda"
        bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
        rb = Rows(
            rows=rows,
            tok=torch.zeros(rows, dtype=torch.long, device=dev),
            lp=torch.zeros(rows, dtype=torch.float32, device=dev),
            sampled=torch.zeros(rows, dtype=torch.bool, device=dev),
            logits=torch.zeros(rows, self.vocab_size, dtype=torch.float32, device=dev),
            meta=torch.zeros(len(META), rows + 1, dtype=torch.long, device=dev),
            meta_host=torch.zeros(len(META), rows + 1, dtype=torch.long, pin_memory=pin),
            members=torch.full((rows, self._per_tile), -1, dtype=torch.int32, device=dev),
            members_host=torch.full((rows, self._per_tile), -1, dtype=torch.int32, pin_memory=pin),
            bitmask=bitmask.pin_memory() if pin else bitmask,
            bitmask_dev=torch.full_like(bitmask, -1, device=dev),
            out_host={
                k: torch.zeros(rows, dtype=d, pin_memory=pin)
                for k, d in (("tok", torch.long), ("lp", torch.float32), ("sampled", torch.bool))
            },
            cu_q=torch.arange(rows + 1, dtype=torch.int32, device=dev),
        )
        self._buckets[rows] = rb
        return rb

    def _model_state(self):
        """What a captured graph bakes in beside the weights: peft's active and disabled adapters."""
        layers = [m for m in self.model.modules() if hasattr(m, "lora_A")]
        if not layers:
            return None
        return tuple(layers[0].active_adapters), any(m.disable_adapters for m in layers)

    # -- the forward, the step and the pick ---------------------------------------------------

    @contextlib.contextmanager
    def pool_attention(self):
        """The model attends through the pool ("atlas_pool") for the block, then as before."""
        before = self.config._attn_implementation  # the base model's config (through peft)
        self.config._attn_implementation = POOL_ATTENTION
        try:
            yield
        finally:
            self.config._attn_implementation = before

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, layout: Layout, keep) -> torch.Tensor:
        """The model over one packed row of tokens; logits of the kept positions, [K, vocab]."""
        if self.fused is not None:
            return self.fused.forward(ids, positions, layout, keep)[:, : self.vocab_size]
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=self._masks,
            use_cache=False,
            logits_to_keep=keep,
            atlas_kv=layout,
        )
        return out.logits[0, :, : self.vocab_size].float()

    def _decode(self, rb: Rows) -> None:
        """One decode step of the bucket: rb.tok fed at the positions in rb.meta; rb.logits out."""
        m, r = rb.meta, rb.rows
        layout = Layout(
            pool=self.pool,
            write_at=m[WRITE, :r],
            cu_q=rb.cu_q,
            starts=m[START].to(torch.int32),
            used=m[USED, :r].to(torch.int32),
            max_q=1,
            max_k=self.pool.positions,
        )
        if self.flash and self.decode_attention == "split":
            layout.splits = split_attention.splits(r, self.pool.kv_heads, self.device)
            if self.share_prefixes and r >= self.share_min_rows:
                layout.pre, layout.members = m[PRE, :r].to(torch.int32), rb.members
                layout.prefix_splits = split_attention.splits(
                    max(r // self._per_tile, 1), self.pool.kv_heads, self.device
                )
        if not self.flash:
            starts, used, pre, lead = m[[START, USED, PRE, LEAD], :r].tolist()
            layout.rows = [
                (i, i + 1, s, u, at, n)
                for i, (s, u, at, n) in enumerate(zip(starts, used, lead, pre, strict=True))
            ]
        rb.logits.copy_(self._forward(rb.tok, m[POS, :r], layout, keep=0))

    def _pick(self, logits: torch.Tensor, bitmask: torch.Tensor, keys: torch.Tensor):
        """Tokens, their log-probs (0 where forced) and the sampled flags, all on the device: the
        temperature, the ban, the grammar's bitmask (bit t % 32 of word t // 32 set: allowed),
        log-softmax and the Gumbel-max draw, through atlas.runtime.split_pick's kernels or its
        torch spelling (compiled into a few fused kernels on a GPU)."""
        if self.split_pick:
            return pick_kernels.pick(
                logits, bitmask, keys, self._unbanned, self.temperature, self.constrained
            )
        return self._pick_torch_fn(logits, bitmask, keys)

    def _pick_torch(self, logits: torch.Tensor, bitmask: torch.Tensor, keys: torch.Tensor):
        return pick_kernels.pick_torch(
            logits,
            bitmask,
            keys,
            self._unbanned,
            self.temperature,
            self.constrained,
            self.top_p,
            self._places,
        )

    def _pick_into(self, rb: Rows) -> None:
        tokens, lp, sampled = self._pick(rb.logits, rb.bitmask_dev, rb.meta[KEY, : rb.rows])
        rb.tok.copy_(tokens)
        rb.lp.copy_(lp)
        rb.sampled.copy_(sampled)

    def _run(self, rb: Rows, fn) -> None:
        """fn(rb) eagerly, or its CUDA graph (captured on the bucket's first use with this pool)."""
        if not self.graphs:
            return fn(rb)
        name = fn.__name__
        if name not in rb.graphs:
            t = time.perf_counter()
            current, stream = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)
            stream.wait_stream(current)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                fn(rb)  # warm-up: lazy initialisation, workspaces, the pick's compile
                # Both functions only rewrite their outputs from their inputs: the warm-up's work is
                # the replay's. Other threads (graders, the device sampler) may use CUDA meanwhile.
                graph.capture_begin(pool=self._graph_pool, capture_error_mode="thread_local")
                try:
                    fn(rb)
                finally:
                    graph.capture_end()
            current.wait_stream(stream)
            rb.graphs[name] = graph
            self.captures += 1
            self._clock["graphs"] += 1
            self._clock["capture_s"] += time.perf_counter() - t
        rb.graphs[name].replay()

    # -- prompts ------------------------------------------------------------------------------

    def _prefill(
        self, prompts: Sequence[Sequence[int]], starts: np.ndarray, kept: np.ndarray
    ) -> tuple[torch.Tensor, list[list[int]]]:
        """Every prompt's tokens past its first `kept` (already in its segment), packed; a prompt
        asked by several rows with nothing kept is computed once and its keys and values written
        to each of those rows' segments. Returns the logits after each row's prompt, [rows, vocab],
        and the rows of each prompt so computed once (their segments hold the same keys)."""
        dev = self.device
        items: dict[tuple, list[int]] = {}  # (prompt, kept, row if kept) -> the rows it serves
        for i, p in enumerate(prompts):
            items.setdefault((tuple(p), int(kept[i]), i if kept[i] else None), []).append(i)
        batches, batch, tokens = [], [], 0
        for item in items:
            n = len(item[0]) - item[1]
            if batch and tokens + n > self.prefill_budget:
                batches.append(batch)
                batch, tokens = [], 0
            batch.append(item)
            tokens += n
        batches.append(batch)
        outs, serves = [], np.empty(len(prompts), dtype=np.int64)  # prompt i's logits: row serves[i]
        for batch in batches:
            new = [len(p) - k for p, k, _ in batch]  # tokens computed now
            self._clock["prefill_tokens"] += sum(new)
            cu = np.concatenate([[0], np.cumsum(new)])
            first = [items[item][0] for item in batch]
            write = np.concatenate(
                [starts[f] + np.arange(k, len(p)) for (p, k, _), f in zip(batch, first, strict=True)]
            )
            src, dst = [], []
            for k, (item, c0, n) in enumerate(zip(batch, cu, new, strict=False)):
                serves[items[item]] = sum(len(o) for o in outs) + k
                for row in items[item][1:]:  # the same prompt, nothing kept: the same keys
                    src.append(c0 + np.arange(n))
                    dst.append(starts[row] + np.arange(n))
            used = [len(p) for p, _, _ in batch]
            layout = Layout(
                pool=self.pool,
                write_at=to_device(write, dev),
                cu_q=to_device(cu, dev, torch.int32),
                starts=to_device([starts[f] for f in first] + [0], dev, torch.int32),
                used=to_device(used, dev, torch.int32),
                max_q=max(new),
                max_k=max(used),
                copy_src=to_device(np.concatenate(src), dev) if src else None,
                copy_dst=to_device(np.concatenate(dst), dev) if dst else None,
            )
            if not self.flash:
                layout.rows = [
                    (int(c), int(c + n), int(starts[f]), u)
                    for c, n, f, u in zip(cu, new, first, used, strict=False)
                ]
            ids = to_device([t for p, k, _ in batch for t in p[k:]], dev)
            positions = to_device(np.concatenate([np.arange(k, len(p)) for p, k, _ in batch]), dev)
            outs.append(self._forward(ids, positions, layout, keep=to_device(cu[1:] - 1, dev)))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        shared = [rows for (_, k, _), rows in items.items() if not k and len(rows) > 1]
        return out.index_select(0, to_device(serves, dev)), shared

    def _reuse(
        self, requests: Sequence[GenerationRequest], starts: np.ndarray
    ) -> tuple[np.ndarray, list[tuple[int, int] | None]]:
        """Move the keys and values these requests can reuse to their new segments: for each
        request, the tokens its cache_key's last request left, when its prompt begins with them
        (one token at least is left to compute: the first pick needs the prompt's last logits).
        What a key kept is given back either way. Returns the positions reused per request, and
        the prefix group (id, length) each reused request stays in, if its keys were in one."""
        kept = np.zeros(len(requests), dtype=np.int64)
        groups: list[tuple[int, int] | None] = [None] * len(requests)
        src, dst = [], []
        for i, r in enumerate(requests):
            old = self._kept.get(r.cache_key) if r.cache_key is not None else None
            if old is None:
                continue
            tokens, start = old
            n = len(tokens)
            if 0 < n < len(r.prompt_ids) and r.prompt_ids[:n] == tokens:
                kept[i] = n
                groups[i] = self._kept_groups.get(r.cache_key)  # its prefix lies within the n
                src.append(start + np.arange(n))
                dst.append(starts[i] + np.arange(n))
        if src:
            self.pool.move(np.concatenate(src), np.concatenate(dst))
        for r in requests:
            if r.cache_key is not None:
                self._forget(r.cache_key)  # copied out, or stale
        self._clock["reused_tokens"] += int(kept.sum())
        return kept, groups

    def _prefix_groups(
        self, requests: Sequence[GenerationRequest], shared: list[list[int]], groups: list
    ) -> list[tuple[int, int] | None]:
        """Each request's prefix group (id, prefix length): the requests of a prompt that the
        prefill computed once and copied to every one's segment (`shared`) hold its keys bit for
        bit, a new group; a request that reuses a grouped conversation's keys stays in its group
        (`groups`, from `_reuse`)."""
        out = list(groups)
        for rows in shared:
            for i in rows:
                out[i] = (self._groups, len(requests[i].prompt_ids))
            self._groups += 1
        return out

    # -- generation ---------------------------------------------------------------------------

    def _caps(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """Tokens each request may generate: its cap, or its grammar's hard bound when lower."""
        if not self.constrained:
            return [r.max_new_tokens for r in requests]
        return [min(r.max_new_tokens, r.grammar.token_bound) for r in requests]

    def segment_size(self, request: GenerationRequest) -> int:
        """Pool positions a request's segment takes: its prompt and its token cap."""
        return len(request.prompt_ids) + self._caps([request])[0]

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], on_finish: OnFinish | None = None
    ) -> list[Generation]:
        """Every request's generation, in request order (`serve` over a fixed list)."""
        feed = ListFeed(requests, on_finish)
        self.serve(feed)
        return feed.outs

    @torch.no_grad()
    def prepare(self, rows: int) -> None:
        """Pay the first serve's costs now, before any rollout's clock: on a GPU, a pool as large as
        the budget allows and, for every bucket up to the one of `rows`, its step and pick captured
        (the sampler and the attention kernels compiled on the way). A later serve of up to `rows`
        rows captures nothing while the pool holds (a larger pool, for a budget the first could not
        reach, captures again). Eagerly (a CPU) there is nothing to prepare."""
        if not self.graphs:
            return
        t = time.perf_counter()
        state = self._model_state()
        if state != self._state:
            self._drop_graphs()
            self._state = state
        budget = self.budget_positions()
        if self.pool is None or self.pool.positions < budget:
            self._new_pool(budget)
        self._clock = dict.fromkeys(("capture_s", "graphs"), 0)
        with self.pool_attention(), liger_rope(self.model):
            size = self.min_batch
            while True:
                rb = self._rows(size)
                h = rb.meta_host.numpy()  # every row empty: its scratch position
                h[:] = 0
                h[WRITE] = h[START] = self._scratch + np.arange(size + 1)
                h[USED] = 1
                rb.meta.copy_(rb.meta_host)
                rb.members.fill_(-1)
                rb.bitmask_dev.fill_(-1)
                self._run(rb, self._pick_into)
                self._run(rb, self._decode)
                if size >= min(bucket(rows, self.min_batch), self.max_rows):
                    break
                size *= 2
        torch.cuda.synchronize(self.device)
        self.last_timing = dict(self._clock, prepare_s=time.perf_counter() - t)

    @torch.no_grad()
    def serve(self, feed: Feed) -> None:
        """Generate what `feed` brings until it has no more, with continuous batching: a request
        that arrives while rows generate joins them at a step's boundary (after its prompt's
        prefill), and a row that ends leaves its place to the next."""
        state = self._model_state()
        if state != self._state:  # adapters switched on or off: graphs and kept keys are stale
            self._drop_graphs()
            for key in list(self._kept):
                self._forget(key)
            self._state = state
        self._clock = dict.fromkeys(CLOCK_SECONDS, 0.0) | dict.fromkeys(CLOCK_COUNTS, 0)
        self._clock["by_bucket"] = {}  # rows of a bucket -> (steps, seconds, GPU seconds)
        try:
            with self.pool_attention(), liger_rope(self.model):  # Liger's RoPE where the model has it
                _Run(self, feed).run()
        finally:
            self.last_timing = dict(self._clock)


class _Run:
    """One `serve`: the rows of the current bucket, the requests waiting to join, the steps."""

    def __init__(self, engine: StaticEngine, feed: Feed):
        self.e, self.feed = engine, feed
        self.rb: Rows | None = None
        self.live: list[_Live | None] = []  # per row of the bucket
        self.waiting: deque[tuple[object, GenerationRequest, int]] = deque()  # (tag, request, since)
        self.more = True
        self.step = 0
        # this step's prefix groups (`share`): rows, prefix lengths, where each reads its prefix;
        # made again after a row joins, ends or moves
        self.regroup, self.shared = True, None
        # (rows of the bucket, or 0 for an admission's prefill; CUDA events around its device work)
        self.spans: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def active(self) -> list[int]:
        return [j for j, row in enumerate(self.live) if row is not None]

    def run(self) -> None:
        try:
            self.loop()
        finally:
            self.gpu_time()

    def event(self) -> torch.cuda.Event | None:
        """A timing event recorded in the device's queue now (None off a GPU)."""
        if self.e.device.type != "cuda":
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def gpu_time(self) -> None:
        """Device seconds of every decode step (its pick and forward) and every admission's
        prefill, from their events, into the clock: what the GPU spent of the wall seconds."""
        if not self.spans:
            return
        self.spans[-1][2].synchronize()
        clock = self.e._clock
        for rows, ev0, ev1 in self.spans:
            seconds = ev0.elapsed_time(ev1) / 1000
            clock["gpu_s"] += seconds
            if rows:
                steps, wall, gpu = clock["by_bucket"].get(rows, (0, 0.0, 0.0))  # a step cut short: none
                clock["by_bucket"][rows] = (steps, wall, gpu + seconds)
            else:
                clock["prefill_gpu_s"] += seconds
        self.spans = []

    def poll(self, block: bool = False) -> None:
        t = time.perf_counter()
        self.arrive(self.feed.poll(block=block))
        self.e._clock["idle_s" if block else "feed_s"] += time.perf_counter() - t

    def loop(self) -> None:
        e = self.e
        while True:
            rows = self.active
            self.poll()
            if not rows and not self.waiting and self.more:
                self.poll(block=True)  # nothing to generate until the feed brings more
                if not self.waiting and self.more:  # a blocking poll brought nothing, yet more is due
                    raise RuntimeError(f"{type(self.feed).__name__}: more requests due, none in flight")
            if not rows and not self.waiting:
                if not self.more:
                    return
                continue
            if self.waiting and len(rows) < e.max_rows and self.admit_now(len(rows)):
                self.admit()
                rows = self.active
                if not rows:  # nothing generates, so nothing will give positions back
                    tag, request, _ = self.waiting[0]
                    raise RuntimeError(
                        f"request {tag!r} needs {e.segment_size(request)} key/value positions; the "
                        f"pool holds {e.pool.positions} (cache_bytes {e.cache_bytes}), "
                        f"{e.segments.largest} of them free in one run"
                    )
            if not rows:
                continue
            if e.shrink and (small := bucket(len(rows), e.min_batch)) < self.rb.rows:
                self.rebucket(small)
                e._clock["shrinks"] += 1
            self.decode_step()

    def arrive(self, arrivals) -> None:
        e = self.e
        e.forget(arrivals.ended)
        budget = e.budget_positions()
        for tag, request in arrivals.requests:
            size = e.segment_size(request)
            if budget is not None and size + e.max_rows + 1 > budget:
                need = size + e.max_rows + 1
                raise RuntimeError(
                    f"one request needs {need} key/value positions ({need * e.position_bytes} bytes "
                    f"with the scratch rows), past the engine's cache_bytes ({e.cache_bytes})"
                )
            if e.fused is not None and size > e.fused.positions:
                raise RuntimeError(
                    f"one request reaches position {size} (its prompt and token cap), past the "
                    f"model's max_position_embeddings ({e.fused.positions})"
                )
            self.waiting.append((tag, request, self.step))
        self.more = arrivals.more

    def admit_now(self, rows: int) -> bool:
        """Whether the waiting requests join now (a prefill) or gather a while longer."""
        e = self.e
        return (
            not rows
            or len(self.waiting) >= e.admit_share * rows
            or self.step - self.waiting[0][2] >= e.admit_wait
        )

    def admit(self) -> None:
        """As many waiting requests as rows and positions allow, oldest first: segments placed,
        kept keys reused, the prompts prefilled, and their first logits in rows of the bucket."""
        e = self.e
        t = time.perf_counter()
        want = sum(e.segment_size(r) for _, r, _ in self.waiting)
        if e.pool is None:
            e._new_pool(want)
        elif not self.active and e.pool.positions - e._scratch_rows < want:
            # Nothing is live and the pool cannot hold all that waits: size it for them now (a
            # pool too small for the batch, say a warm-up's, would otherwise hold while rows run,
            # since with rows live it grows only while both pools fit the budget). Kept keys are
            # copied over where both pools fit the budget, else they go.
            e._grow_pool(want, live=True) or e._grow_pool(want, live=False)
        room = e.max_rows - len(self.active)
        # Kept keys only save prefill: any may go to place a request, but those of the requests
        # placed here (copied once all are placed) and, while others can, of this one.
        picked, keep = [], set()
        while self.waiting and len(picked) < room:
            tag, request, _ = self.waiting[0]
            size = e.segment_size(request)
            live = bool(picked or self.active)
            own = {request.cache_key} - {None}
            compact = lambda picked=picked: self.compact(picked)  # noqa: E731
            start = e._place(size, want, keep | own, live, compact)
            if start is None and own:
                start = e._place(size, want, keep, live, compact)
            if start is None:
                break
            self.waiting.popleft()
            picked.append([tag, request, start, size])
            keep |= own
            want -= size
        if not picked:
            return
        self.regroup = True
        requests = [r for _, r, _, _ in picked]
        starts = np.array([start for _, _, start, _ in picked], dtype=np.int64)
        ev0 = self.event()
        kept, groups = e._reuse(requests, starts)
        first, shared = e._prefill([r.prompt_ids for r in requests], starts, kept)
        groups = e._prefix_groups(requests, shared, groups)
        rows = len(self.active) + len(picked)
        if self.rb is None or rows > self.rb.rows:
            self.rebucket(bucket(rows, e.min_batch))
        free = [j for j, row in enumerate(self.live) if row is None][: len(picked)]
        self.rb.logits.index_copy_(0, to_device(free, e.device), first)
        if ev0 is not None:
            self.spans.append((0, ev0, self.event()))
        caps = e._caps(requests)
        for j, (tag, request, start, size), cap, group in zip(free, picked, caps, groups, strict=True):
            self.live[j] = _Live(
                tag=tag,
                request=request,
                gen=Generation(),
                matcher=xgr.GrammarMatcher(request.grammar.grammar),
                key=seed_key(request.seed),
                cap=cap,
                start=start,
                size=size,
                length=len(request.prompt_ids),
                group=group,
            )
        share = (time.perf_counter() - t) / len(picked)
        for j in free:
            self.live[j].gen.engine_s += share
        e._clock["admissions"] += 1
        e._clock["prefill_s"] += time.perf_counter() - t

    def compact(self, placed: Sequence[list] = ()) -> None:
        """Move every taken segment (the scratch rows, the live rows', the kept keys', and those
        `placed` for the admission under way, [tag, request, start, size]) to the front of the
        pool, in order, so that the free positions are one run at its end. Only the positions
        that hold keys move; the rows' starts (written to the step's buffer every step) and the
        kept keys' follow."""
        e = self.e
        self.regroup = True  # the rows' starts move
        held = [(e._scratch, e._scratch_rows, e._scratch_rows, None)]  # (start, size, keys held, owner)
        held += [(row.start, row.size, row.length, row) for row in self.live if row is not None]
        held += [(start, len(tokens), len(tokens), key) for key, (tokens, start) in e._kept.items()]
        held += [(p[2], p[3], 0, p) for p in placed]  # nothing written there yet
        held.sort(key=lambda h: h[0])
        src, dst, at = [], [], 0
        for start, size, keys, owner in held:
            if start != at:
                src.append(np.arange(start, start + keys))
                dst.append(np.arange(at, at + keys))
            if owner is None:
                e._scratch = at
            elif isinstance(owner, _Live):
                owner.start = at
            elif isinstance(owner, list):
                owner[2] = at
            else:
                e._kept[owner] = (e._kept[owner][0], at)
            at += size
        if src:
            e.pool.move(np.concatenate(src), np.concatenate(dst))
        e.segments = Segments(e.pool.positions)
        e.segments.take(at)
        e._clock["compactions"] += 1

    def rebucket(self, rows: int) -> None:
        """Move the live rows to the front of a bucket of `rows`: only their logits move (their
        keys stay where they are in the pool)."""
        e, old = self.e, self.rb
        self.regroup = True
        rb = e._rows(rows)
        live = [row for row in self.live if row is not None]
        if old is not None and live:
            rb.logits[: len(live)] = old.logits.index_select(0, to_device(self.active, e.device))
        rb.logits[len(live) :] = 0.0
        rb.bitmask.fill_(-1)
        self.rb, self.live = rb, live + [None] * (rows - len(live))

    def decode_step(self) -> None:
        """One token for every live row: masks, the pick and the next forward (both replayed
        graphs on a GPU), the tokens accepted, and the rows that end handed to the feed."""
        e, rb, clock = self.e, self.rb, self.e._clock
        pin = e.device.type == "cuda"
        rows = self.active
        lives = [self.live[j] for j in rows]
        t0 = time.perf_counter()
        if e.constrained:  # the masks for this step; the forward that made the logits ran meanwhile
            e.batch_matcher.batch_fill_next_token_bitmask(
                [row.matcher for row in lives], rb.bitmask, indices=rows
            )
            rb.bitmask_dev.copy_(rb.bitmask, non_blocking=pin)
        mask_s = time.perf_counter() - t0
        clock["fill_s"] += mask_s
        for j, row in zip(rows, lives, strict=True):  # scripted boundary cases only
            if row.request.bias is not None and (b := row.request.bias(row.gen.token_ids)) is not None:
                rb.logits[j] += b[: e.vocab_size].to(e.device)
        # This step's sampling keys (a row's own token count), and where the tokens go when fed.
        at = np.asarray(rows)
        starts = np.array([row.start for row in lives], dtype=np.int64)
        lengths = np.array([row.length for row in lives], dtype=np.int64)
        counts = np.array([len(row.gen.token_ids) for row in lives], dtype=np.int64)
        h = rb.meta_host.numpy()
        h[:] = 0
        h[WRITE] = h[START] = e._scratch + np.arange(rb.rows + 1)  # empty and padding rows
        h[USED] = 1
        h[POS, at] = lengths
        h[WRITE, at] = starts + lengths
        h[START, at] = starts
        h[USED, at] = lengths + 1
        h[KEY, at] = step_keys(np.array([row.key for row in lives], dtype=np.int64), counts)
        h[LEAD] = h[START]
        self.share(rows, lives, starts, h)
        rb.meta.copy_(rb.meta_host, non_blocking=pin)
        rb.members.copy_(rb.members_host, non_blocking=pin)
        ev0 = self.event()
        e._run(rb, e._pick_into)
        for k, v in rb.out_host.items():
            v.copy_(getattr(rb, k), non_blocking=pin)
        if pin:
            copied = torch.cuda.Event()
            copied.record()
        # The next forward goes in the queue before the CPU waits for this step's tokens; it is
        # not needed when every row takes its last token now.
        fed = any(len(row.gen.token_ids) + 1 < row.cap for row in lives)
        if fed:
            e._run(rb, e._decode)
        if pin:
            self.spans.append((rb.rows, ev0, self.event()))
        t1 = time.perf_counter()
        if pin:
            copied.synchronize()
        t2 = time.perf_counter()
        clock["launch_s"] += t1 - t0 - mask_s
        clock["wait_s"] += t2 - t1

        toks, lps, flags = (rb.out_host[k].tolist() for k in ("tok", "lp", "sampled"))
        if e.constrained:
            accepted = e.batch_matcher.batch_accept_token(
                [row.matcher for row in lives], [toks[j] for j in rows]
            )
            if not all(accepted):
                j = rows[accepted.index(False)]
                raise RuntimeError(
                    f"grammar rejected token {toks[j]} it had allowed "
                    f"(request {self.live[j].tag!r}, token {len(self.live[j].gen.token_ids)})"
                )
        ended = []
        for j, row in zip(rows, lives, strict=True):
            g, tok = row.gen, toks[j]
            g.mask_s += mask_s / len(rows)
            g.token_ids.append(tok)
            g.logprobs.append(lps[j])
            g.sampled.append(int(flags[j]))
            if fed:
                row.length += 1  # the token just fed holds its keys now
            if tok in e.stop_token_ids and (not e.constrained or row.matcher.is_terminated()):
                g.finish_reason = "stop"
            elif len(g.token_ids) >= row.cap:
                g.finish_reason = "length"
            else:
                continue
            ended.append(j)
        self.step += 1
        clock["steps"] += 1
        clock["rows"] += len(rows)
        spent = time.perf_counter() - t0
        steps, seconds, gpu = clock["by_bucket"].get(rb.rows, (0, 0.0, 0.0))
        clock["by_bucket"][rb.rows] = (steps + 1, seconds + spent, gpu)
        share = spent / len(rows)
        for row in lives:
            row.gen.engine_s += share
        feed = sum(self.end(j) for j in ended)
        clock["host_s"] += time.perf_counter() - t2 - feed

    def share(self, rows: list[int], lives: list, starts: np.ndarray, h: np.ndarray) -> None:
        """This step's prefix groups: the live rows of each group (in row order), in tiles of up
        to `members_per_tile`, the first of a tile its leader. A tile's rows read their prefix
        from the leader's segment (PRE, LEAD), and the leader's row of the members table lists
        them. A row alone in its tile reads its own keys."""
        e, rb = self.e, self.rb
        if not self.regroup:  # no row joined, ended or moved since the last step: the same groups
            at, pre, lead = self.shared
            h[PRE, at], h[LEAD, at] = pre, lead
            e._clock["shared_rows"] += len(at)
            return
        self.regroup, self.shared = False, (np.empty(0, np.int64),) * 3
        members = rb.members_host.numpy()
        members[:] = -1
        if not e.share_prefixes or rb.rows < e.share_min_rows or (e.flash and e.decode_attention != "split"):
            return  # FlashAttention-2's decode step reads each row's own copy
        n, tile = len(rows), e._per_tile
        group = np.fromiter((-1 if r.group is None else r.group[0] for r in lives), np.int64, n)
        if (group < 0).all():
            return
        pre = np.fromiter((0 if r.group is None else r.group[1] for r in lives), np.int64, n)
        order = np.argsort(group, kind="stable")  # each group's rows together, in row order
        g = group[order]
        first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # where each group begins
        rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))  # place in its group
        lead = np.arange(n) - rank % tile  # its tile's first, in `order`
        on = (g >= 0) & (np.bincount(lead, minlength=n)[lead] > 1)  # in a group, not alone
        at, by = np.asarray(rows)[order][on], order[lead][on]
        self.shared = at, pre[order][on], starts[by]
        h[PRE, at], h[LEAD, at] = self.shared[1:]
        members[np.asarray(rows)[by], (rank % tile)[on]] = at
        e._clock["shared_rows"] += len(at)

    def end(self, j: int) -> float:
        """Row j is done: what its conversation may continue from stays in the pool (the rest of
        its segment is given back), and the generation goes to the feed. Returns the seconds the
        feed took (its `finished`)."""
        e, row = self.e, self.live[j]
        self.live[j] = None
        self.regroup = True
        self.rb.bitmask[j] = -1  # an empty row: anything goes; its tokens are never read
        key = row.request.cache_key
        held = row.length - len(row.request.prompt_ids)  # generated tokens whose keys are held
        if key is not None:
            e._forget(key)
            e._kept[key] = ((row.request.prompt_ids + row.gen.token_ids[:held]), row.start)
            if row.group is not None:
                e._kept_groups[key] = row.group
            e.segments.give(row.start + row.length, row.size - row.length)
        else:
            e.segments.give(row.start, row.size)
        t = time.perf_counter()
        self.feed.finished(row.tag, row.gen)
        seconds = time.perf_counter() - t
        e._clock["feed_s"] += seconds
        return seconds


@dataclass
class _Live:
    """A request generating in a row of the bucket."""

    tag: object
    request: GenerationRequest
    gen: Generation
    matcher: object  # its xgrammar GrammarMatcher
    key: int  # seed_key(request.seed)
    cap: int  # tokens it may generate
    start: int  # its segment: [start, start + size) of the pool
    size: int
    length: int  # positions of its segment holding keys
    group: tuple[int, int] | None = None  # its prefix group: (id, positions shared)
