"""atlas.verl.config: our config -> verl 0.9.1's Hydra overrides, composed through verl's own config
files and startup checks, and the errors for what verl cannot express.

The compose tests need verl (its own venv): without it they skip, unless ATLAS_REQUIRE_VERL is
set (CI's verl venv). The mapping's errors, the overrides file and the lazy import run anywhere.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atlas.config.base import ConfigError
from atlas.config.study import AtlasConfig, config_slice, load_config, parse_config
from atlas.config.training import TrainSlice
from atlas.verl.config import (
    AGENT_LOOP,
    VERL_ENTRY,
    VerlPaths,
    compose,
    hydra_value,
    launch_command,
    read_overrides,
    verl_overrides,
    write_overrides,
)
from conftest import REPO


def _verl(module: str):
    """verl's module; a skip without verl, unless ATLAS_REQUIRE_VERL is set (CI's verl venv)."""
    if os.environ.get("ATLAS_REQUIRE_VERL"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def raw_config(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / name).read_text())


def edited(name: str, edit) -> AtlasConfig:
    raw = raw_config(name)
    edit(raw)
    return parse_config(raw, name)


def on_one_gpu(raw: dict) -> None:
    """The embedded default as a verl run on one GPU."""
    raw["training"]["engine"] = "verl"
    raw["resources"] = {"device": "cuda", "gpus": 1}


def tiny_verl(verl: dict | None = None, training: dict | None = None, **ppo) -> AtlasConfig:
    """The embedded default on one GPU, with these training.verl, training and training.ppo keys."""

    def edit(raw):
        on_one_gpu(raw)
        raw["training"].update(training or {}, verl=verl or {})
        raw["training"]["ppo"].update(ppo)

    return edited("config.yaml", edit)


def overrides_for(cfg: AtlasConfig, run: str, paths: VerlPaths) -> list[str]:
    """verl_overrides of run `run`'s slice, as the train_verl stage gets it (engine verl)."""
    raw = cfg.model_dump(mode="json")
    raw["training"]["engine"] = "verl"
    return verl_overrides(TrainSlice.model_validate(config_slice(parse_config(raw), "training", run)), paths)


def verl_paths(root: Path, model: Path) -> VerlPaths:
    return VerlPaths(
        model=str(model),
        train_files=str(root / "verl" / "train.parquet"),
        val_files=str(root / "verl" / "val.parquet"),
        agent_loop_config=str(root / "verl" / "agent_loop.yaml"),
        reward_fn_path=str(REPO / "src" / "atlas" / "verl" / "reward.py"),
        checkpoints=str(root / "checkpoints"),
        metrics_file=str(root / "run" / "verl_metrics.jsonl"),
        wandb_dir=str(root / "run"),
        hydra_dir=str(root / "run" / "hydra"),
    )


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A real HF-format model folder as verl's HFModelConfig reads it at startup (config and
    tokenizer; verl's config checks load no weights)."""
    _verl("verl")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3Config

    folder = tmp_path_factory.mktemp("hf_model")
    vocab = {"<pad>": 0, "<|im_end|>": 1, "<unk>": 2, "a": 3}
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
    ).save_pretrained(folder)
    Qwen3Config(
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        architectures=["Qwen3ForCausalLM"],
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def report25(hf_model, tmp_path_factory):
    """report25.yaml's zero_potential arm: its paths, its overrides, and verl's composed config."""
    paths = verl_paths(tmp_path_factory.mktemp("report25"), hf_model)
    overrides = overrides_for(load_config(REPO / "config" / "report25.yaml"), "zero_potential", paths)
    return paths, overrides, compose(overrides)


@pytest.mark.verl
def test_report25_composes_with_the_reports_settings(report25):
    paths, overrides, c = report25
    assert overrides[:2] == ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync"]
    ar = c.actor_rollout_ref
    # verl V1 synchronous PPO on the report's 2 GPUs, 40 steps, resumable
    assert (c.trainer.use_v1, c.trainer.v1.trainer_mode) == (True, "sync")
    assert (c.trainer.nnodes, c.trainer.n_gpus_per_node) == (1, 2)
    assert (c.trainer.total_training_steps, c.trainer.total_epochs) == (40, 1)
    assert (c.trainer.resume_mode, c.trainer.default_local_dir) == ("auto", paths.checkpoints)
    assert (c.trainer.save_freq, c.trainer.test_freq, c.trainer.val_before_train) == (1, 5, True)
    assert list(c.trainer.logger) == ["console", "file", "wandb"]
    assert c.trainer.experiment_name == "zero_potential" and c.trainer.project_name == "atlas-report25"
    env = c.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env.VERL_FILE_LOGGER_PATH, env.WANDB_MODE, env.WANDB_DIR) == (
        paths.metrics_file,
        "offline",
        paths.wandb_dir,
    )
    assert (
        env.VERL_USE_EXTERNAL_MODULES == "atlas.verl.critic,atlas.verl.actor,atlas.verl.drift"
    )  # critic LoRA + head, masked actor
    # FSDP2, bf16, LoRA 64 / 128 on actor and critic; params offloaded, optimizer state on the GPU
    assert (ar.actor.strategy, ar.ref.strategy, c.critic.strategy) == ("fsdp2", "fsdp2", "fsdp2")
    for model in (ar.model, c.critic.model):
        assert (model.lora_rank, model.lora_alpha, model.target_modules) == (64, 128, "all-linear")
        assert model.path == paths.model
        assert model.enable_gradient_checkpointing and model.use_remove_padding
        # no flash-attn package in the CPU venv: auto resolves to sdpa for actor, ref and critic
        assert model.override_config.attn_implementation == "sdpa"
    for fsdp in (ar.actor.fsdp_config, c.critic.fsdp):
        assert (fsdp.param_offload, fsdp.optimizer_offload, fsdp.model_dtype) == (True, False, "bf16")
    assert ar.actor.use_remove_padding is True  # interpolated from the model section
    assert ar.actor.checkpoint.save_lora_only is True and c.critic.checkpoint.save_lora_only is True
    # vLLM rollouts through our agent loop: 32 questions x 8 responses a step, in file order
    assert (ar.rollout.name, ar.rollout.mode, ar.rollout.n) == ("vllm", "async", 8)
    assert (ar.rollout.temperature, ar.rollout.top_p, ar.rollout.tensor_model_parallel_size) == (1.0, 1.0, 2)
    assert (ar.rollout.prompt_length, ar.rollout.response_length, ar.rollout.max_model_len) == (49152,) * 3
    assert ar.rollout.multi_turn.max_assistant_turns == 6 and ar.rollout.multi_turn.max_parallel_calls == 1
    assert ar.rollout.agent.default_agent_loop == AGENT_LOOP == "atlas_tool_agent"
    assert ar.rollout.agent.agent_loop_config_path == paths.agent_loop_config
    assert (c.data.train_files, c.data.val_files) == (paths.train_files, paths.val_files)
    assert (c.data.train_batch_size, c.data.shuffle) == (32, False)
    # 4 mini-batches of 8 questions (64 trajectories), micro-batches of 2 per GPU
    for role in (ar.actor, c.critic):
        assert (role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu, role.ppo_epochs) == (8, 2, 1)
    # PPO: GAE, asymmetric and dual clip, k3 KL in the loss, the LoRA-sized learning rates
    assert (c.algorithm.adv_estimator, c.algorithm.gamma, c.algorithm.lam) == ("gae", 1.0, 1.0)
    assert (ar.actor.clip_ratio_low, ar.actor.clip_ratio_high, ar.actor.clip_ratio_c) == (0.2, 0.28, 3.0)
    assert (ar.actor.use_kl_loss, ar.actor.kl_loss_type, ar.actor.kl_loss_coef) == (True, "k3", 0.001)
    assert c.algorithm.use_kl_in_reward is False and c.critic.cliprange_value == 0.5
    for optim in (ar.actor.optim, c.critic.optim):
        assert (optim.lr, optim.clip_grad, optim.override_optimizer_config.eps) == (1e-5, 1.0, 1e-8)
        assert (optim.lr_scheduler_type, optim.lr_warmup_steps) == ("constant", 0)
    assert c.reward.custom_reward_function.path == paths.reward_fn_path
    assert c.reward.custom_reward_function.name == "compute_score"


@pytest.mark.verl
@pytest.mark.parametrize("chosen", ["auto", "flash_attention_2", "sdpa"])
def test_the_attention_reaches_the_hf_configs_verl_builds(hf_model, tmp_path, monkeypatch, chosen):
    """training.verl.attn_implementation becomes the attention of the HF config verl's
    HFModelConfig builds for the actor and the critic; auto follows whether flash-attn imports."""
    from verl.utils.config import omega_conf_to_dataclass

    import atlas.verl.config as verl_config

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        verl_config.importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "flash_attn" else real_find_spec(name, *a),
    )
    cfg = tiny_verl({"attn_implementation": chosen})
    c = compose(overrides_for(cfg, "training_smoke", verl_paths(tmp_path, hf_model)))
    want = "flash_attention_2" if chosen == "auto" else chosen  # flash-attn "installed" here
    assert c.actor_rollout_ref.model.override_config.attn_implementation == want
    assert c.critic.model.override_config.attn_implementation == want
    critic_model = omega_conf_to_dataclass(c.critic.model)
    assert critic_model.hf_config._attn_implementation == want


@pytest.mark.verl
def test_verl_dataclasses_read_the_composed_sections(report25):
    """The actor and critic sections become verl's own config objects (as its workers build them)."""
    from verl.utils.config import omega_conf_to_dataclass

    _, _, c = report25
    actor = omega_conf_to_dataclass(c.actor_rollout_ref.actor)
    assert actor.engine.strategy == "fsdp2" and actor.engine.param_offload is True
    assert actor.checkpoint.save_lora_only is True and actor.rollout_n == 8
    critic = omega_conf_to_dataclass(c.critic)
    assert critic.engine.strategy == "fsdp2" and critic.checkpoint.save_lora_only is True
    assert (critic.model.lora_rank, critic.model.lora_alpha) == (64, 128)


@pytest.mark.verl
def test_every_verl_process_imports_the_critic_and_the_masked_actor_patches(report25):
    from atlas.verl.config import EXTERNAL_MODULES

    _, overrides, _ = report25
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES="
    (value,) = [o.lstrip("+")[len(key) :] for o in overrides if o.lstrip("+").startswith(key)]
    assert (
        value.strip("'").split(",")
        == list(EXTERNAL_MODULES)
        == ["atlas.verl.critic", "atlas.verl.actor", "atlas.verl.drift"]
    )


@pytest.mark.verl
def test_tiny_default_on_one_gpu_composes_and_user_overrides_come_last(hf_model, tmp_path):
    cfg = tiny_verl(
        {"overrides": ["actor_rollout_ref.rollout.n=4"]},
        {"resume_mode": "disable"},
        kl_mode="reward",
        kl_kind="k1",
        lr_schedule="cosine",
        min_lr_ratio=0.1,
    )
    overrides = overrides_for(cfg, "training_smoke", verl_paths(tmp_path, hf_model))
    assert overrides[-1] == "actor_rollout_ref.rollout.n=4"
    c = compose(overrides)
    assert c.actor_rollout_ref.rollout.n == 4  # the user's override wins over responses_per_question (2)
    assert (c.trainer.total_training_steps, c.trainer.n_gpus_per_node) == (2, 1)
    assert c.trainer.resume_mode == "disable"
    assert (c.actor_rollout_ref.model.lora_rank, c.critic.model.lora_alpha) == (8, 16)
    assert c.actor_rollout_ref.rollout.max_model_len == 4096
    assert c.algorithm.use_kl_in_reward is True and c.actor_rollout_ref.actor.use_kl_loss is False
    algo = c.algorithm
    assert (algo.kl_penalty, algo.kl_ctrl.type, algo.kl_ctrl.kl_coef) == ("k1", "fixed", 0.001)
    assert (c.critic.optim.lr_scheduler_type, c.critic.optim.min_lr_ratio) == ("cosine", 0.1)


@pytest.mark.parametrize(
    "extra, named",
    [
        ("trainer.no_such_key=1", "trainer.no_such_key"),  # a key verl does not have
        ("+trainer.use_v1=false", "trainer.use_v1"),  # appending a key verl already has
        ("actor_rollout_ref.rollout.n=[4", "actor_rollout_ref.rollout.n=[4"),  # not Hydra syntax
        ("actor_rollout_ref.actor.loss_agg_mode=mean", "loss_agg_mode"),  # a value verl's dataclass refuses
    ],
)
@pytest.mark.verl
def test_a_bad_extra_override_names_itself(hf_model, tmp_path, extra, named):
    cfg = tiny_verl({"overrides": [extra]})
    overrides = overrides_for(cfg, "zero_potential", verl_paths(tmp_path, hf_model))
    with pytest.raises(ConfigError, match="verl") as err:
        compose(overrides)
    assert named in str(err.value)


@pytest.mark.parametrize(
    "ppo, key",
    [
        ({"whiten_advantages": False}, "training.ppo.whiten_advantages"),  # verl's GAE always whitens
        ({"mini_batches": 3}, "training.ppo.mini_batches"),  # 2 questions a step do not split in 3
        ({"mini_batches": 2, "warmup_steps": 3}, "training.ppo.warmup_steps"),  # verl warms up per step
    ],
)
def test_ppo_settings_verl_cannot_express_raise(tmp_path, ppo, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        overrides_for(tiny_verl(**ppo), "zero_potential", verl_paths(tmp_path, tmp_path / "model"))


def test_the_cpu_default_has_no_gpus_for_verl(tmp_path):
    cfg = load_config(REPO / "config" / "config.yaml")
    with pytest.raises(ConfigError, match=r"resources\.gpus"):
        overrides_for(cfg, "zero_potential", verl_paths(tmp_path, tmp_path / "model"))


def test_overrides_file_and_command(tmp_path):
    cfg = load_config(REPO / "config" / "report25.yaml")
    overrides = overrides_for(cfg, "frozen_potential", verl_paths(tmp_path / "a b", tmp_path / "model"))
    assert len({o.split("=", 1)[0] for o in overrides}) == len(overrides)  # every key set once
    path = tmp_path / "run" / "verl_overrides.txt"
    write_overrides(path, overrides)
    assert read_overrides(path) == overrides
    assert path.read_text().count("\n") == len(overrides)
    assert f"data.train_files='{tmp_path}/a b/verl/train.parquet'" in overrides  # quoted: a space
    assert launch_command(overrides) == [sys.executable, "-m", VERL_ENTRY, *overrides]
    assert VERL_ENTRY == "verl.trainer.main_ppo"


@pytest.mark.verl
def test_values_parse_back_through_hydra():
    _verl("verl")
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    scalars = [True, None, 3, 1e-5, 0.28, "k3", "all-linear", "/a/b.parquet", "true", "1.0"]
    quoted = ["a b", "it's", "c:\\x y", "x\\", "x\\'y"]  # spaces, quotes, backslashes
    for value in [*scalars, *quoted, ["q_proj", "v_proj"], [0.9, 0.999], {"eps": 1e-8}]:
        assert parser.parse_override(f"a.b={hydra_value(value)}").value() == value


def test_importing_needs_neither_verl_nor_hydra():
    code = "import sys, atlas.verl.config; print(sorted({'verl', 'hydra', 'omegaconf'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


@pytest.mark.verl
def test_the_shipped_verl_pipeline_config_composes_at_the_reports_batch(hf_model, tmp_path):
    """config/h200-verl.yaml over config/h200.yaml (--configfile h200.yaml h200-verl.yaml): the
    report's batch, LoRA and turns reach verl, and its node overrides compose."""
    from atlas.config.study import merged, read_yaml

    layers = [read_yaml(REPO / "config" / f) for f in ("config.yaml", "h200.yaml", "h200-verl.yaml")]
    cfg = parse_config(merged(merged(layers[0], layers[1]), layers[2]), "config/h200-verl.yaml")
    c = compose(overrides_for(cfg, "training_smoke", verl_paths(tmp_path, hf_model)))
    assert (c.data.train_batch_size, c.actor_rollout_ref.rollout.n) == (32, 8)
    assert (c.actor_rollout_ref.model.lora_rank, c.critic.model.lora_alpha) == (64, 128)
    assert c.trainer.total_training_steps == 2 and c.trainer.resume_mode == "auto"
    assert c.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3
    assert c.actor_rollout_ref.rollout.gpu_memory_utilization == 0.4
    assert c.actor_rollout_ref.rollout.enforce_eager is True
