"""atlas.rl.synthetic: the update benchmark's batches allow every token they hold."""

import torch

from atlas.rl.synthetic import synthetic_batch


def test_every_sampled_token_is_allowed_by_its_mask_and_the_reward_is_on_the_last():
    b = synthetic_batch(rows=3, tokens=20, vocab=1000, seed=4)
    assert b.input_ids.shape == (3, 20) and int(b.input_ids.min()) >= 3 and int(b.input_ids.max()) < 1000
    assert b.sampled[:, 0].eq(0).all() and b.sampled[:, 1:].eq(1).all()
    assert b.rewards[:, :-1].eq(0).all() and b.rewards[:, -1].ne(0).all()
    for row, masks in zip(b.input_ids, b.masks, strict=True):
        assert masks.positions.tolist() == list(range(1, 20))
        words, bits = row[1:] // 32, row[1:] % 32
        allowed = (masks.bitmask[torch.arange(19), words] >> bits.to(torch.int32)) & 1
        assert allowed.eq(1).all()
        blocked = (masks.bitmask == 0).float().mean().item()
        assert 0.03 < blocked < 0.2  # about 10% of the words closed
    again = synthetic_batch(rows=3, tokens=20, vocab=1000, seed=4)
    assert torch.equal(again.input_ids, b.input_ids)
