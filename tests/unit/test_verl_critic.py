"""The verl critic with LoRA (atlas.verl.critic) on a tiny random Qwen3, on CPU, against verl 0.9.1.

What runs for real: verl's HFModelConfig, verl's own `_build_lora_module` (the defect) and
atlas's override, verl's FSDP2 wrapping (`apply_fsdp2`) on a one-rank gloo CPU mesh, verl's
optimizer builder and value loss, verl's FSDPCheckpointManager save/load and its resume lookup.
What cannot run on CPU: `FSDPEngine.__init__` (it builds a CUDA device mesh, verl has no CPU
platform). So the critic is loaded by atlas.verl.critic.load_value_model, the loader CriticEngine's
_build_module puts in place of verl's (which asks for flash_attention_2 whatever the config says),
with sdpa attention, and the engine methods are called on an engine object whose __init__ did not
run; they read only `self.model_config`.

The file skips without verl (the project's own venv) unless ATLAS_REQUIRE_VERL is set.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import pytest
import torch


def _verl(module: str):
    """verl's module; a skip without verl, unless ATLAS_REQUIRE_VERL is set (CI's verl venv)."""
    if os.environ.get("ATLAS_REQUIRE_VERL"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


pytestmark = pytest.mark.verl  # the module skips without verl (tests/ci_skips.py)
_verl("verl")

import torch.distributed as dist  # noqa: E402
from peft import get_peft_model  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from transformers import AutoModelForTokenClassification, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from verl.trainer.config import CheckpointConfig  # noqa: E402
from verl.trainer.ppo.core_algos import compute_value_loss  # noqa: E402
from verl.utils.checkpoint.checkpoint_manager import (  # noqa: E402
    find_latest_ckpt_path,
    get_checkpoint_tracker_filename,
)
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager  # noqa: E402
from verl.utils.fsdp_utils import MixedPrecisionPolicy, apply_fsdp2  # noqa: E402
from verl.workers.config import FSDPOptimizerConfig, HFModelConfig  # noqa: E402
from verl.workers.config.optimizer import build_optimizer  # noqa: E402
from verl.workers.engine import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import (  # noqa: E402
    FSDPEngineWithLMHead,
    FSDPEngineWithValueHead,
)

from atlas.verl import critic  # noqa: E402

HIDDEN, LAYERS, VOCAB = 64, 2, 512
HEAD = [
    "base_model.model.score.modules_to_save.default.weight",
    "base_model.model.score.modules_to_save.default.bias",
]


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """One gloo rank: verl's checkpoint manager asks torch.distributed for rank and world size."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_config(tmp_path_factory) -> HFModelConfig:
    """verl's critic model config for a tiny random Qwen3 saved as a causal LM (as a base model is)."""
    path = tmp_path_factory.mktemp("base")
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return HFModelConfig(
        path=str(path),
        load_tokenizer=False,
        lora_rank=8,
        lora_alpha=16,
        target_modules="all-linear",
        override_config={"attn_implementation": "sdpa"},
    )


def value_model(model_config: HFModelConfig, seed: int):
    """The critic as verl 0.9.1 loads it: FSDPEngine._build_module for model_type 'value_model'
    (workers/engine/fsdp/transformer_impl.py:290-305) sets these config fields and calls
    load_valuehead_model (utils/model.py:641), which CriticEngine replaces with
    critic.load_value_model (the model config's attention, sdpa here)."""
    hf = model_config.hf_config
    hf.num_labels = 1
    hf.classifier_dropout = 0.0
    hf.hidden_dropout = "0"
    hf.summary_dropout_prob = 0.0
    torch.manual_seed(seed)  # the head is not in the base checkpoint: random at every build
    return critic.load_value_model(model_config.local_path, torch.float32, hf, trust_remote_code=False)


def engine_for_lora_build(cls, model_config: HFModelConfig):
    """An engine object for `_build_lora_module` alone, which reads only self.model_config:
    FSDPEngine.__init__ needs a CUDA device mesh (transformer_impl.py:154)."""
    engine = object.__new__(cls)
    engine.model_config = model_config
    return engine


def fsdp2(module):
    """verl's FSDP2 wrap (transformer_impl.py:472) on a one-rank CPU mesh, fp32 throughout. verl then
    calls fsdp2_load_full_state_dict, which moves to CUDA and on one rank re-broadcasts the
    weights already in place; it is left out."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=["fsdp"])
    policy = MixedPrecisionPolicy(
        param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=True
    )
    apply_fsdp2(
        module, {"mesh": mesh, "mp_policy": policy, "offload_policy": None, "reshard_after_forward": True}, {}
    )
    return module


def values(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Values as FSDPEngineWithValueHead reads them without padding removal (transformer_impl.py:1631)."""
    position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    out = model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        position_ids=position_ids,
        use_cache=False,
    )
    return out.logits.squeeze(-1)


def critic_with_lora(model_config: HFModelConfig, seed: int):
    engine = engine_for_lora_build(critic.CriticEngine, model_config)
    return engine._build_lora_module(value_model(model_config, seed))


def value_step(model, optimizer, input_ids: torch.Tensor) -> None:
    """One critic update with verl's value loss."""
    torch.manual_seed(1)
    returns = torch.randn(input_ids.shape)
    vpreds = values(model, input_ids)
    loss, _ = compute_value_loss(
        vpreds, returns, vpreds.detach(), torch.ones_like(returns), cliprange_value=0.5
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def trained_critic(model_config: HFModelConfig, seed: int, input_ids: torch.Tensor):
    model = fsdp2(critic_with_lora(model_config, seed))
    optimizer = build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-2, total_training_steps=4))
    for _ in range(2):  # LoRA B starts at zero; two steps move every trainable tensor
        value_step(model, optimizer, input_ids)
    return model, optimizer


def batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed))


def saved_model_file(folder) -> dict:
    return torch.load(critic.model_file(str(folder), 1, 0), weights_only=False)


# --- the defects, on verl 0.9.1 --------------------------------------------------------------


def test_verl_critic_lora_build_crashes(model_config):
    """verl's own build: LoraConfig(task_type=CAUSAL_LM) (transformer_impl.py:359-368) on a token
    classifier; peft's causal-LM wrapper needs prepare_inputs_for_generation, which it lacks."""
    engine = engine_for_lora_build(FSDPEngineWithValueHead, model_config)
    with pytest.raises(AttributeError, match="prepare_inputs_for_generation"):
        engine._build_lora_module(value_model(model_config, seed=0))


def test_verl_lora_only_save_drops_the_head(process_group, model_config, tmp_path):
    """verl's FSDPCheckpointManager with save_lora_only keeps names with 'lora_'/'.adapter_' only:
    the head is not saved, and the resumed critic runs with a fresh random head, silently."""
    input_ids = batch()
    model, optimizer = trained_critic(model_config, seed=0, input_ids=input_ids)
    FSDPCheckpointManager(
        model, optimizer, checkpoint_config=CheckpointConfig(save_lora_only=True)
    ).save_checkpoint(str(tmp_path))
    saved = saved_model_file(tmp_path)
    assert saved and all(critic.is_lora_key(k) for k in saved)
    assert critic.value_head_keys(saved) == []

    fresh = fsdp2(critic_with_lora(model_config, seed=1))
    fresh_opt = build_optimizer(fresh.parameters(), FSDPOptimizerConfig(lr=1e-2))
    FSDPCheckpointManager(
        fresh, fresh_opt, checkpoint_config=CheckpointConfig(save_lora_only=True)
    ).load_checkpoint(str(tmp_path))
    with torch.no_grad():
        gap = (values(fresh, input_ids) - values(model, input_ids)).abs().max().item()
    assert gap > 1e-3  # loaded "successfully", values wrong

    # the patched manager refuses that file instead
    with pytest.raises(ValueError, match="holds no value head tensors"):
        critic.CriticCheckpointManager(
            fresh, fresh_opt, checkpoint_config=CheckpointConfig()
        ).load_checkpoint(str(tmp_path))


# --- the fix ---------------------------------------------------------------------------------


def test_critic_lora_trains_the_value_head(model_config):
    model = critic_with_lora(model_config, seed=0)
    assert type(model).__name__ == "PeftModelForTokenClassification"
    lora = model.peft_config["default"]
    assert lora.task_type == "TOKEN_CLS" and "score" in lora.modules_to_save
    assert (lora.r, lora.lora_alpha) == (8, 16)

    params = dict(model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert set(HEAD) <= trainable
    assert trainable == {n for n in params if critic.is_lora_key(n)} | set(HEAD)
    # LoRA on every linear of the 2 layers (7 each), none on the head
    assert sum(".lora_A." in n for n in trainable) == 7 * LAYERS
    assert not any("score" in n and critic.is_lora_key(n) for n in params)

    vpreds = values(model, batch())
    assert vpreds.shape == (2, 9)
    returns = torch.ones_like(vpreds)
    loss, _ = compute_value_loss(
        vpreds, returns, vpreds.detach(), torch.ones_like(vpreds), cliprange_value=0.5
    )
    loss.backward()
    for name in HEAD:
        assert params[name].grad is not None and params[name].grad.abs().sum() > 0, name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in params.items() if ".lora_B." in n)
    assert all(p.grad is None for p in params.values() if not p.requires_grad)


def test_lora_only_checkpoint_keeps_the_head_and_resumes(process_group, model_config, tmp_path):
    """Save as the trainer does (global_step_<k>/critic + tracker, trainer_base.py:984-1025), find it
    the way resume_mode=auto does (trainer_base.py:856-861), load into a differently seeded critic."""
    input_ids = batch()
    model, optimizer = trained_critic(model_config, seed=0, input_ids=input_ids)
    checkpoint = CheckpointConfig(save_lora_only=True)
    step_folder = tmp_path / "global_step_2"
    critic.CriticCheckpointManager(model, optimizer, checkpoint_config=checkpoint).save_checkpoint(
        str(step_folder / "critic"), global_step=2
    )
    with open(get_checkpoint_tracker_filename(str(tmp_path)), "w") as f:
        f.write("2")

    saved = saved_model_file(step_folder / "critic")
    state = model.state_dict()
    assert critic.value_head_keys(saved) == HEAD
    assert set(saved) == set(critic.critic_lora_state(model))
    assert set(saved) == {k for k in state if critic.is_lora_key(k)} | set(HEAD)
    assert not any(
        ".original_module." in k or ".base_layer." in k for k in saved
    )  # nothing of the frozen base
    assert len(saved) == 2 * 7 * LAYERS + 2

    resumed = fsdp2(critic_with_lora(model_config, seed=1))
    with torch.no_grad():
        assert (
            values(resumed, input_ids) - values(model, input_ids)
        ).abs().max() > 1e-3  # differs before loading
    resumed_opt = build_optimizer(resumed.parameters(), FSDPOptimizerConfig(lr=1e-2, total_training_steps=4))
    latest = find_latest_ckpt_path(str(tmp_path))
    assert latest == str(step_folder)
    critic.CriticCheckpointManager(resumed, resumed_opt, checkpoint_config=checkpoint).load_checkpoint(
        os.path.join(latest, "critic")
    )
    with torch.no_grad():
        torch.testing.assert_close(values(resumed, input_ids), values(model, input_ids), rtol=0, atol=1e-6)
        for key in HEAD:
            torch.testing.assert_close(
                resumed.state_dict()[key].full_tensor(), state[key].full_tensor(), rtol=0, atol=0
            )

    # the optimizer resumed too: one more identical step keeps the two critics together
    value_step(model, optimizer, input_ids)
    value_step(resumed, resumed_opt, input_ids)
    with torch.no_grad():
        torch.testing.assert_close(values(resumed, input_ids), values(model, input_ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "targets", ["all-linear", ["q_proj", "v_proj"], ["q_proj", "score"], r".*\.q_proj|score"]
)
def test_the_head_is_never_a_lora_target(model_config, targets):
    """Whatever the targets, the head is a trained full copy; excluded only where peft would target
    it (peft warns about an exclusion that matched nothing)."""
    module = value_model(model_config, seed=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no modules were excluded")
        model = get_peft_model(
            module, critic.critic_lora_config(module, rank=8, alpha=16, target_modules=targets)
        )
    params = dict(model.named_parameters())
    assert all(params[k].requires_grad for k in HEAD)
    assert any(".q_proj.lora_A." in n for n in params)
    assert not any("score" in n and critic.is_lora_key(n) for n in params)


def test_value_head_keys_of_plain_and_peft_critics(model_config):
    plain = value_model(model_config, seed=0)
    assert critic.value_head_keys(plain.state_dict()) == ["score.weight", "score.bias"]
    assert critic.value_head_name(plain) == "score"
    model = critic_with_lora(model_config, seed=0)
    assert critic.value_head_keys(model.state_dict()) == HEAD
    with pytest.raises(ValueError, match="nn.Linear with out_features=1"):
        critic.value_head_name(model.base_model.model.model)  # the decoder without a head


def test_the_critic_loads_with_the_attention_its_config_names(model_config):
    """verl's loader asks for flash_attention_2 whatever override_config says; without flash-attn
    (and without trl) it fails. While CriticEngine builds, verl.utils.model's loader is ours, and
    the critic is a one-label token classifier with the configured attention."""
    import importlib.util

    import verl.utils.model as verl_model_utils

    hf = model_config.hf_config
    assert hf._attn_implementation == "sdpa"
    hf.num_labels = 1
    verl_loader = verl_model_utils.load_valuehead_model
    if importlib.util.find_spec("flash_attn") is None and importlib.util.find_spec("trl") is None:
        with pytest.raises(RuntimeError, match="not a value head model, please install trl"):
            verl_loader(model_config.local_path, torch.float32, hf, trust_remote_code=False)
    with critic._value_model_loader():
        assert verl_model_utils.load_valuehead_model is critic.load_value_model
        model = verl_model_utils.load_valuehead_model(model_config.local_path, torch.float32, hf, False)
    assert verl_model_utils.load_valuehead_model is verl_loader
    assert isinstance(model, AutoModelForTokenClassification._model_mapping[type(hf)])
    assert model.config._attn_implementation == "sdpa"
    assert model.score.out_features == 1


# --- installation ----------------------------------------------------------------------------


def test_registry_builds_the_critic_engine_for_fsdp():
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry.get_engine_cls("value_model", backend) is critic.CriticEngine
        # the critic patch leaves the language model an LM-head engine (atlas.verl.actor's masked
        # one once that module is imported, verl's own otherwise)
        assert issubclass(EngineRegistry.get_engine_cls("language_model", backend), FSDPEngineWithLMHead)
    assert issubclass(critic.CriticEngine, FSDPEngineWithValueHead)


def test_patch_refuses_another_verl(monkeypatch):
    critic.check_verl()
    monkeypatch.setitem(critic._EXPECTED_SOURCES, "FSDPEngine._build_lora_module", "0" * 64)
    with pytest.raises(
        critic.VerlCriticPatchError, match=r"FSDPEngine\._build_lora_module \(.*transformer_impl\.py:339\)"
    ):
        critic.check_verl()
    monkeypatch.undo()
    monkeypatch.setattr(sys.modules["verl"], "__version__", "0.10.0")
    with pytest.raises(critic.VerlCriticPatchError, match="written against verl 0.9.1; verl 0.10.0"):
        critic.check_verl()


# A fresh `import verl` with the patch costs ~30 s (torch, transformers and peft again), and it is
# what every Ray worker does.
def test_overrides_load_the_patch_in_a_fresh_verl_process():
    """The overrides compose with verl's own ppo_trainer.yaml, and the env var they set makes a fresh
    `import verl` (what every Ray worker does) install the critic engine."""
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(sys.modules["verl"].__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=critic.external_lib_overrides())
    env_vars = dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars)
    assert env_vars == {critic.EXTERNAL_MODULES_ENV: "atlas.verl.critic"}

    probe = (
        "import sys, verl; from verl.workers.engine import EngineRegistry; "
        "print('atlas.verl.critic' in sys.modules, EngineRegistry.get_engine_cls('value_model', 'fsdp2').__qualname__)"
    )
    env = {**os.environ, **env_vars}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "CriticEngine"]
