"""Typed pipeline configuration.

The pydantic models here are the single source of truth for `config/*.yaml`. The JSON schema that
the Snakefile validates against (`config/schema.json`) is generated from them:

    python -m atlas schema > config/schema.json

Every stage receives only the slice of the config it reads (see `config_slice`), as canonical
JSON on its command line, so Snakemake reruns a stage exactly when that slice changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atlas.errors import InputError


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config key must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceFiles(_Strict):
    """Where one benchmark's question files live, and how many questions each must hold."""

    train: str = Field(description="Path of the training question file (read in file order).")
    val: str = Field(description="Path of the validation question file (read in file order).")
    train_questions: int | None = Field(
        default=None,
        ge=1,
        description="Expected number of training questions; data preparation stops if the file "
        "holds a different number. Null skips the check.",
    )
    val_questions: int | None = Field(
        default=None,
        ge=1,
        description="Expected number of validation questions; data preparation stops if the file "
        "holds a different number. Null skips the check.",
    )


class DataConfig(_Strict):
    """Question inputs: GPQA CSV files and LiveCodeBench code_generation_lite JSONL files."""

    gpqa: SourceFiles = Field(description="GPQA CSV files in the upstream column layout.")
    lcb: SourceFiles = Field(description="LiveCodeBench code_generation_lite JSONL files.")
    max_private_tests_bytes: int = Field(
        default=256 * 2**20,
        ge=1024,
        description="Largest decoded size of one row's private tests; a compressed blob that "
        "inflates beyond it is refused (zip-bomb guard).",
    )


class ScheduleConfig(_Strict):
    """The ordered training schedule: `steps` x `questions_per_step` slots over the train set."""

    steps: int = Field(ge=1, description="Number of training steps.")
    questions_per_step: int = Field(ge=1, description="Distinct questions drawn for each step.")
    seed: int = Field(
        default=0, ge=0, description="Seed of the per-epoch question order (explicit, recorded)."
    )
    shuffle: bool = Field(
        default=True,
        description="Shuffle the question pool once per epoch; false cycles it in file order "
        "(GPQA rows, then LCB rows).",
    )


class TinyModelConfig(_Strict):
    """The embedded default's model: a local byte-level BPE tokenizer and a random-init Qwen3."""

    tokenizer_vocab_size: int = Field(
        default=2048, ge=300, description="Target BPE vocabulary size (bytes + merges + specials)."
    )
    corpus: list[str] = Field(
        min_length=1,
        description="Text files the tokenizer is trained on, read as raw UTF-8 text.",
    )
    hidden_size: int = Field(default=256, ge=8, description="Model width.")
    intermediate_size: int = Field(default=768, ge=8, description="MLP inner width.")
    num_hidden_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=2, ge=1, description="Key/value heads (GQA).")
    head_dim: int = Field(default=64, ge=4, description="Width of one attention head.")
    max_position_embeddings: int = Field(
        default=8192, ge=256, description="Longest trajectory the model accepts, in tokens."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        return self


class ModelConfig(_Strict):
    """The base model: built locally (tiny) or read from a local HF-format folder."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Model name; a built model lands in results/models/<name>/.",
    )
    path: str | None = Field(
        default=None,
        description="Local folder of a real HF-format model (weights + tokenizer). Null builds "
        "the tiny model from `tiny` instead.",
    )
    tiny: TinyModelConfig | None = Field(
        default=None, description="Spec of the locally built model; required when path is null."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path is None and self.tiny is None:
            raise ValueError("set either model.path (a real model) or model.tiny (build one)")
        if self.path is not None and self.tiny is not None:
            raise ValueError("set only one of model.path and model.tiny")
        return self


class TrainingConfig(_Strict):
    """Training shape. The PPO settings arrive with the training stage."""

    engine: Literal["local", "verl"] = Field(
        default="local",
        description="local: torch + transformers + peft in one process; verl: verl V1 sync PPO.",
    )
    responses_per_question: int = Field(
        ge=1, description="Responses sampled per question per step (the group size)."
    )
    lora_rank: int = Field(
        default=8, ge=1, description="LoRA rank of the actor and critic adapters (report: 64)."
    )
    lora_alpha: int = Field(default=16, ge=1, description="LoRA alpha of both adapters (report: 128).")
    lora_targets: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Modules the adapters wrap: 'all-linear' (every linear layer but the output head) "
        "or a list of module names.",
    )


class RuntimeConfig(_Strict):
    """The sequential tool runtime: turn and token limits, sampling, what tools show back."""

    max_turns: int = Field(
        default=3, ge=1, le=64, description="Generations per episode; the last one may only call submit."
    )
    max_text_tokens: int = Field(
        default=48, ge=0, description="Free-text budget of one generation, in tokens (before its call)."
    )
    max_code_run: int = Field(
        default=64,
        ge=8,
        description="`code` arguments: most printable ASCII characters between two escapes (a line, "
        "roughly).",
    )
    max_code_escapes: int = Field(
        default=8,
        ge=0,
        description='`code` arguments: most escape sequences (\\n, \\t, \\", \\\\, \\/, \\uXXXX). A code '
        "string holds at most max_code_run + max_code_escapes * (max_code_run + 1) characters.",
    )
    max_generation_tokens: int = Field(
        default=4096,
        ge=8,
        description="Token cap of one generation. Must exceed the grammar's hard bound (checked), so a "
        "call is never cut off.",
    )
    max_trajectory_tokens: int = Field(
        default=8192,
        ge=64,
        description="Prompt + generations + tool outputs of one episode. When the next turn could "
        "overflow it, that turn may only submit.",
    )
    tool_output_chars: int = Field(
        default=400,
        ge=16,
        description="Tool output shown to the policy (and kept in the record), in characters.",
    )
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")


class GraderConfig(_Strict):
    """Sandboxed program runs for the python / run_tests / submit tools and the LCB grader."""

    test_timeout_s: float = Field(default=6.0, gt=0, description="Wall-clock bound of one test run.")
    program_timeout_s: float = Field(
        default=30.0, gt=0, description="Wall-clock bound of all tests of one program together."
    )
    memory_mb: int = Field(default=1024, ge=64, description="Address-space limit of a program (RLIMIT_AS).")
    cpu_s: int = Field(default=10, ge=1, description="CPU-time limit of one program run (RLIMIT_CPU).")
    file_size_mb: int = Field(
        default=16, ge=1, description="Largest file a program may write (RLIMIT_FSIZE)."
    )
    open_files: int = Field(default=64, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(
        default=1 << 16, ge=1024, description="Stdout / stderr kept per run; the rest is dropped."
    )
    workers: int = Field(default=2, ge=1, description="Programs graded at once (bounded pool).")
    require_network_isolation: bool = Field(
        default=False,
        description="Refuse to run programs when `unshare -n` is not permitted, instead of recording "
        "sandboxed: false.",
    )


class SmokeConfig(_Strict):
    """The smoke stage: base-model rollouts over a slice of the validation set."""

    questions: int = Field(
        default=8, ge=1, description="First N validation questions (GPQA then LCB, half each)."
    )
    samples: int = Field(default=1, ge=1, description="Episodes per question.")


class ResourcesConfig(_Strict):
    """Compute the jobs ask for; profiles map these to SLURM or Kubernetes."""

    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Where tensors live.")
    gpus: int = Field(default=0, ge=0, description="GPUs per training job (`resources: gpu=N`).")

    @model_validator(mode="after")
    def _gpus_need_cuda(self) -> ResourcesConfig:
        if self.gpus > 0 and self.device != "cuda":
            raise ValueError("gpus > 0 needs device: cuda")
        if self.device == "cuda" and self.gpus == 0:
            raise ValueError("device: cuda needs gpus >= 1")
        return self


class AtlasConfig(_Strict):
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
    training: TrainingConfig = Field(description="Training shape.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Compute per job.")


class ConfigError(InputError):
    """A config that does not satisfy the models; the message names every bad key path."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        scalar = e["type"] != "missing" and not isinstance(e["input"], (dict, list))
        got = f" (got {e['input']!r})" if scalar else ""
        lines.append(f"  {path}: {e['msg']}{got}")
    return "\n".join(lines)


def parse_config(raw: dict[str, Any], source: str = "<config>") -> AtlasConfig:
    try:
        return AtlasConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path) -> AtlasConfig:
    path = Path(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
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
}


def config_slice(config: AtlasConfig | dict[str, Any], stage: str) -> dict[str, Any]:
    if not isinstance(config, AtlasConfig):
        config = parse_config(config)
    dumped = config.model_dump(mode="json")
    return {key: dumped[key] for key in STAGE_SLICES[stage]}
