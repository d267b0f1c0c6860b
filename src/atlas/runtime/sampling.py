"""Seeded sampling shared by the rollout engines: Gumbel-max over counter-based noise.

A row's next token is argmax(log p + g), g = -log(-log u), where u is a hash of (the request's
seed, the step, the token id). That samples exactly from p, vectorised over the whole batch on
any device, and the noise is integer arithmetic: the same on CPU and GPU, and independent of
the row's batch mates. So two engines with the same log-probs draw the same tokens, which is what
lets the GPU engine be checked against the CPU one token by token.

The hash keeps every value below 2**32 inside int64 (products split into 16-bit halves), so no
signed overflow happens on any backend.
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor | int, c: int):
    """(h * c) mod 2**32 for 0 <= h, c < 2**32, without a product above 2**49."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & M32


def _fmix32(h):
    """murmur3's finaliser: a bijection of 32-bit values that mixes every bit into every bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def seed_key(seed: int) -> int:
    """A 32-bit key from a request's seed of any size: every 32-bit word folded in."""
    h = 0x9E3779B9
    while True:
        h = _fmix32(h ^ (seed & M32))
        seed >>= 32
        if seed == 0:
            return h


def step_keys(seed_keys, step: int):
    """The rows' noise keys at one step: ints or an int64 tensor of seed keys (vectorised)."""
    return _fmix32(seed_keys ^ _fmix32((step + 0x632BE5AB) & M32))


def row_key(seed: int, step: int) -> int:
    return step_keys(seed_key(seed), step)


def gumbel(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise [rows, vocab] (float32) from int64 row keys, on the keys' device."""
    tokens = _mul32(torch.arange(vocab, device=keys.device, dtype=torch.int64), 0x9E3779B1)
    h = _fmix32(_fmix32(keys[:, None] ^ tokens[None, :]) ^ keys[:, None])
    return -torch.log(-torch.log(uniform(h)))


def uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes to float32 in (0, 1), never 0 or 1. 23 bits plus a half fit float32's 24-bit
    significand exactly; with 24 bits, (2**24 - 1) + 0.5 rounds to 2**24, u to 1.0 and the noise
    to +inf: a disallowed (-inf) token then scores NaN, and argmax picks it. That happened about
    once per 100 rows and steps at a 151,936-token vocabulary."""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def top_p_keep(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool [rows, vocab]: the smallest set of tokens per row whose mass reaches top_p."""
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    keep_sorted = probs.cumsum(-1) - probs < top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample(logp: torch.Tensor, keys: torch.Tensor, top_p: float = 1.0) -> torch.Tensor:
    """Token ids [rows] drawn from the rows of `logp` (log-probs, -inf where not allowed)."""
    scores = logp + gumbel(keys, logp.shape[-1])
    if top_p < 1.0:
        scores = scores.masked_fill(~top_p_keep(logp, top_p), float("-inf"))
    return scores.argmax(-1)


def draw(logits: torch.Tensor, keys: torch.Tensor, top_p: float = 1.0):
    """One token per row from masked logits (-inf: not allowed). Returns the tokens, their
    log-probs under the masked distribution, and the sampled flags. A row whose grammar leaves
    one token is forced: nothing was chosen, so its flag is False and its log-prob 0."""
    logp = torch.log_softmax(logits, dim=-1)
    sampled = torch.isfinite(logp).sum(-1) > 1
    tokens = sample(logp, keys, top_p)
    chosen = logp.gather(-1, tokens[:, None])[:, 0]
    return tokens, torch.where(sampled, chosen, torch.zeros_like(chosen)), sampled


def keys_for(seeds: list[int], step: int, device) -> torch.Tensor:
    return step_keys(torch.tensor([seed_key(s) for s in seeds], dtype=torch.int64, device=device), step)
