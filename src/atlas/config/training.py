"""Training (`training`: the engine, PPO, verl), the runs and the dose step (`runs`, `dose_step`), and the slices of the stages that train: train, checks' base, dose_step, and the distributed roundtrip's."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from atlas.config.adapters import AdapterShape
from atlas.config.base import FloatPair, Strict
from atlas.config.data import ScheduleConfig
from atlas.config.graders import GraderConfig
from atlas.config.resources import ResourcesConfig
from atlas.config.runtime import RuntimeConfig


class PPOConfig(Strict):
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


class RunConfig(Strict):
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


class DoseStepConfig(Strict):
    """One step from the same start at several doses, on identical rollouts."""

    doses: list[float] = Field(default=[0.0, 0.5, 1.0], min_length=2, description="Doses compared.")
    potential: str = Field(default="critic_snapshot", description="The potential being dosed.")
    snapshot_of: str | None = Field(default="training_smoke", description="See RunConfig.snapshot_of.")
    snapshot_step: int | None = Field(default=None, ge=1, description="See RunConfig.snapshot_step.")


def check_runs(runs: dict[str, RunConfig], dose_step: DoseStepConfig) -> None:
    """Raise ValueError unless every run's name is usable, every snapshot names a run, and no
    chain of snapshots is a cycle."""
    for name, run in runs.items():
        if not re.match(RUN_NAME, name) or name == "dose_step":
            raise ValueError(f"run name {name!r}: expected {RUN_NAME} and not 'dose_step'")
        if run.snapshot_of is not None and run.snapshot_of not in runs:
            raise ValueError(f"runs.{name}.snapshot_of: no run named {run.snapshot_of!r}")
        seen, at = {name}, run.snapshot_of
        while at is not None:  # a snapshot chain must end: a -> b -> a cannot be built
            if at in seen:
                raise ValueError(f"runs.{name}.snapshot_of: the chain through {at!r} is a cycle")
            seen.add(at)
            at = runs[at].snapshot_of
    snap = dose_step.snapshot_of
    if snap is not None and snap not in runs:
        raise ValueError(f"dose_step.snapshot_of: no run named {snap!r}")


def default_runs() -> dict[str, RunConfig]:
    return {
        "training_smoke": RunConfig(steps=2, potential="zero", dose=0.0),
        "zero_potential": RunConfig(potential="zero", dose=1.0),
        "frozen_potential": RunConfig(potential="critic_snapshot", dose=1.0, snapshot_of="training_smoke"),
    }


class VerlConfig(Strict):
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


class TrainingConfig(AdapterShape):  # the adapters' keys (lora_*) are AdapterShape's
    """Training (`training`): the keys every run shares: the engine, the policy's adapters, PPO,
    checkpoints, periodic validation, wandb and verl. The runs and the dose step sit at the top
    level of the config (`runs`, `dose_step`); a training stage's slice holds these keys and its
    one run."""

    engine: Literal["local", "verl"] = Field(
        default="local",
        description="local: torch + transformers + peft in one process; verl: verl V1 sync PPO.",
    )
    responses_per_question: int = Field(
        ge=1, description="Responses sampled per question per step (the group size)."
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
    verl: VerlConfig = Field(default_factory=VerlConfig, description="engine: verl only (ignored by local).")


class RunSlice(RunConfig):
    """The one training run a training-stage slice holds."""

    name: str = Field(pattern=RUN_NAME, description="The run's name (runs.<name>).")
    steps: int = Field(ge=1, description="Steps of the ordered schedule, resolved from schedule.steps.")


class DoseRunSlice(DoseStepConfig):
    """The dose step's settings, as the dose-step slice holds them."""

    name: Literal["dose_step"] = Field(description="The stage's run name.")


def split_training(training: dict[str, Any]) -> tuple[TrainingConfig, dict[str, Any] | None]:
    """A slice's `training` JSON as its TrainingConfig (a slice holds no runs: one, or none),
    and its `run` entry if it has one."""
    keys = {k: v for k, v in training.items() if k != "run"}
    return TrainingConfig.model_validate(keys), training.get("run")


class TrainingSlice(Strict):
    @model_validator(mode="before")
    @classmethod
    def _run_out_of_training(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("training"), dict):
            training, run = split_training(data["training"])
            data = {**data, "training": training}
            if run is not None:
                data["run"] = run
        return data


class TrainSlice(TrainingSlice):
    """A training run's slice (train, and with `checks` the checks stage)."""

    seed: int = Field(ge=0, description="Global seed.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The training keys every run shares.")
    resources: ResourcesConfig = Field(description="Device and GPUs (threads are not in any slice).")
    run: RunSlice = Field(description="The run this stage trains or checks.")


class DoseSlice(TrainingSlice):
    seed: int = Field(ge=0, description="Global seed.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
    runtime: RuntimeConfig = Field(description="Tool runtime limits.")
    graders: GraderConfig = Field(description="Sandboxed program runs.")
    training: TrainingConfig = Field(description="The training keys every run shares.")
    resources: ResourcesConfig = Field(description="Device and GPUs (threads are not in any slice).")
    run: DoseRunSlice = Field(description="The doses and the potential being dosed.")


class RoundtripSlice(TrainingSlice):
    """The distributed roundtrip's slice: the policy it shards (adapter shape, learning rates) and
    the seed it is built with. Every run's roundtrip reads the same one; the run's checkpoint is
    its input folder."""

    seed: int = Field(ge=0, description="Global seed.")
    training: TrainingConfig = Field(description="The training keys every run shares.")
