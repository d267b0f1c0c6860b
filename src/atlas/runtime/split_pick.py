"""The decode step's pick in Triton kernels split along the vocabulary: each row's next token,
its log-prob and whether it was sampled, from the step's logits, the grammar's bitmask and the
rows' noise keys; what `pick_torch` computes (temperature, the grammar's and the ban's mask,
log-softmax, atlas.runtime.sampling's Gumbel-max draw), with top_p 1. `StaticEngine(split_pick=True)`
picks through it, where atlas.runtime.decode_attention's kernels run.

    row r, chunk c   the chunk's maximum and sum of exp over its allowed tokens
    row r, chunk c   the row's log-normaliser from its chunks' partials; the chunk's best
                     log-prob + noise, its token, and its count of allowed tokens
    row r            the best of the row's chunks: the token, its log-prob, sampled if the row
                     allowed more than one token (a forced row's log-prob is 0)

Why not the compiled torch spelling: compiled once for any number of rows, its reductions over
the 151,936-token vocabulary run one program a row, so a step of 8 rows leaves the GPU mostly
idle, and its hash computes in int64 (products split in 16-bit halves). Here a row's vocabulary
is spread over `chunks` programs and the hash is uint32 arithmetic, which wraps as the hash
needs. Every value is the torch spelling's up to float32 rounding: the log-normaliser sums its
chunks' partials, so a token's log-prob may differ in its last bits, and a draw can differ only
where two tokens' scores tie to those bits.
"""

from __future__ import annotations

import torch

from atlas.runtime.sampling import draw

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install: the torch spelling runs
    triton = None

BLOCK = 2048  # tokens a program of the first two kernels reads


def bit_places(vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where token t's bit lives in a grammar bitmask's row: word t // 32, bit t % 32."""
    tokens = torch.arange(vocab, device=device)
    return tokens // 32, (tokens % 32).to(torch.int32)


def pick_torch(
    logits, bitmask, keys, unbanned, temperature: float, constrained: bool, top_p: float = 1.0, places=None
):
    """`pick` in torch, for any top_p: the engine's pick (compiled on a GPU) unless it is made with
    split_pick=True, and the kernels' reference in the tests. `places`: bit_places of the
    vocabulary, made once by a caller that picks often."""
    logits = logits / temperature
    if constrained:
        word, bit = places if places is not None else bit_places(logits.shape[-1], logits.device)
        allowed_bits = (bitmask[:, word] >> bit) & 1
        logits = torch.where((allowed_bits == 1) & unbanned, logits, float("-inf"))
    return draw(logits, keys, top_p)


if triton is not None:

    @triton.jit
    def _fmix32(h):
        h = h ^ (h >> 16)
        h = h * 0x85EBCA6B
        h = h ^ (h >> 13)
        h = h * 0xC2B2AE35
        return h ^ (h >> 16)

    @triton.jit
    def _masked(logits, bitmask, unbanned, row, cols, vocab, temperature, CONSTRAINED: tl.constexpr):
        """The row's logits at `cols` over the temperature; -inf where not allowed."""
        inside = cols < vocab
        x = tl.load(logits + row * vocab + cols, mask=inside, other=0.0) / temperature
        keep = inside
        if CONSTRAINED:
            words = tl.load(bitmask + row * ((vocab + 31) // 32) + cols // 32, mask=inside, other=0)
            bits = (words >> (cols % 32)) & 1
            unban = tl.load(unbanned + cols, mask=inside, other=0)
            keep = keep & (bits == 1) & (unban != 0)
        return tl.where(keep, x, float("-inf"))

    @triton.jit
    def _stats_kernel(
        logits, bitmask, unbanned, chunk_max, chunk_sum, vocab, temperature,
        CHUNKS: tl.constexpr, CONSTRAINED: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = _masked(logits, bitmask, unbanned, row, cols, vocab, temperature, CONSTRAINED)
        m = tl.max(x, 0)
        safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(chunk_max + row * CHUNKS + c, m)
        tl.store(chunk_sum + row * CHUNKS + c, tl.sum(tl.exp(x - safe), 0))

    @triton.jit
    def _normaliser(chunk_max, chunk_sum, row, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
        """The row's maximum and sum of exp(x - maximum), from its chunks' partials."""
        k = tl.arange(0, CHUNKS_P2)
        m = tl.load(chunk_max + row * CHUNKS + k, mask=k < CHUNKS, other=float("-inf"))
        s = tl.load(chunk_sum + row * CHUNKS + k, mask=k < CHUNKS, other=0.0)
        top = tl.max(m, 0)
        return top, tl.sum(s * tl.exp(m - top), 0)  # a chunk of no allowed token: 0 * 0

    @triton.jit
    def _draw_kernel(
        logits, bitmask, unbanned, keys, chunk_max, chunk_sum, chunk_score, chunk_token,
        chunk_count, vocab, temperature,
        CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, CONSTRAINED: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
        top, total = _normaliser(chunk_max, chunk_sum, row, CHUNKS, CHUNKS_P2)
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = _masked(logits, bitmask, unbanned, row, cols, vocab, temperature, CONSTRAINED)
        logp = (x - top) - tl.log(total)
        # atlas.runtime.sampling.gumbel: the row's key hashed with the token's
        key = tl.load(keys + row).to(tl.uint32)
        h = _fmix32(_fmix32(key ^ (cols.to(tl.uint32) * 0x9E3779B1)) ^ key)
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        score = logp - tl.log(-tl.log(u))
        best = tl.argmax(score, 0, tie_break_left=True)
        tl.store(chunk_score + row * CHUNKS + c, tl.max(score, 0))
        tl.store(chunk_token + row * CHUNKS + c, c * BLOCK + best)
        tl.store(chunk_count + row * CHUNKS + c, tl.sum((x > float("-inf")).to(tl.int32), 0))

    @triton.jit
    def _finish_kernel(
        logits, chunk_max, chunk_sum, chunk_score, chunk_token, chunk_count, tokens, logprobs,
        sampled, vocab, temperature, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, CHUNKS_P2)
        score = tl.load(chunk_score + row * CHUNKS + k, mask=k < CHUNKS, other=float("-inf"))
        token = tl.load(chunk_token + row * CHUNKS + tl.argmax(score, 0, tie_break_left=True))
        count = tl.sum(tl.load(chunk_count + row * CHUNKS + k, mask=k < CHUNKS, other=0), 0)
        top, total = _normaliser(chunk_max, chunk_sum, row, CHUNKS, CHUNKS_P2)
        logp = (tl.load(logits + row * vocab + token) / temperature - top) - tl.log(total)
        tl.store(tokens + row, token.to(tl.int64))
        tl.store(logprobs + row, tl.where(count > 1, logp, 0.0))
        tl.store(sampled + row, count > 1)


def pick(logits, bitmask, keys, unbanned, temperature: float, constrained: bool, block: int | None = None):
    """Tokens [rows] (int64), their log-probs (float32, 0 where forced) and the sampled flags
    (bool) from float32 logits [rows, vocab], the grammar's int32 bitmask [rows, ceil(vocab / 32)]
    (bit t % 32 of word t // 32 set: allowed; read only when `constrained`), int64 noise keys
    [rows] and the bool `unbanned` [vocab]; `block` tokens a program (BLOCK). Shapes depend on the
    rows alone, so a CUDA graph can hold the call."""
    rows, vocab = logits.shape
    words = (vocab + 31) // 32
    if not (logits.is_contiguous() and keys.is_contiguous() and bitmask.is_contiguous()):
        raise ValueError("split pick: logits, bitmask and keys must be contiguous")
    if (
        tuple(bitmask.shape) != (rows, words)
        or tuple(keys.shape) != (rows,)
        or tuple(unbanned.shape) != (vocab,)
    ):
        raise ValueError(
            f"split pick: logits {tuple(logits.shape)} need a bitmask [{rows}, {words}], keys [{rows}] and "
            f"unbanned [{vocab}] (got {tuple(bitmask.shape)}, {tuple(keys.shape)}, {tuple(unbanned.shape)})"
        )
    block = block or BLOCK
    chunks = triton.cdiv(vocab, block)
    p2 = triton.next_power_of_2(chunks)
    dev = logits.device
    part_max, part_sum, score = (torch.empty(rows, chunks, device=dev) for _ in range(3))
    token = torch.empty(rows, chunks, dtype=torch.int32, device=dev)
    count = torch.empty(rows, chunks, dtype=torch.int32, device=dev)
    tokens = torch.empty(rows, dtype=torch.int64, device=dev)
    logprobs = torch.empty(rows, dtype=torch.float32, device=dev)
    flags = torch.empty(rows, dtype=torch.bool, device=dev)
    grid = (rows, chunks)
    common = dict(CHUNKS=chunks, CONSTRAINED=constrained, BLOCK=block, num_warps=8)
    _stats_kernel[grid](logits, bitmask, unbanned, part_max, part_sum, vocab, temperature, **common)
    _draw_kernel[grid](
        logits, bitmask, unbanned, keys, part_max, part_sum, score, token, count, vocab,
        temperature, CHUNKS_P2=p2, **common,
    )  # fmt: skip
    _finish_kernel[(rows,)](
        logits, part_max, part_sum, score, token, count, tokens, logprobs, flags, vocab,
        temperature, CHUNKS=chunks, CHUNKS_P2=p2, num_warps=1,
    )  # fmt: skip
    return tokens, logprobs, flags
