"""Manifests and atomic JSON at their edges: the exact text written, a manifest of named files
only, verify given the manifest's own path, manifests that hold fewer sections, and every missing
file named. (The centre is in test_hashing.py; these are the cases a mutation would slip past.)"""

from __future__ import annotations

import json

from atlas.hashing import (
    MANIFEST,
    MANIFEST_FORMAT,
    aside_path,
    atomic_write_json,
    build_manifest,
    canonical_json,
    sha256_bytes,
    verify,
    write_manifest,
)


def test_json_records_are_indented_sorted_and_keep_unicode(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"b": 1, "a": "é"})
    assert (tmp_path / "r.json").read_text(encoding="utf-8") == '{\n  "a": "é",\n  "b": 1\n}\n'


def test_a_manifest_of_named_files_lists_only_them(tmp_path):
    (tmp_path / "kept.txt").write_text("x")
    (tmp_path / "other.txt").write_text("y")
    manifest = build_manifest(tmp_path, stage="s", files=["kept.txt"])
    assert list(manifest["files"]) == ["kept.txt"]
    assert manifest["files"]["kept.txt"]["size"] == 1


def test_verify_takes_the_manifest_path_and_names_every_missing_file(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    write_manifest(tmp_path, stage="s")
    assert verify(tmp_path / MANIFEST) == verify(tmp_path) == []
    (tmp_path / "a.txt").unlink()
    (tmp_path / "b.txt").unlink()
    assert verify(tmp_path / MANIFEST) == [f"{tmp_path / 'a.txt'}: missing", f"{tmp_path / 'b.txt'}: missing"]


def test_a_manifest_that_is_not_an_object_is_named(tmp_path):
    (tmp_path / MANIFEST).write_text("[]")
    assert verify(tmp_path) == [f"{tmp_path / MANIFEST}: not an {MANIFEST_FORMAT} manifest"]


def test_a_manifest_without_a_files_block_is_named(tmp_path):
    minimal = {
        "format": MANIFEST_FORMAT,
        "config": None,
        "config_sha256": sha256_bytes(canonical_json(None).encode()),
    }
    (tmp_path / MANIFEST).write_text(json.dumps(minimal))
    assert verify(tmp_path) == [f"{tmp_path / MANIFEST}: no files block"]


def test_a_manifest_without_inputs_or_code_sections_checks_what_it_has(tmp_path):
    minimal = {
        "format": MANIFEST_FORMAT,
        "files": {},
        "config": None,
        "config_sha256": sha256_bytes(canonical_json(None).encode()),
    }
    (tmp_path / MANIFEST).write_text(json.dumps(minimal))
    assert verify(tmp_path) == []
    (tmp_path / "extra.txt").write_text("z")
    assert verify(tmp_path) == [f"{tmp_path / 'extra.txt'}: present but not in the manifest"]


def test_verify_of_named_files_checks_those_alone(tmp_path):
    (tmp_path / "kept.txt").write_text("x")
    (tmp_path / "other.txt").write_text("y")
    write_manifest(tmp_path, stage="s", config={"k": 1})
    (tmp_path / "other.txt").write_text("changed")
    (tmp_path / "extra.txt").write_text("not listed")
    assert verify(tmp_path, only=["kept.txt"], cache=False) == []
    assert verify(tmp_path, cache=False) == [
        f"{tmp_path / 'other.txt'}: size 7, manifest says 1",
        f"{tmp_path / 'other.txt'}: sha256 {sha256_bytes(b'changed')}, manifest says {sha256_bytes(b'y')}",
        f"{tmp_path / 'extra.txt'}: present but not in the manifest",
    ]


def test_a_folder_without_a_manifest_is_named_so(tmp_path):
    assert verify(tmp_path) == [f"{tmp_path / MANIFEST}: no manifest"]
    assert verify(tmp_path / "missing") == [f"{tmp_path / 'missing' / MANIFEST}: no manifest"]


def test_work_set_aside_goes_to_the_first_unused_number(tmp_path):
    target = tmp_path / "run"
    assert aside_path(target, "stale") == tmp_path / "run.stale-1"
    (tmp_path / "run.stale-1").mkdir()
    assert aside_path(target, "stale") == tmp_path / "run.stale-2"
    (tmp_path / "run.stale-2").write_text("")
    assert aside_path(target, "stale") == tmp_path / "run.stale-3"
    assert aside_path(target, "other") == tmp_path / "run.other-1"
