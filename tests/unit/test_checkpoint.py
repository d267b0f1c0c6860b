"""Compact checkpoints: trainable tensors only, atomic, and a resume that continues bit for bit."""

import json
import os
import random

import pytest
import torch
from safetensors.torch import load_file

from atlas.config.training import TrainingConfig
from atlas.hashing import verify
from atlas.model.policy import ROLES
from atlas.rl.checkpoint import export_adapters, latest_checkpoint, load_compact, save_compact
from conftest import policy_with_optimizers

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)
IDS = torch.tensor([[1, 50, 60, 70, 80, 90, 2]])


def setup(tiny_model):
    return policy_with_optimizers(tiny_model, TRAINING)


def train_step(ac, opts, scheds):
    """One actor and one critic update whose losses use the RNG (as sampling would)."""
    noise = torch.rand(1).item()
    for role in ROLES:
        opts[role].zero_grad()
        with ac.role(role):
            if role == "actor":
                loss = (
                    ac.actor_logits(IDS).log_softmax(-1)[0, :-1].gather(-1, IDS[0, 1:, None]).mean().neg()
                    * noise
                )
            else:
                loss = (ac.values(IDS) - noise).pow(2).mean()
        loss.backward()
        opts[role].step()
        scheds[role].step()
    return random.random()


def snapshot(ac):
    return {f"{r}/{n}": p.detach().clone() for r in ROLES for n, p in ac.trainable(r).items()}


def test_resume_continues_bit_for_bit(tiny_model, tmp_path):
    torch.manual_seed(1)
    random.seed(1)
    ac, opts, scheds = setup(tiny_model)
    for _ in range(2):
        train_step(ac, opts, scheds)
    ckpt = save_compact(tmp_path / "ckpt", 2, ac, opts, scheds, {"schedule_position": 2})
    after_uninterrupted = [train_step(ac, opts, scheds) for _ in range(2)]
    expected = snapshot(ac)

    fresh, fopts, fscheds = setup(tiny_model)  # a new process would start here
    state = load_compact(ckpt, fresh, fopts, fscheds)
    assert state["step"] == 2 and state["extra"] == {"schedule_position": 2}
    after_resumed = [train_step(fresh, fopts, fscheds) for _ in range(2)]
    got = snapshot(fresh)
    assert after_resumed == after_uninterrupted  # python RNG restored
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)


def test_checkpoint_holds_trainable_tensors_only(tiny_model, tmp_path):
    ac, opts, scheds = setup(tiny_model)
    train_step(ac, opts, scheds)
    ckpt = save_compact(tmp_path / "ckpt", 1, ac, opts, scheds, {})
    names = {r: set(load_file(str(ckpt / f"{r}.safetensors"))) for r in ROLES}
    assert names["actor"] == set(ac.trainable("actor"))
    assert names["critic"] == set(ac.trainable("critic"))
    base_names = {n for n, _ in ac.base_parameters()}
    assert not (names["actor"] | names["critic"]) & base_names
    assert all(
        torch.isfinite(t).all() for r in ROLES for t in load_file(str(ckpt / f"{r}.safetensors")).values()
    )
    optim = load_file(str(ckpt / "optim_actor.safetensors"))
    assert {k.rpartition("::")[0] for k in optim} == names["actor"]  # one state per trainable tensor
    base_bytes = os.path.getsize(tiny_model / "model.safetensors")
    assert sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) < base_bytes
    assert verify(ckpt, check_sources=False) == []


def test_latest_checkpoint_skips_incomplete_folders(tiny_model, tmp_path):
    ac, opts, scheds = setup(tiny_model)
    root = tmp_path / "ckpt"
    assert latest_checkpoint(root) is None
    save_compact(root, 1, ac, opts, scheds, {})
    save_compact(root, 3, ac, opts, scheds, {})
    (root / "step_7").mkdir()  # a crash mid-write leaves no MANIFEST
    (root / ".step_9.abc.tmp").mkdir()
    assert latest_checkpoint(root).name == "step_3"
    with pytest.raises(FileExistsError):
        save_compact(root, 3, ac, opts, scheds, {})
    save_compact(root, 10, ac, opts, scheds, {})
    assert latest_checkpoint(root).name == "step_10"  # by number: "step_10" sorts before "step_3"


def test_exported_adapters_and_head(tiny_model, tmp_path):
    ac, opts, scheds = setup(tiny_model)
    train_step(ac, opts, scheds)
    export_adapters(ac, tmp_path / "export")
    for role in ROLES:
        cfg = json.loads((tmp_path / "export" / role / "adapter_config.json").read_text())
        assert (cfg["r"], cfg["lora_alpha"]) == (4, 8)
    head = load_file(str(tmp_path / "export" / "critic" / "value_head.safetensors"))
    assert torch.equal(head["value_head.weight"], ac.value_head.weight)
