"""Rollouts from merged weights: the base with one LoRA adapter folded in, as a plain model.

peft's forward runs every adapted linear layer as base + B(A(x)) * scaling: in a compiled decode
step of the 1.7B model that is ~600 extra small nodes whose launch CPU time bounds the step.
`MergedModel` keeps a second instance of the base architecture whose adapted linear layers hold

    W' = W + scaling * B @ A        (computed in float32, stored in the base's dtype)

and shares every other tensor (embeddings, norms, rotary buffers) with the base. `refresh()`
recomputes W' in place from the adapter's current tensors, so the serving model's parameters
keep their addresses and a CUDA graph captured on them stays valid across refreshes. The base
weights are read, never written: the reference (adapters off) and the critic still see them.

    merged = MergedModel(ac.peft, "actor")   # once
    ...update...; merged.refresh()           # before each rollout: the policy just updated
    engine = StaticEngine(merged.model, ...)

Log-probs of a rollout from W' differ from the adapter path's by bf16 rounding only; the PPO
update recomputes them under the adapters (`rollout/logprob_gap_*` in the step metrics shows the
difference).
"""

from __future__ import annotations

import copy

import torch
from peft.tuners.lora import Linear as LoraLinear


def _strip(name: str) -> str:
    return name.replace(".base_layer", "")


class MergedModel:
    def __init__(self, peft_model, adapter: str = "actor"):
        inner = peft_model.get_base_model()
        self.adapter = adapter
        self._layers: list[tuple[LoraLinear, torch.nn.Parameter]] = []
        config = copy.deepcopy(inner.config)  # the engine switches attention on this copy only
        with torch.device("meta"):
            model = type(inner)(config)
        lora_layers = {_strip(n): m for n, m in inner.named_modules() if isinstance(m, LoraLinear)}
        for name, m in lora_layers.items():
            if adapter not in m.lora_A:
                raise ValueError(f"{name}: no LoRA adapter {adapter!r} (has {sorted(m.lora_A)})")
            if m.lora_variant.get(adapter) is not None or getattr(m, "fan_in_fan_out", False):
                raise ValueError(f"{name}: adapter {adapter!r} is not a plain LoRA; it cannot be merged")
            if m.base_layer.bias is not None or m.lora_B[adapter].bias is not None:
                raise ValueError(f"{name}: linear layers with a bias are not merged")
        state = {}
        for key, value in inner.state_dict().items():
            if "lora_" in key:
                continue
            key = _strip(key)
            layer = key.removesuffix(".weight")
            state[key] = torch.empty_like(value) if layer in lora_layers else value
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if unexpected or [k for k in missing if not self._tied(model, k)]:
            raise ValueError(f"merged model: missing {missing[:3]}, unexpected {unexpected[:3]}")
        if config.tie_word_embeddings:
            model.tie_weights()
        self._share_buffers(model, inner)
        model.requires_grad_(False)
        self.model = model.eval()
        serving = dict(model.named_modules())
        self._layers = [(m, serving[name].weight) for name, m in lora_layers.items()]
        self.refresh()

    @staticmethod
    def _tied(model, key: str) -> bool:
        return key == "lm_head.weight" and model.config.tie_word_embeddings

    @staticmethod
    def _share_buffers(model, inner) -> None:
        """Buffers outside the state dict (rotary frequencies) and tensor attributes are still
        on the meta device: take the base's (they are constants)."""
        source = {_strip(n): m for n, m in inner.named_modules()}
        for name, module in model.named_modules():
            for attr, value in list(vars(module).items()):
                if attr == "_buffers":
                    for b, t in value.items():
                        if t is not None and t.is_meta:
                            value[b] = source[name]._buffers[b]
                elif isinstance(value, torch.Tensor) and value.is_meta:
                    setattr(module, attr, getattr(source[name], attr))
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:
            raise ValueError(f"merged model: tensors left unset: {left[:3]}")

    @torch.no_grad()
    def refresh(self) -> None:
        """W' = W + scaling * B @ A for every adapted layer, from the adapter's current tensors."""
        for m, weight in self._layers:
            a = m.lora_A[self.adapter].weight.float()
            b = m.lora_B[self.adapter].weight.float()
            base = m.base_layer.weight
            weight.copy_(torch.addmm(base.float(), b, a, alpha=m.scaling[self.adapter]))
