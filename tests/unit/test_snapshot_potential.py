"""The frozen critic snapshot's Phi: episode by episode (the reference) and many episodes at once
through the update's packed path, which a GPU step takes; shaping from precomputed values."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

import atlas.rl.snapshot as snapshot
from atlas.config.training import TrainingConfig
from atlas.errors import InputError
from atlas.hashing import sha256_file
from atlas.model.policy import ActorCritic
from atlas.rl.checkpoint import save_trainable
from atlas.rl.potentials import evaluate_potentials
from atlas.rl.rollout import shape
from atlas.rl.snapshot import CriticSnapshotPotential
from unit.test_packing import VOCAB, tiny_lm


def snapshot_run(tmp_path: Path) -> Path:
    """A run folder whose one checkpoint holds a critic unlike the policy's own."""
    other = ActorCritic(
        tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8), seed=5
    )
    with torch.no_grad():
        for p in other.trainable("critic").values():
            p.add_(0.05 * torch.randn_like(p))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_trainable(ckpt, other)
    entry = {
        "step": 1,
        "path": str(ckpt),
        "files": {"critic.safetensors": {"sha256": sha256_file(ckpt / "critic.safetensors")}},
    }
    (tmp_path / "checkpoints.json").write_text(json.dumps({"checkpoints": [entry]}))
    return tmp_path


def episodes(lengths: list[int], seed: int = 3) -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        starts = [2, n // 2, n - 1][: 1 + n % 3]  # one to three generations per episode
        out.append(
            SimpleNamespace(
                token_ids=torch.randint(1, VOCAB, (n,), generator=g).tolist(),
                loss_mask=[0] * n,
                sampled=[0] * n,
                records=[SimpleNamespace(generation_start=s) for s in sorted(set(starts))],
            )
        )
    return out


@pytest.fixture
def potential(tmp_path):
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8), seed=0)
    return CriticSnapshotPotential(model=ac, run_folder=snapshot_run(tmp_path))


def test_many_episodes_at_once_give_each_episodes_own_values(potential, monkeypatch):
    eps = episodes([9, 31, 4, 17, 23, 12])
    one_by_one = [potential(ep) for ep in eps]
    assert [len(v) for v in one_by_one] == [len(ep.records) for ep in eps]
    assert len({round(v[0], 6) for v in one_by_one}) == len(eps)  # real values, not a constant
    assert potential.batch(eps) == one_by_one  # on a CPU: the reference path, exactly
    monkeypatch.setattr(snapshot, "BATCH_TOKENS", 40)  # several packed forwards, a row alone too
    packed = potential.batch(eps, packed=True)
    for got, want in zip(packed, one_by_one, strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    # the actor is active again after the snapshot's adapter
    assert potential.model.peft.active_adapter == "actor"


def test_evaluate_potentials_asks_a_batch_potential_once_and_checks_its_answer(potential, monkeypatch):
    eps = episodes([9, 14, 5])
    calls = []
    real = potential.batch
    monkeypatch.setattr(potential, "batch", lambda e: calls.append(len(e)) or real(e))
    assert evaluate_potentials(potential, eps) == [potential(ep) for ep in eps]
    assert calls == [3]
    monkeypatch.setattr(potential, "batch", lambda e: [[0.0]] * len(e))
    with pytest.raises(
        ValueError, match=r"potential CriticSnapshotPotential\(.*\) returned 1 values for an ep"
    ):
        evaluate_potentials(potential, eps)  # the second episode has three records
    monkeypatch.setattr(potential, "batch", lambda e: real(e)[:2])
    with pytest.raises(ValueError, match="answered for 2 of 3 episodes"):
        evaluate_potentials(potential, eps)


def test_shaping_from_precomputed_values_is_shaping_from_the_potential(potential):
    from unit.test_reward_edges import Fixed, all_sampled, record

    eps = [all_sampled(8, [record(0, 2), record(1, 6, 1.0)]), all_sampled(5, [record(0, 3, 1.0)])]
    phis = [[0.5, -0.25], [0.1]]
    direct = [shape([ep], Fixed(phi), gamma=0.9, dose=1.0)[0] for ep, phi in zip(eps, phis, strict=True)]
    given = shape(eps, potential, gamma=0.9, dose=1.0, phis=phis)  # the snapshot is not asked
    assert [p.token_rewards.tolist() for p in given] == [p.token_rewards.tolist() for p in direct]
    assert [p.potential_before for p in given] == phis
    assert given[0].token_rewards[2].item() == pytest.approx(0.9 * -0.25 - 0.5)


def snapshot_index(root: Path, steps: list[int]) -> Path:
    """checkpoints.json listing a real critic file per step (listed in the given order)."""
    entries = []
    for k in steps:
        ckpt = root / f"step_{k}"
        ckpt.mkdir(parents=True)
        save_file({"value_head.weight": torch.full((1, 4), float(k))}, str(ckpt / "critic.safetensors"))
        digest = sha256_file(ckpt / "critic.safetensors")
        entries.append({"step": k, "path": str(ckpt), "files": {"critic.safetensors": {"sha256": digest}}})
    (root / "checkpoints.json").write_text(json.dumps({"checkpoints": entries}, ensure_ascii=False))
    return root


def test_the_snapshot_is_the_last_checkpoint_or_the_step_asked_for(tmp_path):
    run = snapshot_index(tmp_path / "run", [3, 1, 2])
    assert snapshot.snapshot_file(run, None) == (run / "step_3" / "critic.safetensors", 3)
    assert snapshot.snapshot_file(run, 1) == (run / "step_1" / "critic.safetensors", 1)


def snapshot_refusal(run: Path, step: int | None) -> str:
    with pytest.raises(InputError) as err:
        snapshot.snapshot_file(run, step)
    return str(err.value)


def test_a_snapshot_that_is_missing_unlisted_or_changed_is_refused_by_name(tmp_path):
    index = tmp_path / "checkpoints.json"
    assert snapshot_refusal(tmp_path, None) == f"{index}: missing; the snapshot run has not finished training"
    index.write_text(json.dumps({"checkpoints": []}))
    assert snapshot_refusal(tmp_path, None) == f"{index}: lists no checkpoints"
    snapshot_index(tmp_path, [4, 2])
    assert snapshot_refusal(tmp_path, 3) == f"{index}: no checkpoint for step 3; it lists [2, 4]"
    critic = tmp_path / "step_4" / "critic.safetensors"
    recorded = sha256_file(critic)
    critic.write_bytes(critic.read_bytes()[:-1] + b" ")
    changed = hashlib.sha256(critic.read_bytes()).hexdigest()
    assert snapshot_refusal(tmp_path, None) == f"{critic}: sha256 {changed}, but {index} recorded {recorded}"
    critic.unlink()
    assert snapshot_refusal(tmp_path, 4) == f"{critic}: missing; {index} lists it for step 4"


def test_the_potential_loads_the_step_asked_for_and_names_it(tmp_path):
    run = snapshot_run(tmp_path)
    ac = ActorCritic(tiny_lm(), TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8), seed=0)
    index = json.loads((run / "checkpoints.json").read_text())
    index["checkpoints"].append({**index["checkpoints"][0], "step": 2, "path": "/absent"})
    (run / "checkpoints.json").write_text(json.dumps(index))
    potential = CriticSnapshotPotential(model=ac, run_folder=run, step=1)
    assert (potential.step, potential.source) == (1, str(tmp_path / "ckpt" / "critic.safetensors"))
    assert repr(potential) == f"CriticSnapshotPotential({tmp_path / 'ckpt' / 'critic.safetensors'}, step 1)"


def test_the_packed_path_is_taken_when_asked_and_by_default_on_a_gpu_only(potential, monkeypatch):
    packs = []
    real = snapshot.pack
    monkeypatch.setattr(snapshot, "pack", lambda *a: packs.append(1) or real(*a))
    eps = episodes([9, 31, 4])
    potential.batch(eps)
    assert packs == []  # a CPU: episode by episode
    potential.batch(eps, packed=True)
    assert packs == [1]
    potential.batch(eps, packed=False)
    assert packs == [1]

    class OnGpu(Exception):
        pass

    def rope(_):
        raise OnGpu

    monkeypatch.setattr(snapshot, "liger_rope", rope)
    monkeypatch.setattr(potential, "model", SimpleNamespace(value_head=SimpleNamespace(
        weight=SimpleNamespace(device=torch.device("cuda"))), peft=None))  # fmt: skip
    with pytest.raises(OnGpu):
        potential.batch(eps)  # the default on a CUDA device: packed
