"""A leaner forward for peft's LoRA linear layers: the adapter's product added inside one GEMM.

peft computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`: besides the two small matmuls,
that writes the [tokens, out] adapter output, scales it into a second tensor and adds it into a
third, and the backward pass walks the same chain. Here

    y = addmm(base(x), x @ A^T, B^T, alpha=scaling)

lets the GEMM accumulate the adapter's product into the base output (cuBLAS beta = 1), so no
[tokens, out] temporary exists beside y. A and B are used in the input's dtype (bf16 on a GPU:
peft keeps adapter weights in float32 and would otherwise run the adapter in float32); their
gradients flow back through that cast to the float32 weights, as under autocast.

    with fused_lora(model):      # every lora.Linear of `model`, restored afterwards
        loss = ...; loss.backward()

Layers fall back to peft's own forward whenever the fast path would not be the same function:
adapters disabled or merged, more than one active adapter, dropout, a LoRA variant (DoRA), extra
arguments. Torch + peft only.
"""

from __future__ import annotations

import contextlib
import types

import torch
from peft.tuners.lora import Linear as LoraLinear


def _fast_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    active = self.active_adapters
    name = active[0] if len(active) == 1 else None
    if (
        args
        or kwargs
        or self.disable_adapters
        or self.merged
        or name is None
        or name not in self.lora_A
        or name in self.lora_variant
        or not isinstance(self.lora_dropout[name], torch.nn.Identity)
    ):
        return type(self).forward(self, x, *args, **kwargs)  # peft's own
    result = self.base_layer(x)
    a = self.lora_A[name].weight.to(result.dtype)
    b = self.lora_B[name].weight.to(result.dtype)
    xa = torch.nn.functional.linear(x.to(result.dtype), a)
    out = torch.addmm(
        result.reshape(-1, result.shape[-1]), xa.reshape(-1, xa.shape[-1]), b.t(), alpha=self.scaling[name]
    )
    return out.view(result.shape)


def has_lora(model: torch.nn.Module) -> bool:
    return any(isinstance(m, LoraLinear) for m in model.modules())


@contextlib.contextmanager
def fused_lora(model: torch.nn.Module):
    """Give every peft lora.Linear in `model` the fused forward for the block's duration. A graph
    compiled inside one block is reused by the next (tests/unit/test_packing.py checks it)."""
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no peft LoRA linear layers to fuse")
    for m in layers:
        m.forward = types.MethodType(_fast_forward, m)
    try:
        yield model
    finally:
        for m in layers:
            vars(m).pop("forward", None)  # back to the class's forward
