"""The report folder (`report`), and the report stage's slice."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict


class ReportConfig(Strict):
    """The report folder (results/report25/): which runs are the study's arms."""

    arms: list[str] = Field(
        default=["zero_potential", "frozen_potential"],
        min_length=1,
        description="Training runs compared as arms in the arms_* tables and figures; the other "
        "training runs (the training smoke) appear in step_metrics_by_run only.",
    )
    title: str = Field(
        default="ATLAS Report 25: Sequential Tool Runtime Upgrade (reproduction)",
        description="pretty_name of the dataset card.",
    )


class ReportSlice(Strict):
    study: str = Field(description="Name of the study.")
    report: ReportConfig = Field(description="The report folder.")
