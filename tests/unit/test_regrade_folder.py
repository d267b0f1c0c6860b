"""Re-grading one journal folder with the current graders (regrade_folder), and what the plan
records of it (summary, brief) and moves aside (supersede): written-out expected values."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from atlas.config.graders import GraderConfig
from atlas.config.runtime import RuntimeConfig
from atlas.data.schema import TestCase
from atlas.rl import regrade
from atlas.rl.journal import step_dir, val_dir
from atlas.rl.regrade import FolderRegrade, ResumePlan, brief, regrade_folder, summary, supersede
from atlas.runtime.records import ExecutionRecord, write_records


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


SUBMIT = ExecutionRecord(
    run="zero_potential", step=2, phase="train", question_uid="gpqa-1", source="gpqa", sample=0, turn=1,
    tool="submit", arguments='{"answer": "C"}', action_token=9, generation_start=3, generated_tokens=6,
    forced_tokens=0, finish_reason="stop", tool_status="ok", tool_output_sha256=sha("submitted C"),
    tool_output_excerpt="submitted C", sandboxed=True, score=0.0, timing_s_generate=0.1, timing_s_tool=0.0,
)  # fmt: skip
QUESTIONS = {
    "gpqa-1": {"question_uid": "gpqa-1", "source": "gpqa", "correct_letter": "C"},  # the fixed key: C
    "gpqa-2": {"question_uid": "gpqa-2", "source": "gpqa", "correct_letter": "A"},
    "lcb-1": {"question_uid": "lcb-1", "source": "lcb", "func_name": None},
    "lcb-2": {"question_uid": "lcb-2", "source": "lcb", "func_name": None},
}


def journal(folder: Path, *records: ExecutionRecord) -> Path:
    folder.mkdir(parents=True)
    write_records(folder / "records.parquet", list(records))
    return folder


def test_each_executed_call_is_graded_again_and_only_a_changed_score_is_a_change(tmp_path):
    folder = journal(
        tmp_path / "step_2",
        SUBMIT,  # scored 0 by the old grader, 1 by the current one
        replace(SUBMIT, question_uid="gpqa-2", sample=3, arguments='{"answer": "A"}', score=1.0,
                tool_output_sha256=sha("submitted A")),  # unchanged
        replace(SUBMIT, question_uid="gpqa-2", sample=4, arguments='{"answer": "B"}',
                tool_output_sha256=sha("submitted B, old wording")),  # same score, other output
        replace(SUBMIT, question_uid="gpqa-2", sample=6, arguments='{"answer": "D"}',
                tool_output_sha256=sha("submitted D, old wording")),  # and another
        replace(SUBMIT, question_uid="lcb-1", source="lcb", arguments='{"code": "print(5)"}',
                tool_output_sha256=sha("1/1 tests passed")),  # passes the tests now, in the sandbox
        replace(SUBMIT, question_uid="lcb-2", source="lcb", tool="run_tests", arguments='{"code": "print(5)"}',
                tool_output_sha256=sha("this problem has no public tests")),  # no tests: unchanged
        replace(SUBMIT, question_uid="gpqa-2", sample=5, turn=0, tool="submit", arguments='{"answer": "Z"}',
                tool_status="refused", score=0.0),  # a refusal is the parser's: never run again
    )  # fmt: skip
    tests = {"lcb-1": [(TestCase("stdin", "2 3\n", "5\n"), "public")]}
    out = regrade_folder(folder, QUESTIONS, tests, RuntimeConfig(), GraderConfig())
    assert out == FolderRegrade(
        folder=folder.as_posix(),
        calls=6,
        score_changes=[
            "gpqa-1 sample 0 turn 1 submit: score 0 -> 1",
            "lcb-1 sample 0 turn 1 submit: score 0 -> 1",
        ],
        output_changes=2,
    )


def test_a_folder_without_records_or_with_a_question_not_in_the_run_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"step_0/records.parquet: missing"):
        regrade_folder(tmp_path / "step_0", QUESTIONS, {}, RuntimeConfig(), GraderConfig())
    folder = journal(tmp_path / "step_1", replace(SUBMIT, question_uid="gpqa-9"))
    with pytest.raises(KeyError, match=r"step_1/records.parquet: question gpqa-9 is not in this run's"):
        regrade_folder(folder, QUESTIONS, {}, RuntimeConfig(), GraderConfig())


PLAN = ResumePlan(
    latest=4,
    start=2,
    revalidate=[0],
    first_changed_step=2,
    folders=[
        FolderRegrade("journal/step_0", 5),
        FolderRegrade("journal/step_2", 4, ["a: score 0 -> 1", "b: score 1 -> 0"], 1),
        FolderRegrade("journal/val_0", 3, [], 2),
    ],
)


def test_the_summary_counts_every_folder_and_lists_only_those_that_changed():
    assert summary(PLAN) == {
        "latest_checkpoint": 4,
        "resumed_from": 2,
        "first_changed_step": 2,
        "revalidated": [0],
        "calls_regraded": 12,
        "score_changes": 2,
        "output_changes_kept": 3,
        "folders": [
            {"folder": "journal/step_2", "calls": 4, "score_changes": ["a: score 0 -> 1", "b: score 1 -> 0"],
             "output_changes": 1},
            {"folder": "journal/val_0", "calls": 3, "score_changes": [], "output_changes": 2},
        ],
    }  # fmt: skip
    assert brief(PLAN) == {k: v for k, v in summary(PLAN).items() if k != "folders"}
    assert list(brief(PLAN)) == list(summary(PLAN))[:-1]


def run_folder(root: Path, checkpoints=(1, 2, 3), steps=3, validated=(0, 1, 2, 3)) -> None:
    for c in checkpoints:
        (root / f"step_{c}").mkdir(parents=True)
    for s in range(steps):
        step_dir(root, s).mkdir(parents=True)
    for j in validated:
        val_dir(root, j).mkdir(parents=True)
    (root / "wandb").mkdir()


def left(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.name != "journal")


def test_supersede_moves_the_work_after_the_resume_point_latest_checkpoint_first(tmp_path, monkeypatch):
    root = tmp_path / "run"
    run_folder(root)
    moved = []
    move = regrade.shutil.move
    monkeypatch.setattr(regrade.shutil, "move", lambda src, dst: (moved.append(Path(src)), move(src, dst)))
    plan = ResumePlan(latest=3, start=1, revalidate=[], first_changed_step=1, folders=[])
    aside = supersede(root, plan, [1, 2, 3], [0, 1, 2, 3])
    assert aside == tmp_path / "run.superseded-1"
    assert [p.relative_to(root).as_posix() for p in moved] == [
        "step_3", "step_2", "journal/step_1", "journal/step_2", "journal/val_2", "journal/val_3", "wandb",
    ]  # fmt: skip
    assert left(root) == ["journal/step_0", "journal/val_0", "journal/val_1", "step_1"]
    assert json.loads((aside / "regrade.json").read_text())["resumed_from"] == 1


def test_supersede_from_scratch_moves_every_point_and_a_revalidated_one_below_the_start(tmp_path):
    root = tmp_path / "run"
    run_folder(root)
    plan = ResumePlan(latest=3, start=0, revalidate=[], first_changed_step=0, folders=[])
    supersede(root, plan, [1, 2, 3], [0, 1, 2, 3])
    assert left(root) == []
    root = tmp_path / "again"
    run_folder(root)
    plan = ResumePlan(latest=3, start=2, revalidate=[1], first_changed_step=None, folders=[])
    supersede(root, plan, [1, 2, 3], [0, 1, 2, 3])
    assert left(root) == [
        "journal/step_0",
        "journal/step_1",
        "journal/val_0",
        "journal/val_2",
        "step_1",
        "step_2",
    ]
