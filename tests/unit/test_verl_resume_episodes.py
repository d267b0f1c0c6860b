"""Before a verl launch that resumes, the episode folders verl writes again move aside: a killed
attempt's file must not stand in for a sample that fails on the rerun."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from atlas.config.study import config_slice
from atlas.rl.recovery import VERL_TRACKER, verl_latest
from atlas.verl.convert import VerlOutputError, read_episodes, retire_episodes
from conftest import REPO


def episode(folder, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"name": name}))


def test_a_resume_moves_aside_what_verl_writes_again(tmp_path):
    episodes = tmp_path / "episodes"
    for g in (1, 2, 3):
        episode(episodes / "train" / f"global_step_{g}", "q_0__0")
    for g in (0, 2):
        episode(episodes / "val" / f"global_step_{g}", "q_1__0")
    # killed after checkpoint 2: step 3 and the validation at 2 (verl validates on resuming) again
    aside = retire_episodes(episodes, 2)
    assert aside == tmp_path / "episodes.earlier-1"
    assert sorted(p.relative_to(episodes).as_posix() for p in episodes.glob("*/global_step_*")) == [
        "train/global_step_1",
        "train/global_step_2",
        "val/global_step_0",
    ]
    moved = sorted(p.relative_to(aside).as_posix() for p in aside.rglob("*.json"))
    assert moved == ["train/global_step_3/q_0__0.json", "val/global_step_2/q_1__0.json"]
    assert json.loads((aside / moved[0]).read_text()) == {"name": "q_0__0"}  # moved whole, not rewritten
    assert json.loads((aside / moved[1]).read_text()) == {"name": "q_1__0"}
    # the rerun's step 3 lost its only sample: counted short, not filled by the old file
    (episodes / "train/global_step_3/failed").mkdir(parents=True)
    with pytest.raises(VerlOutputError, match="0 episodes, expected 1"):
        read_episodes(episodes / "train/global_step_3", 1)
    # nothing past 3 steps: None; no checkpoint (0 steps done): every step and point goes
    assert retire_episodes(episodes, 3) is None
    second = retire_episodes(episodes, 0)
    assert second == tmp_path / "episodes.earlier-2"
    assert not list(episodes.glob("*/global_step_*"))


def test_the_resume_point_is_verls_tracker(tmp_path):
    assert verl_latest(tmp_path) == 0
    (tmp_path / VERL_TRACKER).write_text("3\n")
    assert verl_latest(tmp_path) == 0  # no global_step_3/: verl starts over
    (tmp_path / "global_step_3").mkdir()
    assert verl_latest(tmp_path) == 3
    (tmp_path / VERL_TRACKER).write_text("")
    assert verl_latest(tmp_path) == 0


@pytest.mark.verl
def test_a_resumed_launch_moves_them_aside_before_verl_starts(tiny_model, data_dir, tmp_path, monkeypatch):
    """The stage itself (`--dry-run`: prepared, composed through verl's loader, not launched), in
    a checkpoint folder a killed launch left: verl's tracker at 1 step, episodes of steps 1-2."""
    if not os.environ.get("ATLAS_REQUIRE_VERL"):
        pytest.importorskip("verl")  # compose reads verl's own config files
    from atlas.stages import train_verl  # imports verl's agent loop

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["training"]["engine"] = "verl"
    raw["resources"] = {"device": "cuda", "gpus": 1}
    s = config_slice(raw, "training", "training_smoke")
    root = tmp_path / "checkpoints"
    argv = ["--config-slice", json.dumps(s), "--model", str(tiny_model), "--checkpoints", str(root)]
    argv += ["--out", str(tmp_path / "run"), "--dry-run"]
    for split in ("train", "val", "tests"):
        argv += [f"--{split}", str(data_dir / f"{split}.parquet")]
    monkeypatch.setattr(train_verl.runlock, "guard", lambda root, run: None)  # a job's guard, not pytest's
    train_verl.main(argv)  # the first launch: the folder and its fingerprint
    (root / "verl/checkpoints/global_step_1").mkdir(parents=True)
    (root / "verl/checkpoints" / VERL_TRACKER).write_text("1")
    for g in (1, 2):
        episode(root / "episodes/train" / f"global_step_{g}", "q_0__0")
    for g in (0, 1):
        episode(root / "episodes/val" / f"global_step_{g}", "q_1__0")
    train_verl.main(argv)  # the launch that resumes after step 1
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("episodes*/*/global_step_*")) == [
        "episodes.earlier-1/train/global_step_2",
        "episodes.earlier-1/val/global_step_1",  # verl validates again on resuming
        "episodes/train/global_step_1",
        "episodes/val/global_step_0",
    ]
