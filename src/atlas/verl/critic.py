"""The critic with LoRA on verl 0.9.1: a value head that trains, is saved, and resumes.

What verl 0.9.1 does with `critic.model.lora_rank > 0` (V1 trainer, FSDP engine):
  - the critic is `AutoModelForTokenClassification` with `num_labels=1`; its head is the `score`
    linear (hidden -> 1), which the base model's checkpoint does not hold (random at build);
  - `FSDPEngine._build_lora_module` wraps it with `LoraConfig(task_type=CAUSAL_LM, ...)`, and peft's
    causal-LM wrapper asks a token classifier for `prepare_inputs_for_generation`: the build fails
    with AttributeError before the first step (verl issue #4620, back in the new engine);
  - with `checkpoint.save_lora_only=True` the saved model file keeps only keys with `lora_` or
    `.adapter_` in their name, so a trainable head would not be saved, and a resume would go on with
    a freshly random head.

What this module changes, without forking verl:
  - `CriticEngine`, a subclass of verl's `FSDPEngineWithValueHead`, builds the critic LoRA with
    `TaskType.TOKEN_CLS`, the head in `modules_to_save` (a trainable full copy) and kept out of the
    LoRA targets (peft's "all-linear" would otherwise put an adapter on it);
  - its checkpoint manager, a subclass of verl's `FSDPCheckpointManager`, adds the head's tensors to
    the LoRA-only model file verl writes, and on load accepts LoRA + head as a LoRA-only state dict
    (verl then loads it non-strictly and rejects unexpected keys); a LoRA-only critic file without
    the head fails loudly instead of resuming with a random head;
  - `CriticEngine._build_module` loads the critic with the attention the model config names
    (`override_config.attn_implementation`): verl's `load_valuehead_model` asks for
    flash_attention_2 whatever the config says, and where the flash-attn package is missing it
    falls back to trl's value-head wrapper, or fails asking for trl;
  - on import, the module checks that verl is 0.9.1 and that the verl functions it overrides or
    wraps have the source it was written against, then puts `CriticEngine` in verl's
    `EngineRegistry` in place of `FSDPEngineWithValueHead` (value_model, fsdp and fsdp2).

How it reaches verl's processes: the critic is built inside a Ray worker, and verl 0.9.1 imports
`critic.model.external_lib` only where the critic's config is turned into a dataclass, in the
TaskRunner (trainer/ppo/v1/trainer_base.py:266); the worker receives the dataclass pickled and never
imports it. What every verl process does import is `VERL_USE_EXTERNAL_MODULES` (verl/__init__.py:49),
so `external_lib_overrides()` sets that variable in the Ray job's runtime env.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping

import torch
import verl.utils.model as verl_model_utils
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from torch import nn
from torch.distributed.fsdp import ShardedStateDictConfig, StateDictType
from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import get_fsdp_state_ctx
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithValueHead

from atlas.verl import patching

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
HEAD_NAMES = ("score", "classifier")  # the head of transformers' *ForTokenClassification models

# A head tensor: `score.weight` on a plain model, `score.modules_to_save.<adapter>.weight` under
# peft (the trained copy; `score.original_module.*` is the frozen original and is not saved).
_HEAD_KEY = re.compile(
    r"(?:^|\.)(?:" + "|".join(HEAD_NAMES) + r")\.(?:modules_to_save\.[^.]+\.)?(?:weight|bias)$"
)

# What this module replaces, wraps or relies on in verl 0.9.1, with the sha256 of its source.
_OWNERS = {c.__name__: c for c in (FSDPEngine, FSDPCheckpointManager, BaseCheckpointManager)}
_OWNERS["verl_model_utils"] = verl_model_utils
_EXPECTED_SOURCES = {
    # wrapped: imports load_valuehead_model from verl.utils.model when it builds a value model
    "FSDPEngine._build_module": "3935df3e22bb9ad00ebe0818a3454ebf8e85035882857d57f7476fe3bc1dad3f",
    # replaced while the critic builds: hard-codes attn_implementation="flash_attention_2"
    "verl_model_utils.load_valuehead_model": "2371ca280654b53bc2f25101ff2eb1898aafef14570f7ed94883d0b4a4ac825b",
    # replaced for the value model: builds the LoRA with TaskType.CAUSAL_LM
    "FSDPEngine._build_lora_module": "31ad1f73ed3cb76436401459b1a4fd3a31f83cff08c02c45214e1d119b37dedc",
    # wrapped: builds the FSDPCheckpointManager that CriticEngine re-classes
    "FSDPEngine.initialize": "f4bc4bd98b1900005288dd702e73673fe79e124edd2bf95251c6e733c3515f6b",
    # wrapped: filters a LoRA-only save by name, writes model_world_size_<W>_rank_<r>.pt
    "FSDPCheckpointManager.save_checkpoint": "408622f180370088c26babd5479719cf237856b9feacb24dbfab1534a85b632b",
    # relied on: calls self.is_lora_only_state_dict, then loads with strict=False
    "FSDPCheckpointManager.load_checkpoint": "6f75218097c563a09e9ec3cbbe4c998b49aad8de5b8bf764871f8e1b0d6546b3",
    # overridden: every key must contain "lora_" or ".adapter_"
    "BaseCheckpointManager.is_lora_only_state_dict": "478f57b07bb2fbd68cff5e0f1efc40099833804036735336865691c46cb755af",
}


class VerlCriticPatchError(RuntimeError):
    """The installed verl is not the one this module was written against."""


def external_lib_overrides() -> list[str]:
    """The Hydra overrides that make every process of the verl job (TaskRunner, workers) import
    this module: verl imports the modules named in VERL_USE_EXTERNAL_MODULES on `import verl`."""
    return [f"++ray_kwargs.ray_init.runtime_env.env_vars.{EXTERNAL_MODULES_ENV}={__name__}"]


# --- names and state -------------------------------------------------------------------------


def is_lora_key(key: str) -> bool:
    """verl 0.9.1's rule for what a LoRA-only save keeps (fsdp_checkpoint_manager.py:325)."""
    return "lora_" in key or ".adapter_" in key


def value_head_keys(state_dict: Mapping[str, object]) -> list[str]:
    """The keys of the value head's trained tensors, in state-dict order."""
    return [k for k in state_dict if _HEAD_KEY.search(k)]


def critic_lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a compact critic checkpoint holds: every LoRA tensor and the value head's tensors."""
    state = model.state_dict()
    head = set(value_head_keys(state))
    if not head:
        raise ValueError(
            f"{type(model).__name__} has no value head tensors; expected keys ending in "
            f"'{HEAD_NAMES[0]}.modules_to_save.<adapter>.weight' (peft) or '{HEAD_NAMES[0]}.weight'"
        )
    return {k: v.detach() for k, v in state.items() if is_lora_key(k) or k in head}


def value_head_name(module: nn.Module) -> str:
    """The attribute holding the token classifier's value head: a Linear with one output."""
    for name in HEAD_NAMES:
        head = getattr(module, name, None)
        if isinstance(head, nn.Linear) and head.out_features == 1:
            return name
    found = {n: type(getattr(module, n, None)).__name__ for n in HEAD_NAMES}
    raise ValueError(
        f"critic {type(module).__name__} has no value head: expected one of {HEAD_NAMES} to be an "
        f"nn.Linear with out_features=1 (AutoModelForTokenClassification, num_labels=1), found {found}. "
        "verl's trl fallback (AutoModelForCausalLMWithValueHead, v_head) is not supported."
    )


# --- the LoRA build --------------------------------------------------------------------------


def _targets_head(target_modules: str | list[str] | None, head: str) -> bool:
    """Whether peft would put a LoRA adapter on the head. Its "all-linear" leaves out only an
    output embedding, which a token classifier does not have, so it takes the head too."""
    if target_modules is None:  # peft's per-architecture defaults: attention projections
        return False
    if isinstance(target_modules, str):
        return target_modules.lower() == "all-linear" or re.fullmatch(target_modules, head) is not None
    return head in target_modules


def _exclude_head(exclude_modules: str | list[str] | None, head: str) -> str | list[str]:
    # a LoRA-wrapped head cannot also be in modules_to_save (peft raises TypeError)
    if exclude_modules is None:
        return [head]
    if isinstance(exclude_modules, str):  # peft matches a string with re.fullmatch
        return f"(?:{exclude_modules})|{re.escape(head)}"
    return [*exclude_modules, head]


def critic_lora_config(
    module: nn.Module,
    rank: int,
    alpha: int,
    target_modules: str | list[str] | None,
    target_parameters: list[str] | None = None,
    exclude_modules: str | list[str] | None = None,
) -> LoraConfig:
    """A token-classification LoRA: adapters on the targets, the value head trained in full."""
    head = value_head_name(module)
    if _targets_head(target_modules, head):
        exclude_modules = _exclude_head(exclude_modules, head)
    return LoraConfig(
        task_type=TaskType.TOKEN_CLS,
        r=rank,
        lora_alpha=alpha,
        target_modules=target_modules,
        target_parameters=target_parameters,
        exclude_modules=exclude_modules,
        modules_to_save=[head],
        bias="none",
    )


def _plain(value):
    # verl's configs hold OmegaConf containers; peft wants plain lists and strings
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def apply_critic_lora(module: nn.Module, model_config) -> PeftModel:
    """The critic LoRA that CriticEngine builds in place of verl's CAUSAL_LM one. `model_config` is
    verl's HFModelConfig (lora_rank, lora_alpha, target_modules, target_parameters, exclude_modules)."""
    if getattr(model_config, "lora_adapter_path", None) is not None:
        raise ValueError(
            f"critic.model.lora_adapter_path={model_config.lora_adapter_path!r}: atlas.verl.critic "
            "builds a fresh critic LoRA and loads no pre-trained critic adapter; resume from a verl "
            "checkpoint (trainer.resume_mode=auto) instead"
        )
    module.enable_input_require_grads()  # gradient checkpointing with frozen embeddings
    config = critic_lora_config(
        module,
        rank=model_config.lora_rank,
        alpha=model_config.lora_alpha,
        target_modules=_plain(model_config.target_modules),
        target_parameters=_plain(model_config.target_parameters),
        exclude_modules=_plain(model_config.exclude_modules),
    )
    model = get_peft_model(module, config)
    # FSDP flattens parameters of one dtype: peft may keep adapters in fp32 over a bf16 base
    base_dtype = next((p.dtype for p in model.parameters() if not p.requires_grad), None)
    for p in model.parameters():
        if p.requires_grad and base_dtype is not None and p.dtype != base_dtype:
            p.data = p.data.to(base_dtype)
    return model


# --- checkpoints -----------------------------------------------------------------------------


def model_file(local_path: str, world_size: int, rank: int) -> str:
    """The per-rank model file verl's FSDPCheckpointManager writes and reads."""
    return os.path.join(local_path, f"model_world_size_{world_size}_rank_{rank}.pt")


class CriticCheckpointManager(FSDPCheckpointManager):
    """verl's FSDP checkpoints, with the value head kept in a LoRA-only save and loaded back."""

    def save_checkpoint(self, local_path: str, hdfs_path=None, global_step: int = 0, max_ckpt_to_keep=None):
        super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if local_path is None or not (
            self.should_save_model and self.should_save_lora_only and self._has_lora()
        ):
            return
        # the same sharded view verl's save took (a no-op context under FSDP2 and without FSDP)
        state_cfg = ShardedStateDictConfig(offload_to_cpu=torch.cuda.is_available())
        with get_fsdp_state_ctx(self.model, StateDictType.SHARDED_STATE_DICT, state_cfg, None):
            state = self.model.state_dict()
        head = {k: state[k] for k in value_head_keys(state)}
        if not head:
            raise ValueError(
                f"critic checkpoint {local_path}: the model has no value head tensors to keep; "
                f"expected keys like 'base_model.model.{HEAD_NAMES[0]}.modules_to_save.default.weight'"
            )
        path = model_file(local_path, self.world_size, self.rank)
        saved = torch.load(path, weights_only=False)
        stray = [k for k in saved if not is_lora_key(k)]
        if not saved or stray:
            raise VerlCriticPatchError(
                f"{path}: expected verl's LoRA-only save to hold only 'lora_'/'.adapter_' keys, "
                f"found {len(saved)} keys, non-LoRA ones: {stray[:5]}"
            )
        saved.update(head)
        tmp = path + ".tmp"
        torch.save(saved, tmp)
        os.replace(tmp, path)
        if self.rank == 0:
            logger.info("critic LoRA-only save %s: kept the value head %s", path, sorted(head))

    @staticmethod
    def is_lora_only_state_dict(state_dict: dict) -> bool:
        """LoRA tensors plus the value head: verl then loads it with strict=False (the frozen base
        comes from the model path) and rejects any unexpected key."""
        head = set(value_head_keys(state_dict))
        rest = [k for k in state_dict if k not in head]
        if not rest or not all(is_lora_key(k) for k in rest):
            return False  # a full state dict, loaded strictly
        if not head:
            raise ValueError(
                f"a LoRA-only critic checkpoint ({len(rest)} LoRA keys) holds no value head tensors: "
                "it was saved without atlas.verl.critic, and resuming would leave the value head at "
                f"its random initialization; expected keys like "
                f"'base_model.model.{HEAD_NAMES[0]}.modules_to_save.default.weight'"
            )
        return True


def load_value_model(local_path, torch_dtype, model_config, trust_remote_code):
    """The critic as verl's load_valuehead_model (utils/model.py:641) loads it, a token classifier
    with one label, but with the attention `model_config` names (verl builds it from
    override_config.attn_implementation) instead of a hard-coded flash_attention_2. No trl
    fallback: the critic LoRA above is built for the token classifier, and a load error is raised
    as it is."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation=model_config._attn_implementation,
        trust_remote_code=trust_remote_code,
    )


@contextlib.contextmanager
def _value_model_loader():
    """verl.utils.model.load_valuehead_model is load_value_model for the block (FSDPEngine's
    _build_module imports it from the module when it runs)."""
    verl_loader = verl_model_utils.load_valuehead_model
    verl_model_utils.load_valuehead_model = load_value_model
    try:
        yield
    finally:
        verl_model_utils.load_valuehead_model = verl_loader


class CriticEngine(FSDPEngineWithValueHead):
    """verl's FSDP value-model engine with a TOKEN_CLS critic LoRA, the configured attention and
    CriticCheckpointManager."""

    def _build_module(self):
        with _value_model_loader():
            return super()._build_module()

    def _build_lora_module(self, module):
        return apply_critic_lora(module, self.model_config)

    def initialize(self):
        super().initialize()
        if type(self.checkpoint_manager) is not FSDPCheckpointManager:
            raise VerlCriticPatchError(
                f"expected FSDPEngine.initialize to build an FSDPCheckpointManager, "
                f"found {type(self.checkpoint_manager).__name__}"
            )
        self.checkpoint_manager.__class__ = CriticCheckpointManager  # same state, two methods changed


# --- install ---------------------------------------------------------------------------------


def check_verl() -> None:
    """Fail loudly unless verl, and the verl functions this module overrides, wraps or relies on,
    are the ones it was written against."""
    patching.check_verl(
        __name__,
        VERL_VERSION,
        _EXPECTED_SOURCES,
        _OWNERS,
        VerlCriticPatchError,
        "Re-check the critic LoRA build and the LoRA-only checkpoint filter in that version before "
        "changing VERL_VERSION.",
    )


def install() -> None:
    """Check verl, then make verl's engine registry build CriticEngine for the FSDP value model."""
    check_verl()
    patching.replace_engine(
        "value_model", CriticEngine, FSDPEngineWithValueHead, VerlCriticPatchError, __name__
    )


install()
