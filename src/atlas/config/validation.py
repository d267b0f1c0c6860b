"""Full validation (`validation`), and the validation stage's slice."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict
from atlas.config.graders import GraderConfig
from atlas.config.resources import ResourcesConfig
from atlas.config.runtime import RuntimeConfig
from atlas.config.training import TrainingConfig, TrainingSlice


class ValidationConfig(Strict):
    """Full validation: each policy over the whole validation set."""

    samples: int = Field(default=1, ge=1, description="Episodes per validation question.")
    policies: list[str] = Field(
        default=["base", "zero_potential", "frozen_potential"],
        description="'base' (the model without adapters) and training runs whose final actor is validated.",
    )


class ValidationSamples(Strict):
    samples: int = Field(ge=1, description="Episodes per validation question.")


class ValidationSlice(TrainingSlice):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The policy's adapter shape (LoRA keys); the rest default.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")
    validation: ValidationSamples = Field(description="Full validation (not the list of policies).")
