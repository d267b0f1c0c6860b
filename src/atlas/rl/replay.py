"""Log-probs for the PPO ratio under the same grammar masks the rollout sampled with.

The engine samples from the masked, temperature-scaled distribution. Recomputing a token's
log-prob from the raw logits would measure a different distribution (mass on tokens the grammar
forbade), so the ratio would drift from 1 at the very first update. Instead the grammar matchers
are replayed over each generation to rebuild the exact masks, and the recomputed log-probs use
them. Forced tokens (sampled = 0) are kept out of the loss; their masked log-prob is 0 anyway.

    masks = replay_masks(episode, rt)           # once per trajectory, after the rollout
    lp = masked_logprobs(logits, targets, masks, temperature)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr

from atlas.runtime.session import Runtime


@dataclass
class ReplayedMasks:
    """Allowed-token bitmasks for every generated position of one trajectory.

    positions[i] is a trajectory index t of a generated token; bitmask[i] is the xgrammar bitmask
    (int32, vocab/32 words) that was in force when token t was chosen, control-token ban included.
    """

    positions: torch.Tensor  # [n] int64
    bitmask: torch.Tensor  # [n, ceil(vocab / 32)] int32


def replay_masks(episode, rt: Runtime) -> ReplayedMasks:
    vocab = rt.engine.vocab_size
    banned = sorted(rt.grammars.banned_token_ids)
    positions, rows = [], []
    for span in episode.generations:
        matcher = xgr.GrammarMatcher(rt.grammars.get(span.offered).grammar)
        bitmask = xgr.allocate_token_bitmask(span.end - span.start, vocab)
        for k, t in enumerate(range(span.start, span.end)):
            matcher.fill_next_token_bitmask(bitmask, k)
            token = episode.token_ids[t]
            if not matcher.accept_token(token):
                raise ValueError(
                    f"{episode.question['question_uid']} sample {episode.sample}: token {token} at "
                    f"position {t} is not legal under the grammar it was sampled with"
                )
        for b in banned:  # the engine adds -inf to these before masking; clear their bits
            bitmask[:, b // 32] &= ~(1 << (b % 32))
        positions.extend(range(span.start, span.end))
        rows.append(bitmask)
    return ReplayedMasks(
        torch.tensor(positions, dtype=torch.long), torch.cat(rows) if rows else torch.empty(0)
    )


def masked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, bitmask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log p(target) under softmax(masked logits / temperature), differentiable in `logits`.

    logits [n, V] are the model's outputs at the positions *before* each target; bitmask [n, W]
    the replayed masks of those targets."""
    scaled = logits.float() / temperature
    allowed = unpack_bitmask(bitmask.to(logits.device), scaled.shape[-1])
    scaled = scaled.masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.view(-1, 1)).squeeze(-1)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, W] int32 words -> [n, vocab] bool (bit j of word w is token 32w + j)."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    expanded = (bitmask.unsqueeze(-1) >> bits) & 1
    return expanded.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
