"""The checks of each run (`checks`), and the checks stage's slice."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from atlas.config.base import Strict
from atlas.config.training import TrainSlice


class ChecksConfig(Strict):
    """The checks stage of each training run (results/checks/<run>/)."""

    resumed_steps: int | Literal["all"] = Field(
        default=1,
        description="How many checkpoints (the first ones) the CPU roundtrip resumes from, running "
        "the next step and comparing its metrics with the run's; each costs one training step, so "
        "'all' doubles a run's cost. Every checkpoint still gets the tensor and probe roundtrip.",
    )

    def resumes(self, index: int) -> bool:
        """Whether the checkpoint at position `index` (0-based, in step order) is resumed from."""
        return self.resumed_steps == "all" or index < self.resumed_steps


class ChecksSlice(TrainSlice):
    checks: ChecksConfig = Field(default_factory=ChecksConfig, description="The checks stage.")
