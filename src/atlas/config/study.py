"""The whole study's configuration: every section, its YAML files, its JSON schema and each stage's slice. Only the Snakefile and the command line read it; a stage reads its own slice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from atlas.config.adapters import AdapterShape
from atlas.config.base import ConfigError, Strict, format_validation_error
from atlas.config.checks import ChecksConfig
from atlas.config.data import DataConfig, ScheduleConfig
from atlas.config.graders import GraderConfig
from atlas.config.model import ModelConfig
from atlas.config.report import ReportConfig
from atlas.config.resources import ResourcesConfig
from atlas.config.runtime import RuntimeConfig
from atlas.config.smoke import SmokeConfig
from atlas.config.training import DoseStepConfig, RunConfig, TrainingConfig, check_runs, default_runs
from atlas.config.validation import ValidationConfig


class AtlasConfig(Strict):
    """The whole pipeline configuration (config/config.yaml, config/report25.yaml)."""

    study: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Name of the study this config runs."
    )
    seed: int = Field(default=0, ge=0, description="Global seed for sampling and training.")
    data: DataConfig = Field(description="Question inputs.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
    model: ModelConfig = Field(description="Base model.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Tool runtime limits.")
    graders: GraderConfig = Field(default_factory=GraderConfig, description="Sandboxed program runs.")
    smoke: SmokeConfig = Field(default_factory=SmokeConfig, description="The smoke stage.")
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="Full validation of the final policies and the base."
    )
    training: TrainingConfig = Field(description="The training keys every run shares.")
    runs: dict[str, RunConfig] = Field(
        default_factory=default_runs,
        description="Training runs by name (results/runs/<name>/): the training smoke and the arms. "
        "A run set to null is dropped: a --configfile laid over another removes a run that way.",
        json_schema_extra=lambda schema: schema.update(
            additionalProperties={"anyOf": [schema["additionalProperties"], {"type": "null"}]}
        ),
    )
    dose_step: DoseStepConfig = Field(default_factory=DoseStepConfig, description="The dose step stage.")
    checks: ChecksConfig = Field(default_factory=ChecksConfig, description="The checks of each run.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Compute per job.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="The report folder.")

    @model_validator(mode="before")
    @classmethod
    def _runs_at_the_top(cls, data: Any) -> Any:
        training = data.get("training") if isinstance(data, dict) else None
        for key in ("runs", "dose_step"):
            if isinstance(training, dict) and key in training:
                raise ValueError(
                    f"training.{key}: {key} sits at the top level of the config ({key}:), not under training"
                )
        return data

    @field_validator("runs", mode="before")
    @classmethod
    def _drop_null_runs(cls, runs: Any) -> Any:
        if isinstance(runs, dict):
            return {name: run for name, run in runs.items() if run is not None}
        return runs

    @model_validator(mode="after")
    def _runs_consistent(self) -> AtlasConfig:
        check_runs(self.runs, self.dose_step)
        return self

    @model_validator(mode="after")
    def _policies_exist(self) -> AtlasConfig:
        for policy in self.validation.policies:
            if policy != "base" and policy not in self.runs:
                raise ValueError(f"validation.policies: {policy!r} is neither 'base' nor a training run")
        return self

    @model_validator(mode="after")
    def _arms_are_runs(self) -> AtlasConfig:
        for arm in self.report.arms:
            if arm not in self.runs:
                raise ValueError(f"report.arms: {arm!r} is not a training run ({sorted(self.runs)})")
        return self

    @model_validator(mode="after")
    def _runs_fit_schedule(self) -> AtlasConfig:
        for name, run in self.runs.items():
            if run.steps is not None and run.steps > self.schedule.steps:
                raise ValueError(
                    f"runs.{name}.steps is {run.steps} but schedule.steps is "
                    f"{self.schedule.steps}; a run trains on steps of the ordered schedule"
                )
        return self

    def run_steps(self, run: str) -> int:
        steps = self.runs[run].steps
        return self.schedule.steps if steps is None else steps


def parse_config(raw: dict[str, Any], source: str = "<config>") -> AtlasConfig:
    try:
        return AtlasConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping holding one key twice (safe_load keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merge keys (<<) may be overridden; written-out keys may not
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{key_node.start_mark.name}, line {line}: duplicate key {key!r} (first at line "
                    f"{seen[key]}); expected each key once per mapping"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> Any:
    """A YAML file the project reads: safe types only, a duplicated key refused naming key and line."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    loader = UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    finally:
        loader.dispose()


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base` key by key, nested mappings merged in turn: how Snakemake's
    --configfile lays a config over the Snakefile's. Neither argument is changed."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def check_yaml_files(paths: list[str | Path]) -> None:
    """Read each config file Snakemake loaded with read_yaml (Snakemake's own loader keeps the last
    of two equal keys)."""
    for p in paths:
        read_yaml(p)


def load_config(path: str | Path) -> AtlasConfig:
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid config {path}: expected a mapping at the top level")
    return parse_config(raw, str(path))


def json_schema() -> dict[str, Any]:
    schema = AtlasConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# The config slice each stage reads. A stage's params hold exactly this, so editing any other key
# leaves the stage alone.
STAGE_SLICES: dict[str, tuple[str, ...]] = {
    "data": ("data", "schedule"),
    "model": ("model",),
    "smoke": ("seed", "runtime", "graders", "smoke", "resources"),
    "boundary": ("seed", "runtime", "graders", "resources"),
    "training": ("seed", "schedule", "runtime", "graders", "training", "resources"),
    "checks": ("seed", "schedule", "runtime", "graders", "training", "resources", "checks"),
    "dose_step": ("seed", "schedule", "runtime", "graders", "training", "resources"),
    "distributed_roundtrip": ("seed", "training"),
    "validation": ("seed", "runtime", "graders", "training", "resources", "validation"),
    "report": ("study", "report"),
}


def config_slice(config: AtlasConfig | dict[str, Any], stage: str, run: str | None = None) -> dict[str, Any]:
    """The keys `stage` reads. A training stage reads only its own run's entry of runs
    (so editing one arm leaves the others alone), plus `steps` resolved from the schedule."""
    if not isinstance(config, AtlasConfig):
        config = parse_config(config)
    dumped = config.model_dump(mode="json")
    out = {key: dumped[key] for key in STAGE_SLICES[stage]}
    if "resources" in out:
        # threads schedule jobs; ranks shape the training job (the checks read the run's slice)
        dropped = ("threads", "gpu_memory_gb")
        dropped += () if stage in ("training", "checks") else ("ranks",)
        out["resources"] = {k: v for k, v in out["resources"].items() if k not in dropped}
    if stage in ("training", "checks", "dose_step", "distributed_roundtrip", "validation"):
        training = dict(out["training"])
        runs, dose = dumped["runs"], dumped["dose_step"]
        if training["engine"] == "local":  # the verl knobs cannot change a local run
            training.pop("verl")
        if stage == "validation":  # the policy's adapter shape; its run folder is an input
            training = {k: training[k] for k in AdapterShape.model_fields}
        elif stage in ("training", "checks"):  # the checks read the run's slice, and their own
            if run not in runs:
                raise KeyError(f"no training run {run!r}; configured: {sorted(runs)}")
            training["run"] = {**runs[run], "name": run, "steps": config.run_steps(run)}
        elif stage == "dose_step":
            training["run"] = {**dose, "name": "dose_step"}
        # the distributed roundtrip: the engine keys alone, one slice for every run (the run's
        # folder, whose last checkpoint it shards, is its input)
        out["training"] = training
    if stage == "validation":
        out["validation"] = {"samples": dumped["validation"]["samples"]}  # not the list of policies
    return out
