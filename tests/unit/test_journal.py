"""The training run's working folder: kept for a resume, moved aside when it is another run's."""

import hashlib
import json
import logging

from atlas.hashing import MANIFEST
from atlas.rl import journal
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
    (other / FINGERPRINT).unlink()
    (other / "step_5").mkdir()
    open_root(other, {"config": 1}, "auto", "old")
    assert (tmp_path / "old.stale-unfingerprinted" / "step_3").is_dir()  # the earlier one is kept
    assert (tmp_path / "old.stale-unfingerprinted-2" / "step_5").is_dir()


def test_validation_and_checkpoint_points():
    assert validation_points(4, 2) == [0, 2, 4]
    assert validation_points(5, 2) == [0, 2, 4, 5]
    assert validation_points(2, 5) == [0, 2]
    assert checkpoint_points(5, 2) == [2, 4, 5]  # the last step is always saved


def test_a_second_move_aside_keeps_the_earlier_aside_of_the_same_fingerprint(tmp_path):
    root = tmp_path / "arm"
    first = open_root(root, {"config": 1}, "auto", "arm")
    (root / "step_1").mkdir()
    open_root(root, {"config": 2}, "auto", "arm")  # step_1 aside, under config 1's hash
    open_root(root, {"config": 1}, "auto", "arm")  # config 2's empty folder aside
    (root / "step_2").mkdir()
    open_root(root, {"config": 2}, "auto", "arm")  # config 1's again, beside the earlier aside
    aside = tmp_path / f"arm.stale-{first[:12]}"
    assert sorted(p.name for p in aside.iterdir()) == [FINGERPRINT, "step_1"]
    assert sorted(p.name for p in (tmp_path / f"arm.stale-{first[:12]}-2").iterdir()) == [
        FINGERPRINT,
        "step_2",
    ]
    (root / "step_3").mkdir()
    open_root(root, {"config": 1}, "auto", "arm")
    (root / "step_4").mkdir()
    open_root(root, {"config": 2}, "auto", "arm")
    assert (tmp_path / f"arm.stale-{first[:12]}-3" / "step_4").is_dir()
    # a fingerprint file without a hash (hand-made, or cut short) is moved aside as "unknown"
    (root / FINGERPRINT).write_text("{}")
    open_root(root, {"config": 2}, "auto", "arm")
    assert (tmp_path / "arm.stale-unknown" / FINGERPRINT).read_text() == "{}"
    # an empty folder without a fingerprint is simply used
    empty = tmp_path / "empty"
    empty.mkdir()
    open_root(empty, {"config": 1}, "auto", "empty")
    assert not (tmp_path / "empty.stale-unfingerprinted").exists()
    assert open_root(tmp_path / "new", {"config": 1}, "auto", "new") == first


def test_the_fingerprint_is_the_hash_of_its_canonical_json(tmp_path):
    digest = open_root(tmp_path / "arm", {"config": {"b": 1, "a": "é"}}, "auto", "arm")
    canonical = json.dumps(
        {"config": {"a": "é", "b": 1}}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert digest == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    written = json.loads((tmp_path / "arm" / FINGERPRINT).read_text(encoding="utf-8"))
    assert written == {"sha256": digest, "config": {"a": "é", "b": 1}}


def test_protocol_counts_add_up_over_the_journal_and_keep_every_violation(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"episodes": 4, "violations": 1, "strict": True, "violation_rows": [{"k": 1}]}))
    b.write_text(
        json.dumps({"episodes": 3, "violations": 2, "rate": 0.5, "violation_rows": [{"k": 2}, {"k": 3}]})
    )
    assert journal._protocol_totals([a, b]) == {
        "episodes": 7,
        "violations": 3,
        "violation_rows": [{"k": 1}, {"k": 2}, {"k": 3}],
    }  # booleans and fractions are not counts
    assert journal._protocol_totals([]) == {"violation_rows": []}


def test_the_checkpoint_index_lists_each_checkpoint_with_its_manifest_hashes(tmp_path):
    for k, digest in ((2, "aa"), (4, "bb")):
        (tmp_path / f"step_{k}").mkdir()
        files = {"critic.safetensors": {"sha256": digest, "bytes": k}}
        (tmp_path / f"step_{k}" / MANIFEST).write_text(json.dumps({"files": files, "other": 1}))
    assert journal.checkpoint_index(tmp_path, [4, 2]) == {
        "checkpoints": [
            {"step": 4, "path": (tmp_path / "step_4").as_posix(),
             "files": {"critic.safetensors": {"sha256": "bb", "bytes": 4}}},
            {"step": 2, "path": (tmp_path / "step_2").as_posix(),
             "files": {"critic.safetensors": {"sha256": "aa", "bytes": 2}}},
        ]
    }  # fmt: skip
    assert journal._read_samples(tmp_path / "samples.json") == []  # a journal from before the sampler
    (tmp_path / "samples.json").write_text('[{"rss_gb": 1.5}]')
    assert journal._read_samples(tmp_path / "samples.json") == [{"rss_gb": 1.5}]


def test_each_move_and_removal_is_logged_with_where_the_work_went(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="atlas")
    root = tmp_path / "arm"
    first = open_root(root, {"config": 1}, "auto", "arm")
    open_root(root, {"config": 2}, "auto", "arm")
    open_root(root, {"config": 2}, "disable", "arm")
    other = tmp_path / "old"
    (other / "step_1").mkdir(parents=True)
    open_root(other, {"config": 1}, "auto", "old")
    assert [r.getMessage() for r in caplog.records] == [
        f"arm: earlier work was made with another config or inputs; moved aside to={tmp_path / f'arm.stale-{first[:12]}'}",
        f"arm: resume_mode disable: removing earlier work folder={root}",
        f"old: earlier work has no fingerprint; moved aside to={tmp_path / 'old.stale-unfingerprinted'}",
    ]
