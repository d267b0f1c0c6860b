"""masked_logprobs and unpack_bitmask on values worked out by hand: which bit is which token, the
sign bit of an int32 word, the vocabulary cut, and log p under the masked, tempered softmax."""

from __future__ import annotations

import math

import torch

from atlas.rl.replay import masked_logprobs, unpack_bitmask


def test_bit_j_of_word_w_is_token_32w_plus_j():
    words = torch.tensor([[0b101, -(2**31)], [-1, 0b10]], dtype=torch.int32)
    allowed = unpack_bitmask(words, 64)
    assert allowed.dtype == torch.bool and allowed.shape == (2, 64)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 63]  # bit 31 is the int32 sign bit
    assert allowed[1].nonzero().flatten().tolist() == [*range(32), 33]


def test_the_vocabulary_cuts_the_last_word():
    words = torch.tensor([[0, -1]], dtype=torch.int32)
    allowed = unpack_bitmask(words, 40)
    assert allowed.shape == (1, 40)
    assert allowed[0].nonzero().flatten().tolist() == list(range(32, 40))


def test_log_p_of_the_target_under_the_mask_and_temperature():
    logits = torch.tensor([[0.0, math.log(3.0), 5.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[0b011], [0b100]], dtype=torch.int32)  # row 0: tokens 0, 1; row 1: token 2
    targets = torch.tensor([1, 2])
    lp = masked_logprobs(logits, targets, mask, temperature=1.0)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, torch.tensor([math.log(0.75), 0.0]), atol=1e-6)
    # temperature 2: p(1) = e^(ln 3 / 2) / (1 + e^(ln 3 / 2)) = sqrt 3 / (1 + sqrt 3)
    lp2 = masked_logprobs(logits, targets, mask, temperature=2.0)
    assert torch.allclose(lp2, torch.tensor([math.log(math.sqrt(3) / (1 + math.sqrt(3))), 0.0]), atol=1e-6)


def test_a_target_the_mask_forbids_has_log_p_minus_infinity():
    logits = torch.tensor([[0.0, 0.0, 0.0]])
    lp = masked_logprobs(logits, torch.tensor([2]), torch.tensor([[0b011]], dtype=torch.int32), 1.0)
    assert lp.tolist() == [-math.inf]


def test_half_precision_logits_are_computed_in_float32():
    logits = torch.tensor([[0.0, 10.0, 20.0]], dtype=torch.float16)
    lp = masked_logprobs(logits, torch.tensor([0]), torch.tensor([[0b111]], dtype=torch.int32), 0.01)
    # log p(0) = -2000 - log(1 + e^-1000 + e^-2000) = -2000 in float32, the ratio's precision
    assert lp.dtype == torch.float32 and lp.item() == -2000.0
