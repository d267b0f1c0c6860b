"""The checks stage's roundtrip and batch arithmetic (atlas.checks.roundtrip) on small inputs built
here: the probe batch, the resumed step against the journaled one, the checkpoint's record and the
per-step batch counts, each value asserted."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from atlas.checks.roundtrip import (
    _record,
    batch_math,
    cpu_roundtrip,
    measured,
    next_token_logprobs,
    probe_batch,
    same_metrics,
)
from atlas.config.training import PPOConfig, TrainingConfig
from atlas.errors import CheckFailed
from atlas.model.policy import ROLES, ActorCritic
from atlas.rl.checkpoint import load_compact, save_compact
from atlas.rl.ppo import make_optimizers, make_schedulers

TRAINING = TrainingConfig(responses_per_question=2, lora_rank=4, lora_alpha=8)


def test_the_probe_batch_is_the_first_training_rows_cut_to_the_shortest(tmp_path):
    path = tmp_path / "trajectories.parquet"
    rows = [
        ("val", [9, 9, 9, 9, 9, 9]),
        ("train", [1, 2, 3, 4, 5]),
        ("val", [8, 8]),
        ("train", [6, 7, 8, 9]),
        ("train", [10, 11, 12]),
    ]
    table = pa.table({"phase": [p for p, _ in rows], "token_ids": [ids for _, ids in rows]})
    pq.write_table(table, path)
    assert probe_batch(path).tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]
    assert probe_batch(path, rows=3).tolist() == [[1, 2, 3], [6, 7, 8], [10, 11, 12]]
    assert probe_batch(path, rows=1).tolist() == [[1, 2, 3, 4, 5]]


def test_next_token_logprobs_are_each_next_tokens_log_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, generator=gen)
    ids = torch.tensor([[0, 3, 1, 4], [2, 2, 0, 1]])
    got = next_token_logprobs(logits, ids)
    want = [
        [math.log(torch.softmax(logits[b, t], -1)[ids[b, t + 1]].item()) for t in range(3)] for b in range(2)
    ]
    assert got.shape == (2, 3)
    assert [pytest.approx(row, abs=1e-6) for row in want] == got.tolist()


def test_measured_columns_are_timings_and_perf_only():
    assert measured("timing_s/step") and measured("perf/rollout_tokens_per_s")
    assert not measured("actor/pg_loss") and not measured("rollout/perf")


def test_a_checkpoints_record_holds_its_step_folder_counts_and_tolerance(tmp_path):
    ids = torch.zeros(3, 5, dtype=torch.long)
    assert _record(4, tmp_path / "step_4", 58, ids, 31, 0.0) == {
        "step": 4,
        "checkpoint": (tmp_path / "step_4").as_posix(),
        "tensors_bit_equal": 58,
        "all_finite": True,
        "probe_rows": 3,
        "probe_tokens": 15,
        "probe_logprobs_equal": True,
        "probe_values_equal": True,
        "next_step_metrics_equal": 31,
        "next_step_metrics_rel_tol": 0.0,
    }


def test_nan_matches_only_nan_and_every_metric_after_a_null_is_compared():
    # a null the step did not have, then a metric that differs: both are looked at, in key order
    logged = {"a/null": None, "b/differs": 1.0, "c/nan": float("nan")}
    with pytest.raises(CheckFailed, match=r"metric b/differs is 2.0") as err:
        same_metrics({"b/differs": 2.0, "c/nan": float("nan")}, logged, "x")
    assert "c/nan" not in str(err.value)
    assert same_metrics({"b/differs": 1.0, "c/nan": float("nan")}, logged, "x") == 3
    with pytest.raises(CheckFailed, match=r"metric c/nan is 1.0 after resuming, the run logged nan$"):
        same_metrics({"b/differs": 1.0, "c/nan": 1.0}, logged, "x")
    with pytest.raises(CheckFailed, match=r"metric b/differs is nan after resuming, the run logged 1.0$"):
        same_metrics({"b/differs": float("nan"), "c/nan": float("nan")}, logged, "x")
    # a metric the resumed step lacks is a difference, on a CPU and on a GPU
    with pytest.raises(CheckFailed, match=r"metric b/differs is None after resuming"):
        same_metrics({"c/nan": float("nan")}, logged, "x", rel_tol=1e-4)


def test_on_a_cpu_nothing_is_within_a_tolerance_and_nothing_is_printed(capsys):
    logged = {"actor/kl": 0.0, "perf/x": 1.0}
    with pytest.raises(CheckFailed) as err:
        same_metrics({"actor/kl": 1e-300, "perf/x": 2.0}, logged, "x")
    assert str(err.value) == "x: metric actor/kl is 1e-300 after resuming, the run logged 0.0"
    assert same_metrics({"actor/kl": 0.0, "perf/x": 2.0}, logged, "x") == 1
    assert capsys.readouterr().out == ""


def test_the_near_zero_floor_is_a_hundredth_of_the_tolerance(capsys):
    logged = {"actor/kl": 0.0, "critic/grad_norm": 2.0}
    # 0.99e-6 from 0 passes a 1e-6 floor; a floor of rel_tol / 101 (9.9e-7) would refuse it
    assert same_metrics({"actor/kl": 0.99e-6, "critic/grad_norm": 2.0}, logged, "x", rel_tol=1e-4) == 2
    assert (
        capsys.readouterr().out == "x: 2 metrics within rel_tol 0.0001, using at most 0.99 of it (actor/kl)\n"
    )
    # every metric equal: none used any of the tolerance, and none is named
    assert same_metrics({"actor/kl": 0.0, "critic/grad_norm": 2.0}, logged, "x", rel_tol=1e-4) == 2
    assert capsys.readouterr().out == "x: 2 metrics within rel_tol 0.0001, using at most 0 of it\n"


def test_the_furthest_metric_is_the_first_of_equal_shares(capsys):
    logged = {"a/one": 1.0, "b/two": 1.0}
    assert same_metrics({"a/one": 1.00005, "b/two": 1.00005}, logged, "x", rel_tol=1e-4) == 2
    assert capsys.readouterr().out.endswith("using at most 0.5 of it (a/one)\n")


def record(step, uid, turn, phase="train"):
    return {"phase": phase, "step": step, "question_uid": uid, "turn": turn}


def trajectory(step, uid, turns, tokens, sampled, phase="train"):
    return {
        "phase": phase,
        "step": step,
        "question_uid": uid,
        "turns": turns,
        "token_ids": list(range(tokens)),
        "sampled": [1] * sampled + [0] * (tokens - sampled),
    }


def batch():
    """Two steps of 2 questions x 2 responses, and a validation episode that counts nowhere."""
    trajs, recs = [], []
    for k in range(2):
        for uid, turns, tokens, sampled in [
            ("q1", 2, 10, 4),
            ("q1", 1, 7, 3),
            ("q2", 3, 12, 5),
            ("q2", 1, 6, 2),
        ]:
            trajs.append(trajectory(k, f"{uid}-{k}", turns, tokens + k, sampled))
            recs += [record(k, f"{uid}-{k}", t) for t in range(turns)]
    trajs.append(trajectory(0, "v", 2, 50, 40, phase="val"))
    recs += [record(0, "v", 0, phase="val"), record(0, "v", 1, phase="val")]
    return recs, trajs


PPO = PPOConfig(epochs=2, mini_batches=3, micro_batch_size=1)


def test_batch_math_counts_each_step_and_its_mini_and_micro_batches():
    recs, trajs = batch()
    rows = batch_math(recs, trajs, steps=2, questions=2, responses=2, ppo=PPO)
    assert rows == [
        {
            "step": k,
            "questions": 2,
            "responses_per_question": 2,
            "trajectories": 4,
            "generations": 7,
            "tokens": 35 + 4 * k,
            "sampled_tokens": 14,
            "epochs": 2,
            "mini_batches": 3,
            "trajectories_per_mini_batch": 2,  # 4 trajectories in 3 mini-batches: ceil
            "micro_batches": 2 * 3 * 2,
            "micro_batch_size": 1,
            "optimizer_steps_per_role": 6,
        }
        for k in range(2)
    ]
    wide = PPOConfig(epochs=1, mini_batches=1, micro_batch_size=3)
    (row,) = batch_math(recs, trajs, steps=1, questions=2, responses=2, ppo=wide)
    assert (row["trajectories_per_mini_batch"], row["micro_batches"]) == (4, 2)  # ceil(4 / 3)


def test_batch_math_names_the_step_and_what_the_config_says():
    recs, trajs = batch()
    with pytest.raises(CheckFailed, match=r"^batch_math: step 0: 2 questions, the config says 3$"):
        batch_math(recs, trajs, steps=2, questions=3, responses=2, ppo=PPO)
    short = [t for t in trajs if not (t["step"] == 1 and t["turns"] == 3)]
    with pytest.raises(CheckFailed, match=r"^batch_math: step 1: 3 trajectories, the config says 2 x 2 = 4$"):
        batch_math(recs, short, steps=2, questions=2, responses=2, ppo=PPO)
    lost = [r for r in recs if not (r["step"] == 1 and r["turn"] == 2)]
    with pytest.raises(CheckFailed, match=r"^batch_math: step 1: 6 records for 7 generations$"):
        batch_math(lost, trajs, steps=2, questions=2, responses=2, ppo=PPO)
    with pytest.raises(CheckFailed, match=r"^batch_math: step 2: 0 questions"):  # a step never run
        batch_math(recs, trajs, steps=3, questions=2, responses=2, ppo=PPO)


@dataclass
class Session:
    ac: ActorCritic
    optimizers: dict
    schedulers: dict


def session(tiny_model) -> Session:
    ac = ActorCritic(AutoModelForCausalLM.from_pretrained(tiny_model), TRAINING, seed=0)
    optimizers = make_optimizers(ac, TRAINING.ppo)
    return Session(ac, optimizers, make_schedulers(optimizers, TRAINING.ppo, steps=4))


@pytest.fixture
def checkpoint(tiny_model, tmp_path):
    """step_2 of a policy with trained-looking adapters, saved with its optimizer state."""
    s = session(tiny_model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for role in ROLES:
            for p in s.ac.trainable(role).values():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return save_compact(tmp_path / "ck", 2, s.ac, s.optimizers, s.schedulers, {"position": 7})


IDS = torch.tensor([[1, 50, 60, 70, 80, 90, 2], [1, 40, 41, 42, 43, 44, 2]])


def test_cpu_roundtrip_resumes_into_the_step_from_the_saved_state(tiny_model, checkpoint):
    opened, stepped = [], []

    def open_fresh():
        opened.append(session(tiny_model))
        return opened[-1]

    def train_step(sess, k):
        # the step starts from the checkpoint as saved: the adapters and the RNG, drawn again
        stepped.append((sess, k, torch.rand(1).item()))
        return None, {"actor/pg_loss": 0.5, "timing_s/step": 1.0}

    out = cpu_roundtrip(open_fresh, checkpoint, 2, {"step": 2, "actor/pg_loss": 0.5}, IDS, train_step)
    assert len(opened) == 2 and [(s, k) for s, k, _ in stepped] == [(opened[0], 2)]
    assert (
        out["step"] == 2 and out["next_step_metrics_equal"] == 1 and out["next_step_metrics_rel_tol"] == 0.0
    )
    assert out["tensors_bit_equal"] == 2 * (2 * 7 * 2) + 2 and out["probe_tokens"] == IDS.numel()
    # the same draw as a fresh load of the checkpoint gives: the RNGs were put back before the step
    again = session(tiny_model)
    load_compact(checkpoint, again.ac, again.optimizers, again.schedulers)
    assert stepped[0][2] == torch.rand(1).item()

    with pytest.raises(
        CheckFailed, match=r"resuming into step 2: metric actor/pg_loss is 0.5 after resuming"
    ):
        cpu_roundtrip(open_fresh, checkpoint, 2, {"actor/pg_loss": 0.25}, IDS, train_step)


def test_cpu_roundtrip_without_a_next_step_trains_nothing(tiny_model, checkpoint):
    def train_step(sess, k):
        raise AssertionError("no resumed step was asked for")

    out = cpu_roundtrip(lambda: session(tiny_model), checkpoint, 2, None, IDS, train_step)
    assert out["next_step_metrics_equal"] is None and out["next_step_metrics_rel_tol"] is None
    with pytest.raises(CheckFailed, match=r"state.json: step 2, expected 3$"):
        cpu_roundtrip(lambda: session(tiny_model), checkpoint, 3, None, IDS, train_step)
