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
    copies = self._atlas_copies  # set by fused_lora(copies=...) for its block, else None
    if copies is not None and name in copies and copies[name][0].dtype == result.dtype:
        a, b = copies[name]
    else:
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
def fused_lora(model: torch.nn.Module, copies: torch.dtype | None = None):
    """Give every peft lora.Linear in `model` the fused forward for the block's duration. A graph
    compiled inside one block is reused by the next (tests/test_packing.py checks it).

    copies=dtype (rollouts): the active adapters' A and B are copied once, on entry, into tensors
    of that dtype that the block's forwards read, instead of casting the float32 weights in every
    forward (in a compiled decode step those casts are hundreds of graph nodes). The copies keep
    their storage across blocks (static addresses for CUDA graphs) and are refreshed on each
    entry, so they never lag an optimizer step; the weights must not change inside the block."""
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no peft LoRA linear layers to fuse")
    for m in layers:
        m.forward = types.MethodType(_fast_forward, m)
        m._atlas_copies = None if copies is None else _refreshed_copies(m, copies)
    try:
        yield model
    finally:
        for m in layers:
            vars(m).pop("forward", None)  # back to the class's forward
            m._atlas_copies = None


def _refreshed_copies(m, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The layer's persistent {adapter: (A, B)} copies in `dtype`, overwritten with the weights."""
    store = vars(m).setdefault("_atlas_copy_store", {})
    for name in m.active_adapters:
        if name not in m.lora_A:
            continue
        wa, wb = m.lora_A[name].weight, m.lora_B[name].weight
        pair = store.get(name)
        if pair is None or pair[0].shape != wa.shape or pair[0].dtype != dtype or pair[0].device != wa.device:
            pair = store[name] = (torch.empty_like(wa, dtype=dtype), torch.empty_like(wb, dtype=dtype))
            for t in pair:
                torch._dynamo.mark_static_address(t)
        with torch.no_grad():
            pair[0].copy_(wa)
            pair[1].copy_(wb)
    return store
