"""Rebuilding one arm after a grader fix: the training job re-grades its journal with the edited
grader and resumes from the last checkpoint whose rewards are all unchanged.

Each case copies the finished pipeline, edits the GPQA grader of the copy so that it flips the
score of one (answer, correct letter) pair, chosen from the arm's own records so the first
changed reward falls where the case needs it, and reruns the arm through Snakemake."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from atlas.rl.journal import step_dir, val_dir
from conftest import copy_pipeline, jobs_to_run, run_snakemake

ARM = "zero_potential"
LETTERS = "ABCD"


# --- the real thing: the arm rerun by Snakemake after a grader edit ---


def gpqa_submits(wf: Path, run: str = ARM) -> pl.DataFrame:
    letters = pl.concat(
        [
            pl.read_parquet(wf / "results" / "data" / f"{s}.parquet").select("question_uid", "correct_letter")
            for s in ("train", "val")
        ]
    ).unique()
    return (
        pl.read_parquet(wf / "results" / "runs" / run / "records.parquet")
        .filter((pl.col("tool") == "submit") & (pl.col("source") == "gpqa"))
        .join(letters, on="question_uid")
        .with_columns(answer=pl.col("arguments").str.json_path_match("$.answer"))
    )


def first_train_step(submits: pl.DataFrame) -> dict[tuple[str, str], int]:
    train = submits.filter(pl.col("phase") == "train")
    out: dict[tuple[str, str], int] = {}
    for answer, correct, step in train.select("answer", "correct_letter", "step").iter_rows():
        out[(answer, correct)] = min(step, out.get((answer, correct), step))
    return out


def flip_pair(wf: Path, pair: tuple[str, str]) -> None:
    grader = wf / "src" / "atlas" / "graders" / "gpqa.py"
    grader.write_text(
        grader.read_text()
        + f"""

_grade_letter = grade_letter


def grade_letter(answer: str, correct_letter: str) -> float:  # the "fix" under test
    score = _grade_letter(answer, correct_letter)
    return 1.0 - score if (answer, correct_letter) == {pair!r} else score
"""
    )


def rerun_arm(wf: Path, run: str = ARM) -> dict:
    assert jobs_to_run(wf, [f"results/runs/{run}"]) == {"train"}
    run_snakemake(wf, "--cores", "2", f"results/runs/{run}", timeout=900)
    return json.loads((wf / "results" / "runs" / run / "run.json").read_text())


def journal_bytes(root: Path, step: int) -> dict[str, bytes]:
    folder = step_dir(root, step)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "samples.json"}


def checkpoint_bytes(root: Path, step: int) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / f"step_{step}").iterdir())}


@pytest.fixture
def arm_copy(pipeline, tmp_path):
    wf = copy_pipeline(pipeline, tmp_path / "wf")
    before = {
        "metrics": pl.read_parquet(wf / "results" / "runs" / ARM / "step_metrics.parquet"),
        "records": pl.read_parquet(wf / "results" / "runs" / ARM / "records.parquet"),
    }
    return wf, before


def test_grader_fix_that_changes_no_reward_retrains_nothing(arm_copy):
    wf, before = arm_copy
    seen = set(first_train_step(gpqa_submits(wf)))
    seen |= set(gpqa_submits(wf).select("answer", "correct_letter").iter_rows())
    unseen = next((a, c) for a in LETTERS for c in LETTERS if (a, c) not in seen)
    flip_pair(wf, unseen)
    info = rerun_arm(wf)
    assert info["resumed_from_step"] == 2  # the last step: nothing to redo
    assert info["regrade"]["score_changes"] == 0 and info["regrade"]["calls_regraded"] > 0
    assert info["superseded"] is None
    after = pl.read_parquet(wf / "results" / "runs" / ARM / "step_metrics.parquet")
    # Identical to the last measured timing: the steps were re-assembled from the journal, not rerun.
    assert after.equals(before["metrics"])
    assert pl.read_parquet(wf / "results" / "runs" / ARM / "records.parquet").equals(before["records"])
    assert not list((wf / "results" / "checkpoints").glob(f"{ARM}.superseded-*"))


def test_grader_fix_changing_a_reward_at_step_k_resumes_from_checkpoint_k(arm_copy):
    wf, before = arm_copy
    firsts = first_train_step(gpqa_submits(wf))
    later = {pair: step for pair, step in firsts.items() if step >= 1}
    assert later, f"the arm's records have no GPQA answer pair first seen after step 0: {firsts}"
    pair, k = max(later.items(), key=lambda item: item[1])  # the latest: the fewest steps to redo
    root = wf / "results" / "checkpoints" / ARM
    kept_journal = {s: journal_bytes(root, s) for s in range(k)}
    kept_checkpoints = {c: checkpoint_bytes(root, c) for c in range(1, k + 1)}
    old_step_k = pl.read_parquet(step_dir(root, k) / "records.parquet")

    flip_pair(wf, pair)
    info = rerun_arm(wf)
    assert info["resumed_from_step"] == k
    assert info["regrade"]["first_changed_step"] == k
    # Steps before k and checkpoints up to k are untouched, byte for byte.
    assert {s: journal_bytes(root, s) for s in range(k)} == kept_journal
    assert {c: checkpoint_bytes(root, c) for c in range(1, k + 1)} == kept_checkpoints
    # Step k ran again from checkpoint k: the same generations (same policy, same seeds), with the
    # fixed grader's scores on exactly the flipped pair.
    new_step_k = pl.read_parquet(step_dir(root, k) / "records.parquet")
    same = ["question_uid", "sample", "turn", "tool", "arguments", "action_token", "tool_output_sha256"]
    assert new_step_k.select(same).equals(old_step_k.select(same))
    letters = pl.read_parquet(wf / "results" / "data" / "train.parquet").select(
        "question_uid", "correct_letter"
    )
    flipped = (
        new_step_k.join(old_step_k.select(*same[:3], old_score="score"), on=same[:3])
        .join(letters, on="question_uid", how="left")
        .with_columns(answer=pl.col("arguments").str.json_path_match("$.answer"))
        .filter(pl.col("score") != pl.col("old_score"))
    )
    assert flipped.height >= 1
    assert set(flipped.select("answer", "correct_letter").iter_rows()) == {pair}
    assert (flipped["score"] == 1.0 - flipped["old_score"]).all()
    # The run folder: steps < k are the journal's (same measured timings), steps >= k are new.
    after = pl.read_parquet(wf / "results" / "runs" / ARM / "step_metrics.parquet")
    assert after.filter(pl.col("step") < k).equals(before["metrics"].filter(pl.col("step") < k))
    assert after.filter(pl.col("step") == k)["timing_s/step"][0] != before["metrics"]["timing_s/step"][k]
    # What no longer counts was moved aside with the reason, not deleted.
    aside = wf / info["superseded"]
    assert aside.name == f"{ARM}.superseded-1"
    assert (aside / "journal" / f"step_{k}" / "records.parquet").is_file()
    assert json.loads((aside / "regrade.json").read_text())["resumed_from"] == k


def test_grader_fix_changing_a_reward_at_step_0_trains_from_scratch(pipeline, tmp_path):
    # The training smoke (2 steps): the same code path as an arm, half the steps to redo.
    run = "training_smoke"
    wf = copy_pipeline(pipeline, tmp_path / "wf")
    before = pl.read_parquet(wf / "results" / "runs" / run / "step_metrics.parquet")
    firsts = first_train_step(gpqa_submits(wf, run))
    pair = next((p for p, step in firsts.items() if step == 0), None)
    assert pair is not None, f"no GPQA answer pair at step 0: {firsts}"
    root = wf / "results" / "checkpoints" / run
    old_step_0 = pl.read_parquet(step_dir(root, 0) / "records.parquet")

    flip_pair(wf, pair)
    info = rerun_arm(wf, run)
    assert info["resumed_from_step"] == 0 and info["regrade"]["first_changed_step"] == 0
    new_step_0 = pl.read_parquet(step_dir(root, 0) / "records.parquet")
    assert new_step_0["score"].to_list() != old_step_0["score"].to_list()
    assert (root / "step_2").is_dir() and val_dir(root, 0).is_dir()
    aside = wf / info["superseded"]
    assert sorted(p.name for p in (aside / "journal").iterdir()) == ["step_0", "step_1", "val_0", "val_2"]
    assert sorted(p.name for p in aside.iterdir()) == ["journal", "regrade.json", "step_1", "step_2", "wandb"]
    after = pl.read_parquet(wf / "results" / "runs" / run / "step_metrics.parquet")
    assert after.height == 2 and not after["timing_s/step"].equals(before["timing_s/step"])
