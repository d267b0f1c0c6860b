"""Synthetic PPO batches: the update measured at a real shape without rollouts.

    batch = synthetic_batch(rows=4, tokens=2048, vocab=151_936, seed=0, device="cuda")
    prep = ppo.prepare(ac, batch, cfg.training.ppo, temperature=1.0)

Random token ids; every token after the first counts as sampled under a grammar bitmask that
allows about 90% of the vocabulary and always the token itself (so the masked log-probs are
finite); one random reward on each row's last token; zero rollout log-probs.
"""

from __future__ import annotations

import torch

from atlas.rl.ppo import Batch
from atlas.rl.replay import ReplayedMasks


def synthetic_batch(rows: int, tokens: int, vocab: int, seed: int, device: str = "cpu") -> Batch:
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, tokens), device=device, generator=g)
    words = -(-vocab // 32)
    masks = []
    for row in ids:
        bitmask = torch.full((tokens - 1, words), -1, dtype=torch.int32, device=device)
        bitmask[torch.rand(bitmask.shape, device=device, generator=g) < 0.1] = 0
        bitmask[torch.arange(tokens - 1, device=device), row[1:] // 32] = -1  # the token's own word
        masks.append(ReplayedMasks(torch.arange(1, tokens), bitmask))
    sampled = torch.ones((rows, tokens), device=device)
    sampled[:, 0] = 0
    rewards = torch.zeros((rows, tokens), device=device)
    rewards[:, -1] = torch.randn(rows, device=device, generator=g)
    logprobs = torch.zeros((rows, tokens), device=device)
    return Batch(ids, torch.ones_like(ids), sampled, logprobs, rewards, masks)
