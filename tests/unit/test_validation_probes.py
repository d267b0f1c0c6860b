"""The validation stage's tensor digests: the raw bytes of any dtype the base model is held in."""

import hashlib

import torch

from atlas.stages.validation import tensor_sha


def test_a_bf16_tensor_digest_is_its_raw_bytes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    assert tensor_sha(t) == hashlib.sha256(t.view(torch.int16).numpy().tobytes()).hexdigest()
    bumped = t.clone()
    bumped[2, 3] = 100.0
    assert tensor_sha(bumped) != tensor_sha(t)
    f = torch.arange(6, dtype=torch.float32)
    assert tensor_sha(f) == hashlib.sha256(f.numpy().tobytes()).hexdigest()
