"""The policy's LoRA adapters (training.lora_*): the shape that building or loading a policy needs.

The training section holds these keys with the rest of training; full validation reads them
alone, so it imports this module and not the training section's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from atlas.config.base import Strict


class AdapterShape(Strict):
    """The LoRA adapters of the actor and the critic: one shape for both."""

    lora_rank: int = Field(
        default=8, ge=1, description="LoRA rank of the actor and critic adapters (report: 64)."
    )
    lora_alpha: int = Field(default=16, ge=1, description="LoRA alpha of both adapters (report: 128).")
    lora_targets: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Modules the adapters wrap: 'all-linear' (every linear layer but the output head) "
        "or a list of module names.",
    )
