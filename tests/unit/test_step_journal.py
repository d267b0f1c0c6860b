"""One writer per record, and one journal write per step: a real training step on the tiny model
(the embedded default's training smoke) writes each step's records.parquet exactly once, before
the update, with every record's value and advantage, and never changes a record the runtime
wrote; a step whose batch breaks the protocol is journaled once, without values, and stops."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
import torch

from atlas.config.study import config_slice, load_config
from atlas.config.training import TrainSlice
from atlas.rl import journal
from atlas.rl.step import open_session, ppo_step, train_step
from atlas.runtime import runfolder
from atlas.runtime.rollouts import episode_specs, rollout
from conftest import REPO


@pytest.fixture(scope="module")
def session(training_inputs):
    s = config_slice(load_config(REPO / "config" / "config.yaml"), "training", "training_smoke")
    return open_session(TrainSlice.model_validate(s), training_inputs)


@pytest.fixture
def writes(monkeypatch):
    """Every records.parquet a run folder's writer writes, as (path, rows)."""
    seen: list[tuple[str, int]] = []
    real = runfolder.write_records

    def counted(path, records, credits=None):
        seen.append((str(path), len(records)))
        real(path, records, credits)

    monkeypatch.setattr(runfolder, "write_records", counted)
    return seen


def test_a_step_journals_its_records_once_before_the_update(session, writes, tmp_path):
    calls = []
    weights = {}

    def journal_rollouts(data):  # what atlas.stages.train journals, rank 0
        calls.append(data)
        weights.update({n: p.detach().clone() for n, p in session.ac.trainable("actor").items()})
        journal.write_step_rollouts(tmp_path, 0, data.episodes, data.credits, data.report, run=session.name)

    before = {n: p.detach().clone() for n, p in session.ac.trainable("actor").items()}
    data, metrics = train_step(session, 0, journal_rollouts)

    assert len(calls) == 1 and calls[0] is data
    path = journal.step_dir(tmp_path, 0) / "records.parquet"
    n = sum(len(ep.records) for ep in data.episodes)
    assert writes == [(str(path), n)]
    # journaled before the update: the actor was still the rollout's policy, and it moved after
    assert all(torch.equal(weights[k], before[k]) for k in before)
    assert any(not torch.equal(p, before[k]) for k, p in session.ac.trainable("actor").items())
    # the one write holds the values and advantages of every record, and the step's rewards
    rows = pl.read_parquet(path)
    assert rows.height == n == metrics["protocol/records"]
    assert rows["value"].null_count() == 0 and rows["advantage"].null_count() == 0
    credits = [c for mine in data.credits for c in mine]
    assert rows["reward"].to_list() == [c.reward for c in credits]
    assert rows["advantage"].to_list() == [c.advantage for c in credits]


def two_episodes(session):
    """Two training episodes of the first question, played by the session's policy."""
    specs = episode_specs(session.train_rows[:1], session.tests, 2)
    return rollout(
        session.rt, specs, session.runtime, session.graders, run="r", step=1, phase="train", seed=0
    )


def step(session, episodes, **kwargs):
    """ppo_step on the session's policy, potential and optimizers, at dose 1."""
    return ppo_step(
        session.rt,
        session.ac,
        episodes,
        session.potential,
        session.ppo,
        session.runtime,
        session.optimizers,
        dose=1.0,
        **kwargs,
    )


def test_records_stay_as_the_runtime_wrote_them(session):
    episodes = two_episodes(session)
    written = [[dataclasses.asdict(r) for r in ep.records] for ep in episodes]
    data, _ = step(session, episodes)
    assert [[dataclasses.asdict(r) for r in ep.records] for ep in data.episodes] == written
    rec = data.episodes[0].records[0]
    for name, value in (("run", "other"), ("score", 1.0), ("reward", 1.0), ("advantage", 0.5)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, name, value)
    assert all(c.advantage is not None for mine in data.credits for c in mine)


def test_a_batch_that_breaks_the_protocol_is_journaled_once_and_stops(session, writes, tmp_path):
    episodes = two_episodes(session)
    ep = episodes[0]
    ep.records[0] = dataclasses.replace(ep.records[0], arguments='{"answer":"nothing called"}')
    calls = []

    def journal_rollouts(data):
        calls.append(data)
        journal.write_step_rollouts(tmp_path, 1, data.episodes, data.credits, data.report, run="r")

    with pytest.raises(SystemExit, match="r step 1: 1 protocol violations"):
        step(session, episodes, journal_rollouts=journal_rollouts, where="r step 1")
    assert len(calls) == 1 and len(writes) == 1
    rows = pl.read_parquet(journal.step_dir(tmp_path, 1) / "records.parquet")
    assert rows["value"].null_count() == rows["advantage"].null_count() == rows.height
    assert (journal.step_dir(tmp_path, 1) / "protocol.json").is_file()
