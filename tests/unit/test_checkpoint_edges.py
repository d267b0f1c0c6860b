"""Compact checkpoints at their edges: a data-parallel job's per-rank RNG states, a checkpoint
loaded by a job of another size, trainable tensors that do not match by name, what state.json
holds, and which step_<k> folders count."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from atlas.config.training import TrainingConfig
from atlas.hashing import MANIFEST
from atlas.model.policy import ROLES
from atlas.rl.checkpoint import (
    STATE,
    checkpoint_steps,
    latest_checkpoint,
    load_compact,
    load_trainable,
    rng_state,
    save_compact,
)
from conftest import policy_with_optimizers

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)


@pytest.fixture(scope="module")
def policy(tiny_model):
    return policy_with_optimizers(tiny_model, TRAINING)


def ranks_rng(n: int) -> list[dict]:
    """n different RNG states, as n ranks would hold them."""
    out = []
    for r in range(n):
        torch.manual_seed(100 + r)
        random.seed(200 + r)
        out.append(rng_state())
    return out


def test_a_one_process_checkpoint_keeps_its_layout(policy, tmp_path):
    ac, opts, scheds = policy
    (rng,) = ranks_rng(1)
    path = save_compact(tmp_path, 4, ac, opts, {"actor": scheds["actor"]}, {"pos": 9}, rngs=[rng])
    state = json.loads((path / STATE).read_text())
    assert state["step"] == 4 and state["extra"] == {"pos": 9}
    assert state["schedulers"]["critic"] is None and state["schedulers"]["actor"]["last_epoch"] == 0
    assert "ranks" not in state and "python_random_ranks" not in state
    assert state["python_random"] == rng["python"]
    assert set(load_file(str(path / "rng.safetensors"))) == {"torch"}
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["stage"] == "compact_checkpoint" and manifest["config"] == {"step": 4}
    text = (path / STATE).read_text(encoding="utf-8")  # one spelling: sorted keys, indent 1
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    # a role saved without a scheduler is loaded without one: the job may have none for it
    loaded = load_compact(path, ac, opts, {"actor": scheds["actor"]})
    assert loaded["schedulers"]["critic"] is None and scheds["actor"].last_epoch == 0


def test_each_rank_restores_its_own_generators(policy, tmp_path):
    ac, opts, scheds = policy
    rngs = ranks_rng(3)
    path = save_compact(tmp_path, 2, ac, opts, scheds, {}, rngs=rngs)
    state = json.loads((path / STATE).read_text())
    assert state["ranks"] == 3
    assert state["python_random"] == rngs[0]["python"]
    assert state["python_random_ranks"] == [rngs[1]["python"], rngs[2]["python"]]
    assert set(load_file(str(path / "rng.safetensors"))) == {"torch", "torch.rank1", "torch.rank2"}
    for rank in range(3):
        torch.manual_seed(0)
        random.seed(0)
        back = load_compact(path, ac, opts, scheds, rank=rank, world=3)
        assert back["step"] == 2
        assert torch.equal(torch.get_rng_state(), rngs[rank]["torch"]), rank
        assert random.getstate()[1] == tuple(rngs[rank]["python"][1]), rank


def test_a_checkpoint_of_another_job_size_is_refused(policy, tmp_path):
    ac, opts, scheds = policy
    path = save_compact(tmp_path, 1, ac, opts, scheds, {}, rngs=ranks_rng(2))
    with pytest.raises(ValueError) as err:
        load_compact(path, ac, opts, scheds)
    assert str(err.value) == f"{path}: a checkpoint of 2 ranks, loaded by a job of 1"
    one = save_compact(tmp_path, 2, ac, opts, scheds, {})
    with pytest.raises(ValueError) as err:
        load_compact(one, ac, opts, scheds, rank=0, world=2)
    assert str(err.value) == f"{one}: a checkpoint of 1 ranks, loaded by a job of 2"


def test_trainable_tensors_must_match_by_name(policy, tmp_path):
    ac, opts, scheds = policy
    path = save_compact(tmp_path, 1, ac, opts, scheds, {})
    actor = load_file(str(path / "actor.safetensors"))
    names = sorted(actor)
    dropped = {n: actor[n] for n in names[4:]}  # four missing, five unexpected: three of each named
    dropped |= {f"not.a.parameter.{i}": torch.zeros(1) for i in range(5)}
    save_file(dropped, str(path / "actor.safetensors"))
    with pytest.raises(ValueError) as err:
        load_trainable(path, ac)
    assert str(err.value) == (
        f"{path / 'actor.safetensors'}: tensors missing {names[:3]}, "
        "unexpected ['not.a.parameter.0', 'not.a.parameter.1', 'not.a.parameter.2']"
    )


def test_loaded_tensors_replace_the_trainable_ones(policy, tmp_path):
    ac, opts, scheds = policy
    path = save_compact(tmp_path, 1, ac, opts, scheds, {})
    saved = {r: load_file(str(path / f"{r}.safetensors")) for r in ROLES}
    with torch.no_grad():
        for r in ROLES:
            for p in ac.trainable(r).values():
                p.add_(1.0)
    load_trainable(path, ac)
    for r in ROLES:
        params = ac.trainable(r)
        assert all(torch.equal(params[n], saved[r][n]) for n in params), r


def test_which_step_folders_count(tmp_path):
    root = tmp_path / "ckpt"
    assert checkpoint_steps(root) == [] and latest_checkpoint(root) is None
    for name in ("step_10", "step_2", "step_x", "step_", "step_3", "stepx_4"):
        (root / name).mkdir(parents=True)
        (root / name / MANIFEST).write_text("{}")
    (root / "step_11").mkdir()  # no manifest: a crash mid-write
    assert checkpoint_steps(root) == [2, 3, 10]
    assert latest_checkpoint(root) == root / "step_10"
    (root / "file").write_text("")
    assert checkpoint_steps(root / "file") == []
