"""Which sessions pay the rollout engine's one-time costs. On a GPU `prepare` takes a key/value
pool at the engine's budget (half the job's memory share) and captures every bucket's step; the
checks open several fresh sessions in one process to load and score a checkpoint, and a pool each
ran past the checks job's share. So opening a session prepares nothing; a session that will roll
out asks for it, for its rank's share of a step's episodes."""

from __future__ import annotations

import dataclasses

from atlas.config.study import config_slice, load_config
from atlas.config.training import TrainSlice
from atlas.rl.distributed import Ranks
from atlas.rl.step import open_session
from atlas.runtime.engine import HFEngine
from atlas.runtime.fast_engine import StaticEngine
from conftest import REPO


def test_only_a_session_that_rolls_out_prepares_its_engine(training_inputs, monkeypatch):
    asked = []
    for engine in (HFEngine, StaticEngine):
        monkeypatch.setattr(engine, "prepare", lambda self, rows: asked.append(rows))
    sl = TrainSlice.model_validate(
        config_slice(load_config(REPO / "config" / "config.yaml"), "training", "training_smoke")
    )
    session = open_session(sl, training_inputs)
    assert asked == []
    assert (sl.schedule.questions_per_step, sl.training.responses_per_question) == (2, 2)
    session.prepare_rollouts(sl.schedule.questions_per_step)
    assert asked == [4]  # 2 questions x 2 responses, one rank
    # three ranks: each serves its share of the step's episodes, rounded up
    dataclasses.replace(session, ranks=Ranks(rank=1, world=3, local_rank=1)).prepare_rollouts(5)
    assert asked == [4, 4]  # ceil(5 x 2 / 3)
