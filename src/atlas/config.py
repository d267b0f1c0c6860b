"""Typed pipeline configuration.

The pydantic models here are the single source of truth for `config/*.yaml`. The JSON schema that
the Snakefile validates against (`config/schema.json`) is generated from them:

    python -m atlas schema > config/schema.json

Every stage receives only the slice of the config it reads (see `config_slice`), as canonical
JSON on its command line, so Snakemake reruns a stage exactly when that slice changes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from atlas.errors import InputError


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a config key must not be silently ignored. Values are
    strictly typed ("2" is no int, true no number) and numbers finite (.inf and .nan refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _list_as_tuple(value: Any) -> Any:
    """YAML and JSON have no tuples: a list of the right items is read as one (items stay strict)."""
    return tuple(value) if isinstance(value, list) else value


FloatPair = Annotated[tuple[float, float], BeforeValidator(_list_as_tuple)]


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
    hidden_size: int = Field(default=128, ge=8, description="Model width.")
    intermediate_size: int = Field(default=512, ge=8, description="MLP inner width.")
    num_hidden_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=2, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=1, ge=1, description="Key/value heads (GQA).")
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
    shape: Literal["tiny", "1.7b", "8b"] = Field(
        default="tiny",
        description="Dimensions of the built model: tiny takes them from `tiny`; 1.7b and 8b are "
        "Qwen3-1.7B's and Qwen3-8B's (atlas.model.shapes; `tiny` still gives seed, corpus and "
        "max_position_embeddings). Built models of these shapes are saved in bf16.",
    )
    tokenizer: Literal["corpus", "synthetic-151k"] = Field(
        default="corpus",
        description="Tokenizer of the built model: corpus trains a BPE of "
        "tiny.tokenizer_vocab_size on tiny.corpus; synthetic-151k trains one of 151,936 tokens "
        "(a Qwen3 vocabulary's size) on seeded random words, so the output head and the grammar "
        "masks have a real model's width.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path is None and self.tiny is None:
            raise ValueError("set either model.path (a real model) or model.tiny (build one)")
        if self.path is not None and self.tiny is not None:
            raise ValueError("set only one of model.path and model.tiny")
        if self.path is not None and (self.shape != "tiny" or self.tokenizer != "corpus"):
            raise ValueError(
                "model.shape and model.tokenizer describe a built model: leave them unset with model.path"
            )
        return self


class PPOConfig(_Strict):
    """The PPO update (names follow verl's actor/critic/algorithm keys where one exists)."""

    gamma: float = Field(default=1.0, ge=0, le=1, description="Discount per sampled token (GAE gamma).")
    lam: float = Field(default=1.0, ge=0, le=1, description="GAE lambda.")
    clip_ratio_low: float = Field(default=0.2, gt=0, lt=1, description="Lower PPO clip: ratio >= 1 - low.")
    clip_ratio_high: float = Field(
        default=0.28, gt=0, description="Upper PPO clip: ratio <= 1 + high (asymmetric when != low)."
    )
    clip_ratio_c: float = Field(
        default=3.0, gt=1, description="Dual clip: a negative-advantage loss is capped at c * |A|."
    )
    cliprange_value: float = Field(default=0.5, gt=0, description="Clip of the new value around the old.")
    kl_mode: Literal["none", "reward", "loss"] = Field(
        default="loss",
        description="KL to the reference: none; 'reward' subtracts kl_coef * KL from each sampled "
        "token's reward (verl use_kl_in_reward); 'loss' adds kl_coef * KL to the actor loss "
        "(verl use_kl_loss).",
    )
    kl_kind: Literal["k1", "k2", "k3", "abs"] = Field(
        default="k3", description="KL estimator: k1 = log-ratio, k2 = half squared, k3 = low-variance."
    )
    kl_coef: float = Field(default=0.001, ge=0, description="KL coefficient (beta).")
    entropy_coef: float = Field(default=0.0, ge=0, description="Entropy bonus coefficient of the actor.")
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = Field(default="token-mean", description="How token losses reduce to one number (verl's modes).")
    epochs: int = Field(default=1, ge=1, description="Passes over the step's batch (ppo_epochs).")
    mini_batches: int = Field(default=1, ge=1, description="Optimizer steps per epoch (mini-batches).")
    micro_batch_size: int = Field(
        default=8, ge=1, description="Trajectories per forward/backward; gradients accumulate."
    )
    micro_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Token budget of one forward/backward: consecutive trajectories while their "
        "tokens fit (a longer one goes alone), instead of micro_batch_size rows (verl "
        "ppo_max_token_len_per_gpu with use_dynamic_bsz). Null: cut by micro_batch_size.",
    )
    grad_clip: float = Field(default=1.0, gt=0, description="Max global grad norm per optimizer step.")
    actor_lr: float = Field(default=1e-6, gt=0, description="AdamW learning rate of the actor LoRA.")
    critic_lr: float = Field(default=1e-5, gt=0, description="AdamW learning rate of the critic LoRA + head.")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay.")
    betas: FloatPair = Field(default=(0.9, 0.999), description="AdamW betas.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", description="LR after warm-up: constant, or cosine down to min_lr_ratio."
    )
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Floor of the cosine schedule.")
    whiten_advantages: bool = Field(default=True, description="Whiten advantages over the batch (verl).")
    remove_padding: bool | Literal["auto"] = Field(
        default="auto",
        description="Padding removal in the update's forward passes: rows packed into one (varlen "
        "FlashAttention-2 on a GPU) and token log-probs from a chunked output head, never the full "
        "float32 logits (verl use_remove_padding). auto: on with a GPU (and with engine verl), off "
        "on a CPU, where the padded path is the reference.",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        default="auto",
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them (verl enable_gradient_checkpointing). auto: on with a GPU (and with engine "
        "verl), off on a CPU.",
    )

    liger: bool | Literal["auto"] = Field(
        default="auto",
        description="Liger's Triton kernels (RMSNorm, SwiGLU, RoPE) in the update's forward and "
        "backward passes (the `gpu` extra: liger-kernel). auto: on with a GPU when liger-kernel is "
        "installed; true fails without it.",
    )

    def on_gpu(self, key: Literal["remove_padding", "gradient_checkpointing"], cuda: bool) -> bool:
        """The setting `key` resolved: auto means on exactly when the work runs on a GPU."""
        value = getattr(self, key)
        return cuda if value == "auto" else value


RUN_NAME = r"^[a-z][a-z0-9_]*$"


class RunConfig(_Strict):
    """One training run (an arm of the study, or the training smoke)."""

    steps: int | None = Field(
        default=None, ge=1, description="Steps of the ordered schedule to train on; null = schedule.steps."
    )
    potential: str = Field(default="zero", description="Shaping potential: zero | critic_snapshot | ...")
    dose: float = Field(default=1.0, ge=0, description="Scale of the shaping terms.")
    snapshot_of: str | None = Field(
        default=None,
        description="For critic_snapshot: the run whose checkpointed critic is frozen as Phi.",
    )
    snapshot_step: int | None = Field(
        default=None, ge=1, description="That run's checkpoint step; null = its last."
    )

    @model_validator(mode="after")
    def _snapshot_named(self) -> RunConfig:
        if self.potential == "critic_snapshot" and self.snapshot_of is None:
            raise ValueError("potential critic_snapshot needs snapshot_of (a run name)")
        return self


class DoseStepConfig(_Strict):
    """One step from the same start at several doses, on identical rollouts."""

    doses: list[float] = Field(default=[0.0, 0.5, 1.0], min_length=2, description="Doses compared.")
    potential: str = Field(default="critic_snapshot", description="The potential being dosed.")
    snapshot_of: str | None = Field(default="training_smoke", description="See RunConfig.snapshot_of.")
    snapshot_step: int | None = Field(default=None, ge=1, description="See RunConfig.snapshot_step.")


def _default_runs() -> dict[str, RunConfig]:
    return {
        "training_smoke": RunConfig(steps=2, potential="zero", dose=0.0),
        "zero_potential": RunConfig(potential="zero", dose=1.0),
        "frozen_potential": RunConfig(potential="critic_snapshot", dose=1.0, snapshot_of="training_smoke"),
    }


class VerlConfig(_Strict):
    """engine: verl only: the cluster shape and the verl knobs the shared training keys do not cover.

    The report's settings are the defaults: FSDP2 with parameters offloaded to CPU between phases and
    optimizer state kept on the GPU, gradient checkpointing, padding removal, bf16, vLLM rollouts."""

    nnodes: int = Field(default=1, ge=1, description="Ray nodes (trainer.nnodes).")
    gpus_per_node: int | None = Field(
        default=None, ge=1, description="GPUs per node (trainer.n_gpus_per_node); null = resources.gpus."
    )
    rollout_tensor_parallel: int = Field(
        default=1, ge=1, description="vLLM tensor parallel size (rollout.tensor_model_parallel_size)."
    )
    gpu_memory_utilization: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take (rollout.gpu_memory_utilization).",
    )
    param_offload: bool = Field(default=True, description="FSDP parameters offloaded to CPU between phases.")
    optimizer_offload: bool = Field(default=False, description="FSDP optimizer state offloaded to CPU.")
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa"] = Field(
        default="auto",
        description="Attention of verl's actor, reference and critic: auto = flash_attention_2 where "
        "the flash-attn package is installed, else sdpa (transformers then masks packed rows "
        "block-causally).",
    )
    ray_address: str | None = Field(
        default=None, description="Address of a running Ray cluster; null starts a local one."
    )
    overrides: list[str] = Field(
        default=[],
        description="Extra Hydra overrides passed to verl last, e.g. 'actor_rollout_ref.rollout.n=4'. "
        "Checked by composing verl's own config.",
    )


class TrainingConfig(_Strict):
    """Training: the engine, the policy's adapters, PPO, the runs and what they write."""

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
    merged_rollouts: bool | Literal["auto"] = Field(
        default="auto",
        description="Rollouts and validation sample from a bf16 copy of the base with the actor's "
        "LoRA folded in (atlas.model.merged), refreshed before each rollout, instead of through "
        "the adapter layers: plain linear layers, so a compiled decode step has no adapter nodes. "
        "The base weights are never changed. auto: on with a GPU, off on a CPU.",
    )
    ppo: PPOConfig = Field(default_factory=PPOConfig, description="The PPO update.")
    resume_mode: Literal["auto", "disable"] = Field(
        default="auto",
        description="auto: continue from the latest complete checkpoint of the same run and config; "
        "disable: start from step 0 (the run's old checkpoints are removed).",
    )
    checkpoint_every: int = Field(default=1, ge=1, description="Save a compact checkpoint every k steps.")
    validation_every: int = Field(
        default=2, ge=1, description="Validate every k steps (and before the first and after the last)."
    )
    validation_questions: int | None = Field(
        default=None, ge=2, description="Validation questions per periodic validation; null = all."
    )
    validation_samples: int = Field(default=1, ge=1, description="Episodes per validation question.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        default="offline", description="wandb mode; offline logs land in the run folder's wandb/."
    )
    wandb_project: str = Field(default="atlas", description="wandb project name.")
    runs: dict[str, RunConfig] = Field(
        default_factory=_default_runs,
        description="Training runs by name (results/runs/<name>/): the training smoke and the arms.",
    )
    dose_step: DoseStepConfig = Field(default_factory=DoseStepConfig, description="The dose step stage.")
    verl: VerlConfig = Field(default_factory=VerlConfig, description="engine: verl only (ignored by local).")

    @model_validator(mode="after")
    def _runs_consistent(self) -> TrainingConfig:
        for name, run in self.runs.items():
            if not re.match(RUN_NAME, name) or name == "dose_step":
                raise ValueError(f"run name {name!r}: expected {RUN_NAME} and not 'dose_step'")
            if run.snapshot_of is not None and run.snapshot_of not in self.runs:
                raise ValueError(f"runs.{name}.snapshot_of: no run named {run.snapshot_of!r}")
            seen, at = {name}, run.snapshot_of
            while at is not None:  # a snapshot chain must end: a -> b -> a cannot be built
                if at in seen:
                    raise ValueError(f"runs.{name}.snapshot_of: the chain through {at!r} is a cycle")
                seen.add(at)
                at = self.runs[at].snapshot_of
        snap = self.dose_step.snapshot_of
        if snap is not None and snap not in self.runs:
            raise ValueError(f"dose_step.snapshot_of: no run named {snap!r}")
        return self


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
    max_processes: int = Field(
        default=8,
        ge=2,
        description=(
            "Processes and threads a program may run at once in its sandbox (RLIMIT_NPROC); "
            "memory_mb x max_processes bounds a sandbox's memory, x workers the grader's."
        ),
    )
    scratch_mb: int = Field(
        default=64, ge=1, description="Size of a program's private scratch folder (its /tmp tmpfs)."
    )
    sandbox_uid_base: int = Field(
        default=1_900_000_000,
        ge=1000,
        le=4_000_000_000,
        description="First host uid of the sandboxes when the grader runs as root: each sandbox "
        "runs as this plus twice its grading thread's id plus its slot (0 or 1: the sandbox grading "
        "and the next one, started ahead), a uid nothing else on the machine uses.",
    )
    cpu_cores: float = Field(
        default=1.0,
        gt=0,
        description="CPU quota of one sandbox, in cores (its cgroup's cpu bound, where cgroups are "
        "available).",
    )
    scratch_inodes: int = Field(
        default=4096,
        ge=16,
        description="Files, folders and links a program's scratch folder holds at once (the tmpfs's "
        "nr_inodes, when the grader runs as root; otherwise the sandbox's cgroup memory bounds them).",
    )
    allow_unsandboxed: bool = Field(
        default=False,
        description="Run programs without the bubblewrap sandbox where it cannot start (under the "
        "driver alone, as the grader's user); every verdict and record then says sandboxed: false. "
        "Off, a grading stage stops at start when bubblewrap cannot run.",
    )


class SmokeConfig(_Strict):
    """The smoke stage: base-model rollouts over a slice of the validation set."""

    questions: int = Field(
        default=8, ge=1, description="First N validation questions (GPQA then LCB, half each)."
    )
    samples: int = Field(default=1, ge=1, description="Episodes per question.")


class ValidationConfig(_Strict):
    """Full validation: each policy over the whole validation set."""

    samples: int = Field(default=1, ge=1, description="Episodes per validation question.")
    policies: list[str] = Field(
        default=["base", "zero_potential", "frozen_potential"],
        description="'base' (the model without adapters) and training runs whose final actor is validated.",
    )


class ChecksConfig(_Strict):
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


class ReportConfig(_Strict):
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


class ResourcesConfig(_Strict):
    """Compute the jobs ask for; profiles map these to SLURM or Kubernetes."""

    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Where tensors live.")
    gpus: int = Field(default=0, ge=0, description="GPUs per training job (`resources: gpu=N`).")
    threads: int | None = Field(
        default=None,
        ge=1,
        description="Threads of each model job (Snakemake's `threads`, torch's OMP_NUM_THREADS); "
        "null: every core, one such job at a time. With 1, Snakemake runs as many jobs side by side "
        "as it has cores. Scheduling only: not in any stage's config slice, so changing it reruns "
        "nothing.",
    )
    gpu_memory_gb: dict[Literal["training", "rollouts", "checks"], int] | None = Field(
        default=None,
        description="GPU memory (GiB) each kind of GPU job holds at most: training (train, "
        "dose_step), rollouts (smoke, boundary, validation), checks. Set, each such job claims its "
        "amount as the Snakemake resource `gpu_mem_gb` and cannot allocate past it (torch's "
        "per-process memory fraction; the rollout pool sizes itself within it), so `--resources "
        "gpu_mem_gb=<the GPU's GiB>` runs side by side on one GPU the jobs that fit. null: no "
        "claim. Scheduling only: not in any stage's config slice.",
    )

    ranks: int | None = Field(
        default=None,
        ge=1,
        description="Data-parallel ranks of each training job (torchrun processes, each rolling out "
        "its share of a step's questions, then one synced update). null: one per GPU on cuda "
        "(`gpus`), one process on cpu; on cpu a number runs that many gloo ranks. On cuda it must "
        "equal `gpus`: one rank per GPU.",
    )

    @property
    def world_size(self) -> int:
        """The training job's rank count (1: a plain process, no torchrun)."""
        return self.ranks or max(1, self.gpus)

    @model_validator(mode="after")
    def _gpus_need_cuda(self) -> ResourcesConfig:
        if self.gpus > 0 and self.device != "cuda":
            raise ValueError("gpus > 0 needs device: cuda")
        if self.device == "cuda" and self.gpus == 0:
            raise ValueError("device: cuda needs gpus >= 1")
        if self.device == "cuda" and self.ranks is not None and self.ranks != self.gpus:
            raise ValueError(f"ranks {self.ranks} with gpus {self.gpus}: on cuda each rank has one GPU")
        if self.gpu_memory_gb is not None:
            if self.device != "cuda":
                raise ValueError("gpu_memory_gb needs device: cuda")
            missing = {"training", "rollouts", "checks"} - set(self.gpu_memory_gb)
            if missing or min(self.gpu_memory_gb.values()) < 1:
                raise ValueError(
                    f"gpu_memory_gb: give training, rollouts and checks at least 1 GiB each "
                    f"(got {self.gpu_memory_gb})"
                )
        return self

    def gpu_mem_gb(self, kind: str) -> int:
        """The Snakemake resource `gpu_mem_gb` a job of `kind` claims (0: none)."""
        return 0 if self.gpu_memory_gb is None else self.gpu_memory_gb[kind]


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
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="Full validation of the final policies and the base."
    )
    training: TrainingConfig = Field(description="Training shape.")
    checks: ChecksConfig = Field(default_factory=ChecksConfig, description="The checks of each run.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="Compute per job.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="The report folder.")

    @model_validator(mode="after")
    def _policies_exist(self) -> AtlasConfig:
        for policy in self.validation.policies:
            if policy != "base" and policy not in self.training.runs:
                raise ValueError(f"validation.policies: {policy!r} is neither 'base' nor a training run")
        return self

    @model_validator(mode="after")
    def _arms_are_runs(self) -> AtlasConfig:
        for arm in self.report.arms:
            if arm not in self.training.runs:
                raise ValueError(f"report.arms: {arm!r} is not a training run ({sorted(self.training.runs)})")
        return self

    @model_validator(mode="after")
    def _runs_fit_schedule(self) -> AtlasConfig:
        for name, run in self.training.runs.items():
            if run.steps is not None and run.steps > self.schedule.steps:
                raise ValueError(
                    f"training.runs.{name}.steps is {run.steps} but schedule.steps is "
                    f"{self.schedule.steps}; a run trains on steps of the ordered schedule"
                )
        return self

    def run_steps(self, run: str) -> int:
        steps = self.training.runs[run].steps
        return self.schedule.steps if steps is None else steps


class ConfigError(InputError):
    """A config that does not satisfy the models; the message names every bad key path."""


def _hint(value: Any) -> str:
    """Why a value that looks right is refused: the config is strictly typed."""
    if isinstance(value, bool):
        return ": a boolean, not a number"
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return ": a string; write the number unquoted (YAML reads 1e-6 as a string: write 1.0e-6)"
    return ""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        scalar = e["type"] != "missing" and not isinstance(e["input"], (dict, list))
        got = f" (got {e['input']!r}{_hint(e['input'])})" if scalar else ""
        lines.append(f"  {path}: {e['msg']}{got}")
    return "\n".join(lines)


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
    "validation": ("seed", "runtime", "graders", "training", "resources", "validation"),
    "report": ("study", "report"),
}


def config_slice(config: AtlasConfig | dict[str, Any], stage: str, run: str | None = None) -> dict[str, Any]:
    """The keys `stage` reads. A training stage reads only its own run's entry of training.runs
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
    if stage in ("training", "checks", "dose_step", "validation"):
        training = dict(out["training"])
        runs, dose = training.pop("runs"), training.pop("dose_step")
        if training["engine"] == "local":  # the verl knobs cannot change a local run
            training.pop("verl")
        if stage == "validation":  # the policy's adapter shape; its run folder is an input
            training = {
                k: training[k] for k in ("lora_rank", "lora_alpha", "lora_targets", "responses_per_question")
            }
        elif stage in ("training", "checks"):  # the checks read the run's slice, and their own
            if run not in runs:
                raise KeyError(f"no training run {run!r}; configured: {sorted(runs)}")
            training["run"] = {**runs[run], "name": run, "steps": config.run_steps(run)}
        else:
            training["run"] = {**dose, "name": "dose_step"}
        out["training"] = training
    if stage == "validation":
        out["validation"] = {"samples": dumped["validation"]["samples"]}  # not the list of policies
    return out


# --- typed stage slices: what a stage's --config-slice holds, validated on arrival ---
#
# The JSON is config_slice()'s (the rule's params: Snakemake compares it between runs). A training
# stage's `training` holds its one run under `run`, not `runs`: editing another run must not rerun
# it. The slice models put that run in its own typed field, so no stage picks keys out by hand.


class RunSlice(RunConfig):
    """The one training run a training-stage slice holds."""

    name: str = Field(pattern=RUN_NAME, description="The run's name (training.runs.<name>).")
    steps: int = Field(ge=1, description="Steps of the ordered schedule, resolved from schedule.steps.")


class DoseRunSlice(DoseStepConfig):
    """The dose step's settings, as the dose-step slice holds them."""

    name: Literal["dose_step"] = Field(description="The stage's run name.")


def split_training(training: dict[str, Any]) -> tuple[TrainingConfig, dict[str, Any] | None]:
    """A slice's `training` JSON as the TrainingConfig of its engine keys (no runs: the slice holds
    one, or none), and its `run` entry if it has one."""
    keys = {k: v for k, v in training.items() if k != "run"}
    keys.setdefault("runs", {})
    keys.setdefault("dose_step", {"snapshot_of": None})  # the named run is not in this slice
    return TrainingConfig.model_validate(keys), training.get("run")


class _Slice(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _run_out_of_training(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("training"), dict):
            training, run = split_training(data["training"])
            data = {**data, "training": training}
            if run is not None:
                data["run"] = run
        return data


class DataSlice(_Slice):
    data: DataConfig = Field(description="Question inputs.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")


class ModelSlice(_Slice):
    model: ModelConfig = Field(description="Base model.")


class SmokeSlice(_Slice):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    smoke: SmokeConfig = Field(description="The smoke stage.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")


class BoundarySlice(_Slice):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")


class TrainSlice(_Slice):
    """A training run's slice (train, and with `checks` the checks stage)."""

    seed: int = Field(ge=0, description="Global seed.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The training keys of the run's engine, without runs.")
    resources: ResourcesConfig = Field(description="Device and GPUs (threads are not in any slice).")
    run: RunSlice = Field(description="The run this stage trains or checks.")


class ChecksSlice(TrainSlice):
    checks: ChecksConfig = Field(default_factory=ChecksConfig, description="The checks stage.")


class DoseSlice(_Slice):
    seed: int = Field(ge=0, description="Global seed.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The training keys, without runs.")
    resources: ResourcesConfig = Field(description="Device and GPUs (threads are not in any slice).")
    run: DoseRunSlice = Field(description="The doses and the potential being dosed.")


class ValidationSamples(_Strict):
    samples: int = Field(ge=1, description="Episodes per validation question.")


class ValidationSlice(_Slice):
    seed: int = Field(ge=0, description="Global seed.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The policy's adapter shape (LoRA keys); the rest default.")
    resources: ResourcesConfig = Field(description="Device (threads are not in any slice).")
    validation: ValidationSamples = Field(description="Full validation (not the list of policies).")


class ReportSlice(_Slice):
    study: str = Field(description="Name of the study.")
    report: ReportConfig = Field(description="The report folder.")
