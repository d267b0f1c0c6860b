"""The re-grade planner on re-grade results given directly: where a training job resumes after a
grader fix, and which validation points it grades again."""

from __future__ import annotations

from pathlib import Path

from atlas.rl.journal import val_dir
from atlas.rl.regrade import FolderRegrade, plan_resume


def planned(root: Path, changed: set[str], latest=4, checkpoints=(1, 2, 3, 4), validated=(0, 2, 4)):
    for j in validated:  # the planner re-grades the validation points whose journal exists
        val_dir(root, j).mkdir(parents=True, exist_ok=True)

    def regrade(folder: Path) -> FolderRegrade:
        return FolderRegrade(folder.name, 1, ["score 0 -> 1"] if folder.name in changed else [])

    return plan_resume(root, latest, list(checkpoints), list(validated), regrade)


def test_plan_keeps_everything_when_no_score_changed(tmp_path):
    plan = planned(tmp_path, set())
    assert (plan.start, plan.revalidate, plan.first_changed_step, plan.unchanged) == (4, [], None, True)


def test_plan_resumes_before_the_first_changed_step_and_revalidates_earlier_points(tmp_path):
    plan = planned(tmp_path, {"step_2", "step_3", "val_0"})
    assert (plan.start, plan.revalidate, plan.first_changed_step) == (2, [0], 2)
    plan = planned(tmp_path, {"step_0"})
    assert (plan.start, plan.revalidate) == (0, [])
    # Checkpoints every 2 steps: a change at step 3 resumes from checkpoint 2.
    plan = planned(tmp_path, {"step_3"}, checkpoints=(2, 4))
    assert plan.start == 2
    # A changed validation point without a checkpoint lowers the resume point below it.
    plan = planned(tmp_path, {"val_2"}, checkpoints=(3, 4), validated=(0, 2, 4))
    assert (plan.start, plan.revalidate) == (0, [])
    plan = planned(tmp_path, {"val_4"})
    assert (plan.start, plan.revalidate) == (4, [4])
