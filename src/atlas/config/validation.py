"""Full validation (`validation`), and the validation stage's slice."""

from __future__ import annotations

from pydantic import Field

from atlas.config.adapters import AdapterShape
from atlas.config.base import Strict
from atlas.config.graders import GraderConfig
from atlas.config.resources import ResourcesConfig
from atlas.config.runtime import RuntimeConfig


class ValidationConfig(Strict):
    """Full validation: each policy over the whole validation set."""

    samples: int = Field(default=1, ge=1, description="Episodes per validation question.")
    policies: list[str] = Field(
        default=["base", "zero_potential", "frozen_potential"],
        description="'base' (the model without adapters) and training runs whose final actor is validated.",
    )


class ValidationSamples(Strict):
    samples: int = Field(ge=1, description="Episodes per validation question.")


class ValidationSlice(Strict):
    """Full validation's slice: of the training section only the adapters' shape, which loading a
    trained policy needs; an edit to any other training key leaves the validations alone."""

    seed: int = Field(ge=0, description="Global seed (the adapters' initial values).")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: AdapterShape = Field(description="The policy's adapter shape (training.lora_*).")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")
    validation: ValidationSamples = Field(description="Full validation (not the list of policies).")
