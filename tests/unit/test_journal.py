"""The training run's working folder: kept for a resume, moved aside when it is another run's."""

import json

from atlas.rl.journal import FINGERPRINT, checkpoint_points, open_root, validation_points


def test_same_fingerprint_keeps_the_work_other_fingerprint_moves_it_aside(tmp_path):
    root = tmp_path / "checkpoints" / "arm"
    first = open_root(root, {"config": {"dose": 1.0}}, "auto", "arm")
    (root / "step_1").mkdir()
    assert open_root(root, {"config": {"dose": 1.0}}, "auto", "arm") == first
    assert (root / "step_1").is_dir()  # kept: a rerun resumes from it

    second = open_root(root, {"config": {"dose": 0.5}}, "auto", "arm")
    assert second != first
    aside = tmp_path / "checkpoints" / f"arm.stale-{first[:12]}"
    assert (aside / "step_1").is_dir()  # nothing is deleted
    assert json.loads((aside / FINGERPRINT).read_text())["config"] == {"dose": 1.0}
    assert sorted(p.name for p in root.iterdir()) == [FINGERPRINT]
    assert json.loads((root / FINGERPRINT).read_text())["sha256"] == second


def test_resume_disable_starts_over_and_unfingerprinted_work_is_kept_aside(tmp_path):
    root = tmp_path / "arm"
    open_root(root, {"config": 1}, "auto", "arm")
    (root / "step_1").mkdir()
    open_root(root, {"config": 1}, "disable", "arm")
    assert sorted(p.name for p in root.iterdir()) == [FINGERPRINT]

    other = tmp_path / "old"
    (other / "step_3").mkdir(parents=True)  # from before fingerprints existed
    open_root(other, {"config": 1}, "auto", "old")
    assert (tmp_path / "old.stale-unfingerprinted" / "step_3").is_dir()


def test_validation_and_checkpoint_points():
    assert validation_points(4, 2) == [0, 2, 4]
    assert validation_points(5, 2) == [0, 2, 4, 5]
    assert validation_points(2, 5) == [0, 2]
    assert checkpoint_points(5, 2) == [2, 4, 5]  # the last step is always saved
