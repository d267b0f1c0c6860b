"""The packed attention's CUDA kernel (varlen FlashAttention-2) against a float32 reference that
attends row by row. Skips without CUDA (CI has none); scripts/gpu_session.sh runs it on the H200."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas.rl.packing import varlen_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_varlen_flash_attention_matches_a_float32_reference_values_and_gradients():
    torch.manual_seed(0)
    lengths, hq, hkv, d = [300, 1, 517, 64], 8, 2, 128
    n = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn((1, h, n, d), device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    grad = torch.randn((1, n, hq, d), device="cuda", dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, _ = varlen_attention(
        None, *leaves, None, scaling=d**-0.5, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    out.backward(grad)

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    rows = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (x[0, :, a:b] for x in ref_leaves)
        rows.append(
            F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=d**-0.5, enable_gqa=True)
        )
    ref = torch.cat(rows, dim=1).transpose(0, 1).unsqueeze(0)
    ref.backward(grad.double())

    def rel(x, y):
        return ((x.double() - y).norm() / y.norm()).item()

    assert rel(out, ref) < 1e-2  # bf16 operands: ~3e-3 expected
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert rel(got.grad, want.grad) < 2e-2
    assert torch.isfinite(out).all()
