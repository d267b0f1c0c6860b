"""The re-grade planner on re-grade results given directly: where a training job resumes after a
grader fix, and which validation points it grades again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from atlas.rl import regrade
from atlas.rl.journal import val_dir
from atlas.rl.regrade import FolderRegrade, plan_resume, supersede


def planned(root: Path, changed: set[str], latest=4, checkpoints=(1, 2, 3, 4), validated=(0, 2, 4)):
    for j in validated:  # the planner re-grades the validation points whose journal is whole
        val_dir(root, j).mkdir(parents=True, exist_ok=True)
        (val_dir(root, j) / "validation.json").write_text("[]")

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
    # From scratch nothing is validated again ahead of the run: point 0 runs as the run's first.
    plan = planned(tmp_path, {"step_0", "val_0"})
    assert (plan.start, plan.revalidate) == (0, [])
    plan = planned(tmp_path, {"step_1", "val_0"})
    assert (plan.start, plan.revalidate) == (1, [0])
    # A changed point 1 without a checkpoint 1 sends the run back to scratch.
    plan = planned(tmp_path, {"val_1"}, checkpoints=(2, 3, 4), validated=(0, 1, 2, 4))
    assert (plan.start, plan.revalidate) == (0, [])


def test_a_validation_point_not_whole_is_validated_again(tmp_path):
    # A job killed after supersede moved val_4 away (or while it wrote val_4) resumes at 4 and
    # validates 4 again, before the run folder is assembled from the journal.
    planned(tmp_path, set())
    (val_dir(tmp_path, 4) / "validation.json").unlink()  # records written, the last file not
    plan = planned_as_is(tmp_path)
    assert (plan.start, plan.revalidate, plan.unchanged) == (4, [4], False)
    shutil.rmtree(val_dir(tmp_path, 2))  # moved aside by a killed supersede
    assert planned_as_is(tmp_path).revalidate == [2, 4]
    shutil.rmtree(val_dir(tmp_path, 0))
    assert planned_as_is(tmp_path).revalidate == [0, 2, 4]
    # without a checkpoint at the missing point, the job resumes below it
    assert planned_as_is(tmp_path, checkpoints=(1, 3, 4)).start == 1


def planned_as_is(root: Path, checkpoints=(1, 2, 3, 4)):
    """The plan for the journal as it is on disk, no score changed."""
    return plan_resume(root, 4, list(checkpoints), [0, 2, 4], lambda f: FolderRegrade(f.name, 1, []))


def test_supersede_leaves_a_point_past_the_latest_checkpoint_in_place(tmp_path):
    # killed between validating at step 4 and saving checkpoint 4: nothing to supersede
    for k in (1, 2, 3):
        (tmp_path / f"step_{k}").mkdir()
    plan = planned(tmp_path, set(), latest=3, checkpoints=(1, 2, 3), validated=(0, 2, 4))
    assert plan.unchanged
    assert supersede(tmp_path, plan, [1, 2, 3], [0, 2, 4]) is None
    assert (val_dir(tmp_path, 4) / "validation.json").is_file()
    # a change at step 1 moves checkpoints 2, 3 and the points after 1 up to 3, not 4
    plan = planned(tmp_path, {"step_1"}, latest=3, checkpoints=(1, 2, 3), validated=(0, 2, 4))
    aside = supersede(tmp_path, plan, [1, 2, 3], [0, 2, 4])
    assert sorted(p.name for p in aside.iterdir()) == ["journal", "regrade.json", "step_2", "step_3"]
    assert sorted(p.name for p in (aside / "journal").iterdir()) == ["val_2"]
    assert val_dir(tmp_path, 4).is_dir() and val_dir(tmp_path, 0).is_dir()


def test_supersede_says_why_before_it_moves_anything(tmp_path, monkeypatch):
    for k in (1, 2, 3):
        (tmp_path / f"step_{k}").mkdir()
    plan = planned(tmp_path, {"step_1"}, latest=3, checkpoints=(1, 2, 3), validated=(0, 2))

    def killed(src, dst):  # the job dies at its first move
        raise KeyboardInterrupt

    monkeypatch.setattr(regrade.shutil, "move", killed)
    with pytest.raises(KeyboardInterrupt):
        supersede(tmp_path, plan, [1, 2, 3], [0, 2])
    aside = tmp_path.with_name(f"{tmp_path.name}.superseded-1")
    assert json.loads((aside / "regrade.json").read_text())["resumed_from"] == 1
