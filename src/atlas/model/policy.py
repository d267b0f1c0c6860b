"""Actor and critic on one base model: two peft LoRA adapters and a trainable value head.

    actor      base + "actor" adapter          -> next-token logits (the policy)
    critic     base + "critic" adapter + head  -> one value per position
    reference  base with adapters disabled     -> the KL reference; no third copy of the weights

Base weights are frozen and stay bit-identical. Switching the active adapter also switches which
LoRA tensors require grad (peft's set_adapter), so an actor loss can only move actor tensors and
a critic loss only critic tensors and the head. The critic adapter is an ordinary CAUSAL_LM LoRA
on the same layers; its value comes from the last hidden state through `value_head`, which peft
does not know about, so it is saved explicitly with the compact checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from atlas.config.adapters import AdapterShape

ROLES = ("actor", "critic")


def lora_config(adapters: AdapterShape) -> LoraConfig:
    return LoraConfig(
        r=adapters.lora_rank,
        lora_alpha=adapters.lora_alpha,
        target_modules=adapters.lora_targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


class ActorCritic(nn.Module):
    def __init__(self, base: nn.Module, adapters: AdapterShape, seed: int = 0):
        """`adapters`: the LoRA shape (a TrainingConfig is one)."""
        super().__init__()
        torch.manual_seed(seed)  # LoRA A matrices and the head are random: fix them
        for p in base.parameters():
            p.requires_grad_(False)
        self._lora = lora_config(adapters)
        self.peft = get_peft_model(base, self._lora, adapter_name="actor")
        self.peft.add_adapter("critic", lora_config(adapters))
        self.frozen_heads = nn.ModuleDict()  # value heads of frozen critic snapshots, by adapter name
        hidden = base.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32)
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1) ** 0.5)
        nn.init.zeros_(self.value_head.bias)
        self.peft.set_adapter("actor")

    def _use(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role {role!r}; expected one of {ROLES}")
        self.peft.set_adapter(role)

    def actor_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        self._use("actor")
        return self.peft(input_ids=input_ids, attention_mask=attention_mask).logits

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """V(s_t) for every position t: the value of the state after reading token t. The actor
        is active again afterwards (rollouts sample whatever adapter is active)."""
        with self.role("critic"):
            out = self.peft(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            return self.value_head(out.hidden_states[-1].float()).squeeze(-1)

    def reference_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        with self.peft.disable_adapter():
            return self.peft(input_ids=input_ids, attention_mask=attention_mask).logits

    def trainable(self, role: str) -> dict[str, nn.Parameter]:
        """The tensors an optimizer of `role` updates (compact checkpoints hold exactly these).

        Listing them does not switch the active adapter: rollouts must keep sampling the actor."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}; expected one of {ROLES}")
        out = {n: p for n, p in self.peft.named_parameters() if f".{role}." in n and "lora_" in n}
        if role == "critic":
            out.update({f"value_head.{n}": p for n, p in self.value_head.named_parameters()})
        return out

    def add_frozen_critic(self, name: str, critic: dict[str, torch.Tensor]) -> None:
        """Load a saved critic (a compact checkpoint's critic tensors) as a third, frozen adapter.

        The snapshot shares the base weights, like the reference; no optimizer ever sees it."""
        if name in ROLES or any(role in name for role in ROLES):
            raise ValueError(f"frozen critic name {name!r} must not contain {ROLES}")
        self.peft.add_adapter(name, self._lora)
        own = self.trainable("critic")
        if set(critic) != set(own):
            missing, extra = sorted(set(own) - set(critic)), sorted(set(critic) - set(own))
            raise ValueError(f"critic snapshot tensors: missing {missing[:3]}, unexpected {extra[:3]}")
        head = nn.Linear(
            self.value_head.in_features, 1, dtype=torch.float32, device=self.value_head.weight.device
        )
        with torch.no_grad():
            params = dict(self.peft.named_parameters())
            for key, value in critic.items():
                if key.startswith("value_head."):
                    getattr(head, key.removeprefix("value_head.")).copy_(value)
                else:
                    params[key.replace(".critic.", f".{name}.")].copy_(value)
        head.requires_grad_(False)
        self.frozen_heads[name] = head
        self._use("actor")  # set_adapter also settles requires_grad: only the active adapter's

    def frozen_values(
        self, name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """V(s_t) of the frozen critic `name` at every position, without gradients."""
        with torch.no_grad(), self.role(name):
            out = self.peft(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            return self.frozen_heads[name](out.hidden_states[-1].float()).squeeze(-1)

    def base_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.peft.named_parameters() if "lora_" not in n)

    @contextlib.contextmanager
    def role(self, role: str):
        """Run a block with `role`'s adapter active, then restore the adapter active before.

        Restoring (not always the actor) matters when blocks nest: a backward pass must run while
        its role is still active, because peft clears requires_grad of inactive adapters and
        autograd skips accumulating into a tensor that no longer requires grad."""
        if role not in ROLES and role not in self.frozen_heads:
            raise ValueError(f"adapter {role!r}; expected one of {ROLES} or {sorted(self.frozen_heads)}")
        before = self.peft.active_adapter
        self.peft.set_adapter(role)
        try:
            yield self
        finally:
            self.peft.set_adapter(before)
