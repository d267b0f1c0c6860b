"""Config generation for `engine: verl`: our config -> verl 0.9.1's Hydra overrides for one run.

    paths = VerlPaths(model=..., train_files=..., ...)      # files the launcher wrote
    overrides = verl_overrides(train_slice, paths)        # the run's TrainSlice
    compose(overrides)                                       # verl's own config + startup checks
    write_overrides(run_folder / "verl_overrides.txt", overrides)
    subprocess.run(launch_command(overrides), check=True)

The overrides select verl's V1 synchronous PPO trainer (`trainer.use_v1=True`,
`trainer.v1.trainer_mode=sync`: rollout and training share the GPUs) with the report's settings:
FSDP2, bf16 weights, LoRA on actor and critic, vLLM rollouts driven by our agent loop, parameters
offloaded to CPU between phases with optimizer state left on the GPU, `resume_mode=auto`. Every key
was checked against verl 0.9.1's `trainer/config/ppo_trainer.yaml` and the dataclasses behind it;
`compose` proves it for a given config by composing verl's own config files with the overrides and
running the checks verl runs at startup before it starts Ray.

verl and Hydra are imported inside the functions: Snakemake rules import this module in an
environment without verl.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas.config.base import ConfigError
from atlas.config.training import TrainSlice
from atlas.hashing import atomic_write_text

# The V1 entry point: in 0.9.1 `verl.trainer.main_ppo` runs TaskRunnerV1 (PPOTrainerSync for
# trainer_mode=sync) when trainer.use_v1 is set; main_ppo_v0 is the deprecated legacy trainer.
VERL_ENTRY = "verl.trainer.main_ppo"
# The name our agent loop registers under (atlas.verl.agent_loop.AGENT_NAME; not imported here,
# since that module imports verl) and the reward function verl's reward loop calls.
AGENT_LOOP = "atlas_tool_agent"
REWARD_FN = "compute_score"
# Modules every process of the verl job imports (verl reads VERL_USE_EXTERNAL_MODULES on `import
# verl`): the critic LoRA with its value head (atlas.verl.critic) must reach the Ray workers.
# atlas.verl.actor makes the actor's log-probs those under the grammar masks; atlas.verl.drift
# adds the local engine's rollout-vs-trainer metrics to the trainer's.
EXTERNAL_MODULES = ("atlas.verl.critic", "atlas.verl.actor", "atlas.verl.drift")
if TYPE_CHECKING:  # the same modules as imports, so the workflow's code inputs (atlas.sources) hold them
    import atlas.verl.actor
    import atlas.verl.critic
    import atlas.verl.drift  # noqa: F401


@dataclass(frozen=True)
class VerlPaths:
    """The files and folders one verl training run reads and writes.

    model            HF-format base model folder (actor, reference and critic all start from it).
    train_files      verl dataset parquet of the run's ordered schedule: one row per slot, step by
                     step (steps x questions_per_step rows); verl reads it in file order.
    val_files        verl dataset parquet of the periodic-validation questions.
    agent_loop_config  YAML registering our agent loop (rollout.agent.agent_loop_config_path).
    reward_fn_path   the .py file defining `compute_score` (src/atlas/verl/reward.py).
    checkpoints      trainer.default_local_dir: global_step_<k>/{actor,critic}/..., and where
                     resume_mode=auto looks for the latest complete step.
    metrics_file     JSONL of verl's per-step metrics (verl's `file` logger, one
                     {"step": k, "data": {...}} line per step). verl takes its path from the
                     VERL_FILE_LOGGER_PATH environment variable, not from a config key, so the
                     overrides put it in Ray's runtime_env. verl opens it with mode "wb": a resumed
                     launch truncates it, so give each launch its own file.
    wandb_dir        WANDB_DIR (wandb writes <wandb_dir>/wandb/); needed unless wandb_mode is
                     disabled.
    hydra_dir        hydra.run.dir: Hydra's output folder (the composed config in .hydra/ and the
                     job log); null leaves Hydra's default, outputs/<date>/<time>/ under the cwd.
    rollout_data_dir  trainer.rollout_data_dir: verl's per-step dump of the generations
                     (<step>.jsonl); null writes none.
    """

    model: str
    train_files: str
    val_files: str
    agent_loop_config: str
    reward_fn_path: str
    checkpoints: str
    metrics_file: str
    wandb_dir: str | None = None
    hydra_dir: str | None = None
    rollout_data_dir: str | None = None


# ---------------------------------------------------------------------------------------------
# Values in Hydra's override grammar


_BARE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf"}


def hydra_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it back (bool, None, int, float, str,
    list, dict). Strings are quoted unless they are plain words or paths."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _BARE.match(value) and value.lower() not in _HYDRA_WORDS:
            return value
        # in a quoted value a backslash is literal unless it precedes a quote (or the closing one)
        quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted) + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra override form for {type(value).__name__}: {value!r}")


# ---------------------------------------------------------------------------------------------
# Our config -> verl's keys


def _gpus(cfg: TrainSlice) -> tuple[int, int]:
    """(nnodes, GPUs per node). verl has no CPU platform, so a verl run needs GPUs."""
    v = cfg.training.verl
    per_node = v.gpus_per_node if v.gpus_per_node is not None else cfg.resources.gpus
    if per_node < 1:
        raise ConfigError(
            "training.engine verl runs on GPUs only: set resources.gpus (with resources.device: cuda) "
            "or training.verl.gpus_per_node"
        )
    if (v.nnodes * per_node) % v.rollout_tensor_parallel:
        raise ConfigError(
            f"training.verl.rollout_tensor_parallel ({v.rollout_tensor_parallel}) must divide the "
            f"{v.nnodes * per_node} GPUs of the run (nnodes x gpus_per_node)"
        )
    return v.nnodes, per_node


def _mini_batch_prompts(cfg: TrainSlice, n_gpus: int) -> int:
    """verl's ppo_mini_batch_size counts prompts (it multiplies by rollout.n); ours splits the
    step's trajectories into `mini_batches` optimizer steps."""
    ppo, q = cfg.training.ppo, cfg.schedule.questions_per_step
    if q % ppo.mini_batches:
        raise ConfigError(
            f"training.ppo.mini_batches ({ppo.mini_batches}) must divide schedule.questions_per_step "
            f"({q}): verl's mini-batches hold whole questions (all their responses)"
        )
    prompts = q // ppo.mini_batches
    trajectories = prompts * cfg.training.responses_per_question
    if trajectories % n_gpus:
        raise ConfigError(
            f"training.ppo.mini_batches ({ppo.mini_batches}): a mini-batch of {trajectories} trajectories "
            f"does not split over {n_gpus} GPUs (verl shards each mini-batch evenly)"
        )
    return prompts


def _warmup_steps(cfg: TrainSlice) -> int:
    """verl steps its LR scheduler once per training step (after the step's last mini-batch),
    ours once per optimizer step; a warm-up converts only in whole training steps. (verl's ramp
    is k / w from 0, ours (k + 1) / (w + 1); with the report's warmup_steps 0 both are flat.)"""
    ppo = cfg.training.ppo
    per_step = ppo.epochs * ppo.mini_batches
    if ppo.warmup_steps % per_step:
        raise ConfigError(
            f"training.ppo.warmup_steps ({ppo.warmup_steps}) must be a multiple of epochs x mini_batches "
            f"({per_step}): verl steps the LR schedule once per training step, not per optimizer step"
        )
    return ppo.warmup_steps // per_step


def _optim(cfg: TrainSlice, lr: float) -> dict[str, Any]:
    """One role's optimizer keys (actor_rollout_ref.actor.optim / critic.optim). The cosine
    schedule has verl's shape (min_lr_ratio floor, half cosine) but moves once per training step."""
    ppo = cfg.training.ppo
    return {
        "lr": lr,
        "weight_decay": ppo.weight_decay,
        "betas": list(ppo.betas),
        # verl has no eps key; override_optimizer_config goes to the optimizer's constructor.
        "override_optimizer_config": {"eps": ppo.eps},
        # the engines clip with optim.clip_grad (the role's grad_clip is the legacy key, set too)
        "clip_grad": ppo.grad_clip,
        "lr_warmup_steps": _warmup_steps(cfg),
        "lr_warmup_steps_ratio": 0.0,
        "lr_scheduler_type": ppo.lr_schedule,
        "min_lr_ratio": ppo.min_lr_ratio,
    }


def _kl(cfg: TrainSlice) -> dict[str, Any]:
    """kl_mode 'loss' -> actor.use_kl_loss; 'reward' -> algorithm.use_kl_in_reward with a fixed
    controller. verl names the estimators k1/k2/k3/abs as we do (and kl/mse/low_var_kl)."""
    ppo = cfg.training.ppo
    loss, reward = ppo.kl_mode == "loss", ppo.kl_mode == "reward"
    return {
        "actor_rollout_ref.actor.use_kl_loss": loss,
        "actor_rollout_ref.actor.kl_loss_coef": ppo.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": ppo.kl_kind,
        "algorithm.use_kl_in_reward": reward,
        "algorithm.kl_penalty": ppo.kl_kind,
        "algorithm.kl_ctrl.type": "fixed",
        "algorithm.kl_ctrl.kl_coef": ppo.kl_coef,
    }


def _unmappable(cfg: TrainSlice) -> None:
    ppo = cfg.training.ppo
    if not ppo.whiten_advantages:
        raise ConfigError(
            "training.ppo.whiten_advantages: false has no verl equivalent (verl's GAE always whitens "
            "the advantages over the batch); set it to true for engine verl"
        )


def attention(cfg: TrainSlice) -> str:
    """training.verl.attn_implementation resolved in this environment (the launch's, which is the
    workers')."""
    chosen = cfg.training.verl.attn_implementation
    if chosen != "auto":
        return chosen
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


def verl_overrides(cfg: TrainSlice, paths: VerlPaths) -> list[str]:
    """verl's Hydra overrides for the slice's training run, in the order main_ppo applies them; the
    user's training.verl.overrides come last and so win."""
    run = cfg.run.name
    _unmappable(cfg)
    t, rt, ppo, v = cfg.training, cfg.runtime, cfg.training.ppo, cfg.training.verl
    nnodes, per_node = _gpus(cfg)
    mini = _mini_batch_prompts(cfg, nnodes * per_node)
    steps = cfg.run.steps
    logger = ["console", "file"] + ([] if t.wandb_mode == "disabled" else ["wandb"])
    if "wandb" in logger and paths.wandb_dir is None:
        raise ConfigError(f"training.wandb_mode is {t.wandb_mode!r}: VerlPaths.wandb_dir is needed")
    dtype = "bf16"  # the report trained in bf16 (verl's model_dtype default is fp32)
    lora = {"lora_rank": t.lora_rank, "lora_alpha": t.lora_alpha, "target_modules": t.lora_targets}
    model = {
        "path": paths.model,
        **lora,
        "enable_gradient_checkpointing": ppo.on_gpu("gradient_checkpointing", cuda=True),
        # the actor's and ref's use_remove_padding interpolate this key
        "use_remove_padding": ppo.on_gpu("remove_padding", cuda=True),
    }
    fsdp = {"param_offload": v.param_offload, "optimizer_offload": v.optimizer_offload, "model_dtype": dtype}
    ar = "actor_rollout_ref"

    keys: dict[str, Any] = {
        # -- the V1 synchronous trainer
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": "sync",
        "trainer.nnodes": nnodes,
        "trainer.n_gpus_per_node": per_node,
        "trainer.total_training_steps": steps,
        # train_files holds the run's schedule; one epoch is the run, and a shorter file ends
        # the run early instead of cycling silently
        "trainer.total_epochs": 1,
        "trainer.save_freq": t.checkpoint_every,
        "trainer.test_freq": t.validation_every,
        "trainer.val_before_train": True,  # we validate before the first step too
        # 'disable' starts from step 0 in verl too; moving the run's old checkpoints aside (as the
        # local engine does) is the launcher's job, verl leaves them in default_local_dir
        "trainer.resume_mode": t.resume_mode,
        "trainer.default_local_dir": paths.checkpoints,
        "trainer.project_name": t.wandb_project,
        "trainer.experiment_name": run,
        "trainer.logger": logger,
        "trainer.rollout_data_dir": paths.rollout_data_dir,
        # -- data: the schedule is already ordered
        "data.train_files": paths.train_files,
        "data.val_files": paths.val_files,
        "data.train_batch_size": cfg.schedule.questions_per_step,
        "data.shuffle": False,
        "data.seed": cfg.seed,
        # max_trajectory_tokens bounds prompt + response together, but verl pads each side to its
        # own length, and either side alone can take nearly all of it (a long LCB statement; a
        # short prompt and max_turns of turns). So each side gets the whole budget, and vLLM's
        # max_model_len holds the sum to it (our agent loop sizes every turn to fit).
        "data.max_prompt_length": rt.max_trajectory_tokens,
        "data.max_response_length": rt.max_trajectory_tokens,
        # -- algorithm: GAE on the driver
        "algorithm.adv_estimator": "gae",
        "algorithm.gamma": ppo.gamma,
        "algorithm.lam": ppo.lam,
        # -- actor, reference (LoRA: the actor with its adapter off) and rollout share one model
        **{f"{ar}.model.{k}": val for k, val in model.items()},
        # verl reads the attention from override_config (HFModelConfig, default flash_attention_2)
        f"+{ar}.model.override_config.attn_implementation": attention(cfg),
        f"{ar}.actor.strategy": "fsdp2",
        **{f"{ar}.actor.fsdp_config.{k}": val for k, val in fsdp.items()},
        **{f"{ar}.ref.fsdp_config.{k}": val for k, val in fsdp.items() if k != "optimizer_offload"},
        f"{ar}.actor.fsdp_config.seed": cfg.seed,
        f"{ar}.actor.data_loader_seed": cfg.seed,
        f"{ar}.actor.ppo_epochs": ppo.epochs,
        f"{ar}.actor.ppo_mini_batch_size": mini,
        f"{ar}.actor.ppo_micro_batch_size_per_gpu": ppo.micro_batch_size,
        f"{ar}.actor.use_dynamic_bsz": False,
        f"{ar}.actor.clip_ratio_low": ppo.clip_ratio_low,
        f"{ar}.actor.clip_ratio_high": ppo.clip_ratio_high,
        f"{ar}.actor.clip_ratio_c": ppo.clip_ratio_c,
        f"{ar}.actor.entropy_coeff": ppo.entropy_coef,
        f"{ar}.actor.loss_agg_mode": ppo.loss_agg_mode,
        f"{ar}.actor.grad_clip": ppo.grad_clip,
        **_kl(cfg),
        **{f"{ar}.actor.optim.{k}": val for k, val in _optim(cfg, ppo.actor_lr).items()},
        # compact checkpoints: LoRA weights only (a CheckpointConfig field since 0.9.0, not in the
        # YAML, hence '+'). verl keeps keys holding 'lora_' or '.adapter_'.
        f"+{ar}.actor.checkpoint.save_lora_only": True,
        f"{ar}.ref.log_prob_micro_batch_size_per_gpu": ppo.micro_batch_size,
        f"{ar}.rollout.name": "vllm",
        f"{ar}.rollout.mode": "async",
        f"{ar}.rollout.n": t.responses_per_question,
        f"{ar}.rollout.temperature": rt.temperature,
        f"{ar}.rollout.top_p": rt.top_p,
        f"{ar}.rollout.seed": cfg.seed,
        f"{ar}.rollout.max_model_len": rt.max_trajectory_tokens,
        f"{ar}.rollout.tensor_model_parallel_size": v.rollout_tensor_parallel,
        f"{ar}.rollout.gpu_memory_utilization": v.gpu_memory_utilization,
        # vLLM loads the base weights from the model folder; each sync then sends the adapters
        f"{ar}.rollout.load_format": "safetensors",
        # vLLM's (masked) log-probs of the sampled tokens: verl logs their gap to the actor's
        # recomputed ones (training/rollout_probs_diff_*)
        f"{ar}.rollout.calculate_log_probs": True,
        f"{ar}.rollout.log_prob_micro_batch_size_per_gpu": ppo.micro_batch_size,
        # validation samples as training does (the local engine's validation draws too)
        f"{ar}.rollout.val_kwargs.n": t.validation_samples,
        f"{ar}.rollout.val_kwargs.do_sample": True,
        f"{ar}.rollout.val_kwargs.temperature": rt.temperature,
        f"{ar}.rollout.val_kwargs.top_p": rt.top_p,
        # verl's multi_turn keys are read by its own tool agent loop; ours reads runtime.* itself.
        # Set to the same limits (max_tool_response_length counts characters, as ours does).
        f"{ar}.rollout.multi_turn.enable": True,
        f"{ar}.rollout.multi_turn.max_assistant_turns": rt.max_turns,
        f"{ar}.rollout.multi_turn.max_user_turns": rt.max_turns,
        f"{ar}.rollout.multi_turn.max_parallel_calls": 1,
        f"{ar}.rollout.multi_turn.max_tool_response_length": rt.tool_output_chars,
        f"{ar}.rollout.agent.default_agent_loop": AGENT_LOOP,
        f"{ar}.rollout.agent.agent_loop_config_path": paths.agent_loop_config,
        # -- critic: the same base model with its own LoRA and value head
        "critic.strategy": "fsdp2",
        **{f"critic.model.{k}": val for k, val in model.items()},
        "+critic.model.override_config.attn_implementation": attention(cfg),
        **{f"critic.fsdp.{k}": val for k, val in fsdp.items()},
        "critic.fsdp.seed": cfg.seed,
        "critic.data_loader_seed": cfg.seed,
        "critic.ppo_epochs": ppo.epochs,
        "critic.ppo_mini_batch_size": mini,
        "critic.ppo_micro_batch_size_per_gpu": ppo.micro_batch_size,
        "critic.cliprange_value": ppo.cliprange_value,
        "critic.loss_agg_mode": ppo.loss_agg_mode,
        "critic.grad_clip": ppo.grad_clip,
        **{f"critic.optim.{k}": val for k, val in _optim(cfg, ppo.critic_lr).items()},
        # verl's filter keeps only LoRA keys; atlas.verl.critic's checkpoint manager adds the
        # value head to the file (and refuses to resume from a critic file without it)
        "+critic.checkpoint.save_lora_only": True,
        # -- reward: scored from the records (0.9.1 moved the key under reward.)
        "reward.custom_reward_function.path": paths.reward_fn_path,
        "reward.custom_reward_function.name": REWARD_FN,
        # -- Ray's job environment: our modules in every verl process, and where verl's file
        # logger and wandb write (environment variables, not config keys)
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES": ",".join(EXTERNAL_MODULES),
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": paths.metrics_file,
        # vLLM's xgrammar backend on our token table (atlas.verl.vllm_plugin) in its server processes
        "+ray_kwargs.ray_init.runtime_env.env_vars.ATLAS_VLLM_TOKEN_TABLE": "1",
    }
    if "wandb" in logger:
        keys["+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE"] = t.wandb_mode
        keys["+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR"] = paths.wandb_dir
    if v.ray_address is not None:
        keys["+ray_kwargs.ray_init.address"] = v.ray_address
    if paths.hydra_dir is not None:
        keys["hydra.run.dir"] = paths.hydra_dir
    return [f"{k}={hydra_value(val)}" for k, val in keys.items()] + list(v.overrides)


# ---------------------------------------------------------------------------------------------
# verl's own config and checks


def verl_config_dir() -> Path:
    """verl's Hydra config folder (verl/trainer/config), found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("engine verl needs the verl package (pip install 'atlas[verl]', its own venv)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _check_syntax(overrides: list[str]) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_override(o)
        except HydraException as err:
            raise ConfigError(f"verl override {o!r} is not valid Hydra syntax: {err}") from None


def _composition_error(err: Exception, overrides: list[str]) -> ConfigError:
    """Hydra names the key it could not set; name the override(s) that set it too."""
    msg = str(err).strip()
    quoted = set(re.findall(r"'([^']+)'", msg))
    named = [o for o in overrides if _override_key(o) in quoted]
    # "Could not append" blames a '+' override; "Could not override" one without
    appending = [o for o in named if o.startswith("+") == ("Could not append" in msg)]
    named = appending or named
    which = f" ({', '.join(repr(o) for o in named)})" if named else ""
    return ConfigError(f"verl's config rejected an override{which}: {msg}")


def _validate(config) -> None:
    """What verl's main_ppo.main runs before Ray starts: validate_config, which converts the
    actor and critic sections to verl's dataclasses (the critic's HFModelConfig reads the model
    folder's config and tokenizer) and checks batch sizes against the GPUs; then the model and
    rollout sections, converted to their dataclasses as the trainer and its workers convert them
    (they check themselves), and the V1 trainer mode, looked up in verl's trainer registry when that imports (it needs the
    transferqueue package)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    checked = config
    if importlib.util.find_spec("vllm") is None:
        # validate_config's last check looks the LoRA rank up in vLLM's table, importing vllm
        # (a GPU wheel). Without it, run every other check: on a copy whose rollout is not named
        # vllm, the one field that check reads.
        checked = copy.deepcopy(config)
        checked.actor_rollout_ref.rollout.name = "vllm (not installed: LoRA rank table not checked)"
    validate_config(
        checked, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    # what the driver and the actor-rollout workers convert next (the reference section is
    # rewritten by the workers before its conversion, so it is left to them)
    omega_conf_to_dataclass(config.actor_rollout_ref.model)
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    try:
        from verl.trainer.ppo.v1 import get_trainer_cls
    except ModuleNotFoundError as err:
        if err.name != "transfer_queue":
            raise
    else:
        get_trainer_cls(config.trainer.v1.trainer_mode)


def compose(overrides: list[str]):
    """verl's `ppo_trainer` config with `overrides`, composed as verl.trainer.main_ppo composes it
    (Hydra, verl's config folder), then checked by verl's own startup validation. Returns the
    OmegaConf DictConfig; a bad override or a value verl refuses raises ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_syntax(overrides)
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            config = hydra_compose(config_name="ppo_trainer", overrides=overrides)
    except HydraException as err:
        raise _composition_error(err, overrides) from None
    try:
        _validate(config)
    except (HydraException, OmegaConfBaseException, AssertionError, ValueError, TypeError, OSError) as err:
        raise ConfigError(
            f"verl's config checks refused the composed config: {type(err).__name__}: {err}"
        ) from err
    return config


# ---------------------------------------------------------------------------------------------
# The command


def write_overrides(path: str | Path, overrides: list[str]) -> None:
    """One override per line, written atomically. Rerun with
    `xargs -d '\\n' -a PATH python -m verl.trainer.main_ppo`."""
    bad = [o for o in overrides if "\n" in o]
    if bad:
        raise ConfigError(f"verl override {bad[0]!r} holds a newline; one override per line cannot hold it")
    atomic_write_text(path, "".join(o + "\n" for o in overrides))


def read_overrides(path: str | Path) -> list[str]:
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def launch_command(overrides: list[str]) -> list[str]:
    """argv of verl's V1 PPO entry point with these overrides (the current interpreter)."""
    return [sys.executable, "-m", VERL_ENTRY, *overrides]
