"""The smoke and boundary stages (`smoke`), and their slices."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict
from atlas.config.graders import GraderConfig
from atlas.config.resources import ResourcesConfig
from atlas.config.runtime import RuntimeConfig


class SmokeConfig(Strict):
    """The smoke stage: base-model rollouts over a slice of the validation set."""

    questions: int = Field(
        default=8, ge=1, description="First N validation questions (GPQA then LCB, half each)."
    )
    samples: int = Field(default=1, ge=1, description="Episodes per question.")


class SmokeSlice(Strict):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    smoke: SmokeConfig = Field(description="The smoke stage.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")


class BoundarySlice(Strict):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")
