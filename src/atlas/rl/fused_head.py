"""Token log-probs straight from final hidden states, without the vocab x tokens logits.

    lp, ent = head_logprobs(hidden, lm_head_weight, targets, bitmask, temperature)

The plain path (atlas.rl.replay.masked_logprobs) takes the model's logits [n, V], upcasts them to
float32, masks and log-softmaxes them: at the report's sizes (a 151,936-token vocabulary, thousands
of positions) that is gigabytes per micro-batch, kept alive for the backward pass. Here the head's
matmul, the grammar mask, the temperature and the log-softmax run over `chunk` positions at a
time, and only two floats per position are kept (the log-sum-exp and, if asked, the entropy). The
backward pass recomputes each chunk's logits and turns them straight into the gradient of the
hidden states (and of the head weight, if it requires one), so peak memory is one chunk's logits.

Numerically it is the plain path: logits in the head's dtype (bf16 on a GPU, as the model's own
lm_head gives them), then float32: z = logits / temperature, z = -inf where the grammar's
bitmask forbids a token, lp = z[target] - logsumexp(z). The entropy is that of the same masked,
tempered distribution, H = logsumexp(z) - sum(p * z) over the allowed tokens (the plain PPO loss
takes the entropy of the raw logits instead; this one is what the policy actually samples from).

The bitmask is xgrammar's layout: int32 words, bit j of word w allows token 32w + j; bits past
the weight's vocabulary are ignored, tokens past the bitmask's are forbidden. Torch only.
"""

from __future__ import annotations

import sys

import torch

DEFAULT_CHUNK = 1024


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, W] int32 words -> [n, vocab] bool, token 32w + j allowed iff bit j of word w is set."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be [n, words] int32, got {bitmask.dtype} {tuple(bitmask.shape)}")
    n, words = bitmask.shape
    if sys.byteorder == "little":  # byte k of word w holds tokens 32w + 8k ... 32w + 8k + 7
        b = bitmask.contiguous().view(torch.uint8)
        shifts = torch.arange(8, device=b.device, dtype=torch.uint8)
        bits = ((b.unsqueeze(-1) >> shifts) & 1).view(n, words * 32)
    else:
        shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
        bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(n, words * 32)
    allowed = torch.zeros(n, vocab, dtype=torch.bool, device=bitmask.device)
    k = min(vocab, words * 32)
    allowed[:, :k] = bits[:, :k].bool()
    return allowed


def _chunk_scores(h, weight, bitmask, temperature):
    """float32 tempered, masked scores z [c, V] of one chunk, and the allowed mask (or None)."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        z = (h.to(weight.dtype) @ weight.t()).float()
    if temperature != 1.0:
        z = z / temperature
    allowed = None
    if bitmask is not None:
        allowed = unpack_bitmask(bitmask, z.shape[-1])
        z.masked_fill_(~allowed, float("-inf"))
    return z, allowed


def _probs(z, lse, allowed):
    """p and log p of one chunk; log p is set to 0 where a token is forbidden (p = 0 there, and
    -inf would turn p * log p into NaN)."""
    logp = z - lse[:, None]
    p = logp.exp()
    return p, (logp if allowed is None else logp.masked_fill_(~allowed, 0.0))


class _FusedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, bitmask, temperature: float, chunk: int, want_entropy: bool):
        n = hidden.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if want_entropy else None
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            z, allowed = _chunk_scores(
                hidden[a:b], weight, None if bitmask is None else bitmask[a:b], temperature
            )
            lse[a:b] = torch.logsumexp(z, dim=-1)
            lp[a:b] = z.gather(-1, targets[a:b, None]).squeeze(-1) - lse[a:b]
            if want_entropy:  # -sum p log p, with log p = 0 (not -inf) where p = 0
                p, logp = _probs(z, lse[a:b], allowed)
                ent[a:b] = -(p * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, bitmask, lse, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
        if not want_entropy:
            ent = torch.zeros(0, device=hidden.device)
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, targets, bitmask, lse, ent = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        d_hidden = torch.empty_like(hidden) if want_h else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        use_ent = ent is not None and g_ent is not None and g_ent.numel() > 0
        n, chunk = hidden.shape[0], ctx.chunk
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            z, allowed = _chunk_scores(
                hidden[a:b], weight, None if bitmask is None else bitmask[a:b], ctx.temperature
            )
            p, logp = _probs(z, lse[a:b], allowed)
            # d lp / dz = onehot(target) - p
            gz = p * (-g_lp[a:b, None].float())
            gz.scatter_add_(-1, targets[a:b, None], g_lp[a:b, None].float())
            if use_ent:  # d H / dz_k = -p_k (log p_k + H)
                gz -= g_ent[a:b, None].float() * p * (logp + ent[a:b, None])
            if ctx.temperature != 1.0:
                gz = gz / ctx.temperature
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                gz = gz.to(weight.dtype)
                if want_h:
                    d_hidden[a:b] = (gz @ weight).to(hidden.dtype)
                if want_w:
                    d_weight += (gz.t() @ hidden[a:b].to(weight.dtype)).float()
        if want_w:
            d_weight = d_weight.to(weight.dtype)
        return d_hidden, d_weight, None, None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bitmask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk: int = DEFAULT_CHUNK,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) [n] (float32) and, with entropy=True, the entropy [n] of the masked, tempered
    distribution, from hidden states [n, H] before each target and the head weight [V, H].

    Differentiable in `hidden` and `weight` (only where they require grad)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [n, H] and weight [V, H] expected, got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets: expected shape {tuple(hidden.shape[:1])}, got {tuple(targets.shape)}")
    if bitmask is not None and bitmask.shape[0] != hidden.shape[0]:
        raise ValueError(f"bitmask: expected {hidden.shape[0]} rows, got {bitmask.shape[0]}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    bitmask = None if bitmask is None else bitmask.to(hidden.device)
    lp, ent = _FusedHead.apply(
        hidden, weight, targets.to(hidden.device), bitmask, temperature, chunk, entropy
    )
    return lp, (ent if entropy else None)


def packed_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    packed,
    masks,
    temperature: float,
    chunk: int = DEFAULT_CHUNK,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, T] log-probs of every generated token under its replayed mask (0 elsewhere), as
    atlas.rl.ppo.token_logprobs gives them, from the packed final hidden states [1, N, H].

    `packed` is the atlas.rl.packing.Packed of the batch; `masks` one object per row with
    `positions` (the row's generated token indices) and `bitmask` (their masks), such as
    atlas.rl.replay.ReplayedMasks. With entropy=True also [B, T] entropies of the raw next-token
    distribution before each generated token (no mask, temperature 1: the PPO loss's entropy
    bonus, as atlas.rl.ppo takes it from full logits), from a second pass of the chunked head."""
    h, at, ids = _generated(hidden, packed, masks)
    before, targets = h[at - 1], ids[at]
    lp, _ = head_logprobs(before, weight, targets, _bitmasks(masks, h.device), temperature, chunk)
    if not entropy:
        return _unpacked(packed, at, lp), None
    _, ent = head_logprobs(before, weight, targets, None, 1.0, chunk, entropy=True)
    return _unpacked(packed, at, lp), _unpacked(packed, at, ent)


def packed_old_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, packed, masks, temperature: float, chunk: int = DEFAULT_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] log-probs of the generated tokens under their masks, as packed_token_logprobs gives
    them, and over the whole vocabulary (no grammar mask, at `temperature`: what a trainer that
    ignores the grammar computes; atlas.rl.drift), from one set of packed hidden states."""
    h, at, ids = _generated(hidden, packed, masks)
    before, targets = h[at - 1], ids[at]
    masked, _ = head_logprobs(before, weight, targets, _bitmasks(masks, h.device), temperature, chunk)
    raw, _ = head_logprobs(before, weight, targets, None, temperature, chunk)
    return _unpacked(packed, at, masked), _unpacked(packed, at, raw)


def _generated(hidden: torch.Tensor, packed, masks):
    """The packed hidden states [N, H], the packed index of every generated token and the packed
    token ids, on the hidden states' device."""
    h = hidden[0] if hidden.dim() == 3 else hidden
    if len(masks) != len(packed.lengths):
        raise ValueError(f"{len(masks)} masks for {len(packed.lengths)} packed rows")
    where = []
    for row, (m, start) in enumerate(zip(masks, packed.starts, strict=True)):
        pos = m.positions.cpu()  # replay makes host tensors: then the check costs no device sync
        if pos.numel() and (int(pos.min()) < 1 or int(pos.max()) >= packed.lengths[row]):
            raise ValueError(f"row {row}: generated positions must lie in 1..{packed.lengths[row] - 1}")
        where.append(pos + start)
    return h, torch.cat(where).to(h.device), packed.input_ids[0].to(h.device)


def _bitmasks(masks, device) -> torch.Tensor:
    """The generated tokens' bitmasks, row after row, on `device`."""
    return torch.cat([m.bitmask for m in masks]).to(device, non_blocking=True)


def _unpacked(packed, at: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B, T] `values` at the packed indices `at`, 0 elsewhere."""
    zeros = torch.zeros(packed.tokens, dtype=torch.float32, device=values.device)
    return packed.unpack(zeros.index_put((at,), values))


def output_weight(model) -> torch.Tensor:
    """The LM head's weight [V, H] of a transformers causal LM (or a peft model around one)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = inner.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ValueError(f"{type(inner).__name__} has no output embedding with a weight")
    return head.weight
